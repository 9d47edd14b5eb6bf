package record

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cohortdl/cohort/core/status"
)

// EpochsFile holds the run's finished epochs in its out directory, one
// EpochSummary a line: the coordinator keeps them there rather than in
// memory, so it does not grow with the length of a run (about 0.85 kB an
// epoch of 4 ranks), and streams summary.json, each checkpoint's meta.json
// and the consensus file's epochs from it.
const EpochsFile = "epochs.jsonl"

// maxEpochLine bounds one line of EpochsFile when it is read back.
const maxEpochLine = 16 << 20

// EpochSource is a run's finished epochs in order, wherever they are kept.
type EpochSource interface {
	// Len is the number of epochs.
	Len() int
	// Each calls yield with each epoch's JSON (json.Marshal's bytes), in
	// order, until it returns an error. The bytes are only valid during
	// the call.
	Each(yield func(epoch []byte) error) error
}

// EpochList is an EpochSource held in memory, such as a checkpoint's
// epochs read back.
type EpochList []EpochSummary

func (l EpochList) Len() int { return len(l) }

func (l EpochList) Each(yield func([]byte) error) error {
	// One encoder into one buffer for every epoch: the garbage of a
	// rewrite does not grow with the run.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, e := range l {
		buf.Reset()
		if err := enc.Encode(e); err != nil {
			return fmt.Errorf("encode epoch %d: %w", e.Epoch, err)
		}
		if err := yield(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))); err != nil {
			return err
		}
	}
	return nil
}

// Epochs reads every epoch of src into memory.
func Epochs(src EpochSource) ([]EpochSummary, error) {
	out := make([]EpochSummary, 0, src.Len())
	err := src.Each(func(b []byte) error {
		var e EpochSummary
		if err := json.Unmarshal(b, &e); err != nil {
			return fmt.Errorf("decode finished epoch %d: %w", len(out)+1, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// epochLog is the Recorder's EpochSource: EpochsFile, or, where that
// file cannot be written (no out directory, a full disk), memory.
type epochLog struct {
	path string // "" once in memory
	n    int
	mem  EpochList
	// opened: the file holds this run's epochs; the first write replaces
	// what an earlier run into the same directory left.
	opened bool
}

func newEpochLog(out string) *epochLog {
	l := &epochLog{}
	if out != "" {
		l.path = filepath.Join(out, EpochsFile)
	}
	return l
}

func (l *epochLog) Len() int { return l.n }

// reset replaces the epochs with prior (a resumed run's inherited ones).
func (l *epochLog) reset(prior []EpochSummary) error {
	l.n, l.mem = 0, nil
	if l.path == "" {
		l.mem, l.n = append(EpochList(nil), prior...), len(prior)
		return nil
	}
	var buf bytes.Buffer
	for _, e := range prior {
		if err := appendLine(&buf, e); err != nil {
			return err
		}
	}
	if err := os.WriteFile(l.path, buf.Bytes(), 0o644); err != nil {
		return l.toMemory(prior, fmt.Errorf("write %s: %w", l.path, err))
	}
	l.n, l.opened = len(prior), true
	return nil
}

// add appends e; an error says the epochs went to memory from here on.
func (l *epochLog) add(e EpochSummary) error {
	if l.path == "" {
		l.mem, l.n = append(l.mem, e), l.n+1
		return nil
	}
	var buf bytes.Buffer
	if err := appendLine(&buf, e); err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_APPEND | os.O_CREATE
	if !l.opened {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(l.path, flags, 0o644)
	if err == nil {
		_, err = f.Write(buf.Bytes())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		// The file may hold part of the line: what is known good is
		// read back, and e kept beside it.
		prior, rerr := Epochs(l)
		if rerr != nil {
			return fmt.Errorf("append to %s: %w; and reading it back: %v", l.path, err, rerr)
		}
		return l.toMemory(append(prior, e), fmt.Errorf("append to %s: %w", l.path, err))
	}
	l.n, l.opened = l.n+1, true
	return nil
}

func (l *epochLog) toMemory(all []EpochSummary, why error) error {
	l.path, l.mem, l.n = "", append(EpochList(nil), all...), len(all)
	return fmt.Errorf("%w; the finished epochs are kept in memory", why)
}

func appendLine(buf *bytes.Buffer, e EpochSummary) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode epoch %d: %w", e.Epoch, err)
	}
	buf.Write(b)
	buf.WriteByte('\n')
	return nil
}

func (l *epochLog) Each(yield func([]byte) error) error {
	if l.path == "" {
		return l.mem.Each(yield)
	}
	if l.n == 0 {
		return nil
	}
	f, err := os.Open(l.path)
	if err != nil {
		return fmt.Errorf("read the finished epochs: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), maxEpochLine)
	for i := 0; i < l.n; i++ {
		if !sc.Scan() {
			err := sc.Err()
			if err == nil {
				err = fmt.Errorf("it ends after %d of %d epochs", i, l.n)
			}
			return fmt.Errorf("read the finished epochs from %s: %w", l.path, err)
		}
		if err := yield(sc.Bytes()); err != nil {
			return err
		}
	}
	return nil
}

// maxEpochPoints bounds the status page's epoch curve: beyond it the
// curve keeps every other point of its older part, as often as needed,
// and always the latest epoch, so a run of any length shows its whole
// course in a bounded snapshot.
const maxEpochPoints = 1024

// epochCurve is the status page's epoch curve. A snapshot shares its
// array: it is only appended to, beyond what a snapshot sees, or copied.
type epochCurve struct {
	pts    []status.EpochPoint
	stride uint64 // the epochs kept are the multiples of stride, and the latest
	tail   bool   // the last point is the latest epoch, off the stride
}

func (c *epochCurve) reset() { *c = epochCurve{} }

func (c *epochCurve) add(p status.EpochPoint) {
	if c.stride == 0 {
		c.stride = 1
	}
	if c.tail {
		// The old latest point gives way: on a new array, since a
		// snapshot may hold the old one.
		c.pts = append(make([]status.EpochPoint, 0, len(c.pts)+8), c.pts[:len(c.pts)-1]...)
	}
	c.pts = append(c.pts, p)
	c.tail = p.Epoch%c.stride != 0
	for len(c.pts) > maxEpochPoints {
		c.stride *= 2
		kept := make([]status.EpochPoint, 0, maxEpochPoints)
		for i, q := range c.pts {
			if q.Epoch%c.stride == 0 || i == len(c.pts)-1 {
				kept = append(kept, q)
			}
		}
		c.pts = kept
		c.tail = p.Epoch%c.stride != 0
	}
}

// points is the curve for a snapshot.
func (c *epochCurve) points() []status.EpochPoint { return c.pts[:len(c.pts):len(c.pts)] }
