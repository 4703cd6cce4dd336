package api

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The dashboard's security model. The CLI presents the bearer token from
// api.token. A browser cannot be handed that token safely, so `deepmarket
// ui` asks the API (with the token) for a one-time login link; visiting it
// trades the link for a session: a random ID in an HttpOnly, SameSite=Strict
// cookie, looked up in a table kept in memory (a restarted node signs
// everyone out). Requests that change something and come with the cookie
// must also carry the session's CSRF token in X-CSRF-Token (the page gets
// it in a meta tag), must not come from another origin, and must name a
// loopback Host (a DNS-rebound name never gets a session's powers).
const (
	// LoginLinkTTL is how long a login link stays valid; it works once.
	LoginLinkTTL = 10 * time.Minute
	// SessionTTL is how long a dashboard session lasts.
	SessionTTL = 12 * time.Hour
	// CSRFHeader carries a session's CSRF token on state-changing requests.
	CSRFHeader = "X-CSRF-Token"

	maxLinks    = 16 // outstanding login links; the oldest goes first
	maxSessions = 64
)

// session is one signed-in browser.
type session struct {
	csrf    string
	expires time.Time
	seq     uint64 // order of creation: the oldest goes first
}

// link is an outstanding login link.
type link struct {
	expires time.Time
	seq     uint64
}

// sessions holds login links and sessions by the SHA-256 of their secret,
// so a lookup compares hashes, not secrets, and a memory dump of the table
// holds nothing a browser could present.
type sessions struct {
	now func() time.Time

	mu       sync.Mutex
	seq      uint64
	links    map[[32]byte]link
	sessions map[[32]byte]*session
}

func newSessions(now func() time.Time) *sessions {
	if now == nil {
		now = time.Now
	}
	return &sessions{now: now, links: map[[32]byte]link{}, sessions: map[[32]byte]*session{}}
}

func secret() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashOf(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// newLink mints a login link token.
func (s *sessions) newLink() (string, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.expireLocked(now)
	for len(s.links) >= maxLinks {
		var oldest [32]byte
		first := true
		for k, l := range s.links {
			if first || l.seq < s.links[oldest].seq {
				oldest, first = k, false
			}
		}
		delete(s.links, oldest)
	}
	tok := secret()
	exp := now.Add(LoginLinkTTL)
	s.seq++
	s.links[hashOf(tok)] = link{expires: exp, seq: s.seq}
	return tok, exp
}

// redeem trades a login link token for a new session (ID, CSRF token);
// ok is false for a token that is unknown, used or expired.
func (s *sessions) redeem(tok string) (id string, sess session, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.expireLocked(now)
	h := hashOf(tok)
	if _, found := s.links[h]; !found || tok == "" {
		return "", session{}, false
	}
	delete(s.links, h) // once
	for len(s.sessions) >= maxSessions {
		var oldest [32]byte
		first := true
		for k, v := range s.sessions {
			if first || v.seq < s.sessions[oldest].seq {
				oldest, first = k, false
			}
		}
		delete(s.sessions, oldest)
	}
	id = secret()
	s.seq++
	sess = session{csrf: secret(), expires: now.Add(SessionTTL), seq: s.seq}
	s.sessions[hashOf(id)] = &sess
	return id, sess, true
}

// lookup returns the live session with this ID.
func (s *sessions) lookup(id string) (session, bool) {
	if id == "" {
		return session{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.sessions[hashOf(id)]
	if !ok || !s.now().Before(v.expires) {
		return session{}, false
	}
	return *v, true
}

// end signs a session out.
func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, hashOf(id))
}

func (s *sessions) expireLocked(now time.Time) {
	for k, l := range s.links {
		if !now.Before(l.expires) {
			delete(s.links, k)
		}
	}
	for k, v := range s.sessions {
		if !now.Before(v.expires) {
			delete(s.sessions, k)
		}
	}
}

// cookieName is the session cookie's name for the node at host. Cookies
// do not tell ports apart, and several nodes may share a machine (a
// testnet): each gets its own cookie.
func cookieName(host string) string {
	_, port, err := net.SplitHostPort(host)
	if err != nil || port == "" {
		port = "80"
	}
	return "dm_session_" + port
}

// auth is how a request proved who it is.
type auth int

const (
	authNone auth = iota
	authBearer
	authSession
)

// who checks the bearer token, then the session cookie.
func (s *Server) who(r *http.Request) (auth, session) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(s.p.Token)) == 1 {
			return authBearer, session{}
		}
		return authNone, session{}
	}
	if !loopbackHost(r.Host) {
		return authNone, session{}
	}
	c, err := r.Cookie(cookieName(r.Host))
	if err != nil {
		return authNone, session{}
	}
	if sess, ok := s.sessions.lookup(c.Value); ok {
		return authSession, sess
	}
	return authNone, session{}
}

// loopbackHost reports whether a Host header names this machine by a
// loopback address or "localhost": what a browser on this machine uses,
// and never a name an attacker's DNS could point here.
func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// safeMethod reports whether a method changes nothing.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// csrfOK checks a session's state-changing request: its CSRF token, and
// that the browser says it comes from the dashboard's own origin.
func csrfOK(r *http.Request, sess session) bool {
	if safeMethod(r.Method) {
		return true
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(sess.csrf)) != 1 {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "http://"+r.Host {
		return false
	}
	if sf := r.Header.Get("Sec-Fetch-Site"); sf != "" && sf != "same-origin" && sf != "none" {
		return false
	}
	return true
}

// refuse answers 401 unless the request carries the token or a session
// cookie (403 for a session's request that fails the CSRF checks).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request) bool {
	switch kind, sess := s.who(r); kind {
	case authBearer:
		return false
	case authSession:
		if csrfOK(r, sess) {
			return false
		}
		writeJSON(w, http.StatusForbidden, &Error{Message: "cross-site request refused: reload the dashboard and try again"})
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="deepmarket"`)
	writeJSON(w, http.StatusUnauthorized, &Error{Message: "missing or wrong API token (the CLI reads it from api.token in the node's home; the dashboard needs a link from `deepmarket ui`)"})
	return true
}

// refuseUnlessBearer answers 401 unless the request carries the token:
// for what only the CLI may do, such as minting login links.
func (s *Server) refuseUnlessBearer(w http.ResponseWriter, r *http.Request) bool {
	if kind, _ := s.who(r); kind == authBearer {
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="deepmarket"`)
	writeJSON(w, http.StatusUnauthorized, &Error{Message: "this needs the API token (run `deepmarket ui` on the node's machine)"})
	return true
}
