package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/internal/testutil"
)

// bin is the deepmarket binary built once for these tests: they run the
// CLI as a user would, as a separate process.
var bin string

func TestMain(m *testing.M) {
	// sandboxtest.Need's probe runs a trial job by re-executing this binary.
	sandbox.MaybeRunTrampoline()
	dir, err := os.MkdirTemp("", "deepmarket-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "deepmarket")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DEEPMARKET_HOME=") // only --home counts in tests
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, args...)
	if r.code != 0 {
		t.Fatalf("deepmarket %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func expectFail(t *testing.T, code int, want string, args ...string) {
	t.Helper()
	r := run(t, args...)
	if r.code != code || !strings.Contains(r.stderr, want) {
		t.Errorf("deepmarket %s: exit %d, stderr %q; want exit %d and %q", strings.Join(args, " "), r.code, r.stderr, code, want)
	}
}

func initHome(t *testing.T, extra ...string) string {
	t.Helper()
	home := filepath.Join(t.TempDir(), "home")
	args := append([]string{"init", "--home", home, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--chain-id", "deepmarket-cli-test",
		"--ledger-p2p", "tcp://127.0.0.1:" + freePort(t), "--ledger-rpc", "tcp://127.0.0.1:" + freePort(t)}, extra...)
	mustRun(t, args...)
	// Tests choose their peers: no LAN discovery.
	cfg := filepath.Join(home, "config.toml")
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, bytes.Replace(b, []byte("mdns = true"), []byte("mdns = false"), 1), 0o644)
	return home
}

func TestInitAndKeysShow(t *testing.T) {
	home := filepath.Join(t.TempDir(), "h")
	var initOut struct {
		PeerID  string `json:"peer_id"`
		Address string `json:"address"`
		ChainID string `json:"chain_id"`
	}
	out := mustRun(t, "init", "--home", home, "--moniker", "lab-pc-1", "--site", "psu", "--json")
	if err := json.Unmarshal([]byte(out), &initOut); err != nil {
		t.Fatalf("init --json: %v\n%s", err, out)
	}
	if !strings.HasPrefix(initOut.ChainID, "deepmarket-local-") {
		t.Fatalf("chain ID %q", initOut.ChainID)
	}
	for _, f := range []string{"node.key", "api.token"} {
		st, err := os.Stat(filepath.Join(home, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", f, err, st.Mode().Perm())
		}
	}
	cfg, _ := os.ReadFile(filepath.Join(home, "config.toml"))
	for _, want := range []string{`moniker = "lab-pc-1"`, `site = "psu"`, "# Site label", "[p2p]", "[api]", "announce_interval"} {
		if !bytes.Contains(cfg, []byte(want)) {
			t.Errorf("config.toml lacks %q", want)
		}
	}
	var keys struct {
		Address string `json:"address"`
		PeerID  string `json:"peer_id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "keys", "show", "--json", "--home", home)), &keys); err != nil {
		t.Fatal(err)
	}
	if keys.PeerID != initOut.PeerID || !strings.HasPrefix(keys.Address, "dm1") {
		t.Fatalf("keys show = %+v, init said %+v", keys, initOut)
	}
	// DEEPMARKET_HOME works in place of --home.
	cmd := exec.Command(bin, "keys", "show", "--json")
	cmd.Env = append(os.Environ(), "DEEPMARKET_HOME="+home)
	if o, err := cmd.Output(); err != nil || !bytes.Contains(o, []byte(keys.PeerID)) {
		t.Fatalf("DEEPMARKET_HOME: %v %s", err, o)
	}

	expectFail(t, 1, "--force", "init", "--home", home)
	if k2 := mustRun(t, "keys", "show", "--json", "--home", home); !strings.Contains(k2, keys.PeerID) {
		t.Fatal("a refused init changed the key")
	}
	out = mustRun(t, "init", "--home", home, "--force")
	if !strings.Contains(out, "Moved the old home to") {
		t.Fatalf("init --force: %s", out)
	}
	if k3 := mustRun(t, "keys", "show", "--json", "--home", home); strings.Contains(k3, keys.PeerID) {
		t.Fatal("init --force kept the old key")
	}
}

func TestInitJoinsGenesis(t *testing.T) {
	dir := t.TempDir()
	gen := filepath.Join(dir, "genesis.json")
	os.WriteFile(gen, []byte(`{"chain_id":"deepmarket-testnet-1","validators":[]}`), 0o644)
	out := mustRun(t, "init", "--home", filepath.Join(dir, "h"), "--genesis", gen)
	if !strings.Contains(out, "deepmarket-testnet-1") {
		t.Fatalf("init --genesis: %s", out)
	}
	os.WriteFile(gen, []byte(`not json`), 0o644)
	expectFail(t, 1, "not a genesis JSON", "init", "--home", filepath.Join(dir, "h2"), "--genesis", gen)
	expectFail(t, 1, "bootstrap address", "init", "--home", filepath.Join(dir, "h3"), "--bootstrap", "/ip4/1.2.3.4/tcp/1")
	expectFail(t, 1, "loopback only", "init", "--home", filepath.Join(dir, "h4"), "--api", "0.0.0.0:7700")
	if _, err := os.Stat(filepath.Join(dir, "h3")); err == nil {
		t.Fatal("a refused init left a home behind")
	}
}

func TestMissingHome(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	for _, args := range [][]string{{"status"}, {"keys", "show"}, {"node", "run"}, {"offers"}, {"lend", "--stop"}} {
		expectFail(t, 1, "deepmarket init", append(args, "--home", missing)...)
	}
}

func TestCorruptConfig(t *testing.T) {
	home := initHome(t)
	cfg := filepath.Join(home, "config.toml")
	orig, _ := os.ReadFile(cfg)
	lines := strings.Split(string(orig), "\n")
	lines[6] = "moniker = = broken"
	os.WriteFile(cfg, []byte(strings.Join(lines, "\n")), 0o644)
	expectFail(t, 1, "config.toml:7:", "node", "run", "--home", home)

	os.WriteFile(cfg, append(append([]byte{}, orig...), []byte("\n[p2p2]\nlisten = 1\n")...), 0o644)
	expectFail(t, 1, `unknown key "p2p2`, "node", "run", "--home", home)

	os.WriteFile(cfg, bytes.Replace(orig, []byte(`dht = "auto"`), []byte(`dht = "sometimes"`), 1), 0o644)
	expectFail(t, 1, "[p2p] dht", "node", "run", "--home", home)
}

func TestLendFlagErrors(t *testing.T) {
	home := initHome(t)
	for _, c := range []struct {
		want string
		args []string
	}{
		{"unknown unit", []string{"--cores", "1", "--mem", "8XB"}},
		{"negative", []string{"--cores", "1", "--mem", "-8GiB"}},
		{"more than 0", []string{"--cores", "1", "--mem", "0"}},
		{"at least 1 core", []string{"--cores", "0", "--mem", "1GiB"}},
		{"at least 1 core", []string{"--cores", "-2", "--mem", "1GiB"}},
		{"cannot be negative", []string{"--cores", "1", "--mem", "1GiB", "--gpus", "-1"}},
		{"HH:MM-HH:MM", []string{"--cores", "1", "--mem", "1GiB", "--window", "7pm-7am"}},
		{"more than 6 decimals", []string{"--cores", "1", "--mem", "1GiB", "--price", "core=0.0000001"}},
		{"unknown resource", []string{"--cores", "1", "--mem", "1GiB", "--price", "disk=1"}},
		{"both --cores and --mem", []string{"--cores", "1"}},
		{"no other lend flags", []string{"--stop", "--cores", "1"}},
		{"invalid argument", []string{"--cores", "many", "--mem", "1G"}},
	} {
		expectFail(t, 2, c.want, append([]string{"lend", "--home", home}, c.args...)...)
	}
}

// startNodeProcess runs `deepmarket node run` and waits for its API.
func startNodeProcess(t *testing.T, home string, extra ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"node", "run", "--home", home}, extra...)...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if r := run(t, "status", "--home", home, "--json"); r.code == 0 {
			return cmd, &logs
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("node did not start:\n%s", logs.String())
	return nil, nil
}

func TestNodeProcess(t *testing.T) {
	home := initHome(t)
	cmd, logs := startNodeProcess(t, home)

	var st map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--home", home)), &st); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"peer_id", "addrs", "account", "chain_id", "height", "peers", "lending", "api"} {
		if _, ok := st[k]; !ok {
			t.Errorf("status --json lacks %q: %v", k, st)
		}
	}
	if st["lending"] != false || st["chain_id"] != "deepmarket-cli-test" {
		t.Fatalf("status: %v", st)
	}

	cores := runtime.NumCPU()
	expectFail(t, 2, fmt.Sprintf("this machine has %d", cores), "lend", "--home", home, "--cores", fmt.Sprint(cores+1), "--mem", "1GiB")
	expectFail(t, 2, "this machine has 0", "lend", "--home", home, "--cores", "1", "--mem", "1GiB", "--gpus", "1")
	expectFail(t, 2, "--mem: cannot lend", "lend", "--home", home, "--cores", "1", "--mem", "100TiB")
	if out := mustRun(t, "lend", "--home", home, "--json"); !strings.Contains(out, `"lending": false`) {
		t.Fatalf("refused lends changed the state: %s", out)
	}

	out := mustRun(t, "lend", "--home", home, "--cores", "1", "--mem", "512MiB", "--price", "core=0.5,mem=0.1")
	if !strings.Contains(out, "Lending 1 cores, 512 MiB") || !strings.Contains(out, "0.5/core-hour") {
		t.Fatalf("lend: %s", out)
	}
	var offers []map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "offers", "--json", "--home", home)), &offers); err != nil {
		t.Fatal(err)
	}
	if len(offers) != 1 {
		t.Fatalf("offers: %v", offers)
	}
	for _, k := range []string{"machine", "owner", "site", "cores", "mem_bytes", "gpus", "price", "expires_at"} {
		if _, ok := offers[0][k]; !ok {
			t.Errorf("offers --json lacks %q", k)
		}
	}
	// 1 core at 0.5 + 0.5 GiB (rounded up to 1) at 0.1 = 0.6 credits/h.
	if offers[0]["price"] != float64(600000) || offers[0]["machine"] != st["peer_id"] {
		t.Fatalf("offer %v", offers[0])
	}
	if out := mustRun(t, "peers", "--json", "--home", home); strings.TrimSpace(out) != "[]" {
		t.Fatalf("peers: %s", out)
	}
	if out := mustRun(t, "offers", "--home", home); !strings.Contains(out, "(this machine)") {
		t.Fatalf("offers table: %s", out)
	}

	// A second node on the same ports fails with a clear message.
	api := strings.TrimPrefix(st["api"].(string), "http://")
	other := initHome(t)
	expectFail(t, 1, "is in use", "node", "run", "--home", other, "--api", api)
	addr := st["addrs"].([]any)[0].(string)
	listen := addr[:strings.Index(addr, "/p2p/")]
	expectFail(t, 1, "address already in use", "node", "run", "--home", other, "--listen", listen)
	// The same home twice: the store is locked.
	expectFail(t, 1, "another", "node", "run", "--home", home, "--api", "127.0.0.1:0")

	// SIGTERM stops it cleanly within 5 s.
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logs)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("still running 5 s after SIGTERM\n%s", logs)
	}
	t.Logf("stopped %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(home, "api.addr")); err == nil {
		t.Error("api.addr left behind after a clean stop")
	}
	expectFail(t, 1, "not running", "status", "--home", home)

	// Restarted, it lends again without being told.
	startNodeProcess(t, home)
	if out := mustRun(t, "lend", "--home", home, "--json"); !strings.Contains(out, `"lending": true`) {
		t.Fatalf("lend lost over restart: %s", out)
	}
}

func TestPortInUseAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	home := initHome(t)
	expectFail(t, 1, "is in use", "node", "run", "--home", home, "--api", ln.Addr().String())
}

func TestHelp(t *testing.T) {
	out := mustRun(t, "--help")
	for _, c := range []string{"init", "node", "keys", "status", "lend", "offers", "peers"} {
		if !strings.Contains(out, c) {
			t.Errorf("--help lacks %q", c)
		}
	}
	if out := mustRun(t, "lend", "--help"); !strings.Contains(out, "--window") || !strings.Contains(out, "Example") && !strings.Contains(out, "Examples") {
		t.Errorf("lend --help: %s", out)
	}
	expectFail(t, 2, "unknown flag", "status", "--bogus")
}

func freePort(t *testing.T) string { return testutil.FreePort(t) }

func balanceOf(t *testing.T, home string, addr ...string) uint64 {
	t.Helper()
	var b struct {
		Balance uint64 `json:"balance"`
	}
	args := append([]string{"ledger", "balance", "--json", "--home", home}, addr...)
	if err := json.Unmarshal([]byte(mustRun(t, args...)), &b); err != nil {
		t.Fatal(err)
	}
	return b.Balance
}

// TestLedgerCLI: on a node's local one-validator chain, the node's account
// starts with credits; transfers and grants commit, history shows them,
// bad input is refused before anything is sent, and the audit balances.
func TestLedgerCLI(t *testing.T) {
	home := initHome(t)
	startNodeProcess(t, home)
	other := "dm1qje8qcjtdsz9a3aq2e7kv3wgwrkapzlunwqgpu"
	if b := balanceOf(t, home); b != 1000_000000 {
		t.Fatalf("starter balance %d", b)
	}
	out := mustRun(t, "ledger", "transfer", other, "12.5", "--memo", "gpu time", "--home", home)
	if !strings.Contains(out, "Sent 12.5 credits") {
		t.Fatalf("transfer: %s", out)
	}
	if hash := txHashRE.FindString(out); !strings.Contains(mustRun(t, "ledger", "tx", hash, "--home", home), "committed at height") {
		t.Fatalf("ledger tx of the transfer %s", hash)
	}
	expectFail(t, 2, "not a transaction hash", "ledger", "tx", "abc", "--home", home)
	if help := mustRun(t, "ledger", "transfer", "--help"); !strings.Contains(help, "3 outcome unknown") {
		t.Fatalf("transfer --help does not document the exit status: %s", help)
	}
	if b := balanceOf(t, home, other); b != 12_500000 {
		t.Fatalf("recipient has %d", b)
	}
	mustRun(t, "ledger", "grant", other, "100", "--home", home)
	if b := balanceOf(t, home, other); b != 112_500000 {
		t.Fatalf("after grant recipient has %d", b)
	}
	before := balanceOf(t, home)
	expectFail(t, 2, "more than 6 decimals", "ledger", "transfer", other, "1.0000001", "--home", home)
	expectFail(t, 2, "not a DeepMarket address", "ledger", "transfer", "dm1nothing", "1", "--home", home)
	expectFail(t, 2, "must be more than 0", "ledger", "transfer", other, "0", "--home", home)
	expectFail(t, 1, "your balance is 987.5", "ledger", "transfer", other, "5000", "--home", home)
	if after := balanceOf(t, home); after != before {
		t.Fatalf("refused transfers changed the balance: %d -> %d", before, after)
	}

	var hist []struct {
		Type  string            `json:"type"`
		Attrs map[string]string `json:"attrs"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ledger", "history", "--json", "--home", home)), &hist); err != nil {
		t.Fatal(err)
	}
	if len(hist) != 2 || hist[0].Type != "grant" || hist[1].Type != "transfer" || hist[1].Attrs["memo"] != "gpu time" {
		t.Fatalf("history %+v", hist)
	}

	// Its records: no escrow of its own yet; a bad address is a usage error.
	if out := mustRun(t, "ledger", "record", "--home", home); !strings.Contains(out, "as a payer:   no escrow closed yet") ||
		!strings.Contains(out, "as a machine: 0 completed, 0 failed") {
		t.Errorf("ledger record: %s", out)
	}
	var rec struct {
		Address string         `json:"address"`
		Payer   map[string]any `json:"payer"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ledger", "record", other, "--json", "--home", home)), &rec); err != nil || rec.Address != other || rec.Payer["owed"] != 0.0 {
		t.Errorf("ledger record --json: %+v %v", rec, err)
	}
	expectFail(t, 2, "addresses look like dm1", "ledger", "record", "dm1nothing", "--home", home)

	// Appeals and verdicts: usage errors say which argument; the ledger
	// refuses an appeal of a job with no escrow, and the balance stays.
	j := strings.Repeat("ab", 32)
	before = balanceOf(t, home)
	expectFail(t, 2, "not a job ID", "ledger", "appeal", "abc", "--claim", "1", "--evidence", "bafy", "--home", home)
	expectFail(t, 2, "--evidence is required", "ledger", "appeal", j, "--claim", "1", "--home", home)
	expectFail(t, 2, "--claim must be more than 0", "ledger", "appeal", j, "--claim", "0", "--evidence", "bafy", "--home", home)
	expectFail(t, 1, "no open escrow for job", "ledger", "appeal", j, "--claim", "1", "--evidence", "bafy", "--home", home)
	expectFail(t, 2, "say --overturn or --uphold", "ledger", "verdict", j, other, "--home", home)
	expectFail(t, 2, "addresses look like dm1", "ledger", "verdict", j, "dm1nothing", "--uphold", "--home", home)
	expectFail(t, 1, "no open escrow for job", "ledger", "verdict", j, other, "--uphold", "--home", home)
	if after := balanceOf(t, home); after != before {
		t.Fatalf("refused appeals changed the balance: %d -> %d", before, after)
	}

	var rep struct {
		OK       bool     `json:"ok"`
		Height   int64    `json:"height"`
		Supply   uint64   `json:"supply"`
		Balances uint64   `json:"balances"`
		Escrowed uint64   `json:"escrowed"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ledger", "audit", "--json", "--home", home)), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Supply != 1100_000000 || rep.Balances != rep.Supply || rep.Escrowed != 0 || rep.Height < 2 || rep.Problems == nil {
		t.Fatalf("audit %+v", rep)
	}
	if out := mustRun(t, "ledger", "audit", "--home", home); !strings.Contains(out, "audit OK") || !strings.Contains(out, "genesis: "+filepath.Join(home, "genesis.json")) {
		t.Fatalf("audit: %s", out)
	}
	expectFail(t, 1, "ledger RPC listening", "ledger", "audit", "--rpc", "http://127.0.0.1:"+freePort(t))
}

// twoNodeProcesses starts node A, then node B bootstrapping from A.
func twoNodeProcesses(t *testing.T) (homeA string, nodeA *exec.Cmd, homeB string) {
	t.Helper()
	homeA = initHome(t)
	nodeA, _ = startNodeProcess(t, homeA)
	var stA struct {
		Addrs []string `json:"addrs"`
	}
	json.Unmarshal([]byte(mustRun(t, "status", "--json", "--home", homeA)), &stA)
	homeB = initHome(t, "--bootstrap", stA.Addrs[0])
	startNodeProcess(t, homeB)
	return homeA, nodeA, homeB
}

// TestDataCLI: a directory added on one node is fetched byte for byte by
// another over bitswap; bad input is refused; rm and gc free the space;
// pins survive a restart.
func TestDataCLI(t *testing.T) {
	homeA, nodeA, homeB := twoNodeProcesses(t)

	src := filepath.Join(t.TempDir(), "fashion")
	os.MkdirAll(filepath.Join(src, "train"), 0o755)
	big := make([]byte, 3<<20+17)
	rand.NewChaCha8([32]byte{1}).Read(big)
	os.WriteFile(filepath.Join(src, "train", "images.idx"), big, 0o644)
	os.WriteFile(filepath.Join(src, "README"), []byte("Fashion-MNIST, a subset\n"), 0o644)
	os.WriteFile(filepath.Join(src, "empty"), nil, 0o644)

	var added struct {
		CID  string `json:"cid"`
		Size int64  `json:"size"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "data", "add", src, "--json", "--home", homeA)), &added); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(added.CID, "bafy") || added.Size < int64(len(big)) {
		t.Fatalf("data add: %+v", added)
	}
	if out := mustRun(t, "data", "add", src, "--home", homeA); !strings.Contains(out, added.CID) {
		t.Fatalf("adding again gave another CID: %s", out)
	}

	out := filepath.Join(t.TempDir(), "got")
	var got struct {
		CID  string `json:"cid"`
		Path string `json:"path"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "data", "get", added.CID, "-o", out, "--json", "--home", homeB)), &got); err != nil {
		t.Fatal(err)
	}
	if got.Path != out {
		t.Fatalf("written to %q, want %q", got.Path, out)
	}
	for _, name := range []string{"train/images.idx", "README", "empty"} {
		want, _ := os.ReadFile(filepath.Join(src, name))
		have, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !bytes.Equal(want, have) {
			t.Fatalf("%s: %d bytes (%v), want %d identical", name, len(have), err, len(want))
		}
	}
	if ls := mustRun(t, "data", "ls", "--home", homeB); !strings.Contains(ls, added.CID) || !strings.Contains(ls, "pinned") {
		t.Fatalf("data ls on the fetcher: %s", ls)
	}

	expectFail(t, 2, "not a CID", "data", "get", "not-a-cid", "--home", homeB)
	expectFail(t, 2, "no such file", "data", "add", filepath.Join(src, "missing"), "--home", homeA)
	expectFail(t, 2, "wants PATH", "data", "add", "--home", homeA)
	expectFail(t, 1, "already exists", "data", "get", added.CID, "-o", out, "--home", homeB)
	expectFail(t, 1, "not pinned", "data", "rm", "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku", "--home", homeB)

	mustRun(t, "data", "rm", added.CID, "--home", homeB)
	var gc struct {
		RemovedBlocks int   `json:"removed_blocks"`
		RemovedBytes  int64 `json:"removed_bytes"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "data", "gc", "--json", "--home", homeB)), &gc); err != nil {
		t.Fatal(err)
	}
	if gc.RemovedBlocks < 4 || gc.RemovedBytes < int64(len(big)) {
		t.Fatalf("gc after rm: %+v", gc)
	}
	if ls := mustRun(t, "data", "ls", "--json", "--home", homeB); strings.TrimSpace(ls) != "[]" {
		t.Fatalf("data ls after rm: %s", ls)
	}

	// The adder's pin survives a restart.
	nodeA.Process.Signal(syscall.SIGTERM)
	nodeA.Wait()
	startNodeProcess(t, homeA)
	if ls := mustRun(t, "data", "ls", "--home", homeA); !strings.Contains(ls, added.CID) {
		t.Fatalf("pin lost over restart: %s", ls)
	}
}

// TestPricesAndQuoteCLI: a node lending itself prices and quotes on its
// own machine; a job that cannot fit gets a reason, not an error.
func TestPricesAndQuoteCLI(t *testing.T) {
	home := initHome(t)
	startNodeProcess(t, home)
	mustRun(t, "lend", "--home", home, "--cores", "1", "--mem", "1GiB")
	var pr struct {
		Subset   string `json:"subset"`
		Machines []struct {
			Machine string `json:"machine"`
			Unit    struct {
				Core uint64 `json:"core"`
			} `json:"unit"`
		} `json:"machines"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(pr.Machines) == 0 && time.Now().Before(deadline) {
		json.Unmarshal([]byte(mustRun(t, "prices", "--json", "--home", home)), &pr)
		time.Sleep(100 * time.Millisecond)
	}
	// 0.1 credit a core-hour at idle, times 1/0.9 for the risk of a lab
	// machine with no record yet.
	if pr.Subset != "all" || len(pr.Machines) != 1 || pr.Machines[0].Unit.Core != 111112 {
		t.Fatalf("prices: %+v", pr)
	}
	if out := mustRun(t, "prices", "--home", home); !strings.Contains(out, "market (1 machines") {
		t.Fatalf("prices table: %s", out)
	}
	if out := mustRun(t, "quote", "--workers", "1", "--cores", "1", "--mem", "512MiB", "--duration", "2h", "--home", home); !strings.Contains(out, "credits in all") {
		t.Fatalf("quote: %s", out)
	}
	if out := mustRun(t, "quote", "--workers", "3", "--cores", "1", "--mem", "256MiB", "--home", home); !strings.Contains(out, "no quote") || !strings.Contains(out, "1 of the 3 workers") {
		t.Fatalf("quote of 3 workers on 1 core: %s", out)
	}
	expectFail(t, 2, "--mem", "quote", "--mem", "lots", "--home", home)
}

// TestDataGetInterruptedResumes: Ctrl-C during `data get` keeps what was
// fetched (listed as partial), and the next get finishes the job.
func TestDataGetInterruptedResumes(t *testing.T) {
	homeA, _, homeB := twoNodeProcesses(t)

	src := filepath.Join(t.TempDir(), "big.bin")
	f, _ := os.Create(src)
	rng := rand.NewChaCha8([32]byte{7})
	buf := make([]byte, 1<<20)
	for range 384 {
		rng.Read(buf)
		f.Write(buf)
	}
	f.Close()
	var added struct {
		CID string `json:"cid"`
	}
	json.Unmarshal([]byte(mustRun(t, "data", "add", src, "--json", "--home", homeA)), &added)

	out := filepath.Join(t.TempDir(), "got.bin")
	get := exec.Command(bin, "data", "get", added.CID, "-o", out, "--home", homeB)
	get.Env = append(os.Environ(), "DEEPMARKET_HOME=")
	var stderr bytes.Buffer
	get.Stderr = &stderr
	if err := get.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	get.Process.Signal(os.Interrupt)
	if err := get.Wait(); err == nil {
		t.Skip("the get finished before it could be interrupted")
	}
	if !strings.Contains(stderr.String(), "resumes") {
		t.Errorf("interrupted get said %q; want it to say a new get resumes", stderr.String())
	}
	var pins []struct {
		CID     string `json:"cid"`
		Partial bool   `json:"partial"`
	}
	json.Unmarshal([]byte(mustRun(t, "data", "ls", "--json", "--home", homeB)), &pins)
	if len(pins) != 1 || !pins[0].Partial {
		t.Fatalf("after the interrupt: %+v, want one partial", pins)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("an interrupted get left a file at -o")
	}
	mustRun(t, "data", "get", added.CID, "-o", out, "--home", homeB)
	want, _ := os.ReadFile(src)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatal("the resumed get differs")
	}
}

func TestSimCLI(t *testing.T) {
	dir := t.TempDir()
	out := mustRun(t, "sim", "--scenario", "edge", "--loads", "0.4", "--seeds", "1", "--policies", "round-robin,kube-default", "--out", dir)
	for _, want := range []string{"edge (reserved model, 1 seeds)", "marginal-cost", "round-robin", "kube-default"} {
		if !strings.Contains(out, want) {
			t.Errorf("sim output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"sim.md", "sim.json", "edge-slowdown.svg"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	// A drawn trace, written and replayed.
	trace := filepath.Join(dir, "ws.json")
	mustRun(t, "sim", "--scenario", "workstations", "--load", "0.5", "--seed", "3", "--write-trace", trace)
	var reps []struct {
		Experiment string `json:"experiment"`
		Rows       []struct {
			Policy       string  `json:"policy"`
			MeanSlowdown float64 `json:"mean_slowdown"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "sim", "--trace", trace, "--policies", "mosix", "--json")), &reps); err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 || len(reps[0].Rows) != 2 || reps[0].Rows[1].Policy != "mosix" || reps[0].Rows[0].MeanSlowdown < 1 {
		t.Errorf("replayed trace: %+v", reps)
	}
	expectFail(t, 2, "no such policy", "sim", "--policies", "fastest")
	expectFail(t, 2, "--loads", "sim", "--loads", "x")
	expectFail(t, 2, "--scenario", "sim", "--scenario", "cloud")
	expectFail(t, 1, "no such file", "sim", "--trace", filepath.Join(dir, "missing.json"))
}

func TestSubmitSpecErrors(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "train.py"), []byte("print(1)\n"), 0o644)
	write := func(body string) string {
		p := filepath.Join(dir, "job.toml")
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	base := `name = "t"
command = ["python3", "train.py"]
bundle = "."
workers = 2
cores = 1
memory = "1GiB"
max_price = "1"
max_duration = "10m"
`
	expectFail(t, 2, "workers: 0", "submit", write(strings.Replace(base, "workers = 2", "workers = 0", 1)))
	expectFail(t, 2, "reaches outside the bundle", "submit", write(strings.Replace(base, `"train.py"]`, `"../x.py"]`, 1)))
	expectFail(t, 2, "unknown key", "submit", write(base+"gpu_model = \"a100\"\n"))
	expectFail(t, 2, "one job spec file", "submit")
	// A valid spec needs a node to go further.
	home := filepath.Join(t.TempDir(), "nohome")
	r := run(t, "submit", write(base), "--home", home, "--yes")
	if r.code == 0 || r.code == 2 {
		t.Errorf("submit without a node: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestSubmitWaitsInTheQueueCLI: a node lending one core; jobs of two
// one-core workers cannot run on it. submit says the job waits in the
// queue, why and where; jobs and jobs show keep saying so; cancel takes
// it out at no cost.
func TestSubmitWaitsInTheQueueCLI(t *testing.T) {
	home := initHome(t)
	startNodeProcess(t, home)
	mustRun(t, "lend", "--home", home, "--cores", "1", "--mem", "1GiB")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "job.py"), []byte("print(1)\n"), 0o644)
	spec := filepath.Join(dir, "job.toml")
	os.WriteFile(spec, []byte(`name = "two"
framework = "generic"
command = ["python3", "job.py"]
bundle = "."
workers = 2
cores = 1
memory = "256MiB"
max_price = "1"
max_duration = "10m"
`), 0o644)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(mustRun(t, "offers", "--home", home), "1") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	out := mustRun(t, "submit", spec, "--yes", "--home", home)
	if !strings.Contains(out, "(waiting)") || !strings.Contains(out, "waits in this node's queue, position 1") ||
		!strings.Contains(out, "no machine can take the job now") || !strings.Contains(out, "nothing is paid while it waits") {
		t.Fatalf("submit of a job that cannot run now:\n%s", out)
	}
	var sub struct {
		ID    string `json:"job_id"`
		State string `json:"state"`
		Queue struct {
			Position int    `json:"position"`
			Why      string `json:"why"`
		} `json:"queue"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "submit", spec, "--yes", "--json", "--home", home)), &sub); err != nil ||
		sub.State != "waiting" || sub.Queue.Position != 2 || sub.Queue.Why == "" {
		t.Fatalf("submit --json of a second such job: %+v %v", sub, err)
	}
	if out := mustRun(t, "jobs", "--home", home); !strings.Contains(out, "waiting (#1)") || !strings.Contains(out, "waiting (#2)") {
		t.Fatalf("jobs:\n%s", out)
	}
	if out := mustRun(t, "jobs", "show", sub.ID, "--home", home); !strings.Contains(out, "in the queue since") || !strings.Contains(out, "position 2") {
		t.Fatalf("jobs show:\n%s", out)
	}
	if out := mustRun(t, "cancel", sub.ID, "--home", home); !strings.Contains(out, "cancelled; cost 0 credits") || !strings.Contains(out, "nothing was paid") {
		t.Fatalf("cancel of a waiting job:\n%s", out)
	}
	if out := mustRun(t, "jobs", "--home", home); !strings.Contains(out, "waiting (#1)") || strings.Contains(out, "waiting (#2)") {
		t.Fatalf("jobs after the cancel:\n%s", out)
	}
	// One worker fits, but not at a millionth of a credit: it waits for
	// prices to fall, and says what running it now would cost.
	cheap := filepath.Join(dir, "cheap.toml")
	body, _ := os.ReadFile(spec)
	os.WriteFile(cheap, []byte(strings.NewReplacer("workers = 2", "workers = 1", `max_price = "1"`, `max_price = "0.000001"`).Replace(string(body))), 0o644)
	out = mustRun(t, "submit", cheap, "--yes", "--home", home)
	if !strings.Contains(out, "waits in this node's queue") || !strings.Contains(out, "it would run now for") ||
		!strings.Contains(out, "its max price is 0.000001") {
		t.Fatalf("submit of a job priced below the market:\n%s", out)
	}
}
