package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigRenderLoadRoundTrip(t *testing.T) {
	h := Home{Dir: filepath.Join(t.TempDir(), "h")}
	if _, err := Init(h, InitOptions{Moniker: "pc 1", Site: "lab-a", Bootstrap: []string{"/ip4/127.0.0.1/tcp/7701/p2p/12D3KooWNdkUh92ULEQEiS11zh7e2rnWqZGMsGXs7gTYwD7bCA6h"}}); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(h.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultConfig()
	if cfg.Node.Moniker != "pc 1" || len(cfg.P2P.Bootstrap) != 1 || cfg.P2P.OfferTTL != def.P2P.OfferTTL ||
		cfg.API.Listen != def.API.Listen || len(cfg.P2P.Listen) != len(def.P2P.Listen) || !cfg.P2P.MDNS {
		t.Fatalf("round trip lost settings: %+v", cfg)
	}
}

func TestConfigEnvOverrides(t *testing.T) {
	h := Home{Dir: filepath.Join(t.TempDir(), "h")}
	if _, err := Init(h, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DEEPMARKET_API_LISTEN", "127.0.0.1:7999")
	t.Setenv("DEEPMARKET_P2P_MDNS", "false")
	t.Setenv("DEEPMARKET_P2P_LISTEN", "/ip4/127.0.0.1/tcp/1, /ip4/127.0.0.1/udp/1/quic-v1")
	t.Setenv("DEEPMARKET_P2P_OFFER_TTL", "2m")
	t.Setenv("DEEPMARKET_NODE_SITE", "psu")
	cfg, err := LoadConfig(h.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.API.Listen != "127.0.0.1:7999" || cfg.P2P.MDNS || len(cfg.P2P.Listen) != 2 || cfg.P2P.OfferTTL.Duration != 2*time.Minute || cfg.Node.Site != "psu" {
		t.Fatalf("env not applied: %+v", cfg)
	}
	t.Setenv("DEEPMARKET_P2P_MDNS", "maybe")
	if _, err := LoadConfig(h.ConfigPath()); err == nil || !strings.Contains(err.Error(), "DEEPMARKET_P2P_MDNS") {
		t.Fatalf("bad env value: %v", err)
	}
}

func TestConfigErrorsNameSectionAndKey(t *testing.T) {
	h := Home{Dir: filepath.Join(t.TempDir(), "h")}
	if _, err := Init(h, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	orig, _ := os.ReadFile(h.ConfigPath())
	cfg, err := LoadConfig(h.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to, want string }{
		{`announce_interval = "30s"`, `announce_interval = "80s"`, "[p2p] announce_interval"},
		{`offer_ttl = "1m30s"`, `offer_ttl = "soon"`, "offer_ttl"},
		{`level = "info"`, `level = "loud"`, "[log] level"},
		{`core_hour = "0.1"`, `core_hour = "-1"`, "[prices] core_hour"},
		{fmt.Sprintf("python = %q", cfg.Inventory.Python), `python = ""`, "[inventory] python"},
		{`conn_low = 64`, `conn_low = 500`, "conn_low"},
		{`announce_budget = 600`, `announce_budget = -5`, "[p2p] announce_budget"},
		{`max_inbound_peers = 400`, `max_inbound_peers = 0`, "[ledger] max_inbound_peers"},
	} {
		mod := strings.Replace(string(orig), c.from, c.to, 1)
		if mod == string(orig) {
			t.Fatalf("template lacks %q", c.from)
		}
		os.WriteFile(h.ConfigPath(), []byte(mod), 0o644)
		_, err := LoadConfig(h.ConfigPath())
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "config.toml") {
			t.Errorf("%s: error %v, want it to name %q and the file", c.to, err, c.want)
		}
	}
}
