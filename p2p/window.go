package p2p

import (
	"fmt"
	"time"
)

// Window is a daily availability window in the lender's local time, given
// as "HH:MM-HH:MM". A window whose end is before its start runs over
// midnight ("19:00-07:00" is evenings and nights).
type Window struct {
	Start, End int // minutes since midnight
}

// ParseWindow parses "HH:MM-HH:MM".
func ParseWindow(s string) (Window, error) {
	var sh, sm, eh, em int
	var rest string
	n, _ := fmt.Sscanf(s, "%d:%d-%d:%d%s", &sh, &sm, &eh, &em, &rest)
	if n != 4 || len(s) != len("HH:MM-HH:MM") {
		return Window{}, fmt.Errorf("window %q: want HH:MM-HH:MM, e.g. 19:00-07:00", s)
	}
	for _, v := range [][2]int{{sh, sm}, {eh, em}} {
		if v[0] < 0 || v[0] > 23 || v[1] < 0 || v[1] > 59 {
			return Window{}, fmt.Errorf("window %q: hours are 00-23 and minutes 00-59", s)
		}
	}
	w := Window{Start: sh*60 + sm, End: eh*60 + em}
	if w.Start == w.End {
		return Window{}, fmt.Errorf("window %q is empty; leave --window out to lend all day", s)
	}
	return w, nil
}

// String formats the window as "HH:MM-HH:MM".
func (w Window) String() string {
	return fmt.Sprintf("%02d:%02d-%02d:%02d", w.Start/60, w.Start%60, w.End/60, w.End%60)
}

// minuteOfDay returns t's minutes since local midnight.
func minuteOfDay(t time.Time) int { return t.Hour()*60 + t.Minute() }

// Contains reports whether t (in its own location) falls inside the window.
func (w Window) Contains(t time.Time) bool {
	m := minuteOfDay(t)
	if w.Start < w.End {
		return m >= w.Start && m < w.End
	}
	return m >= w.Start || m < w.End
}

// Next returns, for a time t, whether t is inside the window and when that
// changes next (the end of the current window, or the start of the next).
func (w Window) Next(t time.Time) (inside bool, change time.Time) {
	midnight := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, t.Location())
	at := func(day, minute int) time.Time {
		return time.Date(midnight.Year(), midnight.Month(), midnight.Day()+day, minute/60, minute%60, 0, 0, t.Location())
	}
	inside = w.Contains(t)
	m := minuteOfDay(t)
	target := w.Start
	if inside {
		target = w.End
	}
	if target > m {
		return inside, at(0, target)
	}
	return inside, at(1, target)
}
