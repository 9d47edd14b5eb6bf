// Command hosts benchmarks cohort's training across hosts against PyTorch
// DDP across the same hosts: 4 hosts × 1 rank, each host a network
// namespace whose link is shaped by tc tbf (bench/internal/netns), at each
// rate of -rates (1 Gbit/s and 100 Mbit/s by default), on each model of
// -models with its epochs.
//
// cohort runs as a user runs it across machines: `cohort coordinator` in
// host 0, one `cohort worker` in each host (its own hostname and /dev/shm,
// so the averager sees four hosts and rounds cross the shaped links),
// trainer libtorch, averager cpu with its defaults but for the wire, tried
// on each of -wires; the row keeps the wire that reached the target first.
// DDP is ../shared/peers/ddp_fashion_mnist.py, one rank per process in each
// host (--rank --world --master --iface eth0). Both sides train the same
// model from the same initial weights (the built-in mlp and cnn, the
// transformer of bench/training/transformer.py and the ≥ 5 M-parameter
// wide MLP of widemlp.py, both scripted to TorchScript here), the same
// optimizer (SGD lr 0.05 momentum 0.9, or AdamW lr 0.002 for the
// transformer), batch 64 per rank, 1 thread per rank, seed -seed.
//
// Per row it reports both sides' final accuracy (after the model's last
// epoch), their time to the model's target (cohort's from its summary's
// epoch seconds, DDP's from its epoch lines, both counting evaluation), the
// ratio, and the bytes each host's eth0 sent per epoch by the kernel's
// count (tx_bytes: headers, control traffic and all; the mean over hosts).
// The MLP's target is 85%; the others' DDP's own accuracy one epoch before
// the last, rounded down to half a point, read from the first rate's run.
//
// Where DDP's gradients alone would hold the link for longer than
// -full-epoch-s per epoch (the wide MLP at 100 Mbit/s: about 11 minutes),
// DDP runs -bounded-steps steps there (ddp_steps.py: the peer's own loop on
// that many batches) and its time to the target is its per-step time times
// the steps its curve needed at the first rate (the same arithmetic,
// whatever the link), without its evaluations, which favours DDP; its
// accuracy is that curve's, and the row says "estimated".
//
// Goals (the wide MLP): cohort's time to the target at most 0.3× DDP's at
// 1 Gbit/s and 0.15× at 100 Mbit/s, at a final accuracy at least DDP's −
// 0.1 point. Each row ends in one JSON line {"bench": "matrix", "where":
// "netns-1gbit", ...}. It needs root; without it, it says so and exits 0.
// It exits non-zero only when something failed to run, never for a missed
// goal. SIGINT and SIGTERM stop the runs and remove the namespaces.
//
// Where is: main.go the flags and the rows; cohort.go cohort's runs on the
// bed; ddp.go the peer's; figures.go targets, times and the printed row.
//
//	go run ./bench/hosts -cohort bin/cohort
//	go run ./bench/hosts -cohort bin/cohort -models mlp=1 -rates 1gbit -wires bf16
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/bench/internal/netns"
	"github.com/cohortdl/cohort/bench/internal/repo"
)

const (
	dataDir = "/usr/share/datasets/fashion-mnist"
	hosts   = 4
	batch   = 64
	// nsPrefix names the bed's namespaces; site is its 10.<site>.x.0/24.
	nsPrefix = "cohort-hosts"
	site     = 79
)

// model is one row's model: its name, optimizer and learning rate (both
// sides), and epochs.
type model struct {
	Name      string
	Optimizer string
	LR        float64
	Epochs    int
}

var models = []model{
	{Name: "mlp", Optimizer: "sgd", LR: 0.05},
	{Name: "cnn", Optimizer: "sgd", LR: 0.05},
	{Name: "transformer", Optimizer: "adamw", LR: 0.002},
	{Name: "wide", Optimizer: "sgd", LR: 0.05},
}

type options struct {
	cohort        string
	python        string
	peer          string
	models        []model
	rates         []string
	wires         []string
	seed          int
	fullEpochS    float64
	boundedSteps  int
	runTimeout    time.Duration
	keep, verbose bool
}

func main() {
	var o options
	flag.StringVar(&o.cohort, "cohort", "bin/cohort", "the cohort binary (its plugins in plugins/ beside it)")
	flag.StringVar(&o.python, "python", "/usr/bin/python3", "python with torch")
	flag.StringVar(&o.peer, "peer", "", "the DDP peer (default: ../shared/peers/ddp_fashion_mnist.py beside the repository, or beside the checkout a worktree or clone comes from)")
	modelList := flag.String("models", "mlp=3,cnn=3,transformer=3,wide=3", "models and their epochs, in the order they run (mlp, cnn, transformer, wide)")
	rateList := flag.String("rates", "1gbit,100mbit", "link rates (tc), in order; the first is where DDP's accuracy curve is read")
	wireList := flag.String("wires", "f32,bf16", "averaging-cpu wires cohort tries on each row")
	flag.IntVar(&o.seed, "seed", 1, "the seed of both sides (data order, initial weights)")
	flag.Float64Var(&o.fullEpochS, "full-epoch-s", 150, "DDP runs in full where its gradients' link time per epoch is at most this; beyond, it runs -bounded-steps steps")
	flag.IntVar(&o.boundedSteps, "bounded-steps", 12, "steps of a bounded DDP run")
	flag.DurationVar(&o.runTimeout, "run-timeout", 30*time.Minute, "the longest one run may take")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (configs, outputs, logs)")
	flag.BoolVar(&o.verbose, "v", false, "pass every run's output through to stderr")
	flag.Parse()
	err := o.parse(*modelList, *rateList, *wireList)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/hosts:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Println("cross-host training rows skipped: they need root (ip netns, tc)")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/hosts:", err)
		os.Exit(1)
	}
}

func (o *options) parse(modelList, rateList, wireList string) error {
	known := map[string]model{}
	for _, m := range models {
		known[m.Name] = m
	}
	for _, f := range strings.Split(modelList, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(f), "=")
		e, err := strconv.Atoi(n)
		if !ok || err != nil || e < 1 {
			return fmt.Errorf("-models %q: want model=epochs, epochs at least 1", f)
		}
		m, found := known[name]
		if !found {
			return fmt.Errorf("-models: unknown model %q (mlp, cnn, transformer, wide)", name)
		}
		delete(known, name)
		m.Epochs = e
		o.models = append(o.models, m)
	}
	for _, r := range strings.Split(rateList, ",") {
		if _, err := netns.TCRate(r); err != nil {
			return fmt.Errorf("-rates: %w", err)
		}
		o.rates = append(o.rates, r)
	}
	for _, w := range strings.Split(wireList, ",") {
		if w != "f32" && w != "bf16" {
			return fmt.Errorf("-wires: %q is not an averaging-cpu wire (f32, bf16)", w)
		}
		o.wires = append(o.wires, w)
	}
	if o.boundedSteps < 1 || o.seed < 0 || !(o.fullEpochS > 0) {
		return errors.New("-bounded-steps must be at least 1, -seed not negative, -full-epoch-s positive")
	}
	return nil
}

// bench is what every row shares.
type bench struct {
	o    options
	root string
	tmp  string
	n    int // runs so far, for directory names and ports
	// curves holds each model's DDP run at the first rate: its target and
	// the accuracy curve bounded runs are read against.
	curves map[string]*ddpRun
	files  map[string]modelFile
}

func run(ctx context.Context, o options) error {
	root, err := repo.Root()
	if err != nil {
		return err
	}
	if o.cohort, err = repo.Cohort(o.cohort); err != nil {
		return err
	}
	if o.peer == "" {
		if o.peer, err = repo.DDPPeer(root); err != nil {
			return err
		}
	}
	tmp, err := os.MkdirTemp("", "cohort-bench-hosts-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "keeping", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	b := &bench{o: o, root: root, tmp: tmp, curves: map[string]*ddpRun{}, files: map[string]modelFile{}}
	start := time.Now()
	fmt.Printf("cohort vs torch DDP (gloo) across %d hosts × 1 rank (network namespaces, each host's egress shaped by tc tbf), Fashion-MNIST, batch %d per rank, 1 thread per rank, seed %d\n",
		hosts, batch, o.seed)
	fmt.Println("time to target: cohort's summary epoch seconds, DDP's epoch elapsed_s, both with their evaluations; bytes: each host's eth0 tx_bytes per epoch (all frames), mean over hosts")
	var rows []row
	for _, rate := range o.rates {
		var rs []row
		rs, err = b.rate(ctx, rate)
		rows = append(rows, rs...)
		if err != nil {
			break
		}
	}
	fmt.Printf("\ntotal %.0f s\n", time.Since(start).Seconds())
	// The rows' JSON lines together, those done before a failure too.
	for _, r := range rows {
		if perr := printJSON(r.line()); perr != nil {
			return errors.Join(err, perr)
		}
	}
	return err
}

// rate runs every model at one rate, on a bed of its own that it removes
// however the rows end, and prints each row as it is done.
func (b *bench) rate(ctx context.Context, rate string) ([]row, error) {
	bed, err := netns.New(nsPrefix, site, hosts, rate)
	if err != nil {
		return nil, err
	}
	defer bed.Close()
	fmt.Printf("\n%s\n%s\n", rate, header())
	var rows []row
	for _, m := range b.o.models {
		r, err := b.row(ctx, bed, rate, m)
		if err != nil {
			return rows, fmt.Errorf("%s at %s: %w", m.Name, rate, err)
		}
		rows = append(rows, r)
		fmt.Println(r.text())
		for _, n := range r.notes {
			fmt.Println("      " + n)
		}
	}
	return rows, nil
}

// row runs one model at one rate: DDP (in full or bounded), then cohort on
// each wire.
func (b *bench) row(ctx context.Context, bed *netns.Bed, rate string, m model) (row, error) {
	f, err := b.modelFile(m)
	if err != nil {
		return row{}, err
	}
	r := row{model: m, rate: rate, params: f.params}
	d, err := b.ddp(ctx, bed, rate, m, f)
	if err != nil {
		return row{}, fmt.Errorf("DDP: %w", err)
	}
	r.ddp = d
	for _, wire := range b.o.wires {
		c, err := b.cohort(ctx, bed, m, f, wire)
		if err != nil {
			return row{}, fmt.Errorf("cohort, %s wire: %w", wire, err)
		}
		r.cohorts = append(r.cohorts, c)
	}
	r.settle()
	return r, nil
}
