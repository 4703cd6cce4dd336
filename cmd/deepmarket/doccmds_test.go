package main

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/identity"
)

// TestDocsNameRealCommands: every deepmarket command a reader copies from
// the docs (README.md, python/ and examples/ READMEs, docs/*.md, and each
// command's own --help examples) names a command that exists, flags it
// takes, and as many arguments as it accepts. The docs cannot drift from
// the CLI: rename a flag and this fails on every page that still shows it.
// (TestReadmeQuickStart runs the quick start itself.)
func TestDocsNameRealCommands(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "python/README.md"}
	more, _ := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	examples, _ := filepath.Glob(filepath.Join(repo, "examples", "*", "README.md"))
	more = append(more, examples...)
	for _, m := range more {
		rel, _ := filepath.Rel(repo, m)
		files = append(files, rel)
	}
	checked := 0
	for _, f := range files {
		for _, c := range docCommands(t, filepath.Join(repo, f)) {
			if err := checkCommand(c.args); err != nil {
				t.Errorf("%s:%d: %s\n\t%s", f, c.line, err, c.text)
			}
			checked++
		}
	}
	// Each command's own examples, as --help prints them.
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		for i, l := range strings.Split(strings.ReplaceAll(cmd.Example, "\\\n", " "), "\n") {
			if args := commandArgs(l); args != nil {
				if err := checkCommand(args); err != nil {
					t.Errorf("%s --help, example %d: %s\n\t%s", cmd.CommandPath(), i+1, err, strings.TrimSpace(l))
				}
				checked++
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
	if checked < 60 {
		t.Errorf("checked only %d commands in the docs: the extraction is broken", checked)
	}
}

type docCommand struct {
	line int
	text string
	args []string
}

// docCommands are the deepmarket command lines of a Markdown file's sh
// blocks.
func docCommands(t *testing.T, path string) []docCommand {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docCommand
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		for strings.HasSuffix(l, "\\") && sc.Scan() { // a command continued on the next line
			l = strings.TrimSuffix(l, "\\") + " " + strings.TrimSpace(sc.Text())
			n++
		}
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in && strings.TrimSpace(l) != "```" && strings.Contains(l, "sh")
			continue
		}
		if !in {
			continue
		}
		if args := commandArgs(l); args != nil {
			out = append(out, docCommand{line: n, text: strings.TrimSpace(l), args: args})
		}
	}
	return out
}

var (
	optional   = regexp.MustCompile(`\[[^\]]*\]`)
	docComment = regexp.MustCompile(`\s+#.*$`)
	// A command line: deepmarket at its start, or after a shell operator.
	docCmd = regexp.MustCompile(`(?:^|&&|\|\||;|\$\(|\|)\s*(deepmarket\s[^;&|)]*)`)
)

// commandArgs is the arguments of the first deepmarket command on l (the
// program's name left out), nil if l runs none.
func commandArgs(l string) []string {
	l = docComment.ReplaceAllString(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "$ ")), "")
	// Alternatives inside an optional group are one word: [--profile lan|wifi].
	l = optional.ReplaceAllStringFunc(l, func(g string) string { return strings.ReplaceAll(g, "|", "/") })
	m := docCmd.FindStringSubmatch(l)
	if m == nil {
		return nil
	}
	var args []string
	for _, w := range splitWords(m[1])[1:] {
		if strings.HasPrefix(w, ">") || strings.HasPrefix(w, "2>") {
			break
		}
		args = append(args, w)
	}
	return args
}

// splitWords splits a shell line on spaces, keeping quoted words whole.
func splitWords(s string) []string {
	var out []string
	var cur strings.Builder
	quote, word := rune(0), false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, word = r, true
		case r == ' ' || r == '\t':
			if word {
				out = append(out, cur.String())
				cur.Reset()
				word = false
			}
		default:
			cur.WriteRune(r)
			word = true
		}
	}
	if word {
		out = append(out, cur.String())
	}
	return out
}

// checkCommand checks a documented command line without its optional
// [groups], and with them all; a placeholder (ADDR, HASH, dm1..., CID)
// stands for any value the command accepts there.
func checkCommand(args []string) error {
	var bare, full []string
	in := false
	for _, a := range args {
		open, close := strings.HasPrefix(a, "["), strings.HasSuffix(a, "]")
		w := strings.TrimSuffix(strings.TrimPrefix(a, "["), "]")
		if !in && !open {
			bare = append(bare, a)
		}
		if w != "" {
			full = append(full, w)
		}
		in = (in || open) && !close
	}
	for _, try := range [][]string{bare, full} {
		if err := checkWithPlaceholders(try); err != nil {
			return err
		}
	}
	return nil
}

var placeholder = regexp.MustCompile(`^([A-Z][A-Z0-9_]*|.*\.\.\..*)$`)

// samples are values a placeholder may stand for: an address, a
// transaction hash, a CID, an ID, a number.
var samples = []string{sampleAddress(), strings.Repeat("ab", 32),
	"bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku", "3f2a9c0e11d4", "1"}

func sampleAddress() string {
	k, err := identity.GenerateKey()
	if err != nil {
		panic(err)
	}
	return string(k.Address())
}

func checkWithPlaceholders(args []string) error {
	err := parseCommand(args)
	if err == nil {
		return nil
	}
	var at []int
	for i, a := range args {
		if placeholder.MatchString(a) && !strings.HasPrefix(a, "-") {
			at = append(at, i)
		}
	}
	if len(at) == 0 {
		return err
	}
	for _, v := range samples {
		try := append([]string(nil), args...)
		for _, i := range at {
			try[i] = v
		}
		if parseCommand(try) == nil {
			return nil
		}
	}
	return err
}

// parseCommand resolves args to a command and parses its flags and
// arguments as the CLI would, without running it.
func parseCommand(args []string) error {
	root := newRoot()
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	if cmd.Args != nil {
		return cmd.ValidateArgs(cmd.Flags().Args())
	}
	return nil
}
