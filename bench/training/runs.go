package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// What both sides of every comparison share and the flags do not set.
const (
	momentum = 0.9
	averager = "cpu"
)

// The built-in coordinator policy, for the printed description.
var (
	defaultPolicy    = string(config.Default().Coordinator.Policy)
	defaultSyncEvery = config.Default().Coordinator.SyncEvery
)

// runConfig is one cohort run's config file.
type runConfig struct {
	Seed      int
	Policy    string // "" leaves the built-in policy
	SyncEvery int    // 0 leaves the built-in sync_every
	PluginDir string
	Data      string
	// Model is "mlp" (784-256-10, also when empty), "cnn" or a TorchScript
	// file; Optimizer is "sgd" (momentum 0.9, also when empty) or "adamw"
	// (the trainer's and the peer's defaults: weight decay 0.01).
	Model     string
	Optimizer string
	Batch     int
	LR        float64
	Threads   int
	// SlowRank and SlowDelay, when SlowDelay is set, slow that rank by a
	// fixed time per batch (trainer-libtorch's sleep_per_batch_by_rank).
	SlowRank  int
	SlowDelay time.Duration
	// Blocking turns the async policy's overlapped rounds off.
	Blocking bool
	// Hook, when set, runs as the run starts (see runLogged).
	Hook func(pid int) func() error
}

// hcl renders the config file: the trainer block names every setting of
// the comparison explicitly, so a change of the built-in defaults cannot
// change what is compared.
func (c runConfig) hcl() string {
	var b strings.Builder
	fmt.Fprintf(&b, "run {\n  seed = %d\n}\n\n", c.Seed)
	if c.Policy != "" || c.SyncEvery > 0 || c.Blocking {
		b.WriteString("coordinator {\n")
		if c.Blocking {
			b.WriteString("  async_overlap = false\n")
		}
		if c.Policy != "" {
			fmt.Fprintf(&b, "  policy     = %s\n", hclString(c.Policy))
		}
		if c.SyncEvery > 0 {
			fmt.Fprintf(&b, "  sync_every = %d\n", c.SyncEvery)
		}
		b.WriteString("}\n\n")
	}
	if c.PluginDir != "" {
		fmt.Fprintf(&b, "worker {\n  plugin_dir = %s\n}\n\n", hclString(c.PluginDir))
	}
	fmt.Fprintf(&b, `trainer "libtorch" {
%s  data       = %s
  batch_size = %d
%s  threads    = %d
%s}

averager %s {
}
`, c.modelSettings(), hclString(c.Data), c.Batch, c.optimizerSettings(), c.Threads, c.slowSetting(), hclString(averager))
	return b.String()
}

// modelName is the model as the peer's --model takes it.
func (c runConfig) modelName() string {
	if c.Model == "" {
		return "mlp"
	}
	return c.Model
}

// optimizerName is the optimizer as the peer's --optimizer takes it.
func (c runConfig) optimizerName() string {
	if c.Optimizer == "" {
		return "sgd"
	}
	return c.Optimizer
}

// modelSettings are the trainer block's model lines.
func (c runConfig) modelSettings() string {
	if m := c.modelName(); m != "mlp" {
		return fmt.Sprintf("  model      = %s\n", hclString(m))
	}
	return "  model      = \"mlp\"\n  hidden     = [256]\n"
}

// optimizerSettings are the trainer block's optimizer lines: SGD names its
// momentum, AdamW keeps the trainer's defaults, which are the peer's.
func (c runConfig) optimizerSettings() string {
	lr := strconv.FormatFloat(c.LR, 'g', -1, 64)
	if o := c.optimizerName(); o != "sgd" {
		return fmt.Sprintf("  optimizer  = %s\n  lr         = %s\n", hclString(o), lr)
	}
	return fmt.Sprintf("  optimizer  = \"sgd\"\n  lr         = %s\n  momentum   = %s\n", lr, strconv.FormatFloat(momentum, 'g', -1, 64))
}

// slowSetting is the trainer block's sleep_per_batch_by_rank line, if any.
func (c runConfig) slowSetting() string {
	if c.SlowDelay <= 0 {
		return ""
	}
	return fmt.Sprintf("  sleep_per_batch_by_rank = { %s = %s }\n", hclString(strconv.Itoa(c.SlowRank)), hclString(c.SlowDelay.String()))
}

// hclString quotes s as an HCL string literal: Go's escapes, and the
// template introducers $${ and %%{ doubled so they stay literal.
func hclString(s string) string {
	q := strconv.Quote(s)
	q = strings.ReplaceAll(q, "${", "$${")
	return strings.ReplaceAll(q, "%{", "%%{")
}

// pluginDir is plugins/ next to the cohort binary, where make build puts
// them.
func pluginDir(cohort string) string { return filepath.Join(filepath.Dir(cohort), "plugins") }

// cohortRun runs `cohort run` with cfg from the repository root, on cpus
// (any when empty), and returns its summary and the command's wall time.
func (h *harness) cohortRun(cfg runConfig, ranks, epochs int, cpus []int) (*record.Summary, float64, error) {
	h.n++
	dir := filepath.Join(h.tmp, fmt.Sprintf("cohort-%02d", h.n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, err
	}
	cfgPath := filepath.Join(dir, "cohort.hcl")
	if err := os.WriteFile(cfgPath, []byte(cfg.hcl()), 0o644); err != nil {
		return nil, 0, err
	}
	out := filepath.Join(dir, "out")
	cmd := exec.Command(h.o.cohort, "run", "--config", cfgPath, "--ranks", strconv.Itoa(ranks),
		"--epochs", strconv.Itoa(epochs), "--out", out)
	cmd.Dir = h.root
	start := time.Now()
	logs, err := h.runLogged(cmd, cpus, cfg.Hook)
	wall := time.Since(start).Seconds()
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, tail(logs, 4000))
	}
	sum, err := record.ReadSummary(filepath.Join(out, record.SummaryFile))
	if err != nil {
		return nil, 0, err
	}
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != epochs {
		return nil, 0, fmt.Errorf("cohort run: status %q, %d of %d epochs: %s", sum.Status, len(sum.Epochs), epochs, sum.Error)
	}
	return sum, wall, nil
}

// runLogged runs cmd on cpus (any when empty) with stdout and stderr into
// one buffer (and to stderr with -v), and returns what it wrote. hook, when
// set, is called with the started process's pid; what it returns is called
// once the process has exited.
func (h *harness) runLogged(cmd *exec.Cmd, cpus []int, hook func(pid int) func() error) (string, error) {
	var buf bytes.Buffer
	var w io.Writer = &buf
	if h.o.verbose {
		w = io.MultiWriter(&buf, os.Stderr)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err := startOn(cmd, cpus)
	if err == nil {
		err = waitHooked(cmd, hook)
	}
	return buf.String(), err
}

// waitHooked waits for the started cmd; hook, when set, is called with its
// pid first, and what hook returns once it has exited.
func waitHooked(cmd *exec.Cmd, hook func(pid int) func() error) error {
	if hook == nil {
		return cmd.Wait()
	}
	done := hook(cmd.Process.Pid)
	return errors.Join(cmd.Wait(), done())
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// peerResult is the DDP peer's output: its final line and its epoch lines.
type peerResult struct {
	Peer            string      `json:"peer"`
	FinalAccuracy   float64     `json:"final_accuracy"`
	SecondsToTarget *float64    `json:"seconds_to_target"`
	WallS           float64     `json:"wall_s"`
	ProcessWallS    float64     `json:"process_wall_s"`
	Epochs          []peerEpoch `json:"-"`
}

type peerEpoch struct {
	Epoch    *int    `json:"epoch"`
	Accuracy float64 `json:"test_accuracy"`
	ElapsedS float64 `json:"elapsed_s"`
}

// parsePeer reads the peer's stdout: one JSON line per epoch, then the
// result line (the one naming the peer). Other lines are ignored.
func parsePeer(out string) (peerResult, error) {
	var res peerResult
	found := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var probe struct {
			Peer  string `json:"peer"`
			Epoch *int   `json:"epoch"`
		}
		if json.Unmarshal([]byte(line), &probe) != nil {
			continue
		}
		switch {
		case probe.Peer != "":
			epochs := res.Epochs
			res = peerResult{}
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				return peerResult{}, fmt.Errorf("peer result line %q: %w", line, err)
			}
			res.Epochs = epochs
			found = true
		case probe.Epoch != nil:
			var e peerEpoch
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				return peerResult{}, fmt.Errorf("peer epoch line %q: %w", line, err)
			}
			res.Epochs = append(res.Epochs, e)
		}
	}
	if !found {
		return peerResult{}, fmt.Errorf("no result line in the peer's output %q", tail(out, 2000))
	}
	return res, nil
}

// peerRun runs the DDP peer with cfg's seed, model, optimizer, learning
// rate and batch, and the comparison's ranks, epochs and target (1 thread
// per rank); hook as for runLogged.
func (h *harness) peerRun(cfg runConfig, hook func(pid int) func() error) (peerResult, error) {
	o := h.o
	cmd := exec.Command(o.python, o.peer, "--ranks", strconv.Itoa(o.ranks), "--epochs", strconv.Itoa(o.targetEpochs),
		"--model", cfg.modelName(), "--optimizer", cfg.optimizerName(), "--threads", "1",
		"--lr", strconv.FormatFloat(cfg.LR, 'g', -1, 64), "--batch", strconv.Itoa(cfg.Batch),
		"--seed", strconv.Itoa(cfg.Seed), "--target", strconv.FormatFloat(o.target, 'g', -1, 64))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if o.verbose {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, os.Stderr), io.MultiWriter(&stderr, os.Stderr)
	}
	err := cmd.Start()
	if err == nil {
		err = waitHooked(cmd, hook)
	}
	if err != nil {
		return peerResult{}, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, tail(stderr.String(), 4000))
	}
	res, err := parsePeer(stdout.String())
	if err != nil {
		return peerResult{}, fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	if len(res.Epochs) != o.targetEpochs {
		return peerResult{}, fmt.Errorf("%s: %d epoch lines, want %d", strings.Join(cmd.Args, " "), len(res.Epochs), o.targetEpochs)
	}
	return res, nil
}

// buildRef builds the libtorch reference loop (make keeps it up to date).
func (h *harness) buildRef() error {
	cmd := exec.Command("make", "--no-print-directory", "-f", "plugins/trainer-libtorch/shim.mk", "ref", "REF_OUT="+h.o.ref)
	cmd.Dir = h.root
	if logs, err := h.runLogged(cmd, nil, nil); err != nil {
		return fmt.Errorf("build the reference loop: %w\n%s", err, tail(logs, 4000))
	}
	return nil
}

// ompWaitPolicy is what the reference runs with: the environment's, else
// PASSIVE, which the plugin sets for itself in the same case.
func ompWaitPolicy() string {
	if v := os.Getenv("OMP_WAIT_POLICY"); v != "" {
		return v
	}
	return "PASSIVE"
}

// openBLASThreadTimeout is what the reference runs with: the
// environment's, else what trainer-libtorch's shim package sets for itself
// in the same case (its OpenBLASThreadTimeout).
func openBLASThreadTimeout() string {
	if v := os.Getenv("OPENBLAS_THREAD_TIMEOUT"); v != "" {
		return v
	}
	return "18"
}

// refMalloc is the glibc malloc settings the reference runs with: what
// trainer-libtorch's shim package makes for itself (its MallocEnv, which
// this package cannot import; the same rule and values), so nil where the
// environment chose its own and the plugin then makes none.
func refMalloc() []string {
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_":
			return nil
		case "GLIBC_TUNABLES":
			for _, t := range strings.Split(v, ":") {
				switch name, _, _ := strings.Cut(t, "="); name {
				case "glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad", "glibc.malloc.mmap_max":
					return nil
				}
			}
		}
	}
	return []string{"MALLOC_MMAP_THRESHOLD_=" + strconv.Itoa(32<<20), "MALLOC_TRIM_THRESHOLD_=" + strconv.Itoa(64<<20)}
}

// refRun runs the reference loop for the comparison's epochs on cpus (any
// when empty) and returns its seconds per epoch.
func (h *harness) refRun(images, labels string, n, features, threads int, cpus []int) ([]float64, error) {
	o := h.o
	// No warm-up batches: cohort's run starts cold, and its first epoch
	// holds its first batches.
	cmd := exec.Command(o.ref, images, labels, strconv.Itoa(n), strconv.Itoa(features), strconv.Itoa(o.singleEpochs),
		strconv.Itoa(threads), strconv.Itoa(o.batch), "0")
	cmd.Env = append(os.Environ(), "OMP_WAIT_POLICY="+ompWaitPolicy(), "OPENBLAS_THREAD_TIMEOUT="+openBLASThreadTimeout())
	cmd.Env = append(cmd.Env, refMalloc()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := startOn(cmd, cpus)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, tail(stderr.String(), 4000))
	}
	if o.verbose {
		os.Stderr.Write(stdout.Bytes())
	}
	ms, err := parseRef(stdout.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.ref, err)
	}
	if len(ms) != o.singleEpochs {
		return nil, fmt.Errorf("%s: %d epochs timed, want %d", o.ref, len(ms), o.singleEpochs)
	}
	s := make([]float64, len(ms))
	for i, v := range ms {
		s[i] = round4(v / 1e3)
	}
	return s, nil
}

// parseRef reads the reference's JSON line and returns its milliseconds
// per epoch.
func parseRef(out string) ([]float64, error) {
	var res struct {
		MS []float64 `json:"ms_per_epoch"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil || len(res.MS) == 0 {
		return nil, fmt.Errorf("unexpected output %q (%v)", tail(out, 2000), err)
	}
	for _, v := range res.MS {
		if !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("bad epoch time %v in %q", v, out)
		}
	}
	return res.MS, nil
}

// The training split's IDX files, without their optional .gz.
var trainFiles = [2]string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}

// findIDX returns the path of name or name.gz in dir.
func findIDX(dir, name string) (string, error) {
	for _, p := range []string{filepath.Join(dir, name), filepath.Join(dir, name+".gz")} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("neither %s nor %s.gz in %s (apt-get install dataset-fashion-mnist)", name, name, dir)
}

// trainOnlyData is a directory with links to the training files and no
// test files: the trainer then has nothing to evaluate.
func (h *harness) trainOnlyData() (string, error) {
	dir := filepath.Join(h.tmp, "train-only")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, name := range trainFiles {
		src, err := findIDX(dataDir, name)
		if err != nil {
			return "", err
		}
		dst := filepath.Join(dir, filepath.Base(src))
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := os.Symlink(src, dst); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// rawTrainingSet writes the training images and labels as the raw uint8
// files the reference reads, and returns their paths, the sample count and
// the features per sample.
func (h *harness) rawTrainingSet() (images, labels string, n, features int, err error) {
	var arrays [2][]byte
	var dims [2][]int
	for i, name := range trainFiles {
		path, err := findIDX(dataDir, name)
		if err != nil {
			return "", "", 0, 0, err
		}
		if dims[i], arrays[i], err = readIDXFile(path); err != nil {
			return "", "", 0, 0, err
		}
	}
	if len(dims[1]) != 1 || dims[0][0] != dims[1][0] {
		return "", "", 0, 0, fmt.Errorf("images %v and labels %v do not match", dims[0], dims[1])
	}
	n = dims[0][0]
	features = len(arrays[0]) / max(n, 1)
	images, labels = filepath.Join(h.tmp, "images.u8"), filepath.Join(h.tmp, "labels.u8")
	if err := os.WriteFile(images, arrays[0], 0o600); err != nil {
		return "", "", 0, 0, err
	}
	if err := os.WriteFile(labels, arrays[1], 0o600); err != nil {
		return "", "", 0, 0, err
	}
	return images, labels, n, features, nil
}

func readIDXFile(path string) ([]int, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	dims, data, err := readIDX(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return dims, data, nil
}

// maxIDXBytes bounds what readIDX accepts; Fashion-MNIST's training images
// are 47 MB.
const maxIDXBytes = 1 << 30

// readIDX reads an unsigned-byte IDX array, gzipped or not, and returns its
// dimensions and data.
func readIDX(r io.Reader) ([]int, []byte, error) {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	var head [4]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		return nil, nil, fmt.Errorf("IDX header: %w", err)
	}
	if head[0] != 0 || head[1] != 0 {
		return nil, nil, fmt.Errorf("not an IDX file: magic % x", head)
	}
	if head[2] != 0x08 {
		return nil, nil, fmt.Errorf("IDX element type 0x%02x, want unsigned bytes (0x08)", head[2])
	}
	ndim := int(head[3])
	if ndim == 0 {
		return nil, nil, errors.New("IDX array of no dimensions")
	}
	dims := make([]int, ndim)
	total := 1
	for i := range dims {
		var d uint32
		if err := binary.Read(br, binary.BigEndian, &d); err != nil {
			return nil, nil, fmt.Errorf("IDX dimension %d: %w", i, err)
		}
		dims[i] = int(d)
		if d == 0 || total > maxIDXBytes/int(d) {
			return nil, nil, fmt.Errorf("IDX dimensions %v: empty or over %d bytes", dims[:i+1], maxIDXBytes)
		}
		total *= int(d)
	}
	data := make([]byte, total)
	if _, err := io.ReadFull(br, data); err != nil {
		return nil, nil, fmt.Errorf("IDX data (%v): %w", dims, err)
	}
	if n, _ := br.Read(make([]byte, 1)); n > 0 {
		return nil, nil, fmt.Errorf("IDX data (%v): trailing bytes", dims)
	}
	return dims, data, nil
}

// epochStats is a run's per-epoch seconds and accuracies.
type epochStats struct {
	seconds  []float64
	accuracy []float64
	total    float64
}

// epochFigures takes the summary's epochs; every one must carry an
// accuracy.
func epochFigures(es []record.EpochSummary) (epochStats, error) {
	var e epochStats
	if len(es) == 0 {
		return e, errors.New("the summary lists no epochs")
	}
	for _, s := range es {
		if s.Accuracy == nil {
			return e, fmt.Errorf("epoch %d has no accuracy: the trainer did not evaluate", s.Epoch+1)
		}
		e.seconds = append(e.seconds, round4(s.Seconds))
		e.accuracy = append(e.accuracy, *s.Accuracy)
		e.total += s.Seconds
	}
	return e, nil
}

// timeToTarget is the cumulative seconds up to and including the first
// epoch whose accuracy is at least target; false when none is.
// crossingTime is the matrix's finer reading of the same curve.
func timeToTarget(seconds, accuracy []float64, target float64) (float64, bool) {
	t := 0.0
	for i, s := range seconds {
		t += s
		if i < len(accuracy) && accuracy[i] >= target {
			return t, true
		}
	}
	return 0, false
}

// median of xs (the mean of the middle two for an even count); 0 when
// empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

func round3(x float64) float64 { return math.Round(x*1e3) / 1e3 }
func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

func ptr[T any](v T) *T { return &v }

// chance is a Fashion-MNIST model's accuracy before training (10 classes):
// where crossingTime's curve starts, at 0 s.
const chance = 0.1

// crossingTime reads when the accuracy curve first reaches target, taking
// the curve as linear between evaluations (elapsed: seconds since training
// began, cumulative, at each evaluation; it starts at chance at 0 s).
// Evaluated once an epoch, the first epoch at the target alone would count
// a curve that reaches it just after an evaluation a whole epoch late, on
// one side and not the other; a learning curve is concave, so the line
// between two evaluations lies below it and the reading is late, not
// early, for both sides alike. False when the curve never reaches target.
func crossingTime(elapsed, accuracy []float64, target float64) (float64, bool) {
	prevT, prevA := 0.0, chance
	for i, t := range elapsed {
		if i >= len(accuracy) {
			break
		}
		a := accuracy[i]
		if a >= target {
			if prevA >= target || a == prevA {
				return t, true
			}
			return prevT + (target-prevA)/(a-prevA)*(t-prevT), true
		}
		prevT, prevA = t, a
	}
	return 0, false
}
