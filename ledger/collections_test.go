package ledger

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	idb "github.com/cosmos/iavl/db"
)

// TestCollectionsCoverTheState: each exported map of the State is made by
// exactly one entry of collections, so none is left out of the store, the
// app hash, the books or the full check; the prefixes and names are each
// the table's own.
func TestCollectionsCoverTheState(t *testing.T) {
	stateMaps := map[string]bool{}
	st := reflect.TypeFor[State]()
	for i := range st.NumField() {
		if f := st.Field(i); f.IsExported() && f.Type.Kind() == reflect.Map {
			stateMaps[f.Name] = true
		}
	}
	made := map[string]string{}
	prefixes, names := map[string]bool{}, map[string]bool{}
	for _, c := range collections {
		if prefixes[c.prefix] || names[c.name] || c.prefix == keyMeta || strings.HasPrefix(keyMeta, c.prefix) {
			t.Errorf("collection %s (%q): its prefix or name is another's, or the meta key's", c.name, c.prefix)
		}
		prefixes[c.prefix], names[c.name] = true, true
		var s State
		c.init(&s)
		v := reflect.ValueOf(s)
		var fields []string
		for name := range stateMaps {
			if !v.FieldByName(name).IsNil() {
				fields = append(fields, name)
			}
		}
		if len(fields) != 1 {
			t.Errorf("collection %s makes the maps %v, want one", c.name, fields)
			continue
		}
		if by, dup := made[fields[0]]; dup {
			t.Errorf("State.%s is the map of both %s and %s", fields[0], by, c.name)
		}
		made[fields[0]] = c.name
	}
	for name := range stateMaps {
		if _, ok := made[name]; !ok {
			t.Errorf("State.%s is in no collection: add it to collections", name)
		}
	}
}

// TestEveryCollectionIsInTheAppHash: each collection's entries are leaves
// of the store, so an entry more in any of them moves the app hash (what
// the audit compares after every block it replays) and App.Verify (the
// audit's last check) finds a state that differs from its store. Every
// collection survives a reopen (the store's leaves decode back into the
// same entries), and an entry added to a clone is not in the state it was
// cloned from.
func TestEveryCollectionIsInTheAppHash(t *testing.T) {
	h, _ := pinnedChain(t)
	st := h.app.Snapshot()
	loaded, err := h.app.store.load()
	if err != nil {
		t.Fatal(err)
	}
	base := hashOfAll(t, st)
	for _, c := range collections {
		t.Run(c.name, func(t *testing.T) {
			leaves := leavesOf(st, c)
			if len(leaves) == 0 {
				t.Fatalf("pinnedChain leaves no %s: add one (and pin the new app hash)", c.name)
			}
			if got := leavesOf(loaded, c); !equalLeaves(got, leaves) {
				t.Fatalf("reopened, the store gives %d entries, the state has %d (or they differ)", len(got), len(leaves))
			}
			key := slices.Sorted(maps.Keys(leaves))[0]
			leaf, _ := h.app.store.tree.Get([]byte(c.prefix + key))
			if !bytes.Equal(leaf, leaves[key]) {
				t.Fatalf("the store's %s%s is %x, the state's %x", c.prefix, key, leaf, leaves[key])
			}

			more := st.clone()
			if err := c.decode(more, key+"0", leaves[key]); err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(hashOfAll(t, more), base) {
				t.Fatalf("a %s more leaves the app hash as it was", c.name)
			}
			want := fmt.Sprintf("state's %q is not in the store", c.prefix+key+"0")
			if problems := h.app.store.verify(more); !slices.Contains(problems, want) {
				t.Fatalf("verify of a state with a %s more: %v", c.name, problems)
			}
			if !equalLeaves(leavesOf(st, c), leaves) {
				t.Fatal("an entry added to a clone is in the state it was cloned from")
			}
		})
	}
}

// hashOfAll is the app hash of s written whole into a new store.
func hashOfAll(t *testing.T, s *State) []byte {
	t.Helper()
	store, err := openStore(idb.NewMemDB(), false)
	if err != nil {
		t.Fatal(err)
	}
	s = s.clone()
	s.markAllDirty()
	if _, err := store.write(s); err != nil { // the books start from s's: their problems do not matter here
		t.Fatal(err)
	}
	return store.workingHash()
}

// leavesOf is what the store should hold of c's entries in s.
func leavesOf(s *State, c collection) map[string][]byte {
	out := map[string][]byte{}
	for k := range c.keys(s) {
		if v, ok := s.encode(c.prefix + k); ok {
			out[k] = v
		}
	}
	return out
}

func equalLeaves(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
