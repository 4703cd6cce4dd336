package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckReadOnly: a read-only path never unmasks the host, by its name
// or through a link, nor holds a private path such as the node's home.
func TestCheckReadOnly(t *testing.T) {
	for _, p := range []string{"/opt/deepmarket/venv", "/usr", "/usr/local", "/usr/lib/python3", "/home/alice/venv", "/srv/models", "/var/cache/venv"} {
		if err := CheckReadOnly(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	for p, want := range map[string]string{
		"/":                 "/ would expose the whole host",
		"/proc":             "the host's processes",
		"/proc/self/root":   "the host's processes",
		"/dev":              "devices",
		"/run/user/1000":    "sockets",
		"/var/run":          "sockets",
		"/tmp/venv":         "scratch",
		"/var/tmp":          "scratch",
		"/etc":              "secrets",
		"/etc/ssh":          "secrets",
		"/root/venv":        "root's home",
		"/home":             "every user's home",
		"/home/alice":       "a user's whole home",
		"/var":              "/var would expose",
		"/var/lib/postgres": "services' data",
		"/opt":              "add-on",
		"relative/venv":     "not an absolute path",
	} {
		err := CheckReadOnly(p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error about %q", p, err, want)
		}
	}
	if err := CheckReadOnly("/srv/deepmarket", "/srv/deepmarket/home"); err == nil || !strings.Contains(err.Error(), "/srv/deepmarket/home") {
		t.Errorf("a path holding the node's home: %v", err)
	}
	if err := CheckReadOnly("/srv/deepmarket/home/venv", "/srv/deepmarket/home"); err != nil {
		t.Errorf("a venv inside the node's home (which stays hidden): %v", err)
	}
	// A harmless name that leads to the host's root.
	dir, err := os.MkdirTemp(".", "readonly-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	abs, _ := filepath.Abs(dir)
	link := filepath.Join(abs, "venv")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	err = CheckReadOnly(link)
	if err == nil || CheckReadOnly(abs) == nil && !strings.Contains(err.Error(), "whole host") {
		t.Errorf("a link to /: %v", err)
	}
}

func TestIDRange(t *testing.T) {
	r, err := ParseIDRange(DefaultIDRange)
	if err != nil || r != DefaultIDs || r.Len() != 1000 {
		t.Fatalf("default: %v %v", r, err)
	}
	for _, bad := range []string{"", "70000", "abc-def", "0-999", "500-2000", "70999-70000", "60000-70000", "1000-2000000", "2147483000-2147483648"} {
		if _, err := ParseIDRange(bad); err == nil {
			t.Errorf("ParseIDRange(%q) accepted it", bad)
		}
	}
	passwd := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(passwd, []byte("root:x:0:0::/root:/bin/sh\nbob:x:70005:70005::/home/bob:/bin/sh\n"), 0o644)
	if name, id, err := firstInRange(passwd, DefaultIDs); name != "bob" || id != 70005 || err != nil {
		t.Errorf("firstInRange = %q %d %v, want bob's 70005", name, id, err)
	}
	if name, _, _ := firstInRange(passwd, IDRange{First: 71000, Last: 71999}); name != "" {
		t.Errorf("firstInRange found %q in a free range", name)
	}
}

// TestCheckRootOnly: a work area under a dir another user owns, or one
// others may write to without the sticky bit, is refused.
func TestCheckRootOnly(t *testing.T) {
	needRoot(t)
	base := filepath.Dir(jobDir(t)) // 0755 root, in /tmp (1777, sticky)
	if err := CheckRootOnly(base); err != nil {
		t.Errorf("a root dir under /tmp: %v", err)
	}
	theirs := filepath.Join(base, "theirs")
	os.Mkdir(theirs, 0o755)
	os.Chown(theirs, 4242, 4242)
	os.Mkdir(filepath.Join(theirs, "work"), 0o711)
	if err := CheckRootOnly(filepath.Join(theirs, "work")); err == nil || !strings.Contains(err.Error(), "uid 4242") {
		t.Errorf("under another user's dir: %v", err)
	}
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	os.Mkdir(filepath.Join(open, "work"), 0o711)
	if err := CheckRootOnly(filepath.Join(open, "work")); err == nil || !strings.Contains(err.Error(), "others may write") {
		t.Errorf("under a world-writable dir without the sticky bit: %v", err)
	}
	link := filepath.Join(base, "link")
	os.Symlink(filepath.Join(theirs, "work"), link)
	if err := CheckRootOnly(link); err == nil {
		t.Error("through a link into another user's dir: accepted")
	}
}
