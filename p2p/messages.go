package p2p

import (
	"fmt"
	"regexp"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/deepmarket/deepmarket/identity"
)

// Payload types carried in Envelope.Type. A version suffix lets a later
// release add a type without confusing older nodes, which reject it.
const (
	TypeOffer      = "offer/1"
	TypeWithdrawal = "withdrawal/1"
	TypeBid        = "bid/1"
)

// Range limits: anything past them is absurd for a lab machine or a job and
// is rejected at the door.
const (
	MaxCores       = 4096
	MaxMemBytes    = 64 << 40 // 64 TiB
	MaxGPUs        = 64
	MaxDiskBytes   = 1 << 50 // 1 PiB
	MaxUnitPrice   = 1_000_000_000_000
	MaxWorkers     = 1024
	MaxJobPrice    = 1_000_000_000_000_000
	MaxJobDuration = 30 * 24 * time.Hour
	maxAddrs       = 32
	maxAddrLen     = 256
	maxLabelLen    = 64
	maxTextLen     = 256
)

// Resources is an amount of each schedulable resource.
type Resources struct {
	Cores    uint32 `cbor:"cores" json:"cores"`
	MemBytes uint64 `cbor:"mem" json:"mem_bytes"`
	GPUs     uint32 `cbor:"gpus" json:"gpus"`
}

// GPU describes one lent GPU.
type GPU struct {
	Index    uint32 `cbor:"index" json:"index"`
	Model    string `cbor:"model" json:"model"`
	MemBytes uint64 `cbor:"mem" json:"mem_bytes"`
}

// Prices are reserve prices in micro-credits per resource-hour.
type Prices struct {
	CoreHour   uint64 `cbor:"core_h" json:"core_hour"`
	MemGiBHour uint64 `cbor:"mem_gib_h" json:"mem_gib_hour"`
	GPUHour    uint64 `cbor:"gpu_h" json:"gpu_hour"`
}

// PerHour returns the price of r for one hour, rounding memory up to whole
// micro-credits.
func (p Prices) PerHour(r Resources) uint64 {
	mem := (r.MemBytes + (1<<30 - 1)) >> 30 // whole GiB, rounded up
	return uint64(r.Cores)*p.CoreHour + mem*p.MemGiBHour + uint64(r.GPUs)*p.GPUHour
}

// Software is what a machine can run.
type Software struct {
	OS         string `cbor:"os" json:"os"`
	Arch       string `cbor:"arch" json:"arch"`
	Python     string `cbor:"python,omitempty" json:"python,omitempty"`
	TensorFlow string `cbor:"tf,omitempty" json:"tensorflow,omitempty"`
	Version    string `cbor:"dm" json:"deepmarket"`
	// Checking says the machine's node has not finished probing its
	// Python yet (seconds after it starts): TensorFlow may come.
	Checking bool `cbor:"chk,omitempty" json:"checking,omitempty"`
}

// Offer is a machine's announcement of what it lends. It is signed by the
// machine's own key, so Machine always equals the signer's peer ID.
type Offer struct {
	Machine        string    `cbor:"machine" json:"machine"`
	Owner          string    `cbor:"owner" json:"owner"`
	Moniker        string    `cbor:"moniker" json:"moniker"`
	Site           string    `cbor:"site" json:"site"`
	Lent           Resources `cbor:"lent" json:"lent"`
	GPUs           []GPU     `cbor:"gpu_models,omitempty" json:"gpu_models,omitempty"`
	DiskBytes      uint64    `cbor:"disk" json:"disk_bytes"`
	Allocated      Resources `cbor:"alloc" json:"allocated"`
	Price          Prices    `cbor:"price" json:"price"`
	Window         string    `cbor:"window,omitempty" json:"window,omitempty"`
	AvailableUntil int64     `cbor:"until,omitempty" json:"available_until,omitempty"` // unix seconds; 0: no end
	Addrs          []string  `cbor:"addrs" json:"addrs"`
	Software       Software  `cbor:"sw" json:"software"`
	// Links are the machine's own measurements of its paths to other
	// machines (see LinkMeter), for schedulers predicting a job's time.
	Links []LinkSample `cbor:"links,omitempty" json:"links,omitempty"`
	// Reach is how other machines reach this one (ReachOf): ReachPublic,
	// ReachNAT, ReachRelay, or empty while the machine does not know.
	Reach string `cbor:"reach,omitempty" json:"reach,omitempty"`
	// Images are the CIDs of the job images the machine holds unpacked
	// (the layouts jobs named), most recently used first, at most
	// MaxOfferImages: a job in one of them starts there without fetching
	// it, so schedulers prefer the machine (a warm start).
	Images []string `cbor:"images,omitempty" json:"images,omitempty"`
}

// MaxOfferImages bounds the images an offer lists.
const MaxOfferImages = 16

// HoldsImage reports whether the offer says its machine holds image, a
// layout's CID.
func (o *Offer) HoldsImage(image string) bool {
	return image != "" && slices.Contains(o.Images, image)
}

// Cold starts: a machine that does not hold a job's image fetches it over
// bitswap, checks its layers and unpacks it before the worker runs. make
// bench-env measures about a second for a small image on one machine;
// coldRate is a campus link's share and an unpack together.
const (
	coldStart = time.Second
	coldRate  = 20 << 20 // bytes a second
)

// ColdStart is how long a machine that does not hold an image of bytes
// takes to get ready for a job in it, as schedulers price it and
// submitters compare quotes.
func ColdStart(bytes uint64) time.Duration {
	return coldStart + time.Duration(float64(bytes)/coldRate*float64(time.Second))
}

// Withdrawal takes a machine's offer off the market at once.
type Withdrawal struct {
	Machine string `cbor:"machine" json:"machine"`
	Reason  string `cbor:"reason,omitempty" json:"reason,omitempty"`
}

// Bid is a job looking for machines.
type Bid struct {
	JobID      string    `cbor:"job" json:"job_id"` // hex SHA-256 of the job spec
	Submitter  string    `cbor:"submitter" json:"submitter"`
	Workers    uint32    `cbor:"workers" json:"workers"`
	PerWorker  Resources `cbor:"per_worker" json:"per_worker"`
	MaxPrice   uint64    `cbor:"max_price" json:"max_price"`
	Deadline   int64     `cbor:"deadline,omitempty" json:"deadline,omitempty"` // unix seconds; 0: none
	Duration   int64     `cbor:"duration" json:"duration_s"`                   // expected, seconds
	BundleCID  string    `cbor:"bundle,omitempty" json:"bundle_cid,omitempty"`
	DatasetCID string    `cbor:"dataset,omitempty" json:"dataset_cid,omitempty"`
	Framework  string    `cbor:"framework" json:"framework"`
	Site       string    `cbor:"site,omitempty" json:"site,omitempty"`
	// Training, when the spec has it: how the workers synchronize and,
	// when given, the work, so quotes can predict the job's time.
	Training *Training `cbor:"training,omitempty" json:"training,omitempty"`
	// Floor is the share of each machine's price the job pays for the
	// wall time its worker runs, whatever its rounds or progress
	// (MinFloor to 1; 0: none, which lenders refuse by default).
	Floor float64 `cbor:"floor,omitempty" json:"floor,omitempty"`
	// Image is the CID of the job's image (an OCI layout), when it has
	// one, and ImageBytes its size: a machine that does not hold it
	// fetches and unpacks it first, which quotes count.
	Image      string `cbor:"image,omitempty" json:"image_cid,omitempty"`
	ImageBytes uint64 `cbor:"image_bytes,omitempty" json:"image_bytes,omitempty"`
}

// Floor bounds: a job pays each machine at least MinFloor of its price
// for the time its worker runs; DefaultFloor when the spec says nothing.
const (
	MinFloor     = 0.25
	DefaultFloor = 0.5
)

// Frameworks a bid may name.
var Frameworks = map[string]bool{"tensorflow": true, "torch": true, "generic": true}

var (
	labelRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._ -]*$`)
	jobIDRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	cidRE   = regexp.MustCompile(`^[A-Za-z0-9]{1,128}$`)
)

func rangeErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrOutOfRange, fmt.Sprintf(format, args...))
}

func checkLabel(field, s string, required bool) error {
	if s == "" {
		if required {
			return rangeErr("%s is empty", field)
		}
		return nil
	}
	if len(s) > maxLabelLen || !labelRE.MatchString(s) {
		return rangeErr("%s %q: letters, digits, '.', '_', '-' and spaces, at most %d", field, s, maxLabelLen)
	}
	return nil
}

func (r Resources) check(field string, needCores bool) error {
	if needCores && (r.Cores == 0 || r.MemBytes == 0) {
		return rangeErr("%s: cores and memory must be positive", field)
	}
	if r.Cores > MaxCores || r.MemBytes > MaxMemBytes || r.GPUs > MaxGPUs {
		return rangeErr("%s: %d cores, %d bytes, %d GPUs exceeds %d cores, %d bytes, %d GPUs",
			field, r.Cores, r.MemBytes, r.GPUs, MaxCores, uint64(MaxMemBytes), MaxGPUs)
	}
	return nil
}

// Validate checks an offer's values; signer is the envelope's verified
// signer, which must be the machine itself.
func (o *Offer) Validate(signer peer.ID) error {
	id, err := peer.Decode(o.Machine)
	if err != nil {
		return rangeErr("machine %q is not a peer ID", o.Machine)
	}
	switch o.Reach {
	case "", ReachPublic, ReachNAT, ReachRelay:
	default:
		return rangeErr("reach %q: want public, nat or relay", o.Reach)
	}
	if id != signer {
		return fmt.Errorf("%w: offer for machine %s signed by %s", ErrSignerMismatch, id, signer)
	}
	if _, err := identity.ParseAddress(o.Owner); err != nil {
		return rangeErr("owner: %v", err)
	}
	if err := checkLabel("moniker", o.Moniker, false); err != nil {
		return err
	}
	if err := checkLabel("site", o.Site, false); err != nil {
		return err
	}
	if err := o.Lent.check("lent", true); err != nil {
		return err
	}
	if err := o.Allocated.check("allocated", false); err != nil {
		return err
	}
	if o.Allocated.Cores > o.Lent.Cores || o.Allocated.MemBytes > o.Lent.MemBytes || o.Allocated.GPUs > o.Lent.GPUs {
		return rangeErr("allocation exceeds what is lent")
	}
	if len(o.GPUs) != int(o.Lent.GPUs) {
		return rangeErr("%d GPU models for %d GPUs", len(o.GPUs), o.Lent.GPUs)
	}
	for _, g := range o.GPUs {
		if len(g.Model) > maxTextLen || g.MemBytes > MaxMemBytes {
			return rangeErr("GPU %d description", g.Index)
		}
	}
	if o.DiskBytes > MaxDiskBytes {
		return rangeErr("disk %d bytes", o.DiskBytes)
	}
	if o.Price.CoreHour > MaxUnitPrice || o.Price.MemGiBHour > MaxUnitPrice || o.Price.GPUHour > MaxUnitPrice {
		return rangeErr("price above %d micro-credits per unit-hour", MaxUnitPrice)
	}
	if o.Window != "" {
		if _, err := ParseWindow(o.Window); err != nil {
			return rangeErr("window: %v", err)
		}
	}
	if err := checkLinks(o.Machine, o.Links); err != nil {
		return err
	}
	if o.AvailableUntil < 0 {
		return rangeErr("available_until is negative")
	}
	if len(o.Addrs) > maxAddrs {
		return rangeErr("%d addresses, at most %d", len(o.Addrs), maxAddrs)
	}
	for _, a := range o.Addrs {
		if len(a) > maxAddrLen {
			return rangeErr("address longer than %d", maxAddrLen)
		}
		if _, err := ma.NewMultiaddr(a); err != nil {
			return rangeErr("address %q: %v", a, err)
		}
	}
	if len(o.Images) > MaxOfferImages {
		return rangeErr("%d images, at most %d", len(o.Images), MaxOfferImages)
	}
	for _, c := range o.Images {
		if !cidRE.MatchString(c) {
			return rangeErr("image CID %q", c)
		}
	}
	sw := o.Software
	if len(sw.OS) > maxLabelLen || len(sw.Arch) > maxLabelLen || len(sw.Python) > maxLabelLen ||
		len(sw.TensorFlow) > maxLabelLen || len(sw.Version) > maxLabelLen {
		return rangeErr("software labels longer than %d", maxLabelLen)
	}
	return nil
}

// Validate checks a withdrawal against its signer.
func (w *Withdrawal) Validate(signer peer.ID) error {
	id, err := peer.Decode(w.Machine)
	if err != nil {
		return rangeErr("machine %q is not a peer ID", w.Machine)
	}
	if id != signer {
		return fmt.Errorf("%w: withdrawal for machine %s signed by %s", ErrSignerMismatch, id, signer)
	}
	if len(w.Reason) > maxTextLen {
		return rangeErr("reason longer than %d", maxTextLen)
	}
	return nil
}

// Validate checks a bid's values.
func (b *Bid) Validate() error {
	if !jobIDRE.MatchString(b.JobID) {
		return rangeErr("job ID %q is not a hex SHA-256", b.JobID)
	}
	if _, err := identity.ParseAddress(b.Submitter); err != nil {
		return rangeErr("submitter: %v", err)
	}
	if b.Workers == 0 || b.Workers > MaxWorkers {
		return rangeErr("workers %d not in 1..%d", b.Workers, MaxWorkers)
	}
	if err := b.PerWorker.check("per_worker", true); err != nil {
		return err
	}
	if b.MaxPrice == 0 || b.MaxPrice > MaxJobPrice {
		return rangeErr("max price %d not in 1..%d", b.MaxPrice, uint64(MaxJobPrice))
	}
	if b.Duration <= 0 || b.Duration > int64(MaxJobDuration/time.Second) {
		return rangeErr("duration %ds not in 1..%d", b.Duration, int64(MaxJobDuration/time.Second))
	}
	if b.Deadline < 0 {
		return rangeErr("deadline is negative")
	}
	for _, c := range []string{b.BundleCID, b.DatasetCID, b.Image} {
		if c != "" && !cidRE.MatchString(c) {
			return rangeErr("CID %q", c)
		}
	}
	if b.Image == "" && b.ImageBytes != 0 || b.ImageBytes > MaxDiskBytes {
		return rangeErr("image of %d bytes", b.ImageBytes)
	}
	if !Frameworks[b.Framework] {
		return rangeErr("framework %q (want tensorflow, torch or generic)", b.Framework)
	}
	if b.Training != nil {
		if err := b.Training.Validate(); err != nil {
			return err
		}
		if err := b.Training.ValidateInputs(); err != nil {
			return err
		}
	}
	if b.Floor != 0 && !(b.Floor >= MinFloor && b.Floor <= 1) {
		return rangeErr("floor %g (want %g to 1)", b.Floor, MinFloor)
	}
	return checkLabel("site", b.Site, false)
}

// Clip shortens s to at most n bytes for a text field of a message (a
// reason, say), cut at a character boundary and ending in "…" when cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ell = "…"
	cut := max(0, n-len(ell))
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if n < len(ell) {
		return s[:cut]
	}
	return s[:cut] + ell
}
