package lender

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestOwnerLoad(t *testing.T) {
	at := func(busy, idle, jobs time.Duration) CPUSample {
		return CPUSample{CPUs: 4, Total: busy + idle, Busy: busy, Jobs: jobs}
	}
	start := at(100*time.Second, 300*time.Second, 20*time.Second)
	s := time.Second
	for _, tc := range []struct {
		name string
		a, b CPUSample
		want float64
	}{
		{"an idle machine", start, at(100*s, 304*s, 20*s), 0},
		{"the owner on one core of four", start, at(101*s, 303*s, 20*s), 1},
		{"jobs on two cores, the owner on half of one", start, at(102500*time.Millisecond, 301500*time.Millisecond, 22*s), 0.5},
		{"only jobs", start, at(104*s, 300*s, 24*s), 0},
		{"jobs counted past the ticks", start, at(102*s, 302*s, 22100*time.Millisecond), 0},
		{"the same sample twice", start, start, 0},
		{"samples in the wrong order", at(101*s, 303*s, 20*s), start, 0},
		{"more busy than the machine has", start, CPUSample{CPUs: 4, Total: 404 * s, Busy: 120 * s, Jobs: 20 * s}, 4},
		{"no CPUs counted", start, CPUSample{Total: 404 * s, Busy: 101 * s, Jobs: 20 * s}, 0},
	} {
		if got := OwnerLoad(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: OwnerLoad = %v cores, want %v", tc.name, got, tc.want)
		}
	}
}

func TestOwnerLoadParsesProcStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       CPUSample
		fails      bool
	}{
		{
			name: "two CPUs, guest time inside user",
			stat: "cpu  1000 10 200 5000 30 1 9 7 40 0\ncpu0 500 5 100 2500 15 0 4 3 20 0\ncpu1 500 5 100 2500 15 1 5 4 20 0\nintr 123\nctxt 456\n",
			want: CPUSample{CPUs: 2, Busy: 1220 * clockTick, Total: 6257 * clockTick},
		},
		{
			name: "an old kernel without steal and guest",
			stat: "cpu  1 2 3 4 5 6 7 0\ncpu0 1 2 3 4 5 6 7 0\n",
			want: CPUSample{CPUs: 1, Busy: 19 * clockTick, Total: 28 * clockTick},
		},
		{name: "a short cpu line", stat: "cpu  1 2 3 4\ncpu0 1 2 3 4\n", fails: true},
		{name: "no cpu line", stat: "cpu0 1 2 3 4 5 6 7 8\n", fails: true},
		{name: "no CPU counted", stat: "cpu  1 2 3 4 5 6 7 8\n", fails: true},
		{name: "a counter that is no number", stat: "cpu  1 2 x 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\n", fails: true},
	} {
		got, err := parseProcStat([]byte(tc.stat))
		if (err != nil) != tc.fails || got != tc.want {
			t.Errorf("%s: parseProcStat = %+v, %v; want %+v, failing %v", tc.name, got, err, tc.want, tc.fails)
		}
	}
}

func TestOwnerLoadReadsJobsBesideTheMachine(t *testing.T) {
	stat := filepath.Join(t.TempDir(), "stat")
	if err := os.WriteFile(stat, []byte("cpu  1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := readCPUSample(stat, func() (time.Duration, error) { return 42 * time.Second, nil })
	if err != nil {
		t.Fatal(err)
	}
	if want := (CPUSample{CPUs: 1, Busy: 19 * clockTick, Total: 36 * clockTick, Jobs: 42 * time.Second}); s != want {
		t.Fatalf("sample = %+v, want %+v", s, want)
	}
}
