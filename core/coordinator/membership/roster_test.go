package membership

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/coordinator/link"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// testRoster is a roster of world ranks that records the changes and
// drops it reports.
func testRoster(world uint32) (r *Roster, changed map[uint32][]Status, dropped *[]uint32) {
	changed = map[uint32][]Status{}
	dropped = &[]uint32{}
	r = NewRoster(Config{
		World: world, Slots: link.NewSlots(world), HeartbeatTimeout: 30 * time.Second,
		Start:   func(*link.Link) {},
		Changed: func(rank uint32, st Status) { changed[rank] = append(changed[rank], st) },
		Dropped: func(rank uint32) { *dropped = append(*dropped, rank) },
		Logger:  hclog.NewNullLogger(),
	})
	return r, changed, dropped
}

func ready(digest string, samples uint64) *wirepb.Ready {
	return &wirepb.Ready{LayoutDigest: []byte(digest), Samples: samples, BatchSize: 32}
}

// A Ready that disagrees with rank 0's is refused: the rank is dropped
// (absent again, its slot free for a corrected process) and the formation
// error names why; a cohort forms only when every rank is Ready.
func TestReadyIsCheckedAgainstRankZero(t *testing.T) {
	for _, tc := range []struct {
		name    string
		readies []*wirepb.Ready // ranks 0, 1, 2 in the order sent
		order   []uint32
		refused []uint32
		why     string
	}{
		{"all agree", []*wirepb.Ready{ready("a", 100), ready("a", 100), ready("a", 100)}, []uint32{0, 1, 2}, nil, ""},
		{"another model", []*wirepb.Ready{ready("a", 100), ready("b", 100), ready("a", 100)}, []uint32{0, 1, 2}, []uint32{1}, "layout digest"},
		{"checked when rank 0 comes last", []*wirepb.Ready{ready("a", 100), ready("a", 99), ready("a", 100)}, []uint32{2, 1, 0}, []uint32{1}, "has 99 samples"},
		{"rank 0 with no data", []*wirepb.Ready{ready("a", 0), ready("a", 0), ready("a", 0)}, []uint32{0}, []uint32{0}, "0 samples"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, changed, dropped := testRoster(3)
			for _, id := range tc.order {
				r.Ready(id, tc.readies[id])
			}
			if !slices.Equal(*dropped, tc.refused) {
				t.Fatalf("dropped %v, want %v", *dropped, tc.refused)
			}
			for _, id := range tc.refused {
				if st := r.Status(id); st != Absent || r.ReadyOf(id) != nil {
					t.Errorf("refused rank %d is %v with Ready %v, want absent and none", id, st, r.ReadyOf(id))
				}
				if got := changed[id]; !slices.Equal(got, []Status{Ready, Absent}) {
					t.Errorf("rank %d went through %v, want ready then absent", id, got)
				}
			}
			err := r.FormationError(time.Minute)
			if tc.why != "" && !strings.Contains(err.Error(), tc.why) {
				t.Errorf("formation error %q does not say %q", err, tc.why)
			}
			if all := len(tc.refused) == 0 && len(tc.order) == 3; r.AllReady() != all {
				t.Errorf("AllReady %v, want %v", r.AllReady(), all)
			}
		})
	}
}

// Forming makes every rank live; a death noted twice is applied once, in
// the order noted; a live rank's exit is a departure mid-run and a plain
// exit once the run ends; a lost rank departs only if it was live.
func TestRosterMembershipMoves(t *testing.T) {
	r, _, _ := testRoster(4)
	for id := range uint32(4) {
		r.Ready(id, ready("a", 100))
	}
	r.Form()
	if got := r.Live(); !slices.Equal(got, []uint32{0, 1, 2, 3}) {
		t.Fatalf("live %v after formation", got)
	}
	r.NoteDeath(2, "first")
	r.NoteDeath(1, "other")
	r.NoteDeath(2, "again")
	var deaths []string
	for {
		id, why, ok := r.NextDeath()
		if !ok {
			break
		}
		deaths = append(deaths, fmt.Sprintf("%d:%s", id, why))
	}
	if !slices.Equal(deaths, []string{"2:first", "1:other"}) {
		t.Errorf("deaths applied %v, want rank 2 once, then rank 1", deaths)
	}
	if !r.Lost(2, "gone") || r.Exiting(3, false) != true {
		t.Error("a live rank lost or exiting mid-run must depart")
	}
	r.Leave(2, Dead)
	if r.Lost(2, "again") || r.Exiting(2, false) {
		t.Error("a dead rank departed twice")
	}
	if r.Exiting(1, true) || r.Status(1) != Exited {
		t.Errorf("an exit at the run's end is no departure: status %v", r.Status(1))
	}
	if got := r.Live(); !slices.Equal(got, []uint32{0, 3}) {
		t.Errorf("live %v, want [0 3]", got)
	}
}

func TestLinkReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{os.ErrDeadlineExceeded, "silent for 30s (heartbeat timeout)"},
		{io.EOF, "link closed without Exiting"},
		{errors.New("reset"), "link broken: reset"},
	} {
		if got := linkReason(tc.err, 30*time.Second); got != tc.want {
			t.Errorf("linkReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
