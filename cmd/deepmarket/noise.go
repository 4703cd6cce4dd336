package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// quiet passes a job's log through, line by line, leaving out
// TensorFlow's start-up noise (jobs.IsNoise) and counting what it left out.
type quiet struct {
	w       io.Writer
	partial string
	hidden  int
}

func (q *quiet) Write(p []byte) (int, error) {
	s := q.partial + string(p)
	i := strings.LastIndexByte(s, '\n')
	q.partial = s[i+1:]
	for _, line := range strings.SplitAfter(s[:i+1], "\n") {
		if line == "" {
			continue
		}
		if jobs.IsNoise(line) {
			q.hidden++
			continue
		}
		if _, err := io.WriteString(q.w, line); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close writes what is left of a last line, and says how much was left out.
func (q *quiet) Close() error {
	if q.partial != "" && !jobs.IsNoise(q.partial) {
		io.WriteString(q.w, q.partial+"\n")
	}
	q.partial = ""
	if q.hidden > 0 {
		fmt.Fprintf(q.w, "(%d lines of TensorFlow's start-up messages left out; --verbose shows them)\n", q.hidden)
	}
	return nil
}

// logWriter is w, or w without TensorFlow's noise unless verbose; close
// it when done.
func logWriter(w io.Writer, verbose bool) io.WriteCloser {
	if verbose {
		return nopCloser{w}
	}
	return &quiet{w: w}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
