package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestUICommand: `deepmarket ui` prints a login link to the running node's
// dashboard that works once; without a node it says how to start one.
func TestUICommand(t *testing.T) {
	home := initHome(t)
	expectFail(t, 1, "deepmarket node run", "ui", "--home", home)
	startNodeProcess(t, home)

	var link struct {
		URL       string `json:"url"`
		ExpiresAt string `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ui", "--json", "--home", home)), &link); err != nil || link.ExpiresAt == "" {
		t.Fatalf("ui --json: %+v %v", link, err)
	}
	if !strings.HasPrefix(link.URL, "http://127.0.0.1:") || !strings.Contains(link.URL, "/login?t=") {
		t.Fatalf("link %q", link.URL)
	}
	get := func(u string) (int, []*http.Cookie, string) {
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Cookies(), string(b)
	}
	code, cookies, _ := get(link.URL)
	if code != http.StatusOK || len(cookies) != 1 || !cookies[0].HttpOnly {
		t.Errorf("the link: %d, cookies %v", code, cookies)
	}
	if code, _, body := get(link.URL); code != http.StatusUnauthorized || !strings.Contains(body, "expired or was used") {
		t.Errorf("the link again: %d", code)
	}
	// Text output: the link, on its own line.
	out := mustRun(t, "ui", "--home", home)
	if !strings.Contains(out, "\n  http://127.0.0.1:") || !strings.Contains(out, "/login?t=") {
		t.Errorf("ui prints:\n%s", out)
	}
}
