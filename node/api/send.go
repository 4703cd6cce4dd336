package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/deepmarket/deepmarket/ledger"
)

// ndjson is the media type of streamed answers.
const ndjson = "application/x-ndjson"

// send answers POST /api/v1/ledger/send. A client that accepts NDJSON gets
// a first line {"prepared": {hash, nonce}}, written before the node sends
// the transaction, then {"result": SendResult} or {"error", "status"}: if
// the node dies in between, the client still knows the hash to ask about.
// Other clients (the dashboard) get the SendResult as JSON, as before.
func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	if s.refuse(w, r) {
		return
	}
	var req SendRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if !strings.Contains(r.Header.Get("Accept"), ndjson) {
		res, err := s.p.Ledger.Send(r.Context(), req, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
		return
	}
	w.Header().Set("Content-Type", ndjson)
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	res, err := s.p.Ledger.Send(r.Context(), req, func(p SendPrepared) {
		enc.Encode(streamLine{Prepared: &p})
		if flusher != nil {
			flusher.Flush()
		}
	})
	if err != nil {
		apiErr := toAPIError(err)
		enc.Encode(streamLine{Error: apiErr, Status: apiErr.Status})
		return
	}
	b, _ := json.Marshal(res)
	enc.Encode(streamLine{Result: b})
}

// SendStream transfers (or, for issuers, grants) credits and waits for the
// commit, hearing the transaction's hash first (prepared may be nil). A
// refusal by the ledger is an *Error with its Code; when the outcome
// cannot be known (the node stopped after naming the transaction, or said
// it cannot tell) the error is a *ledger.UnknownOutcomeError with the
// hash (errors.Is ledger.ErrUnknownOutcome).
func (c *Client) SendStream(ctx context.Context, req SendRequest, prepared func(SendPrepared)) (SendResult, error) {
	var out SendResult
	b, err := json.Marshal(req)
	if err != nil {
		return out, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/api/v1/ledger/send", bytes.NewReader(b))
	if err != nil {
		return out, err
	}
	hreq.Header.Set("Authorization", "Bearer "+c.token)
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", ndjson)
	resp, err := (&http.Client{}).Do(hreq) // ctx bounds it: a commit can take a while
	if err != nil {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		return out, fmt.Errorf("%w at %s (%v): start it with `deepmarket node run`", ErrNodeNotRunning, c.base, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		apiErr := &Error{Status: resp.StatusCode}
		if json.NewDecoder(resp.Body).Decode(apiErr) != nil || apiErr.Message == "" {
			apiErr.Message = fmt.Sprintf("API answered %s", resp.Status)
		}
		return out, apiErr
	}
	hash := ""
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line streamLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return out, lost(hash, fmt.Sprintf("unreadable answer: %v", err))
		}
		switch {
		case line.Prepared != nil:
			hash = line.Prepared.Hash
			if prepared != nil {
				prepared(*line.Prepared)
			}
		case line.Error != nil:
			line.Error.Status = line.Status
			if line.Error.Outcome == OutcomeUnknown {
				return out, &ledger.UnknownOutcomeError{Hash: line.Error.Hash, Reason: line.Error.Message}
			}
			return out, line.Error
		case line.Result != nil:
			return out, json.Unmarshal(line.Result, &out)
		}
	}
	reason := "the node closed the answer early (did it stop?)"
	if err := sc.Err(); err != nil {
		reason = fmt.Sprintf("the answer broke off: %v", err)
	}
	return out, lost(hash, reason)
}

// lost is a send whose answer broke off: if the node named the
// transaction, its outcome is unknown (it may commit, now or when the
// node restarts and sends it again); if not, nothing says it was sent,
// but nothing says it was not.
func lost(hash, reason string) error {
	if hash == "" {
		return &ledger.UnknownOutcomeError{Reason: reason + ", before naming the transaction"}
	}
	return &ledger.UnknownOutcomeError{Hash: hash, Reason: reason}
}

// TxStatus tells what became of a transaction (`ledger tx HASH`).
func (c *Client) TxStatus(ctx context.Context, hash string) (ledger.TxStatus, error) {
	var st ledger.TxStatus
	return st, c.do(ctx, http.MethodGet, "/api/v1/ledger/tx/"+hash, nil, &st)
}

// Consent has the node sign, as its machine, a consent to earn into
// owner's account (`ledger consent`).
func (c *Client) Consent(ctx context.Context, req ConsentRequest) (Consent, error) {
	var r Consent
	return r, c.do(ctx, http.MethodPost, "/api/v1/ledger/consent", req, &r)
}
