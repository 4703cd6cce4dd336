package lender

import (
	"encoding/json"
	"sort"
	"strings"
	"sync"
)

// memStore is the node store's contract (JSON documents by key) in
// memory: the node's badger store lives in package node, which this
// package must not import.
type memStore struct {
	mu   sync.Mutex
	docs map[string][]byte
}

func newMemStore() *memStore { return &memStore{docs: map[string][]byte{}} }

var _ Store = (*memStore)(nil)

func (s *memStore) Get(key string, v any) (bool, error) {
	s.mu.Lock()
	doc, ok := s.docs[key]
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal(doc, v)
}

func (s *memStore) Put(key string, v any) error {
	doc, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.docs[key] = doc
	s.mu.Unlock()
	return nil
}

func (s *memStore) Delete(key string) error {
	s.mu.Lock()
	delete(s.docs, key)
	s.mu.Unlock()
	return nil
}

func (s *memStore) Each(prefix string, fn func(key string, doc []byte) error) error {
	s.mu.Lock()
	var keys []string
	for k := range s.docs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	docs := make([][]byte, len(keys))
	for i, k := range keys {
		docs[i] = s.docs[k]
	}
	s.mu.Unlock()
	for i, k := range keys {
		if err := fn(k, docs[i]); err != nil {
			return err
		}
	}
	return nil
}
