package ledger

import (
	"slices"
	"testing"

	abci "github.com/cometbft/cometbft/abci/types"
)

// TestParseEventReadsWhatExecuteWrites: the event a transaction emits
// reads back whole, repeated keys in order, and other events are ignored.
func TestParseEventReadsWhatExecuteWrites(t *testing.T) {
	ev := &event{typ: TypeSettle, accounts: []string{"dm1a", "dm1b", "dm1a"},
		attrs: [][2]string{{"job", "j1"}, {"paid", "m1=5"}, {"paid", "m2=7"}, {"verdict", "x"}, {"verdict", "y"}}}
	events := append([]abci.Event{{Type: "other", Attributes: []abci.EventAttribute{{Key: "type", Value: "nope"}}}}, ev.abci()...)
	e := ParseEvent(events)
	if e.Type != TypeSettle || !slices.Equal(e.Accounts, []string{"dm1a", "dm1b"}) {
		t.Errorf("type %q, accounts %v; want %q, [dm1a dm1b]", e.Type, e.Accounts, TypeSettle)
	}
	if got := e.All("paid"); !slices.Equal(got, []string{"m1=5", "m2=7"}) {
		t.Errorf("paid %v", got)
	}
	if e.Get("job") != "j1" || e.Get("verdict") != "y" || e.Get("absent") != "" {
		t.Errorf("job %q, verdict %q (want the last), absent %q", e.Get("job"), e.Get("verdict"), e.Get("absent"))
	}
	if z := ParseEvent(nil); z.Type != "" || len(z.Attrs) != 0 {
		t.Errorf("no events read as %+v", z)
	}
}
