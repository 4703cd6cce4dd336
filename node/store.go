package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/deepmarket/deepmarket/internal/badgerlock"
)

// ErrLocked means another process holds the node store.
var ErrLocked = errors.New("node store is in use by another process")

// Store is the node's durable state on badger: small JSON documents under
// string keys (lend settings now; jobs and receipts later).
type Store struct{ db *badger.DB }

// OpenStore opens (creating) the store in dir. Badger is tuned small: the
// node store holds kilobytes to megabytes, and a lab machine must not feel
// the node. In particular badger's background compactors wake every 50 ms
// each, which alone costs about half a percent of an idle core; the store
// runs none and compacts in Run's occasional maintenance instead.
func OpenStore(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open node store: %w", err)
	}
	opts := badger.DefaultOptions(dir).
		WithLogger(badgerLogger{log}).
		WithSyncWrites(true).
		WithMemTableSize(4 << 20).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(16).
		WithBlockCacheSize(4 << 20).
		WithIndexCacheSize(2 << 20).
		WithValueThreshold(64 << 10).
		WithValueLogFileSize(16 << 20).
		WithNumCompactors(0)
	db, err := badgerlock.Open(func() (*badger.DB, error) { return badger.Open(opts) })
	if err != nil {
		if badgerlock.Locked(err) {
			return nil, fmt.Errorf("%w (%s): is another `deepmarket node run` using this home?", ErrLocked, dir)
		}
		return nil, fmt.Errorf("open node store %s: %w", dir, err)
	}
	// A process killed leaves its memtable, which the next open flushes
	// into level 0; with no compactors, sixteen crashes without a
	// maintenance in between would stall the seventeenth open. Fold level 0
	// at every open.
	s := &Store{db: db}
	if err := s.Maintain(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Get decodes the document at key into v; found is false if there is none.
func (s *Store) Get(key string, v any) (found bool, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(key))
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error { return json.Unmarshal(b, v) })
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store get %s: %w", key, err)
	}
	return true, nil
}

// Put stores v at key, durably.
func (s *Store) Put(key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store put %s: %w", key, err)
	}
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(key), b) }); err != nil {
		return fmt.Errorf("store put %s: %w", key, err)
	}
	return nil
}

// Each calls fn with every key under prefix and its raw document, in key
// order; fn's error stops the scan and is returned.
func (s *Store) Each(prefix string, fn func(key string, doc []byte) error) error {
	return s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix), PrefetchValues: true, PrefetchSize: 16})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			b, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			if err := fn(string(it.Item().Key()), b); err != nil {
				return err
			}
		}
		return nil
	})
}

// Delete removes key.
func (s *Store) Delete(key string) error {
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete([]byte(key)) }); err != nil {
		return fmt.Errorf("store delete %s: %w", key, err)
	}
	return nil
}

// maintenanceEvery is how often Run compacts and collects the value log.
const maintenanceEvery = 5 * time.Minute

// Run does the store's maintenance every few minutes until ctx ends.
func (s *Store) Run(ctx context.Context) error {
	tick := time.NewTicker(maintenanceEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := s.Maintain(); err != nil {
				return err
			}
		}
	}
}

// Maintain compacts level 0 (written by memtable flushes) into the tree
// once it holds two tables, well before writes would stall at sixteen,
// and garbage-collects the value log.
func (s *Store) Maintain() error {
	levels := s.db.Levels()
	if len(levels) > 0 && levels[0].NumTables >= 2 {
		if err := s.db.Flatten(1); err != nil {
			return fmt.Errorf("compact node store: %w", err)
		}
	}
	for s.db.RunValueLogGC(0.5) == nil {
	}
	return nil
}

// level0Tables reports how many tables wait in level 0 (for tests).
func (s *Store) level0Tables() int {
	if l := s.db.Levels(); len(l) > 0 {
		return l[0].NumTables
	}
	return 0
}

// Close flushes and closes the store.
func (s *Store) Close() error { return s.db.Close() }

// badgerLogger routes badger's logs into slog; its info chatter is debug.
type badgerLogger struct{ log *slog.Logger }

func (l badgerLogger) Errorf(f string, a ...any) {
	l.log.Error(strings.TrimSpace(fmt.Sprintf(f, a...)))
}
func (l badgerLogger) Warningf(f string, a ...any) {
	l.log.Warn(strings.TrimSpace(fmt.Sprintf(f, a...)))
}
func (l badgerLogger) Infof(f string, a ...any) { l.log.Debug(strings.TrimSpace(fmt.Sprintf(f, a...))) }
func (l badgerLogger) Debugf(f string, a ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(f, a...)))
}
