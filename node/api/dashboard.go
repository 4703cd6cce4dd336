package api

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
)

// What the dashboard reads beyond the CLI's routes.
type (
	// Dashboard answers /dashboard, /ledger/activity and /prices/history.
	Dashboard interface {
		Overview(ctx context.Context) (Overview, error)
		Activity(ctx context.Context, addr string, days int) (Activity, error)
		PriceHistory(ctx context.Context, since time.Time) ([]PriceSample, error)
	}
	// Validators answers /validators.
	Validators interface {
		Validators(ctx context.Context) (*ledger.ValidatorSet, error)
	}
)

// Overview is the dashboard's summary of this node's account and machines.
type Overview struct {
	Account  string      `json:"account"`
	Balance  uint64      `json:"balance"`
	Estimate Estimate    `json:"estimate"`
	Machines []MyMachine `json:"machines"`
	Problems []Problem   `json:"problems"`
}

// Estimate is what the next 24 hours should bring at today's prices
// (micro-credits).
type Estimate struct {
	// Earnings: the workers running on this machine now, paid their hourly
	// price until they reach their maximum duration or the 24 hours end.
	Earnings uint64 `json:"earnings_24h"`
	// EarningsIfBusy: everything lent, busy for every hour the machine is
	// offered (inside its window) at its reserve prices.
	EarningsIfBusy uint64 `json:"earnings_if_busy_24h"`
	// Costs: this node's live jobs at their hourly price until their
	// maximum duration, never beyond the rest of their maximum price.
	Costs uint64 `json:"costs_24h"`
}

// MyMachine is a machine of this node's account: this one, and others
// whose offers name the account as owner.
type MyMachine struct {
	Machine   string        `json:"machine"`
	Moniker   string        `json:"moniker,omitempty"`
	Site      string        `json:"site,omitempty"`
	Self      bool          `json:"self"`
	State     string        `json:"state"` // offering, outside-window, idle (not lending), lost
	Lent      p2p.Resources `json:"lent"`
	Allocated p2p.Resources `json:"allocated"`
	PerHour   uint64        `json:"per_hour"` // its price for everything lent
	Workers   int           `json:"workers"`  // running here now (this machine only)
	Earned    uint64        `json:"earned"`   // all time, from the ledger's machine record
	Completed uint64        `json:"completed"`
	Failed    uint64        `json:"failed"`
	LastSeen  time.Time     `json:"last_seen,omitzero"`
}

// Machine states in MyMachine.
const (
	MachineOffering   = "offering"       // its offer is out
	MachineOutsideWin = "outside-window" // lending, outside its daily window
	MachineIdle       = "idle"           // not lending
	MachineLost       = "lost"           // seen offering lately, gone without a word
)

// Problem kinds.
const (
	ProblemFailedJob   = "failed-job"
	ProblemLostWorker  = "lost-worker"
	ProblemLostMachine = "lost-machine"
)

// Problem is something the dashboard shows in red, as PLUTO's panic state
// was: a failed job, a lost worker or machine.
type Problem struct {
	Kind    string    `json:"kind"`
	ID      string    `json:"id"` // the job or machine
	Message string    `json:"message"`
	Since   time.Time `json:"since,omitzero"`
}

// Activity is an account's ledger history with block times, and what it
// earned and spent per day.
type Activity struct {
	Address string          `json:"address"`
	Days    []DayFlow       `json:"days"`
	Entries []ActivityEntry `json:"entries"`
	Earned  uint64          `json:"earned"` // over Days
	Spent   uint64          `json:"spent"`
}

// DayFlow is one UTC day: credits in (earned by machines, received) and
// out (paid for jobs, sent).
type DayFlow struct {
	Day    string `json:"day"` // YYYY-MM-DD
	Earned uint64 `json:"earned"`
	Spent  uint64 `json:"spent"`
}

// ActivityEntry is one transaction that touched the account, with what it
// moved for.
type ActivityEntry struct {
	Time         time.Time `json:"time"`
	Height       int64     `json:"height"`
	Hash         string    `json:"hash"`
	Type         string    `json:"type"`
	What         string    `json:"what"`
	In           uint64    `json:"in,omitempty"`
	Out          uint64    `json:"out,omitempty"`
	Locked       uint64    `json:"locked,omitempty"`   // put into a job's escrow
	Unlocked     uint64    `json:"unlocked,omitempty"` // refunded from one
	Counterparty string    `json:"counterparty,omitempty"`
	Job          string    `json:"job,omitempty"`
	Memo         string    `json:"memo,omitempty"`
}

// PriceSample is the market's prices at one moment.
type PriceSample = market.PriceSample

// SpecRequest is a job spec as TOML, to read into its fields.
type SpecRequest struct {
	TOML string `json:"toml"`
}

// UploadLimit bounds one upload from the dashboard (all its files).
var UploadLimit int64 = 4 << 30

// maxUploadFiles bounds the files of one upload.
const maxUploadFiles = 10000

var uploadNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// routeDashboard registers the dashboard's routes beyond the CLI's.
func (s *Server) routeDashboard() {
	p := s.p
	s.handleFunc("POST /api/v1/ui/login-link", s.loginLink)
	s.handleFunc("GET /api/v1/events", s.events)
	s.handleFunc("GET /api/v1/jobs/{id}/logs/stream", s.logStream)
	s.handle("POST /api/v1/jobs/spec", func(r *http.Request) (any, error) {
		var req SpecRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return ReadSpecFields([]byte(req.TOML))
	})
	s.handleFunc("POST /api/v1/data/upload", s.upload)
	s.handleFunc("GET /api/v1/data/{cid}/archive", s.archive)
	s.handle("GET /api/v1/dashboard", func(r *http.Request) (any, error) { return p.Dashboard.Overview(r.Context()) })
	s.handle("GET /api/v1/ledger/activity", func(r *http.Request) (any, error) {
		days, _ := strconv.Atoi(r.URL.Query().Get("days"))
		if days <= 0 {
			days = 30
		}
		if days > 366 {
			return nil, &Error{Status: http.StatusBadRequest, Field: "days", Message: "days: at most 366"}
		}
		return p.Dashboard.Activity(r.Context(), r.URL.Query().Get("address"), days)
	})
	s.handle("GET /api/v1/prices/history", func(r *http.Request) (any, error) {
		hours, _ := strconv.Atoi(r.URL.Query().Get("hours"))
		if hours <= 0 || hours > 24 {
			hours = 24
		}
		h, err := p.Dashboard.PriceHistory(r.Context(), time.Now().Add(-time.Duration(hours)*time.Hour))
		return nonNil(h), err
	})
	s.handle("GET /api/v1/validators", func(r *http.Request) (any, error) { return p.Validators.Validators(r.Context()) })
}

// ReadSpecFields reads a job spec's TOML into its fields without checking
// their values (Submit does), so that a form can show them; an unknown key
// is an error naming it.
func ReadSpecFields(b []byte) (jobs.File, error) {
	f, err := jobs.DecodeFile(b)
	if err != nil {
		return jobs.File{}, &Error{Status: http.StatusUnprocessableEntity, Field: "toml", Message: "job spec: " + err.Error()}
	}
	return f, nil
}

// upload takes files from the dashboard (multipart: a "path" field before
// each "file", the file's path inside the upload) into a directory, adds
// it to storage and answers its pin: a bundle or dataset by CID.
// ?name= names the directory (default "upload").
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	if s.refuse(w, r) {
		return
	}
	pin, err := s.doUpload(r)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, pin)
}

func (s *Server) doUpload(r *http.Request) (DataPin, error) {
	if s.p.UploadDir == "" || s.p.Data == nil {
		return DataPin{}, &Error{Status: http.StatusNotFound, Message: "this node takes no uploads"}
	}
	name := r.URL.Query().Get("name")
	if name == "" {
		name = "upload"
	}
	if !uploadNameRE.MatchString(name) {
		return DataPin{}, &Error{Status: http.StatusBadRequest, Field: "name", Message: fmt.Sprintf("name %q: want letters, digits, '.', '_' or '-'", name)}
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return DataPin{}, &Error{Status: http.StatusBadRequest, Message: "want multipart/form-data with files"}
	}
	if err := os.MkdirAll(s.p.UploadDir, 0o700); err != nil {
		return DataPin{}, fmt.Errorf("uploads: %w", err)
	}
	tmp, err := os.MkdirTemp(s.p.UploadDir, "up-")
	if err != nil {
		return DataPin{}, fmt.Errorf("uploads: %w", err)
	}
	defer os.RemoveAll(tmp)
	mr := multipart.NewReader(http.MaxBytesReader(nil, r.Body, UploadLimit), params["boundary"])
	paths, err := readUploadParts(mr, filepath.Join(tmp, "raw"))
	if err != nil {
		return DataPin{}, err
	}
	// A folder picked in the browser arrives as folder/...: its content,
	// not the folder, becomes the upload's root.
	raw := filepath.Join(tmp, "raw")
	if top := commonTop(paths); top != "" {
		raw = filepath.Join(raw, top)
	}
	root := filepath.Join(tmp, name)
	if err := os.Rename(raw, root); err != nil {
		return DataPin{}, fmt.Errorf("uploads: %w", err)
	}
	// The job user on a lender reads what the bundle holds; nothing here is
	// secret beyond the upload itself, which only this node reads.
	return s.p.Data.DataAdd(r.Context(), DataAddRequest{Path: root}, nil)
}

// readUploadParts saves each "file" part under dir, at the path the
// "path" part before it gave (else its file name), and returns those
// paths.
func readUploadParts(mr *multipart.Reader, dir string) ([]string, error) {
	tooLarge := &Error{Status: http.StatusRequestEntityTooLarge, Field: "file",
		Message: fmt.Sprintf("upload larger than %d bytes: add it on the node's machine with `deepmarket data add`", UploadLimit)}
	var paths []string
	pending := ""
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		if err != nil {
			return nil, &Error{Status: http.StatusBadRequest, Message: "read upload: " + err.Error()}
		}
		switch part.FormName() {
		case "path":
			b, _ := io.ReadAll(io.LimitReader(part, 4097))
			pending = string(b)
		case "file":
			rel := pending
			if rel == "" {
				rel = part.FileName()
			}
			pending = ""
			if len(paths) >= maxUploadFiles {
				return nil, &Error{Status: http.StatusRequestEntityTooLarge, Field: "file", Message: fmt.Sprintf("more than %d files", maxUploadFiles)}
			}
			rel = filepath.ToSlash(filepath.Clean(filepath.FromSlash(rel)))
			if rel == "" || rel == "." || !filepath.IsLocal(rel) {
				return nil, &Error{Status: http.StatusBadRequest, Field: "file", Message: fmt.Sprintf("file path %q: want a relative path inside the upload", rel)}
			}
			if err := writeUploadPart(filepath.Join(dir, rel), part); errors.As(err, &mbe) {
				return nil, tooLarge
			} else if err != nil {
				return nil, fmt.Errorf("save upload %s: %w", rel, err)
			}
			paths = append(paths, rel)
		}
		part.Close()
	}
	if len(paths) == 0 {
		return nil, &Error{Status: http.StatusBadRequest, Field: "file", Message: "no files in the upload"}
	}
	return paths, nil
}

func writeUploadPart(path string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// commonTop is the first path element every path shares when every path
// has more than one element, else "".
func commonTop(paths []string) string {
	top := ""
	for _, p := range paths {
		first, rest, ok := strings.Cut(p, "/")
		if !ok || rest == "" || (top != "" && first != top) {
			return ""
		}
		top = first
	}
	return top
}

// archive fetches a CID (a job's result) and sends it as a .tar.gz.
func (s *Server) archive(w http.ResponseWriter, r *http.Request) {
	if s.refuse(w, r) {
		return
	}
	if s.p.UploadDir == "" || s.p.Data == nil {
		writeJSON(w, http.StatusNotFound, &Error{Message: "this node serves no downloads"})
		return
	}
	c := r.PathValue("cid")
	if !jobs.IsCID(c) {
		writeJSON(w, http.StatusUnprocessableEntity, &Error{Field: "cid", Message: fmt.Sprintf("%q is not a CID", c)})
		return
	}
	if err := os.MkdirAll(s.p.UploadDir, 0o700); err != nil {
		writeError(w, err)
		return
	}
	tmp, err := os.MkdirTemp(s.p.UploadDir, "down-")
	if err != nil {
		writeError(w, err)
		return
	}
	defer os.RemoveAll(tmp)
	res, err := s.p.Data.DataGet(r.Context(), DataGetRequest{CID: c, Out: filepath.Join(tmp, c)}, nil)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", `attachment; filename="`+c[:min(len(c), 24)]+`.tar.gz"`)
	w.WriteHeader(http.StatusOK)
	if err := writeTarGz(w, res.Path); err != nil {
		s.p.Logger.Warn("archive", "cid", c, "err", err)
	}
}

// writeTarGz writes the tree at root (or the file) as a gzipped tar whose
// names are relative to root.
func writeTarGz(w io.Writer, root string) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	st, err := os.Stat(root)
	if err != nil {
		return err
	}
	base := root
	if !st.IsDir() {
		base = filepath.Dir(root)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(base, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}
