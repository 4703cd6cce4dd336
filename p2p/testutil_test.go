package p2p

import (
	"bytes"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
)

const testChain = "deepmarket-test"

func testKey(t testing.TB, b byte) *identity.Key {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{b}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func testOffer(k *identity.Key) *Offer {
	return &Offer{
		Machine: k.PeerID().String(), Owner: string(k.Address()), Moniker: "pc-1", Site: "lab-a",
		Lent:  Resources{Cores: 4, MemBytes: 8 << 30},
		Price: Prices{CoreHour: 100_000, MemGiBHour: 20_000},
		Addrs: []string{"/ip4/127.0.0.1/tcp/7701"}, Software: Software{OS: "linux", Arch: "amd64", Version: "test"},
	}
}

func testBid(k *identity.Key) *Bid {
	return &Bid{
		JobID: "ab" + string(bytes.Repeat([]byte("0"), 62)), Submitter: string(k.Address()), Workers: 2,
		PerWorker: Resources{Cores: 1, MemBytes: 1 << 30}, MaxPrice: 5_000_000, Duration: 600, Framework: "tensorflow",
	}
}

func seal(t testing.TB, k *identity.Key, chain, typ string, payload any, seq uint64, exp time.Time) []byte {
	t.Helper()
	b, err := Seal(k, chain, typ, payload, seq, exp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
