package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// ErrNodeNotRunning means nothing answers at the API address.
var ErrNodeNotRunning = errors.New("node is not running")

// Client calls a node's local API.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// NewClient returns a client for the API at base (http://127.0.0.1:7700).
func NewClient(base, token string) *Client {
	return &Client{base: strings.TrimRight(base, "/"), token: token, http: &http.Client{Timeout: 60 * time.Second}}
}

// Base returns the API's base URL.
func (c *Client) Base() string { return c.base }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s (%v): start it with `deepmarket node run`", ErrNodeNotRunning, c.base, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read API answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		apiErr := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, apiErr) != nil || apiErr.Message == "" {
			apiErr.Message = fmt.Sprintf("API answered %s", resp.Status)
		}
		return apiErr
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode API answer: %w", err)
	}
	return nil
}

// Status returns the node's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	return s, c.do(ctx, http.MethodGet, "/api/v1/status", nil, &s)
}

// Inventory returns the machine's inventory.
func (c *Client) Inventory(ctx context.Context) (Inventory, error) {
	var inv Inventory
	return inv, c.do(ctx, http.MethodGet, "/api/v1/inventory", nil, &inv)
}

// Lend returns what the machine lends.
func (c *Client) Lend(ctx context.Context) (LendState, error) {
	var st LendState
	return st, c.do(ctx, http.MethodGet, "/api/v1/lend", nil, &st)
}

// SetLend changes what the machine lends and announces it.
func (c *Client) SetLend(ctx context.Context, req LendRequest) (LendState, error) {
	var st LendState
	return st, c.do(ctx, http.MethodPut, "/api/v1/lend", req, &st)
}

// StopLend withdraws the machine from the market.
func (c *Client) StopLend(ctx context.Context) (LendState, error) {
	var st LendState
	return st, c.do(ctx, http.MethodDelete, "/api/v1/lend", nil, &st)
}

// ReleaseHold drops a hold on this machine that runs no worker.
func (c *Client) ReleaseHold(ctx context.Context, id string) (LendState, error) {
	var st LendState
	return st, c.do(ctx, http.MethodDelete, "/api/v1/lend/holds/"+url.PathEscape(id), nil, &st)
}

// Offers lists the offers the node holds.
func (c *Client) Offers(ctx context.Context) ([]Offer, error) {
	var out []Offer
	return out, c.do(ctx, http.MethodGet, "/api/v1/offers", nil, &out)
}

// Peers lists connected peers.
func (c *Client) Peers(ctx context.Context) ([]Peer, error) {
	var out []Peer
	return out, c.do(ctx, http.MethodGet, "/api/v1/peers", nil, &out)
}

// Bids lists bids seen recently.
func (c *Client) Bids(ctx context.Context) ([]SeenBid, error) {
	var out []SeenBid
	return out, c.do(ctx, http.MethodGet, "/api/v1/bids", nil, &out)
}

// PublishBid gossips a bid signed by the node.
func (c *Client) PublishBid(ctx context.Context, req PublishBidRequest) (SeenBid, error) {
	var out SeenBid
	return out, c.do(ctx, http.MethodPost, "/api/v1/bids", req, &out)
}

// Balance returns an account's balance (addr empty: the node's own).
func (c *Client) Balance(ctx context.Context, addr string) (Balance, error) {
	var b Balance
	return b, c.do(ctx, http.MethodGet, "/api/v1/ledger/balance?address="+url.QueryEscape(addr), nil, &b)
}

// Record returns an account's track records as a payer and as a machine
// (addr empty: the node's own).
func (c *Client) Record(ctx context.Context, addr string) (Record, error) {
	var r Record
	return r, c.do(ctx, http.MethodGet, "/api/v1/ledger/record?address="+url.QueryEscape(addr), nil, &r)
}

// History lists what moved credits for an account, newest first.
func (c *Client) History(ctx context.Context, addr string, limit int) ([]ledger.HistoryEntry, error) {
	var h []ledger.HistoryEntry
	q := fmt.Sprintf("/api/v1/ledger/history?address=%s&limit=%d", url.QueryEscape(addr), limit)
	return h, c.do(ctx, http.MethodGet, q, nil, &h)
}

// Send transfers (or, for issuers, grants) credits and waits for commit,
// as one JSON answer (see SendStream, which hears the hash first).
func (c *Client) Send(ctx context.Context, req SendRequest) (SendResult, error) {
	var r SendResult
	return r, c.do(ctx, http.MethodPost, "/api/v1/ledger/send", req, &r)
}

// Audit replays the node's chain from genesis and reports the books.
func (c *Client) Audit(ctx context.Context) (*ledger.AuditReport, error) {
	var r ledger.AuditReport
	return &r, c.do(ctx, http.MethodGet, "/api/v1/ledger/audit", nil, &r)
}

// Prices returns the node's scheduler's current prices.
func (c *Client) Prices(ctx context.Context) (MarketPrices, error) {
	var out MarketPrices
	return out, c.do(ctx, http.MethodGet, "/api/v1/prices", nil, &out)
}

// Quote prices a job shape on the node's scheduler.
func (c *Client) Quote(ctx context.Context, req QuoteRequest) (QuoteResult, error) {
	var out QuoteResult
	return out, c.do(ctx, http.MethodPost, "/api/v1/quote", req, &out)
}

// Quotes returns the quotes received for a job this node bid.
func (c *Client) Quotes(ctx context.Context, job string) ([]ReceivedQuote, error) {
	var out []ReceivedQuote
	return out, c.do(ctx, http.MethodGet, "/api/v1/quotes?job="+url.QueryEscape(job), nil, &out)
}

// Submit submits a job (see SubmitRequest).
func (c *Client) Submit(ctx context.Context, req SubmitRequest) (*jobs.Job, error) {
	var out jobs.Job
	return &out, c.do(ctx, "POST", "/api/v1/jobs", req, &out)
}

// ConfirmJob lets a quoted job go on.
func (c *Client) ConfirmJob(ctx context.Context, id string) (*jobs.Job, error) {
	var out jobs.Job
	return &out, c.do(ctx, "POST", "/api/v1/jobs/"+url.PathEscape(id)+"/confirm", nil, &out)
}

// CancelJob stops a job.
func (c *Client) CancelJob(ctx context.Context, id string) (*jobs.Job, error) {
	var out jobs.Job
	return &out, c.do(ctx, "POST", "/api/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, &out)
}

// Job returns one job.
func (c *Client) Job(ctx context.Context, id string) (*jobs.Job, error) {
	var out jobs.Job
	return &out, c.do(ctx, "GET", "/api/v1/jobs/"+url.PathEscape(id), nil, &out)
}

// Jobs lists the jobs submitted from the node.
func (c *Client) Jobs(ctx context.Context) ([]jobs.Job, error) {
	var out []jobs.Job
	return out, c.do(ctx, "GET", "/api/v1/jobs", nil, &out)
}

// JobLogs reads a job's log from offset.
func (c *Client) JobLogs(ctx context.Context, id string, offset int64) (JobLogs, error) {
	var out JobLogs
	return out, c.do(ctx, "GET", "/api/v1/jobs/"+url.PathEscape(id)+"/logs?offset="+strconv.FormatInt(offset, 10), nil, &out)
}

// Metrics returns the node's Prometheus metrics, as text.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w at %s (%v)", ErrNodeNotRunning, c.base, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", &Error{Status: resp.StatusCode, Message: fmt.Sprintf("metrics: API answered %s", resp.Status)}
	}
	return string(b), nil
}

// LoginLink asks for a one-time link that signs a browser into the
// dashboard (it needs the API token).
func (c *Client) LoginLink(ctx context.Context) (LoginLink, error) {
	var out LoginLink
	return out, c.do(ctx, http.MethodPost, "/api/v1/ui/login-link", nil, &out)
}

// Overview returns the dashboard's summary of the account and its machines.
func (c *Client) Overview(ctx context.Context) (Overview, error) {
	var out Overview
	return out, c.do(ctx, http.MethodGet, "/api/v1/dashboard", nil, &out)
}

// Activity returns an account's ledger activity over the last days (addr
// empty: the node's own).
func (c *Client) Activity(ctx context.Context, addr string, days int) (Activity, error) {
	var out Activity
	q := fmt.Sprintf("/api/v1/ledger/activity?address=%s&days=%d", url.QueryEscape(addr), days)
	return out, c.do(ctx, http.MethodGet, q, nil, &out)
}

// PriceHistory returns the market's prices over the last hours (at most
// 24), oldest first, the last sample being now.
func (c *Client) PriceHistory(ctx context.Context, hours int) ([]PriceSample, error) {
	var out []PriceSample
	return out, c.do(ctx, http.MethodGet, "/api/v1/prices/history?hours="+strconv.Itoa(hours), nil, &out)
}

// Validators returns the ledger's validator set and pending votes.
func (c *Client) Validators(ctx context.Context) (*ledger.ValidatorSet, error) {
	var out ledger.ValidatorSet
	return &out, c.do(ctx, http.MethodGet, "/api/v1/validators", nil, &out)
}

// ReadSpec reads a job spec's TOML into its fields, on the node.
func (c *Client) ReadSpec(ctx context.Context, tomlText string) (jobs.File, error) {
	var out jobs.File
	return out, c.do(ctx, http.MethodPost, "/api/v1/jobs/spec", SpecRequest{TOML: tomlText}, &out)
}
