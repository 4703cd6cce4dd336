package api

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/jobs"
)

//go:embed openapi.json
var openAPI []byte

// The node implements these; each is what one group of routes needs.
type (
	// StatusSource answers /status and /inventory.
	StatusSource interface {
		Status() Status
		Inventory() Inventory
	}
	// Lending answers /lend.
	Lending interface {
		Lend() LendState
		SetLend(ctx context.Context, req LendRequest) (LendState, error)
		StopLend(ctx context.Context) error
		// ReleaseHold drops a hold on this machine that runs no worker.
		ReleaseHold(id string) error
	}
	// Market answers /offers, /bids and /peers.
	Market interface {
		Offers() []Offer
		Bids() []SeenBid
		PublishBid(ctx context.Context, req PublishBidRequest) (SeenBid, error)
		Peers() []Peer
	}
	// Data answers /data/...: datasets by content address.
	Data interface {
		DataAdd(ctx context.Context, req DataAddRequest, progress func(Progress)) (DataPin, error)
		DataGet(ctx context.Context, req DataGetRequest, progress func(Progress)) (DataGetResult, error)
		DataList(ctx context.Context) ([]DataPin, error)
		DataRemove(ctx context.Context, cid string) error
		DataGC(ctx context.Context) (DataGCResult, error)
		// Images added here (env add), by name or CID.
		EnvRecord(ctx context.Context, req EnvRecordRequest) (EnvImage, error)
		EnvBuild(ctx context.Context, req EnvBuildRequest, progress func(Progress)) (EnvImage, error)
		EnvList(ctx context.Context) ([]EnvImage, error)
		EnvShow(ctx context.Context, ref string) (EnvImage, error)
		EnvRemove(ctx context.Context, ref string) (EnvImage, error)
	}
	// Scheduling answers /prices and /quote.
	Scheduling interface {
		MarketPrices(ctx context.Context) (MarketPrices, error)
		QuoteJob(ctx context.Context, req QuoteRequest) (QuoteResult, error)
		Quotes(ctx context.Context, job string) ([]ReceivedQuote, error)
	}
	// Jobs answers /jobs/...: jobs submitted from this node.
	Jobs interface {
		Submit(ctx context.Context, req SubmitRequest) (*jobs.Job, error)
		Confirm(ctx context.Context, id string) (*jobs.Job, error)
		Cancel(ctx context.Context, id string) (*jobs.Job, error)
		Job(ctx context.Context, id string) (*jobs.Job, error)
		Jobs(ctx context.Context) ([]jobs.Job, error)
		Logs(ctx context.Context, id string, offset int64) (JobLogs, error)
	}
	// Ledger answers /ledger/...
	Ledger interface {
		Balance(ctx context.Context, addr string) (Balance, error)
		History(ctx context.Context, addr string, limit int) ([]ledger.HistoryEntry, error)
		// Record is an account's track records, as a payer and as a machine.
		Record(ctx context.Context, addr string) (Record, error)
		// Send signs, sends and waits for a transfer or grant; it calls
		// prepared with the transaction's hash before sending it.
		Send(ctx context.Context, req SendRequest, prepared func(SendPrepared)) (SendResult, error)
		TxStatus(ctx context.Context, hash string) (ledger.TxStatus, error)
		Audit(ctx context.Context) (*ledger.AuditReport, error)
		// Consent signs, as this machine, a consent to earn into another
		// account (which that account's node sends as a link).
		Consent(ctx context.Context, req ConsentRequest) (Consent, error)
	}
)

// FieldError is implemented by validation errors that can name the request
// field at fault.
type FieldError interface {
	error
	Field() string
}

// Params configures NewServer.
type Params struct {
	Token      string
	Status     StatusSource
	Lending    Lending
	Market     Market
	Ledger     Ledger
	Data       Data
	Sched      Scheduling
	Jobs       Jobs
	Dashboard  Dashboard
	Validators Validators
	Gatherer   prometheus.Gatherer // what /metrics serves
	Logger     *slog.Logger
	// UI is the dashboard (package node/web): index.html, login.html and
	// assets/. Nil serves no dashboard.
	UI fs.FS
	// UploadDir is where the dashboard's uploads and downloads are staged
	// (emptied after each); empty takes none.
	UploadDir string
}

// Server is the node's local API.
type Server struct {
	p        Params
	mux      *http.ServeMux
	sessions *sessions
	routes   []string // the patterns registered, for the OpenAPI check
}

// NewServer builds the API's routes.
func NewServer(p Params) (*Server, error) {
	s := &Server{p: p, mux: http.NewServeMux(), sessions: newSessions(nil)}
	s.routeService()
	s.routeLend()
	s.routeMarket()
	s.routeLedger()
	s.routeData()
	s.routeScheduling()
	s.routeJobs()
	s.routeDashboard()
	if err := s.routeUI(); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, &Error{Message: "no such endpoint: " + r.Method + " " + r.URL.Path + " (see /api/v1/openapi.json)"})
	})
	return s, nil
}

// routeService registers what is about the node itself: its health, its
// metrics, the API's description, /status and /inventory.
func (s *Server) routeService() {
	p := s.p
	s.handleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	metrics := promhttp.HandlerFor(p.Gatherer, promhttp.HandlerOpts{})
	s.handleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		// A Prometheus on this machine scrapes 127.0.0.1 without a token;
		// any other Host is a page whose DNS name points here (rebinding)
		// and needs the token like the rest of the API.
		if !loopbackHost(r.Host) {
			if kind, _ := s.who(r); kind != authBearer {
				writeJSON(w, http.StatusForbidden, &Error{Message: "metrics are served to this machine only: scrape 127.0.0.1 or localhost, or send the API token"})
				return
			}
		}
		metrics.ServeHTTP(w, r)
	})
	s.handleFunc("GET /api/v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI)
	})
	s.handle("GET /api/v1/status", func(r *http.Request) (any, error) { return p.Status.Status(), nil })
	s.handle("GET /api/v1/inventory", func(r *http.Request) (any, error) { return p.Status.Inventory(), nil })
}

// routeLend registers /lend: lending this machine and the holds on it.
func (s *Server) routeLend() {
	p := s.p
	s.handle("GET /api/v1/lend", func(r *http.Request) (any, error) { return p.Lending.Lend(), nil })
	s.handle("PUT /api/v1/lend", func(r *http.Request) (any, error) {
		var req LendRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Lending.SetLend(r.Context(), req)
	})
	s.handle("DELETE /api/v1/lend", func(r *http.Request) (any, error) {
		if err := p.Lending.StopLend(r.Context()); err != nil {
			return nil, err
		}
		return p.Lending.Lend(), nil
	})
	s.handle("DELETE /api/v1/lend/holds/{id}", func(r *http.Request) (any, error) {
		if err := p.Lending.ReleaseHold(r.PathValue("id")); err != nil {
			return nil, err
		}
		return p.Lending.Lend(), nil
	})
}

// routeMarket registers /offers, /peers and /bids.
func (s *Server) routeMarket() {
	p := s.p
	s.handle("GET /api/v1/offers", func(r *http.Request) (any, error) { return nonNil(p.Market.Offers()), nil })
	s.handle("GET /api/v1/peers", func(r *http.Request) (any, error) { return nonNil(p.Market.Peers()), nil })
	s.handle("GET /api/v1/bids", func(r *http.Request) (any, error) { return nonNil(p.Market.Bids()), nil })
	s.handle("POST /api/v1/bids", func(r *http.Request) (any, error) {
		var req PublishBidRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Market.PublishBid(r.Context(), req)
	})
}

// routeLedger registers /ledger/...: balances, history, transfers,
// consents and the audit.
func (s *Server) routeLedger() {
	p := s.p
	s.handle("GET /api/v1/ledger/balance", func(r *http.Request) (any, error) {
		return p.Ledger.Balance(r.Context(), r.URL.Query().Get("address"))
	})
	s.handle("GET /api/v1/ledger/history", func(r *http.Request) (any, error) {
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		h, err := p.Ledger.History(r.Context(), r.URL.Query().Get("address"), limit)
		return nonNil(h), err
	})
	s.handle("GET /api/v1/ledger/record", func(r *http.Request) (any, error) {
		return p.Ledger.Record(r.Context(), r.URL.Query().Get("address"))
	})
	s.handleFunc("POST /api/v1/ledger/send", s.send)
	s.handle("GET /api/v1/ledger/tx/{hash}", func(r *http.Request) (any, error) {
		return p.Ledger.TxStatus(r.Context(), r.PathValue("hash"))
	})
	s.handle("POST /api/v1/ledger/consent", func(r *http.Request) (any, error) {
		var req ConsentRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Ledger.Consent(r.Context(), req)
	})
	s.handle("GET /api/v1/ledger/audit", func(r *http.Request) (any, error) { return p.Ledger.Audit(r.Context()) })
}

// routeData registers /data/...: datasets by content address.
func (s *Server) routeData() {
	p := s.p
	s.stream("POST /api/v1/data/add", func(r *http.Request, progress func(Progress)) (any, error) {
		var req DataAddRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Data.DataAdd(r.Context(), req, progress)
	})
	s.stream("POST /api/v1/data/get", func(r *http.Request, progress func(Progress)) (any, error) {
		var req DataGetRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Data.DataGet(r.Context(), req, progress)
	})
	s.handle("GET /api/v1/data", func(r *http.Request) (any, error) {
		l, err := p.Data.DataList(r.Context())
		return nonNil(l), err
	})
	s.handle("DELETE /api/v1/data/{cid}", func(r *http.Request) (any, error) {
		return map[string]string{"removed": r.PathValue("cid")}, p.Data.DataRemove(r.Context(), r.PathValue("cid"))
	})
	s.handle("POST /api/v1/data/gc", func(r *http.Request) (any, error) { return p.Data.DataGC(r.Context()) })
	s.handle("POST /api/v1/envs", func(r *http.Request) (any, error) {
		var req EnvRecordRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Data.EnvRecord(r.Context(), req)
	})
	s.stream("POST /api/v1/envs/build", func(r *http.Request, progress func(Progress)) (any, error) {
		var req EnvBuildRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Data.EnvBuild(r.Context(), req, progress)
	})
	s.handle("GET /api/v1/envs", func(r *http.Request) (any, error) {
		l, err := p.Data.EnvList(r.Context())
		return nonNil(l), err
	})
	s.handle("GET /api/v1/envs/{ref}", func(r *http.Request) (any, error) { return p.Data.EnvShow(r.Context(), r.PathValue("ref")) })
	s.handle("DELETE /api/v1/envs/{ref}", func(r *http.Request) (any, error) { return p.Data.EnvRemove(r.Context(), r.PathValue("ref")) })
}

// routeScheduling registers /prices, /quote and /quotes.
func (s *Server) routeScheduling() {
	p := s.p
	s.handle("GET /api/v1/prices", func(r *http.Request) (any, error) { return p.Sched.MarketPrices(r.Context()) })
	s.handle("POST /api/v1/quote", func(r *http.Request) (any, error) {
		var req QuoteRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Sched.QuoteJob(r.Context(), req)
	})
	s.handle("GET /api/v1/quotes", func(r *http.Request) (any, error) {
		q, err := p.Sched.Quotes(r.Context(), r.URL.Query().Get("job"))
		return nonNil(q), err
	})
}

// routeJobs registers /jobs/...: jobs submitted from this node.
func (s *Server) routeJobs() {
	p := s.p
	s.handle("POST /api/v1/jobs", func(r *http.Request) (any, error) {
		var req SubmitRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return p.Jobs.Submit(r.Context(), req)
	})
	s.handle("GET /api/v1/jobs", func(r *http.Request) (any, error) {
		l, err := p.Jobs.Jobs(r.Context())
		return nonNil(l), err
	})
	s.handle("GET /api/v1/jobs/{id}", func(r *http.Request) (any, error) { return p.Jobs.Job(r.Context(), r.PathValue("id")) })
	s.handle("POST /api/v1/jobs/{id}/confirm", func(r *http.Request) (any, error) { return p.Jobs.Confirm(r.Context(), r.PathValue("id")) })
	s.handle("POST /api/v1/jobs/{id}/cancel", func(r *http.Request) (any, error) { return p.Jobs.Cancel(r.Context(), r.PathValue("id")) })
	s.handle("GET /api/v1/jobs/{id}/logs", func(r *http.Request) (any, error) {
		off, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
		return p.Jobs.Logs(r.Context(), r.PathValue("id"), off)
	})
}

// nonNil makes a nil list an empty one, which JSON writes as [] not null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// handleFunc registers a route as it is.
func (s *Server) handleFunc(pattern string, fn http.HandlerFunc) {
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, fn)
}

// handle registers a token-guarded JSON route.
func (s *Server) handle(pattern string, fn func(*http.Request) (any, error)) {
	s.handleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if s.refuse(w, r) {
			return
		}
		out, err := fn(r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
}

// maxBody bounds request bodies; the API takes small JSON documents only.
const maxBody = 1 << 20

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &Error{Status: http.StatusBadRequest, Message: "bad request body: " + err.Error()}
	}
	return nil
}

func writeError(w http.ResponseWriter, err error) {
	e := toAPIError(err)
	writeJSON(w, e.Status, e)
}

// faultStatus is the one table from the roles' kinds of failure to HTTP.
var faultStatus = map[fault.Kind]int{
	fault.Internal:    http.StatusInternalServerError,
	fault.Malformed:   http.StatusBadRequest,
	fault.Invalid:     http.StatusUnprocessableEntity,
	fault.NotFound:    http.StatusNotFound,
	fault.Conflict:    http.StatusConflict,
	fault.Unavailable: http.StatusServiceUnavailable,
	fault.Timeout:     http.StatusGatewayTimeout,
}

// toAPIError maps an error to the API's error document and status.
func toAPIError(err error) *Error {
	var apiErr *Error
	var fe *fault.Error
	var fieldErr FieldError
	var unknown *ledger.UnknownOutcomeError
	var refused *ledger.Error
	switch {
	// The ledger's answers: an outcome not known in time names the
	// transaction, which may still commit; a refusal carries its code.
	case errors.As(err, &unknown):
		return &Error{Status: http.StatusGatewayTimeout, Message: err.Error(), Hash: unknown.Hash, Outcome: OutcomeUnknown}
	case errors.As(err, &refused):
		return &Error{Status: http.StatusUnprocessableEntity, Code: refused.Code, Message: refused.Reason}
	case errors.Is(err, ledger.ErrNotSent):
		return &Error{Status: http.StatusServiceUnavailable, Message: err.Error()}
	case errors.As(err, &apiErr):
		e := *apiErr
		if e.Status == 0 {
			e.Status = http.StatusBadRequest
		}
		return &e
	case errors.As(err, &fe):
		status, ok := faultStatus[fe.Kind]
		if !ok {
			status = http.StatusInternalServerError
		}
		return &Error{Status: status, Message: err.Error(), Field: fe.Field}
	case errors.As(err, &fieldErr):
		return &Error{Status: http.StatusUnprocessableEntity, Message: err.Error(), Field: fieldErr.Field()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusServiceUnavailable, Message: err.Error()}
	default:
		return &Error{Status: http.StatusInternalServerError, Message: err.Error()}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// Serve answers requests on ln until ctx ends, then shuts down gracefully
// within two seconds.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.p.Logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}

// Handler exposes the routes, for tests.
func (s *Server) Handler() http.Handler { return s.mux }
