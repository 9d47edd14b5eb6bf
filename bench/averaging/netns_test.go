package main

import (
	"math"
	"testing"
)

func TestFrameOverhead(t *testing.T) {
	for _, c := range []struct {
		mtu        int
		timestamps bool
		want       float64 // frame bytes over payload bytes
	}{
		{1500, true, 1514.0 / 1448},
		{1500, false, 1514.0 / 1460},
		{9000, true, 9014.0 / 8948},
		{53, true, 67.0 / 1},
	} {
		got, err := frameOverhead(c.mtu, c.timestamps)
		if err != nil || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("frameOverhead(%d, %v) = %v, %v; want %v", c.mtu, c.timestamps, got, err, c.want)
		}
	}
	for _, mtu := range []int{0, 40, 52} {
		if got, err := frameOverhead(mtu, true); err == nil {
			t.Errorf("frameOverhead(%d, true) = %v, want an error", mtu, got)
		}
	}
}
