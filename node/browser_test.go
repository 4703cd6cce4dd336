package node

// The dashboard (package node/web) in a real browser: headless Chromium,
// driven with chromedp, against real nodes on loopback. Without Chromium
// these tests skip, unless DM_REQUIRE_BROWSER=1 says they must run (make
// test sets it; scripts/browser-env.sh installs Chromium). Screenshots of
// every page go to $DM_ARTIFACTS/<test> (default: the test's temporary
// directory), and each is checked not to be blank.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromium finds the browser ($DM_CHROMIUM if set, else Debian's), or
// skips (fails under DM_REQUIRE_BROWSER=1).
func chromium(t *testing.T) string {
	t.Helper()
	cands := []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"}
	if c := os.Getenv("DM_CHROMIUM"); c != "" {
		cands = []string{c}
	}
	for _, c := range cands {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	if os.Getenv("DM_REQUIRE_BROWSER") == "1" {
		t.Fatal("chromium is not installed but DM_REQUIRE_BROWSER=1: run scripts/browser-env.sh (make deps does)")
	}
	t.Skip("chromium is not installed: run scripts/browser-env.sh (make deps does) to run the dashboard's browser tests")
	return ""
}

// artifacts is where a test's screenshots go.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if root := os.Getenv("DM_ARTIFACTS"); root != "" {
		dir = filepath.Join(root, strings.ReplaceAll(t.Name(), "/", "_"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots: %s (set DM_ARTIFACTS to keep them)", dir)
	return dir
}

// browser is one headless Chromium for a test; tabs share it.
type browser struct {
	t    *testing.T
	ctx  context.Context // the first tab's; new tabs open beside it
	shot string          // screenshot directory

	mu     sync.Mutex
	errors []string // uncaught exceptions and console.error calls
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromium(t)
	profile, err := os.MkdirTemp("", "deepmarket-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900), chromedp.UserDataDir(profile))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(func(string, ...any) {}), chromedp.WithErrorf(func(string, ...any) {}))
	b := &browser{t: t, ctx: ctx, shot: artifacts(t)}
	t.Cleanup(func() {
		cancel()
		acancel()
		// Chromium's children may write a moment after it stops.
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err := chromedp.Do(ctx); err != nil { // start it
		t.Fatalf("start %s: %v", path, err)
	}
	b.listen(ctx)
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, e := range b.errors {
			t.Errorf("browser: %s", e)
		}
	})
	return b
}

func (b *browser) listen(ctx context.Context) {
	chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *cdpruntime.EventExceptionThrown:
			msg = "uncaught: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *cdpruntime.EventConsoleAPICalled:
			if ev.Type != cdpruntime.ConsoleAPICalledTypeError {
				return
			}
			var parts []string
			for _, a := range ev.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			msg = "console.error: " + strings.Join(parts, " ")
		default:
			return
		}
		b.mu.Lock()
		b.errors = append(b.errors, msg)
		b.mu.Unlock()
	})
}

// tab is a browser tab on one node's dashboard.
type tab struct {
	b    *browser
	t    *testing.T
	ctx  context.Context
	node *testNode
}

// tab opens a tab (the browser's first one the first time) for node.
func (b *browser) tab(n *testNode, first bool) *tab {
	ctx := b.ctx
	if !first {
		var cancel context.CancelFunc
		ctx, cancel = chromedp.NewContext(b.ctx)
		b.t.Cleanup(cancel)
		if err := chromedp.Do(ctx); err != nil {
			b.t.Fatal(err)
		}
		b.listen(ctx)
	}
	return &tab{b: b, t: b.t, ctx: ctx, node: n}
}

func (tb *tab) base() string { return tb.node.APIURL() }

// do runs actions, failing the test on error.
func (tb *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.t.Fatalf("%s: %v", what, err)
	}
}

// js evaluates an expression (awaiting a promise) into T.
func js[T any](tb *tab, expr string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// quote makes a JavaScript string literal.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// textOf is the expression for an element's text ("" if absent).
func textOf(sel string) string {
	return fmt.Sprintf(`((document.querySelector(%s) || {}).textContent || "")`, quote(sel))
}

// wait polls a JavaScript condition until it holds (through page loads).
func (tb *tab) wait(within time.Duration, what, cond string) {
	tb.t.Helper()
	deadline := time.Now().Add(within)
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`Boolean(`+cond+`)`))
		cancel()
		if err == nil && ok {
			return
		}
		lastErr = err
		time.Sleep(150 * time.Millisecond)
	}
	body := js[string](tb, `document.body ? document.body.innerText.slice(0, 3000) : ""`)
	tb.t.Fatalf("timed out after %s waiting for %s (last error %v); the page says:\n%s", within, what, lastErr, body)
}

// waitText waits until the element's text contains want.
func (tb *tab) waitText(within time.Duration, sel, want string) {
	tb.t.Helper()
	tb.wait(within, fmt.Sprintf("%s to say %q", sel, want), textOf(sel)+`.includes(`+quote(want)+`)`)
}

// login signs the tab into its node's dashboard with a one-time link.
func (tb *tab) login() {
	tb.t.Helper()
	link, err := tb.node.client.LoginLink(tb.t.Context())
	if err != nil {
		tb.t.Fatal(err)
	}
	if !strings.HasPrefix(link.URL, tb.base()+"/login?t=") {
		tb.t.Fatalf("login link %q is not on the node's API %s", link.URL, tb.base())
	}
	tb.do("open the login link", chromedp.Navigate(link.URL))
	tb.wait(time.Minute, "the dashboard after signing in", `location.pathname === "/" && document.querySelector('#main[data-page="dashboard"]')`)
}

// open loads a page of the dashboard and waits for its script to draw it.
func (tb *tab) open(path, page string) {
	tb.t.Helper()
	tb.do("open "+path, chromedp.Navigate(tb.base()+path))
	tb.wait(30*time.Second, "page "+page, fmt.Sprintf(`document.querySelector('#main[data-page=%s]')`, quote(page)))
}

// nav follows a link in the page's navigation (no reload).
func (tb *tab) nav(label, page string) {
	tb.t.Helper()
	tb.do("click "+label, chromedp.Click(chromedp.CSS(fmt.Sprintf(`header nav a[href=%s]`, quote(label))), chromedp.NodeVisible))
	tb.wait(30*time.Second, "page "+page, fmt.Sprintf(`document.querySelector('#main[data-page=%s]')`, quote(page)))
}

// shot saves a screenshot of the whole page as name.png, checks that it is
// not blank, and checks that every form control on the page has a label.
func (tb *tab) shot(name string) {
	tb.t.Helper()
	unlabelled := js[[]string](tb, `[...document.querySelectorAll("input, select, textarea")]
		.filter((el) => el.type !== "hidden" && el.labels.length === 0 && !el.getAttribute("aria-label"))
		.map((el) => el.outerHTML.slice(0, 120))`)
	if len(unlabelled) > 0 {
		tb.t.Errorf("%s: form controls without a label: %v", name, unlabelled)
	}
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(tb.b.shot, name+".png")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	if err := checkNotBlank(buf); err != nil {
		tb.t.Errorf("screenshot %s: %v", path, err)
	}
}

// checkNotBlank decodes a PNG and wants many colours, none of which covers
// nearly all of it: a page that drew nothing (or only its background) fails.
func checkNotBlank(b []byte) error {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("not a PNG: %w", err)
	}
	r := img.Bounds()
	if r.Dx() < 200 || r.Dy() < 200 {
		return fmt.Errorf("only %dx%d pixels", r.Dx(), r.Dy())
	}
	counts := map[uint32]int{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			counts[cr>>8<<16|cg>>8<<8|cb>>8]++
		}
	}
	top := 0
	for _, n := range counts {
		top = max(top, n)
	}
	total := r.Dx() * r.Dy()
	if len(counts) < 64 || float64(top) > 0.97*float64(total) {
		return fmt.Errorf("looks blank: %d colours, the commonest covering %.1f%%", len(counts), 100*float64(top)/float64(total))
	}
	return nil
}

// uiPython is the interpreter the dashboard's job runs with: generic jobs
// need only python3.
func uiPython(t *testing.T) string {
	t.Helper()
	needSandbox(t) // lending needs it
	for _, p := range []string{os.Getenv("DM_PYTHON"), "/opt/deepmarket/venv/bin/python3", "/usr/bin/python3"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no python3 for the test job")
	return ""
}

// untarFile finds name in a base64 .tar.gz and returns its content.
func untarFile(t *testing.T, b64, name string) string {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the download is not gzip: %v", err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == name {
			b, _ := io.ReadAll(tr)
			return string(b)
		}
	}
	t.Fatalf("%s not in the download (it holds %v)", name, names)
	return ""
}
