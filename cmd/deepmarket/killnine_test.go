package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var txHashRE = regexp.MustCompile(`[0-9A-F]{64}`)

// sentTransfer is one `ledger transfer` run and what the CLI said of it.
type sentTransfer struct {
	run    int
	amount uint64 // micro-credits
	said   string // committed, rejected, unknown, not-sent
	hash   string
	out    string
}

// TestTransfersSurviveKillNine runs `deepmarket ledger transfer` as a user
// would, and kills the node with SIGKILL at a varied moment of each
// transfer, 22 times, restarting it between. The CLI must never say
// rejected for a transfer that can commit: afterwards (the node restarted
// once more, its outbox sent again what it had), every transfer reported
// committed is on chain, none reported rejected is, each reported unknown
// has an answer from `ledger tx`, and the recipient holds exactly what the
// committed ones moved.
func TestTransfersSurviveKillNine(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a node process 22 times")
	}
	home := initHome(t)
	cfgPath := filepath.Join(home, "config.toml")
	cfg, _ := os.ReadFile(cfgPath)
	cfg = regexp.MustCompile(`(?m)^block_time = .*$`).ReplaceAll(cfg, []byte(`block_time = "200ms"`))
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	const to = "dm1qje8qcjtdsz9a3aq2e7kv3wgwrkapzlunwqgpu"
	rng := rand.New(rand.NewPCG(7, 9))
	var sent []sentTransfer
	for i := 0; i < 22; i++ {
		node, logs := startNodeProcess(t, home)
		s := sentTransfer{run: i, amount: uint64(i+1) * 1_000_000}
		args := []string{"ledger", "transfer", to, fmt.Sprint(i + 1), "--home", home}
		if i%7 == 3 { // the ledger refuses memos over 256 bytes
			args = append(args, "--memo", strings.Repeat("m", 300))
		}
		cli := exec.Command(bin, args...)
		cli.Env = append(os.Environ(), "DEEPMARKET_HOME=")
		var out bytes.Buffer
		cli.Stdout, cli.Stderr = &out, &out
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(700)) * time.Millisecond)
		node.Process.Kill()
		node.Wait()
		err := cli.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		s.out = strings.TrimSpace(out.String())
		s.hash = txHashRE.FindString(s.out)
		switch {
		case code == 0 && strings.Contains(s.out, "Sent "):
			s.said = "committed"
		case code == 3 && strings.HasPrefix(s.out, "outcome unknown: "):
			s.said = "unknown"
			if s.hash != "" && !strings.Contains(s.out, "check with `deepmarket ledger tx "+s.hash+"`") {
				t.Fatalf("run %d: unknown outcome without the command to check it: %s", i, s.out)
			}
		case code == 1 && strings.Contains(s.out, "transfer rejected: ") && s.hash != "":
			s.said = "rejected"
		case code == 1 && !strings.Contains(s.out, "rejected") && s.hash == "":
			s.said = "not-sent" // the node was gone before the transfer was signed
		default:
			t.Fatalf("run %d: exit %d: %s\nnode log:\n%s", i, code, s.out, logs)
		}
		t.Logf("run %d (%d credits, killed): %s %s", i, i+1, s.said, s.hash)
		sent = append(sent, s)
	}

	startNodeProcess(t, home)
	status := func(hash string) (state string, height int64) {
		t.Helper()
		var st struct {
			State  string `json:"state"`
			Height int64  `json:"height"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "ledger", "tx", hash, "--json", "--home", home)), &st); err != nil {
			t.Fatal(err)
		}
		return st.State, st.Height
	}
	// Let the restarted node's outbox settle: no transaction pending and
	// the same answers twice in a row.
	states := map[string]string{}
	for deadline, stable := time.Now().Add(30*time.Second), 0; stable < 2; {
		changed := false
		for _, s := range sent {
			if s.hash == "" {
				continue
			}
			st, _ := status(s.hash)
			if st != states[s.hash] || st == "pending" {
				changed = true
			}
			states[s.hash] = st
		}
		if changed {
			stable = 0
		} else {
			stable++
		}
		if time.Now().After(deadline) {
			t.Fatalf("the outcomes did not settle: %v", states)
		}
		time.Sleep(time.Second)
	}
	var onChain uint64
	said, became := map[string]int{}, map[string]int{}
	for _, s := range sent {
		said[s.said]++
		st := states[s.hash]
		switch s.said {
		case "committed":
			if st != "committed" {
				t.Errorf("run %d was reported committed, the chain says %s", s.run, st)
			}
		case "rejected":
			if st == "committed" || st == "pending" {
				t.Errorf("run %d was reported rejected, the chain says %s", s.run, st)
			}
		}
		if st == "committed" {
			onChain += s.amount
		}
		if s.said == "unknown" {
			became[st]++
		}
	}
	if got := balanceOf(t, home, to); got != onChain {
		t.Fatalf("the recipient holds %d, the transactions found committed moved %d; states %v", got, onChain, states)
	}
	if said["committed"] == 0 || said["unknown"] == 0 {
		t.Fatalf("the kills never caught a transfer in flight, or never let one through: %v", said)
	}
	if out := mustRun(t, "ledger", "audit", "--home", home); !strings.Contains(out, "audit OK") {
		t.Fatalf("audit after the kills: %s", out)
	}
	t.Logf("CLI said %v; the unknown ones became %v; %d micro-credits on chain", said, became, onChain)
}
