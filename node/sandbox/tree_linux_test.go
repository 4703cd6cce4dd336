package sandbox

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A job's temporary dirs come and go while the watchdog measures its tree
// (Keras saves a model through one): that is never "over the bound".
func TestDirUsageWhileDirsComeAndGo(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kept"), make([]byte, 1<<16), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tmp := filepath.Join(dir, "tmp", "a", "b")
			os.MkdirAll(tmp, 0o755)
			os.WriteFile(filepath.Join(tmp, "f"), []byte("x"), 0o644)
			os.RemoveAll(filepath.Join(dir, "tmp"))
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	n := 0
	for ; time.Now().Before(deadline); n++ {
		if u := dirUsage(dir); u == math.MaxUint64 || u < 1<<16 {
			close(stop)
			<-done
			t.Fatalf("measure %d: usage %d while temporary dirs come and go", n, u)
		}
	}
	close(stop)
	<-done
	t.Logf("%d measures", n)
}
