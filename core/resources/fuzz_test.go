package resources

import (
	"bytes"
	"testing"
)

// The parsers read files the kernel writes, but nothing read may panic a
// process: each fuzz target checks that and what a parse promises. Seeds:
// testdata/*.txt and testdata/fuzz/<target>.

func FuzzParseCPUStat(f *testing.F) {
	f.Add([]byte(readTestdata(f, "stat.txt")))
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ParseCPUStat(bytes.NewReader(in))
		if err != nil {
			return
		}
		if p, ok := CPUPercent(CPUStat{}, c); ok && (p < 0 || p > 100) {
			t.Fatalf("CPUPercent from zero = %v", p)
		}
	})
}

func FuzzParseMeminfo(f *testing.F) {
	f.Add([]byte(readTestdata(f, "meminfo.txt")))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ParseMeminfo(bytes.NewReader(in))
		if err != nil {
			return
		}
		if m.Used() > m.Total {
			t.Fatalf("used %d > total %d", m.Used(), m.Total)
		}
	})
}

func FuzzParseSmapsRollup(f *testing.F) {
	f.Add([]byte(readTestdata(f, "smaps_rollup.txt")))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ParseSmapsRollup(bytes.NewReader(in))
		if err != nil {
			return
		}
		if m.RSS%1024 != 0 || m.PSS%1024 != 0 {
			t.Fatalf("not whole kB: %+v", m)
		}
	})
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 250 40 0 0 20 0 1 0 5 100 10"))
	f.Add([]byte("2 (a) b) S 0"))
	f.Fuzz(func(t *testing.T, in []byte) {
		_, _ = ParseProcStat(bytes.NewReader(in))
	})
}

func FuzzParseStatm(f *testing.F) {
	f.Add([]byte("1000 408 100 10 0 300 0\n"))
	f.Add([]byte("1 18446744073709551615"))
	f.Fuzz(func(t *testing.T, in []byte) {
		if _, err := statmRSS(bytes.NewReader(in)); err == nil {
			if _, err := ParseStatm(bytes.NewReader(in)); err != nil {
				t.Fatalf("statmRSS accepted %q that ParseStatm refuses: %v", in, err)
			}
		}
	})
}
