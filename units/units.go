package units

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// MicroPerCredit is how many micro-credits make one credit.
const MicroPerCredit = 1_000_000

var sizeUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1000, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1000 * 1000, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1000 * 1000 * 1000, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1000 * 1000 * 1000 * 1000, "tib": 1 << 40,
}

// ParseSize parses a size such as "8GiB", "8G" (binary, like free -g),
// "8GB" (decimal), "8192MiB", "1.5GiB" or a plain number of bytes.
func ParseSize(s string) (uint64, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, errors.New("empty size; write it like 8GiB, 512MiB or 8G")
	}
	i := 0
	for i < len(in) && (in[i] >= '0' && in[i] <= '9' || in[i] == '.') {
		i++
	}
	num, unit := in[:i], strings.ToLower(strings.TrimSpace(in[i:]))
	if num == "" {
		if strings.HasPrefix(in, "-") {
			return 0, fmt.Errorf("size %q is negative", s)
		}
		return 0, fmt.Errorf("size %q: want a number then a unit, like 8GiB", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB or K, M, G, T)", s, in[i:])
	}
	whole, frac, hasFrac := strings.Cut(num, ".")
	if strings.Contains(frac, ".") || (whole == "" && frac == "") {
		return 0, fmt.Errorf("size %q: malformed number", s)
	}
	w, err := strconv.ParseUint(orZero(whole), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	hi, total := bits.Mul64(w, mult)
	if hi != 0 {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	if hasFrac && frac != "" {
		f, err := strconv.ParseFloat("0."+frac, 64)
		if err != nil {
			return 0, fmt.Errorf("size %q: malformed number", s)
		}
		add := uint64(math.Round(f * float64(mult)))
		if total+add < total {
			return 0, fmt.Errorf("size %q: too large", s)
		}
		total += add
	}
	return total, nil
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

// FormatSize prints bytes in binary units with up to one decimal.
func FormatSize(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	v := float64(b) / float64(div)
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + []string{"KiB", "MiB", "GiB", "TiB", "PiB"}[exp]
}

// ParseCredits parses a credit amount ("12", "0.5", "1.000001") into
// micro-credits. More than six decimals, negatives and overflow are errors.
func ParseCredits(s string) (uint64, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, errors.New("empty amount")
	}
	if strings.HasPrefix(in, "-") {
		return 0, fmt.Errorf("amount %q is negative", s)
	}
	whole, frac, _ := strings.Cut(in, ".")
	if len(frac) > 6 {
		return 0, fmt.Errorf("amount %q has more than 6 decimals (1 micro-credit = 0.000001)", s)
	}
	for _, part := range []string{whole, frac} {
		for _, c := range part {
			if c < '0' || c > '9' {
				return 0, fmt.Errorf("amount %q is not a number", s)
			}
		}
	}
	if whole == "" && frac == "" {
		return 0, fmt.Errorf("amount %q is not a number", s)
	}
	w, err := strconv.ParseUint(orZero(whole), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("amount %q is too large", s)
	}
	hi, micro := bits.Mul64(w, MicroPerCredit)
	if hi != 0 {
		return 0, fmt.Errorf("amount %q is too large", s)
	}
	f, _ := strconv.ParseUint(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	if micro+f < micro {
		return 0, fmt.Errorf("amount %q is too large", s)
	}
	return micro + f, nil
}

// FormatCredits prints micro-credits as credits with trailing zeros cut.
func FormatCredits(micro uint64) string {
	s := fmt.Sprintf("%d.%06d", micro/MicroPerCredit, micro%MicroPerCredit)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// PriceFor is what d costs at perHour micro-credits an hour, rounded down:
// 0 for no time, and at most the largest uint64 (a float past the range
// converts to an undefined value, not to the largest).
func PriceFor(perHour uint64, d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	v := float64(perHour) * d.Hours()
	if v >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(v)
}

// Plural is one when n is 1, else many: "1 core", "2 cores".
func Plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Count prints n with its noun: "1 core", "0 GPUs".
func Count(n int, one, many string) string {
	return strconv.Itoa(n) + " " + Plural(n, one, many)
}

// FormatResources prints an amount of resources as people read it: "1
// core, 2 GiB", "4 cores, 16 GiB, 1 GPU" (GPUs only when there are some).
func FormatResources(cores int, memBytes uint64, gpus int) string {
	s := Count(cores, "core", "cores") + ", " + FormatSize(memBytes)
	if gpus > 0 {
		s += ", " + Count(gpus, "GPU", "GPUs")
	}
	return s
}
