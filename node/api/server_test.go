package api

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/node/web"
)

const testToken = "test-token"

// clock is a settable time for the session table.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newTestServer serves the API's routes that need no node (sessions, the
// dashboard's pages and assets, /jobs/spec) on loopback.
func newTestServer(t *testing.T) (*Server, *httptest.Server, *clock) {
	t.Helper()
	s, err := NewServer(Params{Token: testToken, UI: web.FS(), Gatherer: prometheus.NewRegistry(),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	s.sessions.now = c.now
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts, c
}

// browser is an HTTP client that keeps cookies and does not follow
// redirects, as the tests check them.
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar := &cookieJar{}
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// cookieJar keeps cookies by name, whatever the host: enough for one server.
type cookieJar struct {
	mu sync.Mutex
	c  map[string]*http.Cookie
}

func (j *cookieJar) SetCookies(_ *url.URL, cs []*http.Cookie) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.c == nil {
		j.c = map[string]*http.Cookie{}
	}
	for _, c := range cs {
		if c.MaxAge < 0 {
			delete(j.c, c.Name)
			continue
		}
		j.c[c.Name] = c
	}
}

func (j *cookieJar) Cookies(*url.URL) []*http.Cookie {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []*http.Cookie
	for _, c := range j.c {
		out = append(out, &http.Cookie{Name: c.Name, Value: c.Value})
	}
	return out
}

func (b *browser) do(method, path string, body string, hdr map[string]string) (*http.Response, string) {
	b.t.Helper()
	u := path
	if !strings.HasPrefix(path, "http") {
		u = b.base + path
	}
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

var csrfRE = regexp.MustCompile(`<meta name="csrf-token" content="([^"]+)">`)

func (b *browser) login(link string) (csrf string) {
	b.t.Helper()
	resp, body := b.do("GET", link, "", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `http-equiv="refresh"`) {
		b.t.Fatalf("login link: %d %s", resp.StatusCode, body)
	}
	resp, body = b.do("GET", "/", "", nil)
	if resp.StatusCode != http.StatusOK {
		b.t.Fatalf("GET / after login: %d", resp.StatusCode)
	}
	m := csrfRE.FindStringSubmatch(body)
	if m == nil || m[1] == "" {
		b.t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return m[1]
}

func mintLink(t *testing.T, ts *httptest.Server) LoginLink {
	t.Helper()
	l, err := NewClient(ts.URL, testToken).LoginLink(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

const okSpec = `{"toml": "name = \"x\"\nworkers = 2\n"}`

func TestLoginLinkOnceAndTheSessionItStarts(t *testing.T) {
	_, ts, clk := newTestServer(t)
	b := newBrowser(t, ts.URL)

	// Without a session: pages go to /login, the login page says 401, the
	// API says 401, and minting a link needs the token.
	for _, p := range []string{"/", "/resources", "/jobs", "/jobs/abc123", "/market", "/ledger", "/network"} {
		if resp, _ := b.do("GET", p, "", nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Errorf("GET %s without a session: %d to %q", p, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if resp, body := b.do("GET", "/login", "", nil); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "deepmarket ui") {
		t.Errorf("GET /login: %d", resp.StatusCode)
	}
	if resp, _ := b.do("POST", "/api/v1/jobs/spec", okSpec, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /api/v1/jobs/spec without a session: %d", resp.StatusCode)
	}
	if resp, _ := b.do("POST", "/api/v1/ui/login-link", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a login link without the token: %d", resp.StatusCode)
	}

	link := mintLink(t, ts)
	if !strings.HasPrefix(link.URL, ts.URL+"/login?t=") || !link.ExpiresAt.Equal(clk.now().Add(LoginLinkTTL)) {
		t.Fatalf("link %+v", link)
	}
	resp, _ := b.do("GET", link.URL, "", nil)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if strings.HasPrefix(c.Name, "dm_session_") {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" {
		t.Fatalf("session cookie %+v", cookie)
	}
	if _, port, _ := strings.Cut(strings.TrimPrefix(ts.URL, "http://"), ":"); cookie.Name != "dm_session_"+port {
		t.Errorf("cookie %q is not named for the port", cookie.Name)
	}
	if got := resp.Header.Get("Referrer-Policy"); got != "no-referrer" {
		t.Errorf("the login page leaks its URL: Referrer-Policy %q", got)
	}
	// Once only, from any browser.
	if resp, body := newBrowser(t, ts.URL).do("GET", link.URL, "", nil); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "expired or was used") {
		t.Errorf("a link used twice: %d", resp.StatusCode)
	}

	resp, body := b.do("GET", "/", "", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("GET / with a session: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
	csrf := csrfRE.FindStringSubmatch(body)[1]

	// Reading needs no CSRF token; changing does, from this origin only.
	cases := []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"no CSRF token", nil, http.StatusForbidden},
		{"a wrong CSRF token", map[string]string{CSRFHeader: "nope"}, http.StatusForbidden},
		{"another origin", map[string]string{CSRFHeader: csrf, "Origin": "http://evil.example"}, http.StatusForbidden},
		{"a cross-site fetch", map[string]string{CSRFHeader: csrf, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"a DNS-rebound name", map[string]string{CSRFHeader: csrf, "Host": "evil.example" + ts.URL[strings.LastIndex(ts.URL, ":"):]}, http.StatusUnauthorized},
		{"the CSRF token", map[string]string{CSRFHeader: csrf, "Origin": ts.URL, "Sec-Fetch-Site": "same-origin"}, http.StatusOK},
	}
	for _, tc := range cases {
		if resp, body := b.do("POST", "/api/v1/jobs/spec", okSpec, tc.hdr); resp.StatusCode != tc.want {
			t.Errorf("a session's POST with %s: %d %s, want %d", tc.name, resp.StatusCode, body, tc.want)
		}
	}
	// A session cannot make more sessions.
	if resp, _ := b.do("POST", "/api/v1/ui/login-link", "", map[string]string{CSRFHeader: csrf}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a session minting a login link: %d", resp.StatusCode)
	}
	// The CLI's token needs no cookie and no CSRF token.
	if resp, _ := newBrowser(t, ts.URL).do("POST", "/api/v1/jobs/spec", okSpec, map[string]string{"Authorization": "Bearer " + testToken}); resp.StatusCode != http.StatusOK {
		t.Errorf("the bearer token: %d", resp.StatusCode)
	}
	// A wrong token is refused even with a good cookie.
	if resp, _ := b.do("POST", "/api/v1/jobs/spec", okSpec, map[string]string{CSRFHeader: csrf, "Authorization": "Bearer nope"}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong bearer token with a session: %d", resp.StatusCode)
	}

	// Sessions end after SessionTTL.
	clk.advance(SessionTTL + time.Second)
	if resp, _ := b.do("GET", "/", "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET / after the session expired: %d", resp.StatusCode)
	}
}

func TestLoginLinksExpireAndLogoutEndsTheSession(t *testing.T) {
	_, ts, clk := newTestServer(t)
	late := mintLink(t, ts)
	clk.advance(LoginLinkTTL + time.Second)
	if resp, _ := newBrowser(t, ts.URL).do("GET", late.URL, "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("an expired link: %d", resp.StatusCode)
	}

	b := newBrowser(t, ts.URL)
	csrf := b.login(mintLink(t, ts).URL)
	if resp, _ := b.do("POST", "/logout", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("logout without the CSRF token: %d", resp.StatusCode)
	}
	if resp, _ := b.do("POST", "/logout", "", map[string]string{CSRFHeader: csrf}); resp.StatusCode != http.StatusOK {
		t.Errorf("logout: %d", resp.StatusCode)
	}
	if resp, _ := b.do("GET", "/", "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET / after logout: %d", resp.StatusCode)
	}
}

func TestLinksAndSessionsAreBounded(t *testing.T) {
	s, ts, _ := newTestServer(t)
	var links []LoginLink
	for range maxLinks + 4 {
		links = append(links, mintLink(t, ts))
	}
	if n := len(s.sessions.links); n != maxLinks {
		t.Errorf("%d links outstanding, want at most %d", n, maxLinks)
	}
	if resp, _ := newBrowser(t, ts.URL).do("GET", links[0].URL, "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the oldest link beyond the bound still works: %d", resp.StatusCode)
	}
	newBrowser(t, ts.URL).login(links[len(links)-1].URL)
	for range maxSessions + 3 {
		if _, _, ok := s.sessions.redeem(mustLink(s)); !ok {
			t.Fatal("redeem")
		}
	}
	if n := len(s.sessions.sessions); n != maxSessions {
		t.Errorf("%d sessions, want at most %d", n, maxSessions)
	}
}

func mustLink(s *Server) string {
	tok, _ := s.sessions.newLink()
	return tok
}

func TestAssetsNeedNoSessionAndHaveTheirTypes(t *testing.T) {
	_, ts, _ := newTestServer(t)
	b := newBrowser(t, ts.URL)
	for path, ct := range map[string]string{
		"/assets/app.js":    "text/javascript; charset=utf-8",
		"/assets/style.css": "text/css; charset=utf-8",
		"/assets/icon.svg":  "image/svg+xml",
	} {
		resp, body := b.do("GET", path, "", nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ct || body == "" {
			t.Errorf("GET %s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	for _, p := range []string{"/assets/nothing.js", "/assets/", "/assets/pages"} {
		if resp, _ := b.do("GET", p, "", nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, resp.StatusCode)
		}
	}
}

func TestReadSpecFields(t *testing.T) {
	f, err := ReadSpecFields([]byte("name = \"fashion\"\ncommand = [\"python3\", \"train.py\"]\nworkers = 2\nmemory = \"2GiB\"\n"))
	if err != nil || f.Name != "fashion" || f.Workers != 2 || len(f.Command) != 2 || f.Memory != "2GiB" {
		t.Errorf("%+v %v", f, err)
	}
	for _, bad := range []string{"colour = \"red\"\n", "name = \n"} {
		_, err := ReadSpecFields([]byte(bad))
		e, ok := err.(*Error)
		if !ok || e.Field != "toml" || e.Status != http.StatusUnprocessableEntity {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestCommonTop(t *testing.T) {
	for _, tc := range []struct {
		paths []string
		want  string
	}{
		{[]string{"proj/a.py", "proj/sub/b.py"}, "proj"},
		{[]string{"proj/a.py", "other/b.py"}, ""},
		{[]string{"a.py", "proj/b.py"}, ""},
		{[]string{"a.py"}, ""},
		{[]string{"proj/a.py"}, "proj"},
	} {
		if got := commonTop(tc.paths); got != tc.want {
			t.Errorf("commonTop(%q) = %q, want %q", tc.paths, got, tc.want)
		}
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1:7700": true, "localhost:7700": true, "[::1]:7700": true, "127.0.0.1": true,
		"evil.example:7700": false, "10.0.0.5:7700": false, "localhost.evil.example:7700": false,
	} {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v", host, got)
		}
	}
}

// TestOpenAPIDocumentsEveryRoute: each API route the server registers is
// in openapi.json with its method.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	s, _, _ := newTestServer(t)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	pages := map[string]bool{}
	for _, p := range Pages {
		pages[p] = true
	}
	pages["/{$}"] = true
	checked := 0
	for _, r := range s.routes {
		method, path, _ := strings.Cut(r, " ")
		if pages[path] {
			continue
		}
		checked++
		if _, ok := doc.Paths[path][strings.ToLower(method)]; !ok {
			t.Errorf("%s is not in openapi.json", r)
		}
	}
	if checked < 40 {
		t.Errorf("only %d routes checked", checked)
	}
}

// TestMetricsFollowTheHostRules: a Prometheus on this machine scrapes
// /metrics at 127.0.0.1 without a token; a request naming another host (a
// page whose DNS name was pointed at 127.0.0.1) is refused unless it
// carries the API token.
func TestMetricsFollowTheHostRules(t *testing.T) {
	_, ts, _ := newTestServer(t)
	get := func(host, token string) int {
		req, err := http.NewRequest("GET", ts.URL+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for _, c := range []struct {
		host, token string
		want        int
	}{
		{"", "", http.StatusOK},
		{"localhost:7700", "", http.StatusOK},
		{"[::1]:7700", "", http.StatusOK},
		{"evil.example:7700", "", http.StatusForbidden},
		{"192.168.1.5:7700", "", http.StatusForbidden},
		{"evil.example:7700", "wrong", http.StatusForbidden},
		{"evil.example:7700", testToken, http.StatusOK},
	} {
		if got := get(c.host, c.token); got != c.want {
			t.Errorf("Host %q token %q: %d, want %d", c.host, c.token, got, c.want)
		}
	}
}
