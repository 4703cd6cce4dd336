package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// tools holds the paths of the programs the lab drives: iproute2's, and
// nftables' for NAT routers.
type tools struct {
	ip  string
	tc  string // empty when tc is not installed; only netem needs it
	nft string // nftables' nft; empty when not installed; only NAT sites need it
}

// findTools locates ip, tc and nft. Root's PATH normally has /usr/sbin, but
// `sudo` with a trimmed PATH may not, so the usual places are tried too.
func findTools() (tools, error) {
	ip := lookTool("ip")
	if ip == "" {
		return tools{}, fmt.Errorf("%w: iproute2's ip is not installed: install iproute2", ErrUnavailable)
	}
	return tools{ip: ip, tc: lookTool("tc"), nft: lookTool("nft")}, nil
}

func lookTool(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		if p, err := exec.LookPath(dir + "/" + name); err == nil {
			return p
		}
	}
	return ""
}

// beforeCommand, when set by a test, runs before every command and can fail
// it: how the tests check that a Create that fails half way removes what it
// made.
var beforeCommand func(args []string) error

// run runs one ip, tc or nft command. Its error names the command and
// carries its stderr, which is where these tools say what went wrong.
func run(ctx context.Context, path string, args ...string) error {
	_, err := output(ctx, path, args...)
	return err
}

// output runs one command and returns its stdout.
func output(ctx context.Context, path string, args ...string) ([]byte, error) {
	line := path + " " + strings.Join(args, " ")
	if beforeCommand != nil {
		if err := beforeCommand(args); err != nil {
			return nil, fmt.Errorf("%s: %w", line, err)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return nil, fmt.Errorf("%s: %w", line, err)
		}
		return nil, fmt.Errorf("%s: %w: %s", line, err, msg)
	}
	return stdout.Bytes(), nil
}

// notFound reports whether err is iproute2 saying that the thing to delete is
// already gone.
func notFound(err error) bool {
	if err == nil {
		return false
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "Cannot find device") ||
		strings.Contains(s, "No such file or directory") ||
		strings.Contains(s, "does not exist")
}
