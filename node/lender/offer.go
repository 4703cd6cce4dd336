package lender

import (
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/p2p"
)

// Owners says which account the ledger pays for a machine.
type Owners interface {
	MachineOwner(machine identity.Address) (owner identity.Address, registered bool)
}

// OfferSource is what this machine's offer says beside its lend settings:
// where it listens, what it has, and what its holds take now.
type OfferSource struct {
	Host      host.Host
	Account   identity.Address // this machine's key's account
	Moniker   string
	Site      string
	Version   string // the DeepMarket release
	Inventory func() inventory.Inventory
	Owners    Owners
	Allocated func(now time.Time) p2p.Resources
	// Links, when set, are this machine's measured links to others.
	Links func() []p2p.LinkSample
	// Reach, when set, says how other machines reach this one (p2p.ReachOf).
	Reach func() string
	// Images, when set, lists the job images this machine holds unpacked
	// (p2p.Offer.Images), at most n.
	Images func(n int) []string
	// Disk, when set, is the bytes free where workers' files and the
	// image cache go (else the inventory's, in the node's home).
	Disk func() uint64
}

// Build turns lend settings into the offer this machine announces.
func (o OfferSource) Build(s LendSettings, now time.Time) p2p.Offer {
	inv := o.Inventory()
	gpus := make([]p2p.GPU, 0, s.GPUs)
	for i := 0; i < s.GPUs && i < len(inv.GPUs); i++ {
		gpus = append(gpus, inv.GPUs[i])
	}
	addrs := p2p.FullAddrs(o.Host)
	if len(addrs) > 32 {
		addrs = addrs[:32]
	}
	lent := p2p.Resources{Cores: uint32(s.Cores), MemBytes: s.MemBytes, GPUs: uint32(len(gpus))}
	alloc := o.Allocated(now)
	alloc = p2p.Resources{Cores: min(alloc.Cores, lent.Cores), MemBytes: min(alloc.MemBytes, lent.MemBytes), GPUs: min(alloc.GPUs, lent.GPUs)}
	// The account the ledger pays for this machine: its owner's once linked.
	owner, _ := o.Owners.MachineOwner(o.Account)
	var links []p2p.LinkSample
	if o.Links != nil {
		links = o.Links()
	}
	reach := ""
	if o.Reach != nil {
		reach = o.Reach()
	}
	var images []string
	if o.Images != nil {
		images = o.Images(p2p.MaxOfferImages)
	}
	disk := inv.DiskFree
	if o.Disk != nil {
		disk = o.Disk()
	}
	return p2p.Offer{
		Links:   links,
		Reach:   reach,
		Machine: o.Host.ID().String(), Owner: string(owner),
		Moniker: o.Moniker, Site: o.Site,
		Lent:      lent,
		Allocated: alloc,
		GPUs:      gpus,
		DiskBytes: disk,
		Price:     s.Price,
		Window:    s.Window,
		Addrs:     addrs,
		Images:    images,
		Software: p2p.Software{OS: inv.OS, Arch: inv.Arch, Python: inv.Python, TensorFlow: inv.TensorFlow, Version: o.Version,
			Checking: inv.Probing},
	}
}
