package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sync"

	rpclocal "github.com/cometbft/cometbft/rpc/client/local"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
)

// source hands out the transactions of independent streams. A stream's
// transactions must be sent in order (a ledger account's nonces); each
// stream is driven by one worker only, so next needs no locking.
type source interface {
	streams() int
	next(stream int) []byte // nil: the stream is exhausted
	unread(stream int)      // the last tx next gave was not sent: give it again
	// resync restarts a stream whose tx was refused for its nonce from the
	// nonce the chain has committed; false if it cannot.
	resync(ctx context.Context, cl *rpclocal.Local, stream int) bool
	reset() // start over (for a new chain)
}

// ledgerSource is pre-signed transfers: stream i is account i's
// transactions, nonce 0, 1, 2, ... Signing is the clients' work, not the
// ledger's, so it happens before any chain starts.
type ledgerSource struct {
	accounts []*identity.Key
	txs      [][][]byte
	pos      []int
	bytes    int64
	count    int64
}

const genesisBalance = 1_000_000_000_000

func ledgerAccounts(n int) []*identity.Key {
	keys := make([]*identity.Key, n)
	for i := range keys {
		keys[i] = seedKey(fmt.Sprintf("bench-account-%d", i))
	}
	return keys
}

// genesisOf funds every account.
func genesisOf(accounts []*identity.Key) ledger.GenesisState {
	var g ledger.GenesisState
	for _, k := range accounts {
		g.Balances = append(g.Balances, ledger.GenesisBalance{Address: string(k.Address()), Amount: genesisBalance})
	}
	return g
}

// save writes the signed transactions (so that each case's process need
// not sign them again): per account, a count then length-prefixed txs.
func (s *ledgerSource) save(path string) error {
	var b []byte
	for _, seq := range s.txs {
		b = binary.AppendUvarint(b, uint64(len(seq)))
		for _, tx := range seq {
			b = binary.AppendUvarint(b, uint64(len(tx)))
			b = append(b, tx...)
		}
	}
	return os.WriteFile(path, b, 0o600)
}

func loadLedgerSource(path string, n int) (*ledgerSource, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := &ledgerSource{accounts: ledgerAccounts(n), txs: make([][][]byte, n), pos: make([]int, n)}
	for i := range s.txs {
		count, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, fmt.Errorf("%s: truncated", path)
		}
		b = b[k:]
		s.txs[i] = make([][]byte, count)
		for j := range s.txs[i] {
			l, k := binary.Uvarint(b)
			if k <= 0 || uint64(len(b)-k) < l {
				return nil, fmt.Errorf("%s: truncated", path)
			}
			s.txs[i][j] = b[k : k+int(l) : k+int(l)]
			b = b[k+int(l):]
			s.bytes += int64(l)
			s.count++
		}
	}
	return s, nil
}

// newLedgerSource signs total transfers spread over n accounts: account i
// pays 1 credit to account i+1 (mod n) with each of its nonces.
func newLedgerSource(n, total int) *ledgerSource {
	s := &ledgerSource{accounts: ledgerAccounts(n), txs: make([][][]byte, n), pos: make([]int, n)}
	per := (total + n - 1) / n
	var wg sync.WaitGroup
	work := make(chan int, n)
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				to := string(s.accounts[(i+1)%n].Address())
				seq := make([][]byte, per)
				for nonce := range seq {
					tx, err := ledger.NewTx(s.accounts[i], chainID, ledger.TypeTransfer, uint64(nonce), &ledger.Transfer{To: to, Amount: 1})
					if err != nil {
						panic(err)
					}
					seq[nonce] = tx
				}
				s.txs[i] = seq
			}
		}()
	}
	wg.Wait()
	for _, seq := range s.txs {
		for _, tx := range seq {
			s.bytes += int64(len(tx))
			s.count++
		}
	}
	return s
}

func (s *ledgerSource) meanSize() float64 { return float64(s.bytes) / float64(s.count) }
func (s *ledgerSource) streams() int      { return len(s.txs) }
func (s *ledgerSource) reset()            { clear(s.pos) }

func (s *ledgerSource) unread(i int) { s.pos[i]-- }

func (s *ledgerSource) resync(ctx context.Context, cl *rpclocal.Local, i int) bool {
	q, err := cl.ABCIQuery(ctx, "/account/"+string(s.accounts[i].Address()), nil)
	if err != nil || q.Response.Code != 0 {
		return false
	}
	var a ledger.Account
	if err := json.Unmarshal(q.Response.Value, &a); err != nil || a.Nonce > uint64(len(s.txs[i])) {
		return false
	}
	s.pos[i] = int(a.Nonce)
	return true
}

func (s *ledgerSource) next(i int) []byte {
	if s.pos[i] >= len(s.txs[i]) {
		return nil
	}
	tx := s.txs[i][s.pos[i]]
	s.pos[i]++
	return tx
}

// kvSource makes kvstore's "key=value" transactions of a fixed size on
// demand (formatting one costs far less than a microsecond): the key is
// unique in the run, the value pads the transaction to size.
type kvSource struct {
	size int
	seq  []int
}

func newKVSource(streams, size int) *kvSource {
	return &kvSource{size: size, seq: make([]int, streams)}
}

func (s *kvSource) streams() int { return len(s.seq) }
func (s *kvSource) reset()       { clear(s.seq) }

func (s *kvSource) unread(i int) { s.seq[i]-- }

func (s *kvSource) resync(context.Context, *rpclocal.Local, int) bool { return false }

func (s *kvSource) next(i int) []byte {
	tx := make([]byte, 0, s.size)
	tx = fmt.Appendf(tx, "k%04x%010x=", i, s.seq[i])
	s.seq[i]++
	for len(tx) < s.size {
		tx = append(tx, 'v')
	}
	return tx
}
