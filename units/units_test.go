package units

import (
	"math"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	good := map[string]uint64{
		"8GiB": 8 << 30, "8G": 8 << 30, "8g": 8 << 30, "8192MiB": 8 << 30, "8GB": 8e9,
		"1.5GiB": 3 << 29, "512": 512, "1 KiB": 1024, "0.5T": 1 << 39, "1b": 1,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1G", "G", "8XB", "1.2.3G", "99999999999999999999G", "17179869184G", "."} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want error", in, got)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 3 << 29: "1.5 GiB", 8 << 30: "8 GiB"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestCredits(t *testing.T) {
	good := map[string]uint64{"1": 1e6, "0.5": 5e5, "1.000001": 1000001, ".25": 250000, "18446744073709": 18446744073709000000}
	for in, want := range good {
		got, err := ParseCredits(in)
		if err != nil || got != want {
			t.Errorf("ParseCredits(%q) = %d, %v; want %d", in, got, err, want)
		}
		if back, _ := ParseCredits(FormatCredits(got)); back != got {
			t.Errorf("FormatCredits round trip of %d gave %d", got, back)
		}
	}
	for _, in := range []string{"", "-1", "1.0000001", "abc", "1e5", "18446744073710", "."} {
		if got, err := ParseCredits(in); err == nil {
			t.Errorf("ParseCredits(%q) = %d, want error", in, got)
		}
	}
	if FormatCredits(1500000) != "1.5" || FormatCredits(0) != "0" {
		t.Errorf("FormatCredits: %q %q", FormatCredits(1500000), FormatCredits(0))
	}
}

func TestFormatResources(t *testing.T) {
	for _, c := range []struct {
		cores, gpus int
		mem         uint64
		want        string
	}{
		{1, 0, 2 << 30, "1 core, 2 GiB"},
		{4, 1, 16 << 30, "4 cores, 16 GiB, 1 GPU"},
		{2, 3, 512 << 20, "2 cores, 512 MiB, 3 GPUs"},
	} {
		if got := FormatResources(c.cores, c.mem, c.gpus); got != c.want {
			t.Errorf("%+v: %q, want %q", c, got, c.want)
		}
	}
}

// TestPriceFor: an hourly price for a time, rounded down; nothing for no
// time; the largest amount, not a wrapped one, past the range.
func TestPriceFor(t *testing.T) {
	for _, c := range []struct {
		perHour uint64
		d       time.Duration
		want    uint64
	}{
		{3_600_000, time.Second, 1_000},
		{3_600_000, 1500 * time.Millisecond, 1_500},
		{1_000_000, time.Hour, 1_000_000},
		{1, time.Second, 0},
		{1_000_000, 0, 0},
		{1_000_000, -time.Hour, 0},
		{math.MaxUint64, 2 * time.Hour, math.MaxUint64},
		{math.MaxUint64 / 2, 1000 * time.Hour, math.MaxUint64},
	} {
		if got := PriceFor(c.perHour, c.d); got != c.want {
			t.Errorf("PriceFor(%d, %s) = %d, want %d", c.perHour, c.d, got, c.want)
		}
	}
}
