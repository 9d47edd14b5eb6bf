package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// training is one line of the mock trainer's ledger ("rank epoch sample",
// epoch from 0, appended once per batch in one write): a sample trained,
// with the byte offset of its line, which orders it against the faults.
type training struct {
	rank          uint32
	epoch, sample uint64
	off           int64
}

// readLedger parses the ledger at path. A line that does not parse is
// counted, not guessed at.
func readLedger(path string) (ts []training, bad int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("ledger: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var off int64
	for sc.Scan() {
		line := sc.Bytes()
		lineOff := off
		off += int64(len(line)) + 1
		f := bytes.Fields(line)
		if len(f) != 3 {
			bad++
			continue
		}
		r, err1 := strconv.ParseUint(string(f[0]), 10, 32)
		e, err2 := strconv.ParseUint(string(f[1]), 10, 64)
		s, err3 := strconv.ParseUint(string(f[2]), 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			bad++
			continue
		}
		ts = append(ts, training{rank: uint32(r), epoch: e, sample: s, off: lineOff})
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("ledger %s: %w", path, err)
	}
	return ts, bad, nil
}

// lost is work a fault took, which the run then trains again: trainings
// of epoch, by rank (any rank when anyRank), written at ledger offsets in
// [from, to), of the samples in samples (every sample when nil). gone says
// the coordinator recorded the work as in no surviving model: each such
// training must be followed by another. A lost that is not gone only
// bounds what may be trained again.
type lost struct {
	cause    string
	epoch    uint64
	rank     uint32
	anyRank  bool
	gone     bool
	samples  map[uint64]bool
	from, to int64
}

func (l lost) covers(t training) bool {
	return t.epoch == l.epoch && (l.anyRank || t.rank == l.rank) && t.off >= l.from && t.off < l.to &&
		(l.samples == nil || l.samples[t.sample])
}

// account is one run's ledger against its data set and the work its faults
// took.
type account struct {
	// Missing counts (epoch, sample) pairs that no training outside the
	// work the faults took (gone) holds: never trained, or trained only
	// into models that were lost and never again.
	Missing uint64 `json:"samples_missing"`
	// Twice counts the trainings of a sample beyond its first in an epoch.
	Twice uint64 `json:"samples_trained_twice"`
	// Allowed counts those of Twice that retrain work a fault took, by
	// cause; Unexplained is the rest, which no rule allows.
	Allowed     map[string]uint64 `json:"twice_allowed"`
	Unexplained uint64            `json:"twice_unexplained"`
}

// tally counts what the ledger's trainings say about a run of epochs
// epochs over samples samples, given the work its faults took: a sample
// trained n > 1 times in an epoch is allowed min(n-1, k) extra trainings,
// where k of its trainings were taken by a fault; a sample is missing when
// every training of it was taken by a fault that left it in no model.
func tally(ts []training, epochs, samples uint64, losts []lost) account {
	a := account{Allowed: map[string]uint64{}}
	type key struct{ epoch, sample uint64 }
	by := map[key][]training{}
	for _, t := range ts {
		if t.epoch < epochs && t.sample < samples {
			by[key{t.epoch, t.sample}] = append(by[key{t.epoch, t.sample}], t)
		}
	}
	for e := range epochs {
		for s := range samples {
			got := by[key{e, s}]
			held := 0
			for _, t := range got {
				if !slices.ContainsFunc(losts, func(l lost) bool { return l.gone && l.covers(t) }) {
					held++
				}
			}
			if held == 0 {
				a.Missing++
			}
			if len(got) == 0 {
				continue
			}
			extra := uint64(len(got) - 1)
			a.Twice += extra
			for _, t := range got {
				if extra == 0 {
					break
				}
				for _, l := range losts {
					if l.covers(t) {
						a.Allowed[l.cause]++
						extra--
						break
					}
				}
			}
			a.Unexplained += extra
		}
	}
	return a
}

// add sums b into a.
func (a *account) add(b account) {
	a.Missing += b.Missing
	a.Twice += b.Twice
	a.Unexplained += b.Unexplained
	if a.Allowed == nil {
		a.Allowed = map[string]uint64{}
	}
	for k, v := range b.Allowed {
		a.Allowed[k] += v
	}
}
