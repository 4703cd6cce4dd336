package web

import (
	"io/fs"
	"path"
	"regexp"
	"strings"
	"testing"
)

var (
	htmlRefRE = regexp.MustCompile(`(?:src|href)="(/assets/[^"]+)"`)
	importRE  = regexp.MustCompile(`(?m)^\s*import\s+(?:[^"']*\s+from\s+)?["']([^"']+)["']`)
)

// TestEveryReferenceResolves: what the documents load and what each
// module imports is in the embedded tree (a missing file is a blank page).
func TestEveryReferenceResolves(t *testing.T) {
	fsys := FS()
	for _, doc := range []string{"index.html", "login.html"} {
		b, err := fs.ReadFile(fsys, doc)
		if err != nil {
			t.Fatal(err)
		}
		refs := htmlRefRE.FindAllStringSubmatch(string(b), -1)
		if len(refs) == 0 {
			t.Errorf("%s loads nothing", doc)
		}
		for _, m := range refs {
			if _, err := fs.Stat(fsys, strings.TrimPrefix(m[1], "/")); err != nil {
				t.Errorf("%s loads %s: %v", doc, m[1], err)
			}
		}
	}
	modules := 0
	err := fs.WalkDir(fsys, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".js" {
			return err
		}
		modules++
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		for _, m := range importRE.FindAllStringSubmatch(string(b), -1) {
			if !strings.HasPrefix(m[1], "./") && !strings.HasPrefix(m[1], "../") {
				t.Errorf("%s imports %q: only the dashboard's own modules (no CDN, no bare names)", p, m[1])
				continue
			}
			if _, err := fs.Stat(fsys, path.Join(path.Dir(p), m[1])); err != nil {
				t.Errorf("%s imports %s: %v", p, m[1], err)
			}
		}
		if strings.Contains(string(b), ".innerHTML") {
			t.Errorf("%s uses innerHTML: build DOM with dom.js (peers' text must stay text)", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if modules < 10 {
		t.Errorf("only %d modules", modules)
	}
}

// TestNothingLoadsFromElsewhere: no page or style names another origin.
func TestNothingLoadsFromElsewhere(t *testing.T) {
	err := fs.WalkDir(FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(FS(), p)
		if err != nil {
			return err
		}
		for _, bad := range []string{`src="http`, `href="http`, `url(http`, `from "http`, `import("http`} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s loads from another origin (%s)", p, bad)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
