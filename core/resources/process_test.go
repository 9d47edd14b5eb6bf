package resources

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func TestParseProcStat(t *testing.T) {
	tail := " S 1 2 3 4 5 6 7 8 9 10 %s %s 0 0 20 0 1 0 100 1000 10"
	cases := []struct {
		name, in string
		want     uint64
		err      string
	}{
		{"plain", "123 (cohort)" + sprintf(tail, "250", "40"), 290, ""},
		{"name with spaces and parens", "123 (a) b (c))" + sprintf(tail, "7", "3"), 10, ""},
		{"no name", "123 cohort S 1", 0, "no command name"},
		{"short", "123 (cohort) S 1 2 3", 0, "fields after the command name"},
		{"utime not a number", "123 (cohort)" + sprintf(tail, "x", "3"), 0, "utime"},
		{"stime negative", "123 (cohort)" + sprintf(tail, "1", "-3"), 0, "stime"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseProcStat(strings.NewReader(c.in))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one naming %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %d, %v; want %d", got, err, c.want)
			}
		})
	}
}

func sprintf(format string, a, b string) string {
	return strings.Replace(strings.Replace(format, "%s", a, 1), "%s", b, 1)
}

func TestParseStatm(t *testing.T) {
	for _, tc := range []struct {
		in    string
		pages uint64
		err   string
	}{
		{"1000 408 100 10 0 300 0\n", 408, ""},
		{"7 0", 0, ""},
		{"", 0, "0 fields"},
		{"1000", 0, "1 fields"},
		{"1000 -4 1", 0, "resident"},
		{"1000 99999999999999999999 1", 0, "resident"},
	} {
		got, err := ParseStatm(strings.NewReader(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.pages {
			t.Errorf("%q: %d, %v; want %d", tc.in, got, err, tc.pages)
		}
	}
	if _, err := statmRSS(strings.NewReader("1 18446744073709551615")); err == nil {
		t.Error("a resident count whose bytes overflow was accepted")
	}
}

func TestSampleProcessesFixedProc(t *testing.T) {
	proc := t.TempDir()
	stat := func(ticks string) string {
		return "42 (cohort-trainer-mock)" + sprintf(" S 1 2 3 4 5 6 7 8 9 10 %s %s 0 0 20 0 1 0", ticks, "0")
	}
	writeFile(t, filepath.Join(proc, "42", "stat"), stat("1000"))
	writeFile(t, filepath.Join(proc, "42", "statm"), "1000 408 100 10 0 300 0\n")
	s := &Sampler{log: hclog.NewNullLogger(), proc: proc, failed: map[string]bool{}}
	ps := []Process{{Role: "trainer", Name: "mock", PID: 42}, {Role: "averager", Name: "gone", PID: 43}, {Role: "averager", PID: 0}}

	first := s.SampleProcesses(ps)
	if len(first) != 3 || first[0].Role != "trainer" || first[0].Name != "mock" || first[0].PID != 42 {
		t.Fatalf("first %+v", first)
	}
	if first[0].CPUPercent != nil {
		t.Errorf("first reading has CPU %v, want nil (baseline)", *first[0].CPUPercent)
	}
	if want := uint64(408 * os.Getpagesize()); first[0].RSS == nil || *first[0].RSS != want {
		t.Errorf("RSS %v, want %d", first[0].RSS, want)
	}
	for _, u := range first[1:] {
		if u.CPUPercent != nil || u.RSS != nil {
			t.Errorf("missing process %d read %+v", u.PID, u)
		}
	}

	time.Sleep(20 * time.Millisecond)
	writeFile(t, filepath.Join(proc, "42", "stat"), stat("1001"))
	second := s.SampleProcesses(ps[:1])
	if second[0].CPUPercent == nil || *second[0].CPUPercent <= 0 {
		t.Fatalf("CPU after a tick: %v, want > 0", second[0].CPUPercent)
	}
	// A tick is 10 ms of CPU in at least 20 ms of wall time.
	if p := *second[0].CPUPercent; p > 50 {
		t.Errorf("CPU %v%%, want at most 50", p)
	}

	// Counters that go backwards (a reused pid) give no figure.
	writeFile(t, filepath.Join(proc, "42", "stat"), stat("5"))
	if third := s.SampleProcesses(ps[:1]); third[0].CPUPercent != nil {
		t.Errorf("CPU from a backwards counter: %v", *third[0].CPUPercent)
	}
	if len(s.procs) != 1 {
		t.Errorf("baselines %v, want only pid 42's", s.procs)
	}
}

func TestSampleProcessesLive(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	s := New(nil)
	defer s.Close()
	me := []Process{{Role: "worker", PID: os.Getpid()}}
	var before syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &before); err != nil {
		t.Fatal(err)
	}
	s.SampleProcesses(me)
	start := time.Now()
	// Spin until this process has used 200 ms of CPU, however long a
	// loaded machine makes that take, so the expected share is known.
	var used time.Duration
	for used < 200*time.Millisecond {
		var now syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &now); err != nil {
			t.Fatal(err)
		}
		used = time.Duration(now.Utime.Nano()+now.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) * time.Nanosecond
	}
	u := s.SampleProcesses(me)[0]
	wall := time.Since(start)
	// The process's ticks advance in 10 ms steps and other goroutines
	// may add CPU time: allow half the spin's share as the floor.
	want := float32(50 * used.Seconds() / wall.Seconds())
	if u.CPUPercent == nil || *u.CPUPercent < want {
		got := "nil"
		if u.CPUPercent != nil {
			got = fmt.Sprintf("%.1f%%", *u.CPUPercent)
		}
		t.Errorf("a process that used %v of CPU in %v reads CPU %s, want at least %.1f%%", used, wall, got, want)
	}
	if u.RSS == nil || *u.RSS == 0 {
		t.Errorf("RSS %v", u.RSS)
	}
}
