package resources

import (
	"os"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseCPUStat(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     CPUStat
		err      string // empty: no error
	}{
		{name: "linux 6", in: readTestdata(t, "stat.txt"),
			want: CPUStat{User: 21765, System: 8803, Idle: 79552, IOWait: 347, SoftIRQ: 102, Steal: 18}},
		{name: "guest fields", in: "cpu  1 2 3 4 5 6 7 8 9 10\n",
			want: CPUStat{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{name: "old kernel, four fields", in: "cpu 10 20 30 40\ncpu0 10 20 30 40\n",
			want: CPUStat{User: 10, Nice: 20, System: 30, Idle: 40}},
		{name: "future field ignored", in: "cpu 1 2 3 4 5 6 7 8 9 10 11\n",
			want: CPUStat{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{name: "cpu line not first", in: "btime 1\ncpu 1 2 3 4\n", want: CPUStat{1, 2, 3, 4, 0, 0, 0, 0, 0, 0}},
		{name: "empty", in: "", err: "no cpu line"},
		{name: "only per-core lines", in: "cpu0 1 2 3 4\ncpu1 1 2 3 4\n", err: "no cpu line"},
		{name: "three fields", in: "cpu 1 2 3\n", err: "at least 4"},
		{name: "not a number", in: "cpu 1 2 x 4\n", err: "field 3"},
		{name: "negative", in: "cpu 1 -2 3 4\n", err: "field 2"},
		{name: "overflow", in: "cpu 18446744073709551616 2 3 4\n", err: "field 1"},
		{name: "binary junk", in: "\x00\xff\ncpu \xff\n", err: "at least 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCPUStat(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestCPUStatTotals(t *testing.T) {
	c := CPUStat{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if c.Total() != 36 || c.IdleTotal() != 9 {
		t.Errorf("Total %d (want 36: guest is inside user), IdleTotal %d (want 9)", c.Total(), c.IdleTotal())
	}
}

func TestCPUPercent(t *testing.T) {
	base := CPUStat{User: 100, System: 100, Idle: 700, IOWait: 100}
	for _, tc := range []struct {
		name string
		cur  CPUStat
		want float32
		ok   bool
	}{
		{"quarter busy", CPUStat{User: 120, System: 105, Idle: 770, IOWait: 105}, 25, true},
		{"idle", CPUStat{User: 100, System: 100, Idle: 800, IOWait: 100}, 0, true},
		{"busy", CPUStat{User: 150, System: 150, Idle: 700, IOWait: 100}, 100, true},
		{"steal and irq count as busy", CPUStat{User: 100, System: 100, Idle: 750, IOWait: 100, IRQ: 25, Steal: 25}, 50, true},
		{"no time passed", base, 0, false},
		{"counters went back", CPUStat{User: 90, System: 100, Idle: 700, IOWait: 100}, 0, false},
		{"iowait went back", CPUStat{User: 110, System: 100, Idle: 800, IOWait: 90}, 10, true},
		{"idle went back: clamped", CPUStat{User: 200, System: 100, Idle: 650, IOWait: 100}, 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := CPUPercent(base, tc.cur)
			if ok != tc.ok || got != tc.want {
				t.Errorf("CPUPercent = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseMeminfo(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     MemInfo
		used     uint64
		err      string
	}{
		{name: "linux 6", in: readTestdata(t, "meminfo.txt"),
			want: MemInfo{Total: 24684084 * 1024, Available: 24164412 * 1024}, used: (24684084 - 24164412) * 1024},
		{name: "before 3.14: free + buffers + cached", in: "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n",
			want: MemInfo{Total: 1000 << 10, Available: 400 << 10}, used: 600 << 10},
		{name: "lines not read may be odd", in: "MemTotal: 8 kB\nMemAvailable: 2 kB\nWeird: x y z\nnot a field\nHugePages_Total: 0\n",
			want: MemInfo{Total: 8 << 10, Available: 2 << 10}, used: 6 << 10},
		{name: "available above total", in: "MemTotal: 8 kB\nMemAvailable: 9 kB\n",
			want: MemInfo{Total: 8 << 10, Available: 9 << 10}, used: 0},
		{name: "empty", in: "", err: "no MemTotal"},
		{name: "no MemTotal", in: "MemAvailable: 2 kB\n", err: "no MemTotal"},
		{name: "no available or free", in: "MemTotal: 8 kB\n", err: "neither"},
		{name: "not a number", in: "MemTotal: lots kB\nMemAvailable: 2 kB\n", err: "MemTotal"},
		{name: "wrong unit", in: "MemTotal: 8 MB\nMemAvailable: 2 kB\n", err: "MemTotal"},
		{name: "no unit", in: "MemTotal: 8\nMemAvailable: 2 kB\n", err: "MemTotal"},
		{name: "twice", in: "MemTotal: 8 kB\nMemTotal: 9 kB\nMemAvailable: 2 kB\n", err: "twice"},
		{name: "overflows bytes", in: "MemTotal: 18014398509481984 kB\nMemAvailable: 2 kB\n", err: "MemTotal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMeminfo(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want || got.Used() != tc.used {
				t.Fatalf("got %+v (used %d), %v; want %+v (used %d)", got, got.Used(), err, tc.want, tc.used)
			}
		})
	}
}

func TestParseSmapsRollup(t *testing.T) {
	full := readTestdata(t, "smaps_rollup.txt")
	for _, tc := range []struct {
		name, in string
		want     Memory
		err      string
	}{
		{name: "linux 6", in: full,
			want: Memory{RSS: 1632 << 10, PSS: 333 << 10, Private: (72 + 108) << 10, Shared: 1452 << 10}},
		{name: "no header", in: "Rss: 4 kB\nPss: 2 kB\nShared_Clean: 1 kB\nShared_Dirty: 1 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 1 kB\n",
			want: Memory{RSS: 4 << 10, PSS: 2 << 10, Private: 2 << 10, Shared: 2 << 10}},
		{name: "empty", in: "", err: "no Rss"},
		{name: "no Pss", in: strings.Replace(full, "Pss:", "Pxx:", 1), err: "no Pss"},
		{name: "no Private_Dirty", in: strings.Replace(full, "Private_Dirty:", "Private_Dirtx:", 1), err: "no Private_Dirty"},
		{name: "bad number", in: strings.Replace(full, "1632 kB", "16x2 kB", 1), err: "Rss"},
		{name: "bad unit", in: strings.Replace(full, "333 kB", "333 pages", 1), err: "Pss"},
		{name: "twice", in: full + "Rss: 1 kB\n", err: "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSmapsRollup(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestSelfMemory(t *testing.T) {
	self, err := SelfMemory()
	if err != nil {
		t.Skipf("no smaps_rollup here: %v", err)
	}
	if self.RSS == 0 || self.PSS > self.RSS || self.Private > self.RSS {
		t.Errorf("implausible %+v", self)
	}
	byPID, err := ProcessMemory(os.Getpid())
	if err != nil || byPID.RSS == 0 {
		t.Errorf("ProcessMemory(self) = %+v, %v", byPID, err)
	}
	if _, err := ReadSmapsRollup("testdata/missing"); err == nil {
		t.Error("no error for a missing file")
	}
}
