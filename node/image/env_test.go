package image

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// TestEnvOfAStrangersImage: a worker gets the variables an image's config
// sets, less the sandbox's own (HOME, TMPDIR, PWD); a config with more
// variables or bytes of them than the bounds, or an entry that is not
// KEY=VALUE, is refused.
func TestEnvOfAStrangersImage(t *testing.T) {
	withEnv := func(env ...string) []string {
		t.Helper()
		cf, err := empty.Image.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.Config.Env = env
		img, err := mutate.ConfigFile(empty.Image, cf)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Env(img)
		if err != nil {
			return []string{"error: " + err.Error()}
		}
		return got
	}
	if got := withEnv("PATH=/opt/conda/bin:/usr/bin", "HOME=/root", "TMPDIR=/big", "PWD=/", "LD_PRELOAD=/evil.so"); !slices.Equal(got,
		[]string{"PATH=/opt/conda/bin:/usr/bin", "LD_PRELOAD=/evil.so"}) {
		t.Errorf("env %q: want PATH and LD_PRELOAD alone (the sandbox confines the latter)", got)
	}
	many := make([]string, maxEnv+1)
	for i := range many {
		many[i] = fmt.Sprintf("V%d=x", i)
	}
	for name, env := range map[string][]string{
		"too many": many,
		"too big":  {"BIG=" + strings.Repeat("x", maxEnvBytes)},
		"no value": {"JUSTAKEY"},
		"no key":   {"=value"},
	} {
		if got := withEnv(env...); len(got) != 1 || !strings.HasPrefix(got[0], "error: ") {
			t.Errorf("%s: %.80q, want it refused", name, got)
		}
	}
}
