package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/internal/testutil"
)

// TestTestnetDocRuns: the first block of docs/testnet.md runs as written,
// in a temporary folder, with the CLI built from this tree: testnet init,
// testnet run (in the background, as the reader's first terminal), status,
// a lend on node0, and node2's offers, which must come to show node0's.
// Of the other blocks, testnet profiles runs too; the rest need sudo's
// network profiles or a second university's machines, and
// TestDocsNameRealCommands checks them against the CLI.
func TestTestnetDocRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a testnet")
	}
	testutil.NeedRoot(t, func() error { _, err := exec.LookPath("bwrap"); return err })
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	blocks := shBlocks(t, filepath.Join(repo, "docs", "testnet.md"))
	if len(blocks) == 0 || len(blocks[0]) < 4 {
		t.Fatalf("docs/testnet.md's first block: %v", blocks)
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "deepmarket"), ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	env := append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "DEEPMARKET_HOME=")
	var run *exec.Cmd
	defer func() {
		if run != nil {
			syscall.Kill(-run.Process.Pid, syscall.SIGINT)
			done := make(chan error, 1)
			go func() { done <- run.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}
	}()
	for _, line := range blocks[0] {
		t.Logf("$ %s", line)
		switch words := strings.Fields(line); {
		case len(words) > 2 && words[1] == "testnet" && words[2] == "run":
			run = exec.Command("bash", "-c", line)
			run.Dir, run.Env = dir, env
			run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			var logb bytes.Buffer
			run.Stdout, run.Stderr = &logb, &logb
			if err := run.Start(); err != nil {
				t.Fatal(err)
			}
			// The reader waits for the nodes; so does the test: until
			// every node answers (status exits 0 and says no node is down).
			retry(t, 2*time.Minute, "every node up", func() (bool, string) {
				out, err := runQuiet(dir, env, "deepmarket testnet status ./tn")
				return err == nil && !strings.Contains(out, "down"), out + logb.String()
			})
		case strings.Contains(line, " offers"):
			retry(t, time.Minute, "node0's offer on node2", func() (bool, string) {
				out, err := runQuiet(dir, env, line)
				return err == nil && strings.Contains(out, "node0"), out
			})
		default:
			if out, err := runQuiet(dir, env, line); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
		}
	}
	// Of the other blocks, what reads runs too.
	for _, block := range blocks[1:] {
		for _, line := range block {
			if line == "deepmarket testnet profiles" {
				if out, err := runQuiet(dir, env, line); err != nil || !strings.Contains(out, "multi-dc") {
					t.Errorf("%s: %v\n%s", line, err, out)
				}
			}
		}
	}
}

// shBlocks are a Markdown file's sh blocks, each its command lines with
// comments left out and continued lines joined.
func shBlocks(t *testing.T, path string) [][]string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks [][]string
	var cur []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if s := strings.TrimSpace(l); strings.HasPrefix(s, "```") {
			if in {
				blocks = append(blocks, cur)
				cur = nil
			}
			in = !in && strings.Contains(s, "sh")
			continue
		}
		if !in {
			continue
		}
		for strings.HasSuffix(l, "\\") && sc.Scan() {
			l = strings.TrimSuffix(l, "\\") + " " + strings.TrimSpace(sc.Text())
		}
		if l = strings.TrimSpace(docComment.ReplaceAllString(l, "")); l != "" {
			cur = append(cur, l)
		}
	}
	return blocks
}

func runQuiet(dir string, env []string, line string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func retry(t *testing.T, within time.Duration, what string, ok func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		good, out := ok()
		if good {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s\n%s", what, within, tail(out, 4000))
		}
		time.Sleep(time.Second)
	}
}
