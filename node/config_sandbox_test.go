package node

import (
	"strings"
	"testing"
)

// TestConfigCannotWidenTheSandbox: an interpreter whose prefix would be
// bound into every job must not unmask the host, and the error names the
// key and says what to do; the job uid range must be usable.
func TestConfigCannotWidenTheSandbox(t *testing.T) {
	base := DefaultConfig()
	base.Node.ChainID = "test"
	for py, want := range map[string]string{
		"python3":                          "",
		"/opt/deepmarket/venv/bin/python3": "",
		"/usr/bin/python3":                 "",
		"/bin/python3":                     `[inventory] python = "/bin/python3": its prefix / would expose the whole host; point it at a virtualenv such as /opt/deepmarket/venv/bin/python3`,
		"/tmp/venv/bin/python3":            "scratch",
		"/run/venv/bin/python3":            "sockets",
		"/home/alice/bin/python3":          "a user's whole home",
		"/root/venv/bin/python3":           "root's home",
		"/proc/self/root/bin/python3":      "the host's processes",
		"venv/bin/python3":                 "absolute path",
	} {
		c := base
		c.Inventory.Python = py
		err := c.Validate()
		switch {
		case want == "" && err != nil:
			t.Errorf("python = %q: %v", py, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "[inventory] python")):
			t.Errorf("python = %q: %v, want an error naming [inventory] python about %q", py, err, want)
		}
	}
	for _, r := range []string{"0-100", "60000-70000", "x"} {
		c := base
		c.Executor.UIDRange = r
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "[executor] uid_range") {
			t.Errorf("uid_range = %q: %v", r, err)
		}
	}
	c := base
	c.Executor.KeepLogs.Duration = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "[executor] keep_logs") {
		t.Errorf("keep_logs = 0: %v", err)
	}
	for _, size := range []string{"", "1KiB", "lots"} {
		c := base
		c.Executor.ImageCache = size
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "[executor] image_cache") {
			t.Errorf("image_cache = %q: %v", size, err)
		}
	}
}
