package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	badger "github.com/dgraph-io/badger/v4"
)

// ErrLocked means another process holds the node store.
var ErrLocked = errors.New("node store is in use by another process")

// Store is the node's durable state on badger: small JSON documents under
// string keys (lend settings now; jobs and receipts later).
type Store struct{ db *badger.DB }

// OpenStore opens (creating) the store in dir. Badger is tuned small: the
// node store holds kilobytes, and a lab machine must not feel the node.
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
		WithNumLevelZeroTablesStall(4).
		WithBlockCacheSize(4 << 20).
		WithIndexCacheSize(2 << 20).
		WithValueThreshold(64 << 10).
		WithValueLogFileSize(16 << 20).
		WithNumCompactors(2)
	db, err := badger.Open(opts)
	if err != nil {
		if strings.Contains(err.Error(), "Cannot acquire directory lock") {
			return nil, fmt.Errorf("%w (%s): is another `deepmarket node run` using this home?", ErrLocked, dir)
		}
		return nil, fmt.Errorf("open node store %s: %w", dir, err)
	}
	return &Store{db: db}, nil
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

// Delete removes key.
func (s *Store) Delete(key string) error {
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete([]byte(key)) }); err != nil {
		return fmt.Errorf("store delete %s: %w", key, err)
	}
	return nil
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
