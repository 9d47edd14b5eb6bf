package main

// DDP's side of a row: the peer one rank per process in each host, in full
// or over a bounded number of steps, and the model files both sides train.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cohortdl/cohort/bench/internal/netns"
)

// modelFile is what both sides train for a model: the built-in name, or a
// TorchScript file with the seed's initial weights.
type modelFile struct {
	path   string // "mlp", "cnn" or a file
	params int
}

// Parameter counts of the built-in models on Fashion-MNIST.
const (
	mlpParams = 784*256 + 256 + 256*10 + 10
	cnnParams = 206922
)

func (b *bench) modelFile(m model) (modelFile, error) {
	switch m.Name {
	case "mlp":
		return modelFile{"mlp", mlpParams}, nil
	case "cnn":
		return modelFile{"cnn", cnnParams}, nil
	}
	if f, ok := b.files[m.Name]; ok {
		return f, nil
	}
	script := filepath.Join(b.root, "bench", "hosts", "widemlp.py")
	if m.Name == "transformer" {
		script = filepath.Join(b.root, "bench", "training", "transformer.py")
	}
	path := filepath.Join(b.tmp, fmt.Sprintf("%s-%d.pt", m.Name, b.o.seed))
	out, err := exec.Command(b.o.python, script, "--seed", strconv.Itoa(b.o.seed), "--out", path).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, tail(string(ee.Stderr), 2000))
		}
		return modelFile{}, fmt.Errorf("script the %s: %w", m.Name, err)
	}
	params, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || params < 1 {
		return modelFile{}, fmt.Errorf("script the %s: parameter count %q", m.Name, out)
	}
	f := modelFile{path, params}
	b.files[m.Name] = f
	return f, nil
}

// gradientLinkS is the seconds a ring all-reduce of every step's float32
// gradients holds each host's link per epoch: 2(H−1)/H of them per step.
func gradientLinkS(params int, rateBits float64) float64 {
	perStep := 4 * float64(params) * 2 * float64(hosts-1) / float64(hosts)
	return float64(stepsPerEpoch(hosts, batch)) * perStep * 8 / rateBits
}

// ddp runs the peer for the row: in full where its gradients' link time
// per epoch is at most -full-epoch-s (or where no curve is known yet),
// else bounded. The first full run of a model sets its target and curve.
func (b *bench) ddp(ctx context.Context, bed *netns.Bed, rate string, m model, f modelFile) (*ddpRun, error) {
	rateBits, _ := netns.TCRate(rate)
	curve := b.curves[m.Name]
	if curve != nil && gradientLinkS(f.params, rateBits) > b.o.fullEpochS {
		return b.ddpBounded(ctx, bed, m, f, curve)
	}
	d := &ddpRun{}
	before, err := txBytes(bed)
	if err != nil {
		return nil, err
	}
	epochs, _, err := b.peer(ctx, bed, m, f, m.Epochs, nil)
	if err != nil {
		return nil, err
	}
	after, err := txBytes(bed)
	if err != nil {
		return nil, err
	}
	if len(epochs) != m.Epochs {
		return nil, fmt.Errorf("the peer printed %d epoch lines, want %d", len(epochs), m.Epochs)
	}
	for _, e := range epochs {
		d.Elapsed = append(d.Elapsed, e.ElapsedS)
		d.Accuracy = append(d.Accuracy, e.Accuracy)
	}
	d.Bytes = meanSent(before, after, float64(m.Epochs))
	if curve == nil {
		d.Target = target(m, d.Accuracy)
		d.CurveFrom = rate
		b.curves[m.Name] = d
	} else {
		d.Target, d.CurveFrom = curve.Target, curve.CurveFrom
	}
	return d, nil
}

// ddpBounded times -bounded-steps steps of the peer (ddp_steps.py) and
// takes the accuracy from curve, the same model's full run at another
// rate: the arithmetic of DDP's steps does not depend on the link. Its
// bytes are what each host sent from its first step on, by the count each
// rank prints.
func (b *bench) ddpBounded(ctx context.Context, bed *netns.Bed, m model, f modelFile, curve *ddpRun) (*ddpRun, error) {
	steps := b.o.boundedSteps
	epochs, outs, err := b.peer(ctx, bed, m, f, 1, []string{filepath.Join(b.root, "bench", "hosts", "ddp_steps.py"), "--peer", b.o.peer, "--steps", strconv.Itoa(steps), "--"})
	if err != nil {
		return nil, err
	}
	if len(epochs) != 1 {
		return nil, fmt.Errorf("the bounded peer printed %d epoch lines, want 1", len(epochs))
	}
	var sent float64
	for r, out := range outs {
		n, err := stepBytes(out)
		if err != nil {
			return nil, fmt.Errorf("bounded peer rank %d: %w", r, err)
		}
		sent += float64(n)
	}
	perEpoch := float64(stepsPerEpoch(hosts, batch)) / float64(steps)
	return &ddpRun{Accuracy: curve.Accuracy, Target: curve.Target, CurveFrom: curve.CurveFrom, Bounded: true, Steps: steps,
		StepS: epochs[0].ElapsedS / float64(steps), Bytes: sent / float64(len(outs)) * perEpoch}, nil
}

// stepBytes reads ddp_steps.py's {"tx_bytes_steps": N} line.
func stepBytes(out string) (uint64, error) {
	for _, line := range strings.Split(out, "\n") {
		var l struct {
			N *uint64 `json:"tx_bytes_steps"`
		}
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &l) == nil && l.N != nil {
			return *l.N, nil
		}
	}
	return 0, errors.New("no tx_bytes_steps line")
}

// peerEpoch is one of the peer's epoch lines.
type peerEpoch struct {
	Epoch    *int    `json:"epoch"`
	Accuracy float64 `json:"test_accuracy"`
	ElapsedS float64 `json:"elapsed_s"`
}

// peer runs the peer's ranks for epochs, one in each host, and returns
// rank 0's epoch lines and every rank's output; wrap, when set, is the script (and its arguments) the
// peer's arguments go to instead of the peer itself.
func (b *bench) peer(ctx context.Context, bed *netns.Bed, m model, f modelFile, epochs int, wrap []string) ([]peerEpoch, []string, error) {
	b.n++
	master := fmt.Sprintf("%s:%d", bed.Addr(0), 29000+b.n)
	script := wrap
	if script == nil {
		script = []string{b.o.peer}
	}
	procs := make([]*proc, hosts)
	for r := range hosts {
		args := append(append([]string{}, script...), "--rank", strconv.Itoa(r), "--world", strconv.Itoa(hosts),
			"--master", master, "--iface", "eth0", "--model", f.path, "--optimizer", m.Optimizer,
			"--lr", strconv.FormatFloat(m.LR, 'g', -1, 64), "--batch", strconv.Itoa(batch), "--threads", "1",
			"--seed", strconv.Itoa(b.o.seed), "--epochs", strconv.Itoa(epochs))
		p, err := start(ctx, bed.Command(r, b.o.python, args...), nil, b.o.verbose)
		if err != nil {
			killAll(procs)
			return nil, nil, err
		}
		procs[r] = p
	}
	var errs []error
	for _, p := range procs {
		if err := p.wait(ctx, b.o.runTimeout); err != nil {
			errs = append(errs, p.failure(err))
			killAll(procs)
		}
	}
	if len(errs) > 0 {
		return nil, nil, errs[0]
	}
	outs := make([]string, len(procs))
	for r, p := range procs {
		outs[r] = p.out.String()
	}
	var out []peerEpoch
	for _, line := range strings.Split(outs[0], "\n") {
		var e peerEpoch
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &e) == nil && e.Epoch != nil {
			out = append(out, e)
		}
	}
	return out, outs, nil
}

func killAll(ps []*proc) {
	for _, p := range ps {
		if p != nil {
			p.kill()
		}
	}
}
