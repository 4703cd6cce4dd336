package node

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/service"
	"github.com/deepmarket/deepmarket/node/web"
)

// services are what answer the API (package service), each built from
// the parts of the node it reads.
type services struct {
	status  *service.Status
	lending *service.Lending
	market  *service.Market
	data    *service.Data
	dash    *service.Dashboard
	sched   *service.Scheduling
	ledger  *service.Ledger
}

// addServices builds the API's services over the parts Run started (the
// market's, which the submitter publishes its bids through, is there
// already).
func (n *Node) addServices() {
	probe := func() inventory.Inventory { return *n.inv.Load() }
	n.svc.status = &service.Status{
		About: service.About{ChainID: n.cfg.Node.ChainID, LedgerRPC: n.cfg.Ledger.RPCListen, Moniker: n.cfg.Node.Moniker,
			Site: n.cfg.Node.Site, Version: Version, API: n.apiURL, Started: n.started},
		Host: n.host, Account: n.key.Address(), Chain: n.chain, Lender: n.lender, Book: n.book, Machine: probe,
	}
	n.svc.lending = &service.Lending{Lender: n.lender, Exec: n.exec, Holds: n.holds, Owners: n.reads, Machine: n.key.Address(),
		Host: n.host, Probe: probe, Python: n.cfg.Inventory.Python, ConfigPath: n.home.ConfigPath(), ReclaimGrace: ReclaimGrace}
	n.svc.data = &service.Data{Blocks: n.blocks, Records: n.store, Python: n.cfg.Inventory.Python, Logger: n.log.With("module", "data")}
	n.svc.dash = &service.Dashboard{Account: n.key.Address(), Machine: n.host.ID(), Moniker: n.cfg.Node.Moniker, Site: n.cfg.Node.Site,
		Prices: n.cfg.DefaultPrices(), Ledger: n.ledger, Chain: n.chain, Lender: n.lender, Exec: n.exec, Holds: n.holds,
		Book: n.book, Own: &n.own, Market: n.market, History: n.prices, Jobs: n.jobs}
	n.svc.sched = &service.Scheduling{Market: n.market, Book: n.quotes}
	n.svc.ledger = &service.Ledger{Account: n.key.Address(), Client: n.ledger, Chain: n.chain, GenesisPath: n.home.GenesisPath()}
}

// newAPIServer serves the services' answers, and the jobs', on the API.
func newAPIServer(token string, svc services, jobs api.Jobs, reg *prometheus.Registry, uploadDir string, log *slog.Logger) (*api.Server, error) {
	return api.NewServer(api.Params{
		Token: token, Status: svc.status, Lending: svc.lending, Market: svc.market, Ledger: svc.ledger,
		Data: svc.data, Sched: svc.sched, Jobs: namedImages{jobs, svc.data}, Dashboard: svc.dash, Validators: svc.dash,
		UI: web.FS(), UploadDir: uploadDir,
		// CometBFT registers its metrics process-wide; serve them beside ours.
		Gatherer: firstWins{reg, prometheus.DefaultGatherer},
		Logger:   log.With("module", "api"),
	})
}

// namedImages has a job name its image as `env add` recorded it: an
// image that is neither a CID nor a path there (relative to the job's
// directory) is looked up among the names, and the job gets its CID.
type namedImages struct {
	jobsAPI
	data *service.Data
}

// jobsAPI is api.Jobs under another name: embedded as itself, its field
// would hide its own Jobs method.
type jobsAPI = api.Jobs

func (j namedImages) Submit(ctx context.Context, req api.SubmitRequest) (*jobs.Job, error) {
	if ref := req.Spec.Image; ref != "" && !jobs.IsCID(ref) {
		p := ref
		if !filepath.IsAbs(p) {
			p = filepath.Join(req.BaseDir, p)
		}
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			c, found, err := j.data.ResolveEnv(ctx, ref)
			if err != nil {
				return nil, err
			}
			if found {
				req.Spec.Image = c
			}
		}
	}
	return j.jobsAPI.Submit(ctx, req)
}

// ReclaimGrace is how long running jobs keep a machine its owner takes
// back (lend --stop).
var ReclaimGrace = time.Minute
