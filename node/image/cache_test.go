package image

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCacheStaysWithinItsBound: many images through a cache bounded at
// three of them: each is unpacked once and found again; the cache never
// holds more than its bound; the least recently used image goes first,
// one in use never; an image bigger than the whole bound is refused and
// leaves nothing; a reopened cache finds what it held, and drops what a
// crash left half-written.
func TestCacheStaysWithinItsBound(t *testing.T) {
	const size = 1000
	dir := filepath.Join(t.TempDir(), "images")
	c, err := OpenCache(dir, 3*size, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	imgs := make([]string, 6)
	for i := range imgs {
		imgs[i] = imageOf(t, layerOf(t, file("data", fmt.Sprintf("%d%s", i, strings.Repeat("x", size-1)), 0o644)))
	}
	root := func(i int) (string, func()) {
		t.Helper()
		img, err := Open(imgs[i])
		if err != nil {
			t.Fatal(err)
		}
		r, release, err := c.Root(img, fmt.Sprint("layout-", i))
		if err != nil {
			t.Fatalf("image %d: %v", i, err)
		}
		p := r.Dir
		if b, err := os.ReadFile(filepath.Join(p, "data")); err != nil || b[0] != byte('0'+i) {
			t.Fatalf("image %d's root: %q %v", i, b[:1], err)
		}
		return p, release
	}
	held := func() int {
		n, _ := filepath.Glob(filepath.Join(dir, "*.rootfs"))
		return len(n)
	}
	p0, release0 := root(0) // in use throughout
	for i := 1; i < len(imgs); i++ {
		_, release := root(i)
		release()
		if c.Size() > 3*size || held() > 3 {
			t.Fatalf("after image %d: %d bytes in %d images, bound %d", i, c.Size(), held(), 3*size)
		}
	}
	if _, err := os.Stat(p0); err != nil {
		t.Errorf("the image in use was evicted: %v", err)
	}
	// 4 and 5 are the most recently used besides 0: 5 is found again,
	// not unpacked anew (same directory, same inode).
	p5, release5 := root(5)
	fi1, _ := os.Stat(filepath.Join(p5, "data"))
	release5()
	p5b, release := root(5)
	release()
	if fi2, _ := os.Stat(filepath.Join(p5b, "data")); p5b != p5 || !os.SameFile(fi1, fi2) {
		t.Error("image 5 was unpacked again")
	}
	// Found by the CID of the layout it came in, without the layout; a
	// CID it did not come in finds nothing.
	if r, release, ok, err := c.RootOf("layout-5"); err != nil || !ok || r.Dir != p5 {
		t.Errorf("image 5 by its layout's CID: %q %v %v", r.Dir, ok, err)
	} else {
		release()
	}
	if _, _, ok, _ := c.RootOf("layout-1"); ok {
		t.Error("an evicted image was found by its layout's CID")
	}
	for _, gone := range []int{1, 2, 3} {
		img, _ := Open(imgs[gone])
		d, _ := img.Digest()
		if _, err := os.Stat(filepath.Join(dir, d.Hex+".rootfs")); !os.IsNotExist(err) {
			t.Errorf("image %d, least recently used, is still held: %v", gone, err)
		}
	}
	// What the machine's offer lists: the layouts of what it holds, the
	// most recently used first, as many as asked.
	if got := c.Sources(16); !slices.Equal(got, []string{"layout-5", "layout-4", "layout-0"}) {
		t.Errorf("the cache lists %q, want layout-5, layout-4, layout-0", got)
	}
	if got := c.Sources(2); !slices.Equal(got, []string{"layout-5", "layout-4"}) {
		t.Errorf("the cache lists %q when asked for 2", got)
	}
	release0()

	// Bigger than the whole bound: refused, nothing left.
	big, _ := Open(imageOf(t, layerOf(t, file("data", strings.Repeat("y", 4*size), 0o644))))
	if _, _, err := c.Root(big, ""); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an image bigger than the cache: %v", err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".*")); len(leftovers) != 0 {
		t.Errorf("the refused image left %v", leftovers)
	}

	// Reopened after a crash that left a record without files and an
	// unfinished unpack: both go, the rest is found.
	before := held()
	os.WriteFile(filepath.Join(dir, strings.Repeat("a", 64)+".json"), []byte(`{"bytes":5}`), 0o600)
	os.MkdirAll(filepath.Join(dir, ".x.rootfs.unpacking-1"), 0o700)
	c2, err := OpenCache(dir, 3*size, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if held() != before || c2.Size() != int64(before)*size {
		t.Errorf("reopened: %d images, %d bytes; want %d images of %d bytes", held(), c2.Size(), before, size)
	}
	if junk, _ := filepath.Glob(filepath.Join(dir, ".*")); len(junk) != 0 {
		t.Errorf("reopened, the crash's leftovers remain: %v", junk)
	}
	if _, err := os.Stat(filepath.Join(dir, strings.Repeat("a", 64)+".json")); !os.IsNotExist(err) {
		t.Errorf("a record without its files stayed: %v", err)
	}
}

// TestCacheGivesWayOnAFullDisk: the cache counts against its disk: when
// the workers' files leave less than DiskReserve free, idle images go,
// least recently used first, though the cache is within its own bound;
// and an image is unpacked only within what the disk has beyond the
// reserve.
func TestCacheGivesWayOnAFullDisk(t *testing.T) {
	const size = 1000
	dir := filepath.Join(t.TempDir(), "images")
	c, err := OpenCache(dir, 1<<30, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	// A disk of the reserve and 13 images' worth, shared with the
	// workers' files (c.free is called with c.mu held).
	var workers int64
	c.free = func() int64 { return DiskReserve + 13*size - workers - c.sizeLocked() }
	var imgs []string
	for i := range 3 {
		imgs = append(imgs, imageOf(t, layerOf(t, file("data", fmt.Sprintf("%d%s", i, strings.Repeat("x", size-1)), 0o644))))
		img, _ := Open(imgs[i])
		_, release, err := c.Root(img, fmt.Sprint("layout-", i))
		if err != nil {
			t.Fatalf("image %d: %v", i, err)
		}
		release()
	}
	if got := c.Sources(8); len(got) != 3 {
		t.Fatalf("with room on the disk the cache holds %q", got)
	}
	// The workers' files leave 1.5 images' worth less than the reserve
	// free: the cache may hold at most 1500 of its 3000 bytes, so the
	// two least recently used images go.
	workers = 11*size + size/2
	img, _ := Open(imgs[2])
	_, release, err := c.Root(img, "layout-2") // any use re-checks
	if err != nil {
		t.Fatal(err)
	}
	release()
	if got := c.Sources(8); !slices.Equal(got, []string{"layout-2"}) || c.Size() != size {
		t.Errorf("on a full disk the cache holds %q (%d bytes), want layout-2 alone", got, c.Size())
	}
	// No room beyond the reserve: a new image is refused, not unpacked
	// into it.
	big, _ := Open(imageOf(t, layerOf(t, file("data", strings.Repeat("y", 4*size), 0o644))))
	if _, _, err := c.Root(big, ""); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an image on a disk with no room: %v", err)
	}
}
