package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/deepmarket/deepmarket/node/inventory"
)

// Cache keeps unpacked images on a lender, keyed by manifest digest, so
// that an image is unpacked once for every job that runs in it. What it
// holds stays within its bound (file bytes): the least recently used
// images that no worker is using are evicted to make room, and an image
// bigger than the whole bound is refused. It counts against its disk too:
// it never leaves less than DiskReserve free there (evicting when the
// workers' files fill the disk), and an image is unpacked only within
// what is free beyond the reserve. Each image is a directory
// "<hex>.rootfs" beside a "<hex>.json" of its size and last use, so a
// restarted node finds what it unpacked.
type Cache struct {
	dir string
	max int64
	lim Limits
	// free is the bytes free on the cache's filesystem (statfs): the
	// cache never leaves less than DiskReserve free, evicting instead, so
	// it gives way to the workers' files on the same disk.
	free func() int64

	mu     sync.Mutex
	images map[string]*cached // by manifest digest's hex
}

type cached struct {
	Bytes int64     `json:"bytes"`
	Used  time.Time `json:"used"`
	// CIDs are the content addresses of the layouts the image came in
	// (the last maxCIDs): a launch naming one takes the root without
	// fetching the layout again. A CID names the layout's every byte, its
	// manifest with them, so it names this image alone.
	CIDs []string `json:"cids,omitempty"`
	// Env is what the image's config sets (Env).
	Env   []string `json:"env,omitempty"`
	inUse int
}

// maxCIDs bounds the layout CIDs remembered per image.
const maxCIDs = 8

// OpenCache opens (making it if need be) the cache in dir, bounded at max
// bytes; each image is unpacked within lim (and within max).
func OpenCache(dir string, max int64, lim Limits) (*Cache, error) {
	// A job's uid passes through it to its image's root, and lists nothing.
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	c := &Cache{dir: dir, max: max, lim: lim, images: map[string]*cached{}, free: func() int64 { return int64(min(inventory.DiskFree(dir), math.MaxInt64/2)) }}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		n := e.Name()
		switch {
		case strings.HasSuffix(n, ".json"):
			hex := strings.TrimSuffix(n, ".json")
			var m cached
			b, err := os.ReadFile(filepath.Join(dir, n))
			if err == nil {
				err = json.Unmarshal(b, &m)
			}
			if _, serr := os.Stat(filepath.Join(dir, hex+".rootfs")); err != nil || serr != nil {
				c.remove(hex) // half of an image: a crash between its two halves
				continue
			}
			c.images[hex] = &m
		case strings.HasPrefix(n, "."): // an unpack a crash interrupted
			os.RemoveAll(filepath.Join(dir, n))
		}
	}
	for _, e := range entries {
		if hex, ok := strings.CutSuffix(e.Name(), ".rootfs"); ok && c.images[hex] == nil {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return c, nil
}

// Root returns the root filesystem of img, which came in the layout of
// CID from ("" if none), unpacking it first when the cache does not hold
// it, and a release to call once the worker using it is done: until then
// it is not evicted.
func (c *Cache) Root(img v1.Image, from string) (Rootfs, func(), error) {
	d, err := img.Digest()
	if err != nil {
		return Rootfs{}, nil, fmt.Errorf("the image's manifest: %w", err)
	}
	env, err := Env(img)
	if err != nil {
		return Rootfs{}, nil, err
	}
	hex := d.Hex
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.images[hex]
	if m == nil {
		c.evictLocked() // the disk may have filled since the last image
		lim := c.lim
		lim.Bytes = min(lim.Bytes, c.max, max(c.free()-DiskReserve, 0))
		st, err := Unpack(img, filepath.Join(c.dir, hex+".rootfs"), lim)
		if err != nil {
			return Rootfs{}, nil, err
		}
		m = &cached{Bytes: st.Bytes}
		c.images[hex] = m
	}
	m.Env = env
	if from != "" && !slices.Contains(m.CIDs, from) {
		cids := append(m.CIDs, from)
		m.CIDs = cids[max(0, len(cids)-maxCIDs):]
	}
	return c.takeLocked(hex, m)
}

// RootOf is Root for an image the cache holds, named by the CID of a
// layout it came in: false when it holds none, and the layout must be
// fetched.
func (c *Cache) RootOf(from string) (Rootfs, func(), bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for hex, m := range c.images {
		if slices.Contains(m.CIDs, from) {
			root, release, err := c.takeLocked(hex, m)
			return root, release, err == nil, err
		}
	}
	return Rootfs{}, nil, false, nil
}

// Sources lists the layout CIDs of the images the cache holds, the most
// recently used image's first, at most n: what this machine's offer says
// it can start at once.
func (c *Cache) Sources(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	hexes := make([]string, 0, len(c.images))
	for hex, m := range c.images {
		if len(m.CIDs) > 0 {
			hexes = append(hexes, hex)
		}
	}
	slices.SortFunc(hexes, func(a, b string) int { return c.images[b].Used.Compare(c.images[a].Used) })
	var out []string
	for _, hex := range hexes {
		cids := c.images[hex].CIDs
		for i := len(cids) - 1; i >= 0 && len(out) < n; i-- {
			out = append(out, cids[i])
		}
	}
	return out
}

// takeLocked marks image hex used and in use, and returns its root and
// its release; c.mu must be held.
func (c *Cache) takeLocked(hex string, m *cached) (Rootfs, func(), error) {
	m.Used = time.Now()
	m.inUse++
	if err := c.save(hex, m); err != nil {
		m.inUse--
		return Rootfs{}, nil, err
	}
	c.evictLocked()
	var once sync.Once
	release := func() {
		once.Do(func() {
			c.mu.Lock()
			m.inUse--
			c.evictLocked()
			c.mu.Unlock()
		})
	}
	return Rootfs{Dir: filepath.Join(c.dir, hex+".rootfs"), Env: slices.Clone(m.Env)}, release, nil
}

// Size is the file bytes the cache holds.
func (c *Cache) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sizeLocked()
}

func (c *Cache) sizeLocked() int64 {
	var n int64
	for _, m := range c.images {
		n += m.Bytes
	}
	return n
}

// DiskReserve is what the cache leaves free on its disk.
const DiskReserve = 2 << 30

// boundLocked is what the cache may hold now: its bound, less what the
// disk lacks of DiskReserve free; c.mu must be held.
func (c *Cache) boundLocked(size int64) int64 {
	return min(c.max, size+c.free()-DiskReserve)
}

// evictLocked removes the least recently used images not in use until
// the cache is within its bound, and leaves DiskReserve free on its disk
// if it can; c.mu must be held.
func (c *Cache) evictLocked() {
	size := c.sizeLocked()
	bound := c.boundLocked(size)
	if size <= bound {
		return
	}
	var idle []string
	for hex, m := range c.images {
		if m.inUse == 0 {
			idle = append(idle, hex)
		}
	}
	slices.SortFunc(idle, func(a, b string) int { return c.images[a].Used.Compare(c.images[b].Used) })
	for _, hex := range idle {
		if size <= bound {
			return
		}
		size -= c.images[hex].Bytes // and the disk has as much more free: bound stays
		delete(c.images, hex)
		c.remove(hex)
	}
}

// save writes hex's record.
func (c *Cache) save(hex string, m *cached) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := filepath.Join(c.dir, "."+hex+".json")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.dir, hex+".json"))
}

// remove deletes hex's record first, then its files: a crash in between
// leaves files without a record, which OpenCache removes.
func (c *Cache) remove(hex string) {
	err := os.Remove(filepath.Join(c.dir, hex+".json"))
	if err == nil || errors.Is(err, os.ErrNotExist) {
		os.RemoveAll(filepath.Join(c.dir, hex+".rootfs"))
	}
}
