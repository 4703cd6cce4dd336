package quoter

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// exhaustive is the market without its index: every placement is
// scheduler.Quote over a view built for the bid, as before the index.
type exhaustive struct{ *market.Market }

func (m exhaustive) Indexed(now time.Time, framework string) (*scheduler.Index, scheduler.View, []p2p.Offer) {
	v, offers := m.View(now, framework)
	return nil, v, offers
}

// BenchmarkAnswerBid answers the same bids with the market's index and
// exhaustively, side by side, over books of 1,000 and 10,000 offers
// with varied prices, loads and sites; every machine grants its hold.
// It reports each one's bids answered per second and their ratio
// (indexed / exhaustive), and each one's median bid. The indexed mean
// includes a rebuild of the index each second of the run (indexMaxAge),
// which the median leaves out.
func BenchmarkAnswerBid(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("offers=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			now := time.Now()
			book := market.NewOfferBook(n, n)
			for i := range n {
				id := newPeerID(b)
				cores := uint32(2 << r.IntN(5))
				o := &p2p.Offer{Machine: id.String(), Owner: fmt.Sprintf("owner%d", i%50), Site: fmt.Sprintf("site%d", r.IntN(40)),
					Lent:      p2p.Resources{Cores: cores, MemBytes: uint64(cores) << 31},
					Allocated: p2p.Resources{Cores: uint32(r.IntN(int(cores))), MemBytes: uint64(r.IntN(int(cores))) << 30},
					Price:     p2p.Prices{CoreHour: uint64(50_000 + r.IntN(400_000)), MemGiBHour: uint64(5_000 + r.IntN(40_000))}}
				if !book.Apply(&p2p.Received{Signer: id, Seq: 1, Expiry: now.Add(time.Hour), Offer: o}, now) {
					b.Fatal("the book refused an offer")
				}
			}
			mk := market.New(market.Params{Book: book, Subset: market.SubsetAll})
			granted := ReserveFunc(func(context.Context, peer.ID, []string, p2p.Reserve) (p2p.ReserveReply, error) {
				return p2p.ReserveReply{OK: true, Expires: time.Now().Add(holdTTL).UnixMilli()}, nil
			})
			quoter := func(m Market) *Quoter {
				return New(Params{Self: newPeerID(b), Market: m, Holds: granted,
					Quotes: SendFunc(func(context.Context, peer.ID, p2p.Quote) error { return nil }), Logger: slog.New(slog.DiscardHandler)})
			}
			indexed, exh := quoter(mk), quoter(exhaustive{mk})
			bid := func(i int) bidWork {
				return bidWork{bidder: newPeerID(b), bid: p2p.Bid{JobID: fmt.Sprintf("job%d", i), Workers: 4,
					PerWorker: p2p.Resources{Cores: 2, MemBytes: 4 << 30}, MaxPrice: 100_000_000, Duration: 3600, Framework: "generic"}}
			}
			answer := func(q *Quoter, w bidWork) (p2p.Quote, time.Duration) {
				start := time.Now()
				quote, _ := q.answerBid(b.Context(), w)
				d := time.Since(start)
				if len(quote.Workers) != 4 {
					b.Fatalf("no quote: %s", quote.Reason)
				}
				return quote, d
			}
			// Both quote the same: the book does not change.
			same := func(a, c p2p.Quote) {
				if a.PerHour != c.PerHour || a.Total != c.Total {
					b.Fatalf("indexed %+v, exhaustive %+v", a, c)
				}
				for w := range a.Workers {
					if a.Workers[w].Machine != c.Workers[w].Machine || a.Workers[w].PerHour != c.Workers[w].PerHour {
						b.Fatalf("indexed %+v, exhaustive %+v", a.Workers, c.Workers)
					}
				}
			}
			answer(indexed, bid(-1)) // builds the first index
			answer(exh, bid(-1))
			var inIndexed, inExhaustive time.Duration
			indexedEach, exhaustiveEach := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				w := bid(i)
				qi, di := answer(indexed, w)
				qe, de := answer(exh, w)
				same(qi, qe)
				inIndexed += di
				inExhaustive += de
				indexedEach, exhaustiveEach = append(indexedEach, di), append(exhaustiveEach, de)
			}
			median := func(ds []time.Duration) float64 {
				slices.Sort(ds)
				return float64(ds[len(ds)/2]) / float64(time.Microsecond)
			}
			b.ReportMetric(float64(b.N)/inIndexed.Seconds(), "indexed-bids/s")
			b.ReportMetric(float64(b.N)/inExhaustive.Seconds(), "exhaustive-bids/s")
			b.ReportMetric(inExhaustive.Seconds()/inIndexed.Seconds(), "indexed/exhaustive")
			b.ReportMetric(median(indexedEach), "indexed-p50-µs")
			b.ReportMetric(median(exhaustiveEach), "exhaustive-p50-µs")
		})
	}
}
