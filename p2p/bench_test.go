package p2p

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
)

// BenchmarkValidateOffer measures the full validation path of one signed
// offer from one of 1000 signers (make bench-p2p reports it on one core).
func BenchmarkValidateOffer(b *testing.B) {
	const signers = 1000
	keys := make([]*identity.Key, signers)
	ids := make([]peer.ID, signers)
	for i := range keys {
		keys[i] = testKey(b, byte(i))
		ids[i] = keys[i].PeerID()
	}
	exp := time.Now().Add(time.Hour)
	data := make([][]byte, b.N)
	for i := range data {
		k := keys[i%signers]
		data[i] = seal(b, k, testChain, TypeOffer, testOffer(k), uint64(i+1), exp)
	}
	v := NewValidator(testChain, nil)
	topic := OffersTopic(testChain)
	now := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := v.Validate(topic, data[i], ids[i%signers], now); err != nil {
			b.Fatal(err)
		}
	}
}
