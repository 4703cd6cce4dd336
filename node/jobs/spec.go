package jobs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Frameworks a job may name: tensorflow gets TF_CONFIG; torch gets
// torchrun's contract (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE) and runs in the job's own image; generic
// gets MASTER_ADDR, MASTER_PORT and the DM_* variables only.
var Frameworks = map[string]bool{"tensorflow": true, "torch": true, "generic": true}

// Interpreters are the programs a command may name without shipping them:
// every lender offers them, each mapping the name to its own configured
// interpreter. Any other program must be a file of the bundle.
var Interpreters = []string{"python3", "python"}

// IsInterpreter reports whether prog names an interpreter lenders offer.
func IsInterpreter(prog string) bool { return slices.Contains(Interpreters, prog) }

// Bounds on a job's shape.
const (
	MaxWorkers  = 64
	MaxCores    = 256
	MaxGPUs     = 16
	MinMemory   = 64 << 20
	MaxMemory   = 1 << 40
	MinDuration = time.Minute
	// DefaultStallAfter and MinStallAfter bound stall_after: how long a
	// run that reports progress may go without it.
	DefaultStallAfter = 10 * time.Minute
	MinStallAfter     = 10 * time.Second
	MaxDuration       = 7 * 24 * time.Hour
	MaxPrice          = 1_000_000_000_000 // micro-credits: a million credits
	// DefaultMaxWait is how long a job waits in its submitter's queue for
	// machines when its spec does not say (max_wait); MaxMaxWait bounds
	// what it may say.
	DefaultMaxWait = 24 * time.Hour
	MaxMaxWait     = 30 * 24 * time.Hour
)

// File is a job spec as written in TOML.
type File struct {
	Name      string   `toml:"name" json:"name"`
	Framework string   `toml:"framework" json:"framework"`
	Command   []string `toml:"command" json:"command"`
	Bundle    string   `toml:"bundle" json:"bundle"`
	Dataset   string   `toml:"dataset" json:"dataset,omitempty"`
	// Image, when set, is the job's environment: an OCI image layout
	// directory or its CID (node/image). The workers run in its root
	// filesystem instead of the lenders' own Python, and command[0] may
	// be a program of the image by its absolute path.
	Image       string `toml:"image" json:"image,omitempty"`
	Workers     int    `toml:"workers" json:"workers"`
	Cores       int    `toml:"cores" json:"cores"`
	Memory      string `toml:"memory" json:"memory"`
	GPUs        int    `toml:"gpus" json:"gpus,omitempty"`
	MaxPrice    string `toml:"max_price" json:"max_price"`
	MaxDuration string `toml:"max_duration" json:"max_duration"`
	// Deadline (RFC 3339), when set, makes the job worth nothing if it
	// would complete later.
	Deadline string `toml:"deadline" json:"deadline,omitempty"`
	// MaxWait is how long the job may wait in the queue for machines
	// (a duration; default 24h; "0s" fails it at once when nothing fits).
	MaxWait string `toml:"max_wait" json:"max_wait,omitempty"`
	// Site, when set, is preferred: quotes on other sites cost more.
	Site string `toml:"site" json:"site,omitempty"`
	// StallAfter is how long a run may go without progress (a duration;
	// default 10m): once its workers report progress through the
	// deepmarket package, a worker whose count stops growing this long
	// stops the run, and each worker is paid up to its last progress.
	StallAfter string `toml:"stall_after" json:"stall_after,omitempty"`
	// Training, when set, is how the workers synchronize ([training]
	// mode = "sync" or "diloco", sync_every, compress).
	Training *p2p.Training `toml:"training" json:"training,omitempty"`
	// Verify sets a held job's spot checks ([verify] rate, share,
	// tolerance; see p2p.Verify). A held job has them whether or not it
	// says so: each worker checked once in expectation.
	Verify *VerifyFile `toml:"verify" json:"verify,omitempty"`
	// Floor is the share of each machine's price the job pays for the
	// time its worker runs, whatever its rounds or progress (0.25 to 1;
	// default 0.5). Only a spot check the worker failed, or its machine
	// lost, forfeits it.
	Floor *float64 `toml:"floor" json:"floor,omitempty"`
}

// VerifyFile is [verify] as written: share and tolerance have defaults.
type VerifyFile struct {
	Rate      float64  `toml:"rate" json:"rate"`
	Share     *float64 `toml:"share" json:"share,omitempty"`
	Tolerance *float64 `toml:"tolerance" json:"tolerance,omitempty"`
}

// Spec is a validated job spec. Bundle and Dataset are either a local
// directory (absolute, resolved against the spec file's directory) or a
// CID already in the network.
type Spec struct {
	Name        string        `json:"name"`
	Framework   string        `json:"framework"`
	Command     []string      `json:"command"`
	Bundle      string        `json:"bundle"`
	Dataset     string        `json:"dataset,omitempty"`
	Image       string        `json:"image,omitempty"`
	Workers     int           `json:"workers"`
	Cores       int           `json:"cores"`
	MemBytes    uint64        `json:"mem_bytes"`
	GPUs        int           `json:"gpus"`
	MaxPrice    uint64        `json:"max_price"`
	MaxDuration time.Duration `json:"max_duration_ns"`
	Deadline    time.Time     `json:"deadline,omitzero"`
	MaxWait     time.Duration `json:"max_wait_ns"`
	Site        string        `json:"site,omitempty"`
	StallAfter  time.Duration `json:"stall_after_ns,omitempty"`
	Training    *p2p.Training `json:"training,omitempty"`
	Floor       float64       `json:"floor,omitempty"`
}

// SpecError is a spec that does not validate; Field names the key.
type SpecError struct {
	Key, Msg string
}

func (e *SpecError) Error() string { return e.Key + ": " + e.Msg }

// Field names the spec key at fault.
func (e *SpecError) Field() string { return e.Key }

func bad(key, format string, args ...any) error {
	return &SpecError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// ReadSpec reads and validates a job spec file; relative paths in it are
// taken from the file's directory.
func ReadSpec(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	s, err := ParseSpec(b, abs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseSpec parses TOML and validates it (see File.Validate).
func ParseSpec(b []byte, baseDir string) (*Spec, error) {
	f, err := DecodeFile(b)
	if err != nil {
		return nil, err
	}
	return f.Validate(baseDir)
}

// DecodeFile reads a job spec's TOML into its fields without checking
// their values (File.Validate does): the one decoder of specs, for the
// CLI, the dashboard's form and ParseSpec. A TOML error is a *SpecError on
// key "toml"; an unknown key is one naming that key.
func DecodeFile(b []byte) (File, error) {
	var f File
	md, err := toml.NewDecoder(bytes.NewReader(b)).Decode(&f)
	if err != nil {
		return File{}, bad("toml", "%v", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return File{}, bad(und[0].String(), "unknown key %q (see examples/fashion-mnist/job.toml for the keys)", und[0].String())
	}
	return f, nil
}

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	siteRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._ -]{0,63}$`)
)

// Validate checks every key and resolves local paths against baseDir.
func (f *File) Validate(baseDir string) (*Spec, error) {
	s := &Spec{Name: f.Name, Framework: f.Framework, Workers: f.Workers, Cores: f.Cores, GPUs: f.GPUs, Site: f.Site}
	for _, step := range []func(*Spec) error{f.validateWork, f.validateWorkers, f.validateTerms, f.validateTraining} {
		if err := step(s); err != nil {
			return nil, err
		}
	}
	if err := f.validateInputs(s, baseDir); err != nil {
		return nil, err
	}
	return s, nil
}

// validateWork checks what runs: the name, framework and command.
func (f *File) validateWork(s *Spec) error {
	switch {
	case !nameRE.MatchString(f.Name):
		return bad("name", "%q: want 1-64 letters, digits, '.', '_' or '-'", f.Name)
	case f.Framework == "":
		s.Framework = "tensorflow"
	case !Frameworks[f.Framework]:
		return bad("framework", "%q: want tensorflow, torch or generic", f.Framework)
	case f.Framework == "torch" && f.Image == "":
		return bad("image", "framework torch runs in the job's own image (image = a layout directory, a CID or a name from `deepmarket env add`): lenders' Python has no PyTorch")
	}
	if err := checkCommand(f.Command, f.Image != ""); err != nil {
		return err
	}
	s.Command = f.Command
	return nil
}

// validateWorkers checks how many workers, and what each needs.
func (f *File) validateWorkers(s *Spec) error {
	if f.Workers < 1 || f.Workers > MaxWorkers {
		return bad("workers", "%d: want 1 to %d", f.Workers, MaxWorkers)
	}
	if f.Cores < 1 || f.Cores > MaxCores {
		return bad("cores", "%d: want 1 to %d per worker", f.Cores, MaxCores)
	}
	if f.GPUs < 0 || f.GPUs > MaxGPUs {
		return bad("gpus", "%d: want 0 to %d per worker", f.GPUs, MaxGPUs)
	}
	mem, err := units.ParseSize(f.Memory)
	if err != nil {
		return bad("memory", "%v (such as \"2GiB\")", err)
	}
	if mem < MinMemory || mem > MaxMemory {
		return bad("memory", "%s per worker: want 64MiB to 1TiB", f.Memory)
	}
	s.MemBytes = mem
	return nil
}

// validateTerms checks what the job may cost and how long it may take,
// and where it would rather run.
func (f *File) validateTerms(s *Spec) (err error) {
	if f.MaxPrice == "" {
		return bad("max_price", "missing: the most the whole job may cost, in credits (such as \"5\")")
	}
	if s.MaxPrice, err = units.ParseCredits(f.MaxPrice); err != nil {
		return bad("max_price", "%v", err)
	}
	if s.MaxPrice == 0 || s.MaxPrice > MaxPrice {
		return bad("max_price", "%s: want more than 0 and at most %s credits", f.MaxPrice, units.FormatCredits(MaxPrice))
	}
	if f.MaxDuration == "" {
		return bad("max_duration", "missing: how long the job may run at most (such as \"30m\")")
	}
	if s.MaxDuration, err = time.ParseDuration(f.MaxDuration); err != nil {
		return bad("max_duration", "%v", err)
	}
	if s.MaxDuration < MinDuration || s.MaxDuration > MaxDuration {
		return bad("max_duration", "%s: want 1m to 168h", f.MaxDuration)
	}
	if f.Deadline != "" {
		if s.Deadline, err = time.Parse(time.RFC3339, f.Deadline); err != nil {
			return bad("deadline", "%v (want RFC 3339, such as 2026-12-01T18:00:00Z)", err)
		}
	}
	s.StallAfter = DefaultStallAfter
	if f.StallAfter != "" {
		if s.StallAfter, err = time.ParseDuration(f.StallAfter); err != nil {
			return bad("stall_after", "%v", err)
		}
		if s.StallAfter < MinStallAfter || s.StallAfter > s.MaxDuration {
			return bad("stall_after", "%s: want %s to max_duration (%s)", f.StallAfter, MinStallAfter, s.MaxDuration)
		}
	}
	s.MaxWait = DefaultMaxWait
	if f.MaxWait != "" {
		if s.MaxWait, err = time.ParseDuration(f.MaxWait); err != nil {
			return bad("max_wait", "%v (want a duration, such as \"2h\"; \"0s\" not to wait)", err)
		}
		if s.MaxWait < 0 || s.MaxWait > MaxMaxWait {
			return bad("max_wait", "%s: want 0s to 720h", f.MaxWait)
		}
	}
	if f.Site != "" && !siteRE.MatchString(f.Site) {
		return bad("site", "%q is not a site label", f.Site)
	}
	s.Floor = p2p.DefaultFloor
	if f.Floor != nil {
		if s.Floor = *f.Floor; !(s.Floor >= p2p.MinFloor && s.Floor <= 1) {
			return bad("floor", "%g: want %g to 1 (the share of each machine's price paid for the time its worker runs)", s.Floor, p2p.MinFloor)
		}
	}
	return nil
}

// validateTraining checks [training]; its mode defaults to sync.
func (f *File) validateTraining(s *Spec) error {
	if f.Training == nil {
		if f.Verify != nil {
			return bad("verify", "spot checks need a held job: [training] mode = \"diloco\", holder = \"submitter\"")
		}
		return nil
	}
	t := *f.Training
	if t.Mode == "" {
		t.Mode = "sync"
	}
	if v := f.Verify; v != nil {
		if t.Mode == "diloco" && t.Holder == "" {
			t.Holder = p2p.HolderSubmitter // spot checks are the holder's: asking for them asks for one
		}
		t.Verify = &p2p.Verify{Rate: v.Rate, Share: p2p.DefaultVerifyShare, Tolerance: p2p.DefaultVerifyTolerance}
		if v.Share != nil {
			t.Verify.Share = *v.Share
		}
		if v.Tolerance != nil {
			t.Verify.Tolerance = *v.Tolerance
		}
	}
	t.FillHeld()
	if err := t.Validate(); err != nil {
		msg := strings.TrimPrefix(err.Error(), p2p.ErrOutOfRange.Error()+": ")
		if strings.HasPrefix(msg, "verify ") {
			return bad("verify", "%s", msg)
		}
		return bad("training", "%s", msg)
	}
	s.Training = &t
	return nil
}

// validateInputs resolves the bundle and dataset against baseDir and
// checks the command's program and script are there.
func (f *File) validateInputs(s *Spec, baseDir string) (err error) {
	if s.Bundle, err = resolveInput("bundle", f.Bundle, baseDir, true); err != nil {
		return err
	}
	if s.Dataset, err = resolveInput("dataset", f.Dataset, baseDir, false); err != nil {
		return err
	}
	if s.Image, err = resolveInput("image", f.Image, baseDir, false); err != nil {
		return err
	}
	if s.Image != "" && !IsCID(s.Image) {
		if _, err := os.Stat(filepath.Join(s.Image, "index.json")); err != nil {
			return bad("image", "%s is not an OCI image layout (no index.json): give the layout directory or its CID", s.Image)
		}
	}
	if t := s.Training; t != nil && t.Validation != "" {
		v, err := resolveFile("training.validation", t.Validation, baseDir)
		if err != nil {
			return err
		}
		c := *t // the spec's block is the caller's
		c.Validation, s.Training = v, &c
	}
	if s.Image != "" && path.IsAbs(s.Command[0]) {
		return nil // a program of the image: the lender finds it there
	}
	if err := checkProgram(s.Command[0], s.Bundle); err != nil {
		return err
	}
	// A script the command names in the bundle must be there.
	if !IsCID(s.Bundle) {
		for _, a := range s.Command[1:] {
			if looksLikeScript(a) {
				if _, err := os.Stat(filepath.Join(s.Bundle, a)); err != nil {
					return bad("command", "%q is not in the bundle %s", a, s.Bundle)
				}
				break
			}
		}
	}
	return nil
}

// checkCommand refuses paths that reach outside the bundle: the command
// runs in the bundle's directory on a machine that is not the
// submitter's. In an image (inImage), command[0] may name a program of
// the image by its absolute path.
func checkCommand(cmd []string, inImage bool) error {
	if len(cmd) == 0 {
		return bad("command", "missing: the program and its arguments, such as [\"python3\", \"train.py\"]")
	}
	if len(cmd) > 256 {
		return bad("command", "%d arguments: at most 256", len(cmd))
	}
	for i, a := range cmd {
		if a == "" || strings.ContainsRune(a, 0) || len(a) > 4096 {
			return bad("command", "argument %d is empty, too long or holds a NUL byte", i)
		}
		if i == 0 && inImage && path.IsAbs(a) && !strings.Contains(a, "/../") {
			continue
		}
		if looksLikePath(a) {
			clean := filepath.Clean(a)
			if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
				return bad("command", "%q reaches outside the bundle: paths must be relative to it", a)
			}
		}
	}
	return nil
}

// checkProgram refuses a command whose program a lender would not run: it
// must be an interpreter lenders offer, or a file of the bundle named
// relative to it. Refusing here, before anything is escrowed, spares the
// submitter a job that every lender would fail.
func checkProgram(prog, bundle string) error {
	if IsInterpreter(prog) {
		return nil
	}
	refuse := func() error {
		return bad("command[0]", "%q: not in the bundle and not an interpreter lenders offer (%s)", prog, strings.Join(Interpreters, ", "))
	}
	if !filepath.IsLocal(prog) {
		return refuse()
	}
	if IsCID(bundle) {
		return nil // the lender checks once it has the bundle
	}
	st, err := os.Lstat(filepath.Join(bundle, prog))
	if err != nil || !st.Mode().IsRegular() {
		return refuse()
	}
	return nil
}

func looksLikePath(a string) bool {
	return strings.HasPrefix(a, "/") || strings.HasPrefix(a, "./") || strings.HasPrefix(a, "../") || strings.Contains(a, "/../") || looksLikeScript(a)
}

func looksLikeScript(a string) bool {
	return !strings.HasPrefix(a, "-") && (strings.HasSuffix(a, ".py") || strings.HasSuffix(a, ".sh"))
}

// IsCID reports whether s parses as a CID.
func IsCID(s string) bool {
	_, err := cid.Decode(s)
	return err == nil
}

// resolveFile resolves v, a file's path (relative to baseDir) or a CID,
// for key: the path made absolute, or the CID as is. The file must be a
// regular one of at most MaxValidationBytes.
func resolveFile(key, v, baseDir string) (string, error) {
	p, st, err := locate(key, v, baseDir, "file")
	switch {
	case err != nil || st == nil:
		return p, err
	case !st.Mode().IsRegular():
		return "", bad(key, "%s is not a regular file", p)
	case st.Size() > MaxValidationBytes:
		return "", bad(key, "%s is %s (want at most %s: a batch every update is checked on)", p,
			units.FormatSize(uint64(st.Size())), units.FormatSize(MaxValidationBytes))
	}
	return p, nil
}

// MaxValidationBytes bounds a held job's validation batch: the holder
// runs it forward once per update, and a referee fetches it.
const MaxValidationBytes = 256 << 20

func resolveInput(key, v, baseDir string, required bool) (string, error) {
	if v == "" {
		if required {
			return "", bad(key, "missing: a directory or a CID")
		}
		return "", nil
	}
	p, st, err := locate(key, v, baseDir, "directory")
	if err == nil && st != nil && !st.IsDir() {
		return "", bad(key, "%s is not a directory", p)
	}
	return p, err
}

// locate is input v for key: a CID as is (and no file info), else the
// path, relative to baseDir, made absolute and clean, with what it is;
// what names the kind wanted in the error for a path that is not there.
func locate(key, v, baseDir, what string) (string, os.FileInfo, error) {
	if IsCID(v) {
		return v, nil, nil
	}
	p := v
	if !filepath.IsAbs(p) {
		p = filepath.Join(baseDir, p)
	}
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil, bad(key, "%s: no such %s (and not a CID)", p, what)
	case err != nil:
		return "", nil, bad(key, "%v", err)
	}
	return filepath.Clean(p), st, nil
}
