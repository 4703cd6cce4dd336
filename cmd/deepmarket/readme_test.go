package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/internal/testutil"
)

// TestReadmeQuickStart runs the README's quick start line by line, as a new
// user would type it, with HOME in a temporary folder: make deps, make run
// (in the background, on ports of its own), lend, submit the example and
// wait, ui, jobs, and data get of the result the submit printed. The only
// liberties: the node's ports (DEEPMARKET_* variables, so it never meets a
// node already running here) and RESULT_CID, which is what submit printed.
func TestReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the example")
	}
	// The node the quick start runs probes the whole sandbox itself, and
	// lend says what is missing; here: root and bubblewrap.
	testutil.NeedRoot(t, func() error { _, err := exec.LookPath("bwrap"); return err })
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	lines := quickStart(t, filepath.Join(repo, "README.md"))
	home := t.TempDir()
	env := []string{"HOME=" + home, "DEEPMARKET_HOME=",
		"DEEPMARKET_API_LISTEN=127.0.0.1:0", "DEEPMARKET_P2P_LISTEN=/ip4/127.0.0.1/tcp/0", "DEEPMARKET_P2P_MDNS=false",
		"DEEPMARKET_LEDGER_P2P_LISTEN=tcp://127.0.0.1:" + freePort(t), "DEEPMARKET_LEDGER_RPC_LISTEN=tcp://127.0.0.1:" + freePort(t)}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "HOME" && !strings.HasPrefix(k, "DEEPMARKET_") {
			env = append(env, kv)
		}
	}
	// Go keeps its caches under HOME: keep using the real ones.
	for _, k := range []string{"GOPATH", "GOCACHE", "GOMODCACHE"} {
		v, err := exec.Command("go", "env", k).Output()
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, k+"="+strings.TrimSpace(string(v)))
	}
	dir := repo
	resultCID := ""
	cidRE := regexp.MustCompile(`result: (baf[a-z0-9]+)`)
	for _, line := range lines {
		t.Logf("$ %s", line)
		switch {
		case line == "make run":
			runInBackground(t, dir, env, line)
			continue
		case strings.HasPrefix(line, "export PATH="):
			bin := filepath.Join(repo, "bin")
			for i, kv := range env {
				if strings.HasPrefix(kv, "PATH=") {
					env[i] = "PATH=" + bin + ":" + strings.TrimPrefix(kv, "PATH=")
				}
			}
			continue
		case strings.HasPrefix(line, "cd "):
			dir = filepath.Join(dir, strings.TrimPrefix(line, "cd "))
			continue
		case strings.Contains(line, "RESULT_CID"):
			if resultCID == "" {
				t.Fatal("no result CID printed before the line that needs it")
			}
			line = strings.ReplaceAll(line, "RESULT_CID", resultCID)
		}
		out := runLine(t, dir, env, line)
		if m := cidRE.FindStringSubmatch(out); m != nil {
			resultCID = m[1]
		}
	}
	// The result lands outside the example's folder (a result inside it
	// would ship as code with the next submit), in HOME.
	result := filepath.Join(home, "fashion-mnist-result")
	if _, err := os.Stat(filepath.Join(dir, "result")); err == nil {
		t.Errorf("the quick start left a result in %s, the job's bundle", dir)
	}
	b, err := os.ReadFile(filepath.Join(result, "result.json"))
	if err != nil {
		t.Fatalf("the quick start's result: %v", err)
	}
	var res struct {
		Accuracy float64 `json:"test_accuracy"`
		Workers  int     `json:"workers"`
	}
	if err := json.Unmarshal(b, &res); err != nil || res.Workers != 2 || res.Accuracy < 0.7 {
		t.Fatalf("result.json %s (%v): want 2 workers and test accuracy above 0.7", b, err)
	}
	if _, err := os.Stat(filepath.Join(result, "model.keras")); err != nil {
		t.Errorf("no trained model: %v", err)
	}

	// The tour of the CLI, against the quick start's node: every line that
	// reads (or adds the packaged data) runs as written, its optional
	// [groups] left out; the others need values of a reader's own (an
	// address, a CID) or change the machine (TestDocsNameRealCommands
	// checks them against the CLI).
	ran := 0
	for _, line := range tourLines(t, filepath.Join(repo, "README.md")) {
		t.Logf("$ %s", line)
		runLine(t, dir, env, line)
		ran++
	}
	if ran < 12 {
		t.Errorf("ran %d of the tour's commands; the README's tour lost its readers", ran)
	}
}

// tourRuns are the tour's commands a test can run as written: they read,
// or add the packaged dataset.
var tourRuns = map[string]bool{"keys show": true, "status": true, "ui": true, "lend": true, "offers": true, "peers": true,
	"bids": true, "ledger balance": true, "ledger history": true, "ledger audit": true, "prices": true, "quote": true,
	"data add": true, "data ls": true}

// tourLines are the README tour's lines of tourRuns, optional [groups]
// and comments left out; a lend with flags changes the machine, and is
// left out.
func tourLines(t *testing.T, readme string) []string {
	var out []string
	for _, c := range docCommands(t, readme) {
		line := strings.TrimSpace(optional.ReplaceAllString(docComment.ReplaceAllString(c.text, ""), ""))
		words := splitWords(line)
		if len(words) < 2 || words[0] != "deepmarket" || strings.ContainsAny(line, "$|&;<>") {
			continue
		}
		key := words[1]
		if (key == "ledger" || key == "data" || key == "keys") && len(words) > 2 {
			key += " " + words[2]
		}
		switch {
		case !tourRuns[key], key == "lend" && len(words) > 2, slices.ContainsFunc(words[1:], placeholder.MatchString),
			key == "data add" && !slices.Contains(words, "/usr/share/datasets/fashion-mnist"):
			continue
		}
		out = append(out, strings.Join(words, " "))
	}
	return out
}

// quickStart returns the command lines of the README's quick start block,
// comments stripped.
func quickStart(t *testing.T, readme string) []string {
	f, err := os.Open(readme)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	in, fence := false, false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "<!-- quickstart"):
			in = true
		case strings.HasPrefix(l, "<!-- /quickstart"):
			in = false
		case in && strings.HasPrefix(l, "```"):
			fence = !fence
		case in && fence:
			if cmd, _, _ := strings.Cut(l, "  #"); strings.TrimSpace(cmd) != "" {
				lines = append(lines, strings.TrimSpace(cmd))
			}
		}
	}
	if len(lines) < 5 {
		t.Fatalf("README.md has no quick start block (found %q)", lines)
	}
	return lines
}

func runLine(t *testing.T, dir string, env []string, line string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out.String())
	}
	t.Logf("%s", tail(out.String(), 2000))
	return out.String()
}

// runInBackground starts line (the node) and waits until the CLI reaches it.
func runInBackground(t *testing.T, dir string, env []string, line string) {
	t.Helper()
	cmd := exec.Command("bash", "-c", "exec "+line)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("pkill", "-INT", "-f", "bin/deepmarket node run --home "+envValue(env, "HOME")).Run()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			exec.Command("pkill", "-KILL", "-f", "bin/deepmarket node run --home "+envValue(env, "HOME")).Run()
			<-done
		}
		t.Logf("make run:\n%s", tail(out.String(), 4000))
	})
	bin := filepath.Join(dir, "bin", "deepmarket")
	deadline := time.Now().Add(5 * time.Minute) // make run builds first
	for time.Now().Before(deadline) {
		st := exec.Command(bin, "status")
		st.Env = env
		if st.Run() == nil {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("make run: no node answered within 5 minutes\n%s", out.String())
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
