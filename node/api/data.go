package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// DataPin is a dataset (or any file or tree) the node keeps. Size is the
// bytes of all its blocks: what the disk holds and the network moves.
type DataPin struct {
	CID     string    `json:"cid"`
	Name    string    `json:"name,omitempty"`
	Kind    string    `json:"kind"` // file, directory, symlink
	Size    int64     `json:"size"`
	AddedAt time.Time `json:"added_at"`
	// Partial marks a get that has not finished; its blocks are kept and
	// the next get of the same CID resumes from them.
	Partial bool `json:"partial,omitempty"`
}

// DataAddRequest asks the node to import a path on its machine.
type DataAddRequest struct {
	Path string `json:"path"` // absolute
}

// DataGetRequest asks the node to fetch a CID and write it to Out.
type DataGetRequest struct {
	CID string `json:"cid"`
	Out string `json:"out"` // absolute; a directory root becomes this directory
}

// DataGetResult is a finished get.
type DataGetResult struct {
	DataPin
	Path string `json:"path"` // where it was written
}

// DataGCResult is what `data gc` removed.
type DataGCResult struct {
	RemovedBlocks  int      `json:"removed_blocks"`
	RemovedBytes   int64    `json:"removed_bytes"`
	ReclaimedBytes int64    `json:"reclaimed_bytes"`
	KeptBlocks     int      `json:"kept_blocks"`
	Incomplete     []string `json:"incomplete,omitempty"`
}

// Progress reports a long operation: Done of Total bytes (Total 0 while
// unknown), or a Step, a line of what it does (an image build's steps and
// its pip's output).
type Progress struct {
	Done   int64  `json:"done"`
	Total  int64  `json:"total"`
	Blocks int    `json:"blocks"`
	Step   string `json:"step,omitempty"`
}

// streamLine is one line of a streamed answer (NDJSON): progress lines,
// then one result or one error.
type streamLine struct {
	Progress *Progress       `json:"progress,omitempty"`
	Prepared *SendPrepared   `json:"prepared,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    *Error          `json:"error,omitempty"`
	Status   int             `json:"status,omitempty"`
}

// stream registers a token-guarded route whose answer is NDJSON: a
// progress line at most every 200 ms while fn runs, then its result or
// error. The client's disconnecting cancels fn.
func (s *Server) stream(pattern string, fn func(r *http.Request, progress func(Progress)) (any, error)) {
	s.handleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if s.refuse(w, r) {
			return
		}
		streamHandler(w, r, fn)
	})
}

// streamHandler writes fn's progress and outcome as NDJSON.
func streamHandler(w http.ResponseWriter, r *http.Request, fn func(r *http.Request, progress func(Progress)) (any, error)) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	var last time.Time
	progress := func(p Progress) {
		if time.Since(last) < 200*time.Millisecond && p.Done != p.Total {
			return
		}
		last = time.Now()
		enc.Encode(streamLine{Progress: &p})
		if flusher != nil {
			flusher.Flush()
		}
	}
	out, err := fn(r, progress)
	if err != nil {
		apiErr := toAPIError(err)
		enc.Encode(streamLine{Error: apiErr, Status: apiErr.Status})
		return
	}
	b, err := json.Marshal(out)
	if err != nil {
		enc.Encode(streamLine{Error: &Error{Message: err.Error()}, Status: http.StatusInternalServerError})
		return
	}
	enc.Encode(streamLine{Result: b})
}

// doStream calls a streamed route, passing progress lines to progress
// (may be nil) and decoding the result into out.
func (c *Client) doStream(ctx context.Context, method, path string, in, out any, progress func(Progress)) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	// No overall timeout: a dataset can take long. ctx bounds it.
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w at %s (%v): start it with `deepmarket node run`", ErrNodeNotRunning, c.base, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		apiErr := &Error{Status: resp.StatusCode}
		if json.NewDecoder(resp.Body).Decode(apiErr) != nil || apiErr.Message == "" {
			apiErr.Message = fmt.Sprintf("API answered %s", resp.Status)
		}
		return apiErr
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var line streamLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("decode API answer: %w", err)
		}
		switch {
		case line.Progress != nil:
			if progress != nil {
				progress(*line.Progress)
			}
		case line.Error != nil:
			line.Error.Status = line.Status
			return line.Error
		case line.Result != nil:
			if out == nil {
				return nil
			}
			return json.Unmarshal(line.Result, out)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read API answer: %w", err)
	}
	return errors.New("the node closed the answer early (did it stop?)")
}

// DataAdd imports a path on the node's machine and pins it.
func (c *Client) DataAdd(ctx context.Context, path string, progress func(Progress)) (DataPin, error) {
	var p DataPin
	return p, c.doStream(ctx, http.MethodPost, "/api/v1/data/add", DataAddRequest{Path: path}, &p, progress)
}

// DataGet fetches a CID (resuming from blocks the node has), pins it and
// writes it to out on the node's machine.
func (c *Client) DataGet(ctx context.Context, cid, out string, progress func(Progress)) (DataGetResult, error) {
	var r DataGetResult
	return r, c.doStream(ctx, http.MethodPost, "/api/v1/data/get", DataGetRequest{CID: cid, Out: out}, &r, progress)
}

// DataList lists pinned data (and unfinished gets).
func (c *Client) DataList(ctx context.Context) ([]DataPin, error) {
	var out []DataPin
	return out, c.do(ctx, http.MethodGet, "/api/v1/data", nil, &out)
}

// DataRemove unpins a CID.
func (c *Client) DataRemove(ctx context.Context, cid string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/data/"+cid, nil, nil)
}

// DataGC removes unpinned blocks.
func (c *Client) DataGC(ctx context.Context) (DataGCResult, error) {
	var out DataGCResult
	return out, c.do(ctx, http.MethodPost, "/api/v1/data/gc", struct{}{}, &out)
}
