package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/boxo/bitswap"
	bsnet "github.com/ipfs/boxo/bitswap/network/bsnet"
	"github.com/ipfs/boxo/blockservice"
	"github.com/ipfs/boxo/blockstore"
	"github.com/ipfs/boxo/ipld/merkledag"
	uio "github.com/ipfs/boxo/ipld/unixfs/io"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	ds "github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mh "github.com/multiformats/go-multihash"
)

// testNode is a store attached to a real libp2p host on loopback.
type testNode struct {
	*Store
	host host.Host
	dir  string
}

func newHost(t *testing.T) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func openNode(t *testing.T, dir string, opts Options) *testNode {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	h := newHost(t)
	s.Attach(h, nil)
	t.Cleanup(func() { s.Close() })
	return &testNode{Store: s, host: h, dir: dir}
}

func connect(t *testing.T, a, b host.Host) {
	t.Helper()
	if err := a.Connect(t.Context(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

func randomFile(t *testing.T, path string, size int) []byte {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// sameTree fails unless the two trees hold the same names, kinds and bytes.
func sameTree(t *testing.T, want, got string) {
	t.Helper()
	count := 0
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		other := filepath.Join(got, rel)
		fi, err := os.Lstat(other)
		if err != nil {
			t.Errorf("missing %s: %v", rel, err)
			return nil
		}
		count++
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(other)
			if a != b || fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("symlink %s: %q, got %q", rel, a, b)
			}
		case d.IsDir():
			if !fi.IsDir() {
				t.Errorf("%s: not a directory", rel)
			}
		default:
			a, _ := os.ReadFile(p)
			b, _ := os.ReadFile(other)
			if !bytes.Equal(a, b) {
				t.Errorf("%s: %d bytes differ from the %d added", rel, len(b), len(a))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing extra on the other side either.
	extra := 0
	filepath.WalkDir(got, func(string, fs.DirEntry, error) error { extra++; return nil })
	if extra != count {
		t.Errorf("got %d entries, want %d", extra, count)
	}
}

func rawCID(data []byte) cid.Cid {
	h, _ := mh.Sum(data, mh.SHA2_256, -1)
	return cid.NewCidV1(cid.Raw, h)
}

func TestAddGetBetweenPeers(t *testing.T) {
	a := openNode(t, "", Options{})
	b := openNode(t, "", Options{})
	connect(t, b.host, a.host)
	src := t.TempDir()

	empty := filepath.Join(src, "empty.bin")
	randomFile(t, empty, 0)
	one := filepath.Join(src, "one.bin")
	oneByte := randomFile(t, one, 1)
	big := filepath.Join(src, "big.bin")
	randomFile(t, big, 5<<20+12345)
	tree := filepath.Join(src, "tree")
	randomFile(t, filepath.Join(tree, "train", "images.idx"), 3<<20+7)
	randomFile(t, filepath.Join(tree, "train", "labels.idx"), 60000)
	randomFile(t, filepath.Join(tree, "deep", "a", "b", "c", ".hidden"), 10)
	randomFile(t, filepath.Join(tree, "zero"), 0)
	os.MkdirAll(filepath.Join(tree, "empty-dir"), 0o755)
	os.Symlink("train/labels.idx", filepath.Join(tree, "labels"))

	for _, tc := range []struct {
		name, path string
		want       cid.Cid // the CID kubo gives, where it is easy to know
	}{
		{"0-byte file", empty, rawCID(nil)},
		{"1-byte file", one, rawCID(oneByte)},
		{"multi-MiB file", big, cid.Undef},
		{"nested tree", tree, cid.Undef},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var last Progress
			p, err := a.Add(t.Context(), tc.path, func(pr Progress) { last = pr })
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.Defined() && !p.CID.Equals(tc.want) {
				t.Errorf("CID %s, want %s (as `ipfs add --cid-version=1 --raw-leaves`)", p.CID, tc.want)
			}
			if p.CID.Version() != 1 {
				t.Errorf("CID %s is not CIDv1", p.CID)
			}
			if last.Done != last.Total {
				t.Errorf("add progress ended at %d of %d", last.Done, last.Total)
			}
			out := filepath.Join(t.TempDir(), "out")
			path, got, err := b.Get(t.Context(), p.CID, out, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Size != p.Size || got.Partial {
				t.Errorf("fetched pin %+v, added %+v", got, p)
			}
			if tc.path == tree {
				sameTree(t, tree, path)
			} else {
				want, _ := os.ReadFile(tc.path)
				have, err := os.ReadFile(path)
				if err != nil || !bytes.Equal(want, have) {
					t.Fatalf("got %d bytes (%v), want %d identical bytes", len(have), err, len(want))
				}
			}
			// Fetching again is a local no-op and writing to the
			// same place is refused rather than clobbering.
			if _, _, err := b.Get(t.Context(), p.CID, out, nil); err == nil || !strings.Contains(err.Error(), "already exists") {
				t.Errorf("second get into %s: %v, want 'already exists'", out, err)
			}
		})
	}
}

// tamperingBlockstore answers every read with the right CID but wrong bytes.
type tamperingBlockstore struct{ blockstore.Blockstore }

func (t tamperingBlockstore) Get(ctx context.Context, c cid.Cid) (blocks.Block, error) {
	b, err := t.Blockstore.Get(ctx, c)
	if err != nil {
		return nil, err
	}
	bad := append([]byte(nil), b.RawData()...)
	if len(bad) == 0 {
		bad = []byte{0}
	}
	bad[0] ^= 0xff
	return blocks.NewBlockWithCid(bad, c)
}

func TestTamperedPeerIsIgnored(t *testing.T) {
	honest := openNode(t, "", Options{})
	src := filepath.Join(t.TempDir(), "data.bin")
	data := randomFile(t, src, 6<<20)
	p, err := honest.Add(t.Context(), src, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The liar holds the same blocks but serves them altered.
	liarStore, err := Open(t.TempDir(), Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer liarStore.Close()
	if _, err := liarStore.Add(t.Context(), src, nil); err != nil {
		t.Fatal(err)
	}
	liarHost := newHost(t)
	liar := bitswap.New(t.Context(), bsnet.NewFromIpfsHost(liarHost), nil,
		tamperingBlockstore{liarStore.Blockstore()})
	defer liar.Close()

	// The fetcher knows only the liar at first, so the liar is asked;
	// the honest peer turns up once the liar has answered.
	fetcher := openNode(t, "", Options{})
	connect(t, fetcher.host, liarHost)
	out := filepath.Join(t.TempDir(), "out.bin")
	done := make(chan error, 1)
	go func() {
		_, _, err := fetcher.Get(t.Context(), p.CID, out, nil)
		done <- err
	}()
	var st *bitswap.Stat
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st, _ = liar.Stat(); st.BlocksSent > 0 {
			break
		}
	}
	if st.BlocksSent == 0 {
		t.Fatal("the liar was never asked, so the test proves nothing")
	}
	connect(t, fetcher.host, honest.host)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if !bytes.Equal(got, data) {
		t.Fatal("fetched bytes differ from the honest peer's")
	}
	st, _ = liar.Stat()
	t.Logf("liar sent %d tampered blocks; all were rejected", st.BlocksSent)
}

// corruptOnDisk flips bytes of c where they lie on disk (in its pack
// file, or inline in its badger entry), behind the blockstore's back.
func corruptOnDisk(t *testing.T, s *Store, c cid.Cid) {
	t.Helper()
	e, err := s.ds.Get(t.Context(), blockKey(c))
	if err != nil {
		t.Fatal(err)
	}
	inline, ptr, packed, err := decodeEntry(e)
	if err != nil {
		t.Fatal(err)
	}
	if !packed {
		bad := append([]byte{entryInline}, inline...)
		bad[len(bad)-1] ^= 0xff
		if err := s.ds.Put(t.Context(), blockKey(c), bad); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.OpenFile(s.packs.packPath(ptr.pack), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("bit rot"), ptr.offset+int64(ptr.length)/2); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptBlockOnDiskIsRefetchedNeverServed(t *testing.T) {
	a := openNode(t, "", Options{})
	b := openNode(t, "", Options{StallTimeout: 2 * time.Second})
	src := filepath.Join(t.TempDir(), "data.bin")
	data := randomFile(t, src, 3<<20)
	p, err := a.Add(t.Context(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	connect(t, b.host, a.host)
	if _, err := b.Fetch(t.Context(), p.CID, nil); err != nil {
		t.Fatal(err)
	}
	leaf := firstLeaf(t, b.Store, p.CID)
	corruptOnDisk(t, b.Store, leaf)

	// With the only good copy gone, a third node asking b gets nothing.
	a.host.Close()
	c := openNode(t, "", Options{StallTimeout: 2 * time.Second})
	connect(t, c.host, b.host)
	_, err = c.Fetch(t.Context(), p.CID, nil)
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("fetch from the node with a corrupt block: %v, want ErrStalled", err)
	}
	if has, _ := c.Has(t.Context(), leaf); has {
		t.Fatal("the corrupt block was served and stored")
	}
	if has, _ := b.Has(t.Context(), leaf); has {
		t.Fatal("the corrupt block was not dropped when read")
	}

	// A new honest provider: b's get repairs itself.
	a2 := openNode(t, "", Options{})
	if _, err := a2.Add(t.Context(), src, nil); err != nil {
		t.Fatal(err)
	}
	connect(t, b.host, a2.host)
	out := filepath.Join(t.TempDir(), "out.bin")
	if _, _, err := b.Get(t.Context(), p.CID, out, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("repaired file differs")
	}
}

func firstLeaf(t *testing.T, s *Store, root cid.Cid) cid.Cid {
	t.Helper()
	nd, err := s.offlineDAG().Get(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	if len(nd.Links()) == 0 {
		t.Fatal("root has no links")
	}
	return nd.Links()[0].Cid
}

func TestProviderLossMidTransfer(t *testing.T) {
	src := filepath.Join(t.TempDir(), "data.bin")
	data := randomFile(t, src, 48<<20)
	first := openNode(t, "", Options{})
	p, err := first.Add(t.Context(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	second := openNode(t, "", Options{})
	if _, err := second.Add(t.Context(), src, nil); err != nil {
		t.Fatal(err)
	}

	t.Run("another provider takes over", func(t *testing.T) {
		b := openNode(t, "", Options{Window: 1, StallTimeout: 20 * time.Second})
		connect(t, b.host, first.host)
		handedOver := false
		_, _, err := b.Get(t.Context(), p.CID, filepath.Join(t.TempDir(), "out"), func(pr Progress) {
			if !handedOver && pr.Done > pr.Total/4 {
				handedOver = true
				first.host.Close()              // the only provider goes away...
				connect(t, b.host, second.host) // ...and another is found
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if !handedOver {
			t.Fatal("the transfer finished before the provider left")
		}
	})

	t.Run("no provider: bounded failure, then resume", func(t *testing.T) {
		leaving := openNode(t, "", Options{})
		if _, err := leaving.Add(t.Context(), src, nil); err != nil {
			t.Fatal(err)
		}
		b := openNode(t, "", Options{Window: 4 << 20, StallTimeout: 2 * time.Second})
		connect(t, b.host, leaving.host)
		gone := false
		start := time.Now()
		_, err := b.Fetch(t.Context(), p.CID, func(pr Progress) {
			if !gone && pr.Done > pr.Total/3 {
				gone = true
				leaving.host.Close()
			}
		})
		if !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), "resumes") {
			t.Fatalf("got %v, want ErrStalled saying it resumes", err)
		}
		t.Logf("failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
		pins, _ := b.Pins(t.Context())
		if len(pins) != 1 || !pins[0].Partial {
			t.Fatalf("pins after the failed fetch: %+v, want one partial", pins)
		}
		if r, err := b.GC(t.Context()); err != nil || r.Kept < 10 {
			t.Fatalf("GC after a partial fetch kept %d blocks (%v); it must keep them", r.Kept, err)
		}

		// Resume from a new provider: it sends only what is missing.
		fresh := openNode(t, "", Options{})
		if _, err := fresh.Add(t.Context(), src, nil); err != nil {
			t.Fatal(err)
		}
		connect(t, b.host, fresh.host)
		out := filepath.Join(t.TempDir(), "out.bin")
		if _, _, err := b.Get(t.Context(), p.CID, out, nil); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
			t.Fatal("resumed file differs")
		}
		ex := fresh.exch.Load().Interface.(*bitswap.Bitswap)
		st, _ := ex.Stat()
		if st.DataSent >= uint64(len(data))*9/10 {
			t.Fatalf("the resumed fetch moved %d of %d bytes: it did not resume", st.DataSent, len(data))
		}
		t.Logf("resumed fetch moved %d of %d bytes", st.DataSent, len(data))
	})
}

func TestRestartAndGC(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	kept := filepath.Join(src, "kept")
	randomFile(t, filepath.Join(kept, "a.bin"), 2<<20+1)
	shared := randomFile(t, filepath.Join(kept, "shared.bin"), 1<<20)
	dropped := filepath.Join(src, "dropped")
	randomFile(t, filepath.Join(dropped, "b.bin"), 3<<20)
	os.WriteFile(filepath.Join(dropped, "shared.bin"), shared, 0o644)

	pk, err := s.Add(t.Context(), kept, nil)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := s.Add(t.Context(), dropped, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart keeps pinned data.
	s, err = Open(dir, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pins, err := s.Pins(t.Context())
	if err != nil || len(pins) != 2 {
		t.Fatalf("pins after restart: %v %v", pins, err)
	}
	out := filepath.Join(t.TempDir(), "kept")
	if _, err := s.Export(t.Context(), pk.CID, out); err != nil {
		t.Fatal(err)
	}
	sameTree(t, kept, out)

	// GC with everything pinned removes nothing.
	if r, err := s.GC(t.Context()); err != nil || r.Removed != 0 {
		t.Fatalf("GC with all pinned removed %d (%v)", r.Removed, err)
	}
	if err := s.Unpin(t.Context(), pd.CID); err != nil {
		t.Fatal(err)
	}
	if err := s.Unpin(t.Context(), pd.CID); !errors.Is(err, ErrNotPinned) {
		t.Fatalf("second unpin: %v, want ErrNotPinned", err)
	}
	r, err := s.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// b.bin's 3 leaves, its file node and the directory go; shared.bin's
	// leaf stays.
	if r.Removed != 5 || r.RemovedBytes < 3<<20 {
		t.Fatalf("GC removed %d blocks, %d bytes; want 5 blocks, >= 3 MiB", r.Removed, r.RemovedBytes)
	}
	if has, _ := s.Has(t.Context(), pd.CID); has {
		t.Fatal("unpinned root survived GC")
	}
	if has, _ := s.Has(t.Context(), rawCID(shared)); !has {
		t.Fatal("GC removed a block a pin still uses")
	}
	out2 := filepath.Join(t.TempDir(), "kept")
	if _, err := s.Export(t.Context(), pk.CID, out2); err != nil {
		t.Fatalf("pinned data after GC: %v", err)
	}
	sameTree(t, kept, out2)
}

func TestAddRejectsBadInput(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Add(t.Context(), filepath.Join(t.TempDir(), "nope"), nil); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("add of a missing path: %v", err)
	}
	if pins, _ := s.Pins(t.Context()); len(pins) != 0 {
		t.Fatalf("a failed add left pins: %v", pins)
	}
	// An offline store with nothing cannot fetch; it stalls, clearly.
	s2, _ := Open(t.TempDir(), Options{Logger: testLogger(t), StallTimeout: time.Second})
	defer s2.Close()
	if _, err := s2.Fetch(t.Context(), rawCID([]byte("x")), nil); err == nil {
		t.Fatal("offline fetch of a missing block succeeded")
	}
}

// TestFetchIntoAndCancel is the executor's use: lay a dataset out in a
// job directory; a cancelled fetch stops, keeps its blocks and resumes.
func TestFetchIntoAndCancel(t *testing.T) {
	a := openNode(t, "", Options{})
	b := openNode(t, "", Options{Window: 1 << 20})
	connect(t, b.host, a.host)
	src := filepath.Join(t.TempDir(), "ds")
	randomFile(t, filepath.Join(src, "train.bin"), 24<<20)
	randomFile(t, filepath.Join(src, "sub", "test.bin"), 1000)
	p, err := a.Add(t.Context(), src, nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	job := filepath.Join(t.TempDir(), "job", "data")
	_, err = b.FetchInto(ctx, p.CID, job, func(pr Progress) {
		if pr.Done > pr.Total/4 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fetch: %v, want context.Canceled", err)
	}
	if _, err := os.Stat(job); err == nil {
		t.Fatal("a cancelled fetch wrote into the job directory")
	}
	if pins, _ := b.Pins(t.Context()); len(pins) != 1 || !pins[0].Partial {
		t.Fatalf("pins after cancel: %+v", pins)
	}

	os.MkdirAll(job, 0o755)
	if _, err := b.FetchInto(t.Context(), p.CID, job, nil); err != nil {
		t.Fatal(err)
	}
	sameTree(t, src, job)
	if _, err := b.FetchInto(t.Context(), p.CID, job, nil); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("fetching into a full directory: %v", err)
	}
}

// TestTornPackAfterCrash: a pack that lost its tail (a crash before the
// data reached the disk) reads back as missing blocks, not wrong ones,
// and a fetch gets them again.
func TestTornPackAfterCrash(t *testing.T) {
	a := openNode(t, "", Options{})
	src := filepath.Join(t.TempDir(), "f.bin")
	data := randomFile(t, src, 4<<20)
	p, err := a.Add(t.Context(), src, nil)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	b, err := Open(dir, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Add(t.Context(), src, nil); err != nil {
		t.Fatal(err)
	}
	b.Close()
	packs, _ := filepath.Glob(filepath.Join(dir, "packs", "*.pack"))
	if len(packs) != 1 {
		t.Fatalf("packs: %v", packs)
	}
	fi, _ := os.Stat(packs[0])
	if err := os.Truncate(packs[0], fi.Size()/2); err != nil {
		t.Fatal(err)
	}

	reopened := openNode(t, dir, Options{})
	out := filepath.Join(t.TempDir(), "out")
	if _, err := reopened.Export(t.Context(), p.CID, out); err == nil {
		t.Fatal("export of a torn pack succeeded")
	}
	connect(t, reopened.host, a.host)
	if _, _, err := reopened.Get(t.Context(), p.CID, out, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("repaired file differs")
	}
}

// TestProvidersThroughDHT: beyond the peers it is connected to, a fetcher
// finds a provider through the DHT, where the provider announced what it
// pinned.
func TestProvidersThroughDHT(t *testing.T) {
	hA, hB, hC := newHost(t), newHost(t), newHost(t)
	connect(t, hA, hC)
	connect(t, hB, hC)
	// B is a DHT client (a lab machine behind a NAT, say): A's announce
	// goes to C only, so A and B meet only through the provider record.
	newDHT := func(h host.Host, mode dht.ModeOpt) *dht.IpfsDHT {
		d, err := dht.New(h, dht.Mode(mode), dht.ProtocolPrefix("/deepmarket-test"), dht.DisableAutoRefresh())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	dA, dB, dC := newDHT(hA, dht.ModeServer), newDHT(hB, dht.ModeClient), newDHT(hC, dht.ModeServer)
	connect(t, hA, hC) // again, now that the DHTs are up to see it
	connect(t, hB, hC)
	waitFor(t, func() bool { return dA.RoutingTable().Size() > 0 && dB.RoutingTable().Size() > 0 })
	hB.Network().ClosePeer(hA.ID())

	a, err := Open(t.TempDir(), Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.Attach(hA, dA)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go a.Run(ctx)
	src := filepath.Join(t.TempDir(), "d.bin")
	data := randomFile(t, src, 2<<20)
	p, err := a.Add(t.Context(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The add announced the root: C, the only other DHT server A knows,
	// holds the provider record.
	waitFor(t, func() bool {
		provs, _ := dC.ProviderStore().GetProviders(t.Context(), p.CID.Hash())
		return len(provs) > 0
	})

	b, err := Open(t.TempDir(), Options{Logger: testLogger(t), StallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Attach(hB, dB)
	if hB.Network().Connectedness(hA.ID()) == network.Connected {
		t.Fatal("B is already connected to A; the test would not need the DHT")
	}
	out := filepath.Join(t.TempDir(), "out.bin")
	if _, _, err := b.Get(t.Context(), p.CID, out, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("fetched bytes differ")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached in 10 s")
}

// TestStockBitswapClientFetches: a plain boxo bitswap client (what kubo
// runs) gets our blocks, the empty file's block included.
func TestStockBitswapClientFetches(t *testing.T) {
	a := openNode(t, "", Options{})
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "empty"), 0)
	data := randomFile(t, filepath.Join(src, "big"), 2<<20+5)
	p, err := a.Add(t.Context(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHost(t)
	bs := blockstore.NewBlockstore(dssync.MutexWrap(ds.NewMapDatastore()))
	client := bitswap.New(t.Context(), bsnet.NewFromIpfsHost(h), nil, bs, bitswap.WithServerEnabled(false))
	defer client.Close()
	connect(t, h, a.host)
	dag := merkledag.NewDAGService(blockservice.New(bs, client))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	root, err := dag.Get(ctx, p.CID)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := uio.NewDirectoryFromNode(dag, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"empty", "big"} {
		nd, err := dir.Find(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := uio.NewDagReader(ctx, nd, dag)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := map[string][]byte{"empty": {}, "big": data}[name]; !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, want %d", name, len(got), len(want))
		}
	}
}
