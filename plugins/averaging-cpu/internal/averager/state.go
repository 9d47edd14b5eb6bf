package averager

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/cohortdl/cohort/shared/atomicfile"

	"encoding/binary"

	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

// StateFile is the file SaveState writes into a checkpoint directory.
const StateFile = "averager-cpu-outer.bin"

// The outer state file: header, the previous global parameters and the
// velocity as little-endian f32, then a SHA-256 of everything before it.
//
//	0  magic "COHORT-OUTER-v01"  16 kind u32   20 lr f32   24 mu f32
//	28 reserved u32              32 steps u64  40 layout digest [32]
//	72 count u64                 80 prev [count]f32, vel [count]f32
//	.. sha256 [32]
var le = binary.LittleEndian

const (
	stateMagic  = "COHORT-OUTER-v01"
	stateHeader = 80
)

// SaveState writes the outer optimizer's state (the previous global
// parameters and the velocity, identical on every rank) into dir and
// returns the file's path; with no outer optimizer it writes nothing. The
// file is written to a temporary name, synced and renamed.
func (a *Averager) SaveState(ctx context.Context, dir string) ([]string, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.c == nil {
		return nil, errors.New("averager: SaveState before Configure")
	}
	c := a.c
	if c.outer == nil {
		return nil, nil
	}
	path := filepath.Join(dir, StateFile)
	err := atomicfile.Write(path, func(out io.Writer) error {
		h := sha256.New()
		w := io.MultiWriter(out, h)
		var hdr [stateHeader]byte
		copy(hdr[:16], stateMagic)
		le.PutUint32(hdr[16:], uint32(c.cfg.outer.Kind))
		le.PutUint32(hdr[20:], math.Float32bits(c.cfg.outer.LR))
		le.PutUint32(hdr[24:], math.Float32bits(c.cfg.outer.Mu))
		le.PutUint64(hdr[32:], c.outerSteps)
		d := c.layout.Digest()
		copy(hdr[40:72], d[:])
		le.PutUint64(hdr[72:], uint64(c.np))
		if _, err := w.Write(hdr[:]); err != nil {
			return err
		}
		if _, err := w.Write(c.outer.Bytes()); err != nil {
			return err
		}
		_, err := out.Write(h.Sum(nil))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("averager: save state: %w", err)
	}
	return []string{path}, nil
}

// LoadState restores the outer optimizer's state from dir. Every rank must
// load the same checkpoint (ranks whose states disagree restart the outer
// optimizer from the next consensus, with a warning). With no outer
// optimizer it does nothing; with no state file in dir it starts fresh and
// logs a warning.
func (a *Averager) LoadState(ctx context.Context, dir string) error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.c == nil {
		return errors.New("averager: LoadState before Configure")
	}
	c := a.c
	if c.outer == nil {
		return nil
	}
	path := filepath.Join(dir, StateFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		a.log.Warn("no outer optimizer state in the checkpoint; starting it fresh", "dir", dir)
		c.outerSteps, c.outerID = 0, [8]byte{}
		return nil
	}
	if err != nil {
		return fmt.Errorf("averager: load state: %w", err)
	}
	defer f.Close()
	// Until the checksum verifies, the state counts as fresh: a partly
	// read file is overwritten by the next round's seed.
	c.outerSteps, c.outerID = 0, [8]byte{}
	h := sha256.New()
	br := bufio.NewReaderSize(f, 1<<20)
	r := io.TeeReader(br, h)
	var hdr [stateHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("averager: load state %s: header: %w", path, err)
	}
	d := c.layout.Digest()
	switch {
	case string(hdr[:16]) != stateMagic:
		return fmt.Errorf("averager: load state %s: not an averaging-cpu outer state file", path)
	case [32]byte(hdr[40:72]) != d:
		return fmt.Errorf("averager: load state %s: saved for another parameter layout", path)
	case le.Uint64(hdr[72:]) != uint64(c.np):
		return fmt.Errorf("averager: load state %s: %d parameters, this layout has %d", path, le.Uint64(hdr[72:]), c.np)
	}
	if k := numeric.OuterKind(le.Uint32(hdr[16:])); k != c.cfg.outer.Kind {
		a.log.Warn("outer optimizer state was saved by another optimizer; its velocity is reused", "saved", k.String(), "now", c.cfg.outer.Kind.String())
	}
	if _, err := io.ReadFull(r, c.outer.Bytes()); err != nil {
		return fmt.Errorf("averager: load state %s: %w", path, err)
	}
	sum := h.Sum(nil)
	var tail [sha256.Size + 1]byte
	if n, err := io.ReadFull(br, tail[:]); n != sha256.Size || !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("averager: load state %s: the file does not end with its checksum", path)
	}
	if !bytes.Equal(sum, tail[:sha256.Size]) {
		return fmt.Errorf("averager: load state %s: checksum mismatch (corrupt file)", path)
	}
	c.outerSteps = le.Uint64(hdr[32:])
	copy(c.outerID[:], sum)
	if c.outerSteps == 0 {
		c.outerID = [8]byte{}
	}
	a.log.Info("outer optimizer state loaded", "path", path, "steps", c.outerSteps)
	return nil
}
