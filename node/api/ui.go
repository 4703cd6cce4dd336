package api

import (
	"bytes"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

// Pages are the dashboard's pages: each serves the same document, whose
// script draws the page its path names.
var Pages = []string{"/", "/resources", "/jobs", "/jobs/{id}", "/market", "/ledger", "/network"}

// The dashboard's files in Params.UI: two documents and the assets they
// load (see package node/web).
const (
	uiIndex  = "index.html"
	uiLogin  = "login.html"
	uiAssets = "assets"
)

// uiSecurityHeaders keep the dashboard's pages to their own scripts and
// styles, out of frames, and their URLs (a login link) out of Referer.
func uiSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// ui serves the dashboard: its pages (with a session), the login page and
// link, logout, and its static assets.
type ui struct {
	s     *Server
	index *template.Template
	login *template.Template
}

func (s *Server) routeUI() error {
	if s.p.UI == nil {
		return nil
	}
	u := &ui{s: s}
	var err error
	if u.index, err = template.ParseFS(s.p.UI, uiIndex); err != nil {
		return err
	}
	if u.login, err = template.ParseFS(s.p.UI, uiLogin); err != nil {
		return err
	}
	for _, p := range Pages {
		pattern := "GET " + p
		if p == "/" {
			pattern = "GET /{$}"
		}
		s.handleFunc(pattern, u.page)
	}
	s.handleFunc("GET /login", u.loginPage)
	s.handleFunc("POST /logout", u.logout)
	assets, err := fs.Sub(s.p.UI, uiAssets)
	if err != nil {
		return err
	}
	s.mux.Handle("GET /assets/", http.StripPrefix("/assets/", assetServer{assets}))
	return nil
}

// page serves the dashboard document to a signed-in browser, and sends
// anyone else to the login page.
func (u *ui) page(w http.ResponseWriter, r *http.Request) {
	kind, sess := u.s.who(r)
	if kind == authNone {
		http.Redirect(w, r, "/login", http.StatusSeeOther)
		return
	}
	u.render(w, u.index, http.StatusOK, map[string]any{"CSRF": sess.csrf})
}

func (u *ui) render(w http.ResponseWriter, t *template.Template, status int, data any) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		writeError(w, err)
		return
	}
	uiSecurityHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// loginPage redeems a login link (?t=...) for a session cookie and goes on
// to the dashboard; without a valid link it explains how to get one (401).
func (u *ui) loginPage(w http.ResponseWriter, r *http.Request) {
	tok := r.URL.Query().Get("t")
	if tok == "" {
		if kind, _ := u.s.who(r); kind == authSession {
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		u.render(w, u.login, http.StatusUnauthorized, map[string]any{"Message": ""})
		return
	}
	if !loopbackHost(r.Host) {
		u.render(w, u.login, http.StatusUnauthorized, map[string]any{
			"Message": "Open the dashboard at 127.0.0.1 or localhost: the link works only on the node's own machine."})
		return
	}
	id, sess, ok := u.s.sessions.redeem(tok)
	if !ok {
		u.render(w, u.login, http.StatusUnauthorized, map[string]any{
			"Message": "This sign-in link has expired or was used already."})
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName(r.Host), Value: id, Path: "/", Expires: sess.expires, MaxAge: int(SessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
	})
	// A page that moves on by itself rather than a redirect: a redirect
	// would carry the click's origin (a terminal, a mail reader) into the
	// next request, which a SameSite=Strict cookie does not go with.
	u.render(w, u.login, http.StatusOK, map[string]any{"SignedIn": true})
}

// logout ends the session and clears its cookie.
func (u *ui) logout(w http.ResponseWriter, r *http.Request) {
	kind, sess := u.s.who(r)
	if kind != authSession || !csrfOK(r, sess) {
		writeJSON(w, http.StatusUnauthorized, &Error{Message: "not signed in"})
		return
	}
	if c, err := r.Cookie(cookieName(r.Host)); err == nil {
		u.s.sessions.end(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName(r.Host), Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
	writeJSON(w, http.StatusOK, map[string]bool{"signed_out": true})
}

// assetServer serves the dashboard's scripts, styles and images: public
// code, no data, so no session is needed (the login page uses them).
type assetServer struct{ fsys fs.FS }

func (a assetServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := path.Clean(strings.TrimPrefix(r.URL.Path, "/"))
	if !fs.ValidPath(name) || name == "." {
		http.NotFound(w, r)
		return
	}
	b, err := fs.ReadFile(a.fsys, name)
	if err != nil {
		// Not there, or a directory: nothing to serve either way.
		http.NotFound(w, r)
		return
	}
	ct := mime.TypeByExtension(path.Ext(name))
	switch path.Ext(name) {
	case ".js":
		ct = "text/javascript; charset=utf-8"
	case ".css":
		ct = "text/css; charset=utf-8"
	case ".svg":
		ct = "image/svg+xml"
	}
	if ct == "" {
		ct = "application/octet-stream"
	}
	uiSecurityHeaders(w.Header())
	w.Header().Set("Content-Type", ct)
	// The assets are built into the binary: a new binary may change them.
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(b)
}

// LoginLink is a one-time link that signs a browser into the dashboard.
type LoginLink struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// loginLink mints a login link (bearer token only: a session cannot make
// more sessions).
func (s *Server) loginLink(w http.ResponseWriter, r *http.Request) {
	if s.refuseUnlessBearer(w, r) {
		return
	}
	if s.p.UI == nil {
		writeJSON(w, http.StatusNotFound, &Error{Message: "this node serves no dashboard"})
		return
	}
	if !loopbackHost(r.Host) {
		writeJSON(w, http.StatusBadRequest, &Error{Message: "ask for a login link at the API's loopback address (127.0.0.1)"})
		return
	}
	tok, exp := s.sessions.newLink()
	writeJSON(w, http.StatusOK, LoginLink{URL: "http://" + r.Host + "/login?t=" + tok, ExpiresAt: exp.UTC()})
}
