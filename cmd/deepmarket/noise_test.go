package main

import (
	"strings"
	"testing"
)

// The log reaches the reader without TensorFlow's start-up lines, even
// when they arrive cut across writes, and says how many it left out.
func TestQuietLog(t *testing.T) {
	var b strings.Builder
	q := logWriter(&b, false)
	for _, chunk := range []string{
		"[deepmarket 12:00:00] launching\n[w0] 2026-11-27 00:53:30.272382: I tensor",
		"flow/core/util/port.cc:153] oneDNN custom operations are on.\n[w0] epoch 1: loss 0.5\n",
		"[w0] WARNING:tensorflow:Collective ops is not configured\n[w0] done",
	} {
		q.Write([]byte(chunk))
	}
	q.Close()
	want := "[deepmarket 12:00:00] launching\n[w0] epoch 1: loss 0.5\n[w0] done\n" +
		"(2 lines of TensorFlow's start-up messages left out; --verbose shows them)\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	var all strings.Builder
	v := logWriter(&all, true)
	v.Write([]byte("[w0] WARNING:tensorflow:x\n"))
	v.Close()
	if all.String() != "[w0] WARNING:tensorflow:x\n" {
		t.Errorf("verbose: %q", all.String())
	}
}
