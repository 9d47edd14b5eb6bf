package main

// cohort's side of a row: the coordinator in host 0 and one worker in each
// host, as a user runs them across machines.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cohortdl/cohort/bench/internal/netns"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// config is a row's cohort config: the trainer block names every setting
// both sides share, so a change of the built-in defaults cannot change
// what is compared; the coordinator and the averager keep their defaults
// but for the wire.
func (b *bench) config(m model, f modelFile, wire string) string {
	var t strings.Builder
	fmt.Fprintf(&t, "  model      = %s\n", strconv.Quote(f.path))
	if f.path == "mlp" {
		t.WriteString("  hidden     = [256]\n")
	}
	fmt.Fprintf(&t, "  optimizer  = %s\n  lr         = %s\n", strconv.Quote(m.Optimizer), strconv.FormatFloat(m.LR, 'g', -1, 64))
	if m.Optimizer == "sgd" {
		t.WriteString("  momentum   = 0.9\n")
	}
	return fmt.Sprintf(`run {
  seed   = %d
  epochs = %d
}

worker {
  plugin_dir = %s
}

trainer "libtorch" {
%s  data       = %s
  batch_size = %d
  threads    = 1
}

averager "cpu" {
  wire = %s
}
`, b.o.seed, m.Epochs, strconv.Quote(filepath.Join(filepath.Dir(b.o.cohort), "plugins")), t.String(),
		strconv.Quote(dataDir), batch, strconv.Quote(wire))
}

// coordinatorPort is where the coordinator listens in host 0.
const coordinatorPort = 7000

// cohort runs cohort on the bed for the model's epochs on wire.
func (b *bench) cohort(ctx context.Context, bed *netns.Bed, m model, f modelFile, wire string) (cohortRun, error) {
	b.n++
	dir := filepath.Join(b.tmp, fmt.Sprintf("cohort-%02d-%s-%s", b.n, m.Name, wire))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return cohortRun{}, err
	}
	cfg, secret, out := filepath.Join(dir, "cohort.hcl"), filepath.Join(dir, "secret"), filepath.Join(dir, "out")
	if err := os.WriteFile(cfg, []byte(b.config(m, f, wire)), 0o644); err != nil {
		return cohortRun{}, err
	}
	if err := os.WriteFile(secret, []byte(fmt.Sprintf("bench-hosts-secret-%d-%d-0123456789", os.Getpid(), b.n)), 0o600); err != nil {
		return cohortRun{}, err
	}
	env := []string{"COHORT_SECRET_FILE=" + secret}
	coordAddr := fmt.Sprintf("%s:%d", bed.Addr(0), coordinatorPort)
	before, err := txBytes(bed)
	if err != nil {
		return cohortRun{}, err
	}
	coord, err := start(ctx, bed.Command(0, b.o.cohort, "coordinator", "--config", cfg, "--listen", coordAddr,
		"--ranks", strconv.Itoa(hosts), "--out", out, "--http", ""), env, b.o.verbose)
	if err != nil {
		return cohortRun{}, err
	}
	workers := make([]*proc, 0, hosts)
	for r := range hosts {
		// Each host its own hostname and /dev/shm, as separate machines
		// have: the averager groups ranks into hosts by them.
		script := fmt.Sprintf("mount -t tmpfs -o size=2g tmpfs /dev/shm && hostname %s-h%d && exec %s worker --config %s --coordinator %s --rank %d --world %d --local-ranks 1",
			nsPrefix, r, strconv.Quote(b.o.cohort), strconv.Quote(cfg), coordAddr, r, hosts)
		w, err := start(ctx, bed.Command(r, "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script), env, b.o.verbose)
		if err != nil {
			coord.kill()
			killAll(workers)
			return cohortRun{}, err
		}
		workers = append(workers, w)
	}
	cerr := coord.wait(ctx, b.o.runTimeout)
	var werr error
	for _, w := range workers {
		if err := w.wait(ctx, 60*time.Second); err != nil && werr == nil {
			werr = w.failure(err)
		}
	}
	if cerr != nil {
		return cohortRun{}, coord.failure(cerr)
	}
	if werr != nil {
		return cohortRun{}, werr
	}
	after, err := txBytes(bed)
	if err != nil {
		return cohortRun{}, err
	}
	sum, err := record.ReadSummary(filepath.Join(out, record.SummaryFile))
	if err != nil {
		return cohortRun{}, err
	}
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != m.Epochs {
		return cohortRun{}, fmt.Errorf("cohort: status %q, %d of %d epochs: %s", sum.Status, len(sum.Epochs), m.Epochs, sum.Error)
	}
	c := cohortRun{Wire: wire, Bytes: meanSent(before, after, float64(m.Epochs)), Rounds: sum.Averaging.Rounds}
	for _, e := range sum.Epochs {
		if e.Accuracy == nil {
			return cohortRun{}, fmt.Errorf("cohort: epoch %d has no accuracy", e.Epoch+1)
		}
		c.Seconds = append(c.Seconds, e.Seconds)
		c.Accuracy = append(c.Accuracy, *e.Accuracy)
	}
	return c, nil
}
