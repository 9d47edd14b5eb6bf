package trainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/dataset"
	"github.com/cohortdl/cohort/shared/plugin"
	"golang.org/x/sys/cpu"
)

// DefaultData is where the data set is read from when the config names none.
const DefaultData = "/usr/share/datasets/fashion-mnist"

// Settings is the trainer's config block (TrainerConfig.Settings as JSON).
// Omitted keys take the defaults below; unknown keys are an error. The
// plugin README documents every key.
type Settings struct {
	Model      string  `json:"model"`
	Hidden     []int64 `json:"hidden"`
	InputShape []int64 `json:"input_shape"`
	Outputs    int64   `json:"outputs"`
	Loss       string  `json:"loss"`

	Data  string `json:"data"`
	DataX string `json:"data_x"`
	DataY string `json:"data_y"`
	EvalX string `json:"eval_x"`
	EvalY string `json:"eval_y"`

	BatchSize     uint32 `json:"batch_size"`
	EvalBatchSize uint32 `json:"eval_batch_size"`
	// WidenMB: byte features (IDX images, uint8 .npy) of the training split
	// are widened to float32 once, at load, when that takes at most this
	// many MiB (0 keeps bytes and scales each batch as it is gathered): a
	// batch gather is then a copy. The default is defaultWidenMB.
	WidenMB *int64 `json:"widen_mb"`

	Optimizer   string    `json:"optimizer"`
	LR          *float64  `json:"lr"`
	Momentum    *float64  `json:"momentum"`
	Nesterov    *bool     `json:"nesterov"`
	WeightDecay *float64  `json:"weight_decay"`
	Betas       []float64 `json:"betas"`
	Eps         *float64  `json:"eps"`
	// AverageMoments (adam, adamw; default true) puts each trained
	// parameter's first moment in the arena, so rounds average it with
	// the parameters: each rank's Adam then steps from the cohort's
	// gradient history instead of its own batches' alone.
	AverageMoments *bool `json:"average_moments"`
	// CohortSecondMoment (adam, adamw; default true with average_moments)
	// resizes, after each round, what each second moment gained since the
	// previous one to what the ranks' batches in one would have given, so
	// a rank's Adam steps as far as one on the cohort's batch would.
	CohortSecondMoment *bool   `json:"cohort_second_moment"`
	MaxGradNorm        float64 `json:"max_grad_norm"`

	LRSchedule    string   `json:"lr_schedule"`
	LRWarmupSteps uint64   `json:"lr_warmup_steps"`
	LRTotalSteps  *uint64  `json:"lr_total_steps"`
	LRMin         *float64 `json:"lr_min"`
	LRStepSize    *uint64  `json:"lr_step_size"`
	LRGamma       *float64 `json:"lr_gamma"`

	Threads int    `json:"threads"`
	Device  string `json:"device"`

	// SleepPerBatchByRank slows the named ranks by a fixed time per batch
	// (counted in their batch times), to try a cohort of unequal ranks on
	// equal hardware: rank number → duration string.
	SleepPerBatchByRank map[string]string `json:"sleep_per_batch_by_rank"`
}

// maxSleepPerBatch bounds sleep_per_batch_by_rank.
const maxSleepPerBatch = 10 * time.Second

// sleepFor is rank's sleep_per_batch_by_rank entry, or 0.
func (s *Settings) sleepFor(rank uint32) time.Duration {
	d, _ := time.ParseDuration(s.SleepPerBatchByRank[strconv.FormatUint(uint64(rank), 10)])
	return d
}

// checkSleeps validates sleep_per_batch_by_rank.
func (s *Settings) checkSleeps() error {
	for k, v := range s.SleepPerBatchByRank {
		if _, err := strconv.ParseUint(k, 10, 32); err != nil {
			return fmt.Errorf("sleep_per_batch_by_rank: key %q is not a rank number", k)
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > maxSleepPerBatch {
			return fmt.Errorf("sleep_per_batch_by_rank[%q] = %q, want a duration from 0 to %v", k, v, maxSleepPerBatch)
		}
	}
	return nil
}

// defaultWidenMB is 0 (keep bytes) where the shim scales bytes eight at a
// time (x86-64 with AVX2): a 64-image Fashion-MNIST batch of bytes then
// gathers in about 40 µs, against 43 µs for the same batch widened, which
// reads four times the memory, and the host's shared image of the data is
// a quarter the size. Elsewhere each byte is a table lookup (73 µs a
// batch): it widens a 60000-image set of 28×28 (184 MiB widened) and sets
// up to about 2.7 times that.
func defaultWidenMB() int64 {
	if runtime.GOARCH == "amd64" && cpu.X86.HasAVX2 {
		return 0
	}
	return 512
}

// Bounds on settings.
const (
	maxLayerWidth = 1 << 20
	maxLayers     = 64
	maxBatch      = 1 << 20
	maxOutputs    = 1 << 24
	maxThreads    = 1024
	maxWidenMB    = 1 << 24
)

var cudaDevice = regexp.MustCompile(`^cuda(:[0-9]{1,3})?$`)

// parseSettings decodes raw (empty or null: every default), fills in the
// defaults and checks every value.
func parseSettings(raw json.RawMessage) (Settings, error) {
	var s Settings
	if err := plugin.DecodeSettings(raw, &s); err != nil {
		return Settings{}, fmt.Errorf("libtorch trainer settings: %w", err)
	}
	if err := refuseZeroBatches(raw); err != nil {
		return Settings{}, fmt.Errorf("libtorch trainer settings: %w", err)
	}
	if err := s.fill(); err != nil {
		return Settings{}, fmt.Errorf("libtorch trainer settings: %w", err)
	}
	return s, nil
}

// refuseZeroBatches refuses a batch size written as 0: left out, a size
// takes its default, but a 0 someone wrote is a mistake that would
// otherwise train with the default silently.
func refuseZeroBatches(raw json.RawMessage) error {
	var keys map[string]json.RawMessage
	if json.Unmarshal(raw, &keys) != nil {
		return nil // DecodeSettings has judged the block already
	}
	for _, k := range []string{"batch_size", "eval_batch_size"} {
		if v, ok := keys[k]; ok && strings.TrimSpace(string(v)) == "0" {
			return fmt.Errorf("%s = 0: want at least 1, or leave it out for the default", k)
		}
	}
	return nil
}

func f64(v float64) *float64 { return &v }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// fill applies the defaults and validates.
func (s *Settings) fill() error {
	if err := s.checkSleeps(); err != nil {
		return err
	}
	if s.Model == "" {
		s.Model = "mlp"
	}
	switch {
	case s.Model == "mlp" && s.Hidden == nil:
		s.Hidden = []int64{256}
	case s.Model != "mlp" && s.Hidden != nil:
		return fmt.Errorf("hidden applies to model = \"mlp\" only (model is %q)", s.Model)
	}
	if len(s.Hidden) > maxLayers {
		return fmt.Errorf("hidden lists %d layers, at most %d", len(s.Hidden), maxLayers)
	}
	for _, h := range s.Hidden {
		if h < 1 || h > maxLayerWidth {
			return fmt.Errorf("hidden = %v: every width must be 1..%d", s.Hidden, maxLayerWidth)
		}
	}
	if len(s.InputShape) > dataset.MaxDims {
		return fmt.Errorf("input_shape = %v: at most %d dimensions", s.InputShape, dataset.MaxDims)
	}
	for _, d := range s.InputShape {
		if d < 1 || d > dataset.MaxArrayBytes {
			return fmt.Errorf("input_shape = %v: every dimension must be at least 1", s.InputShape)
		}
	}
	if s.Outputs < 0 || s.Outputs > maxOutputs {
		return fmt.Errorf("outputs = %d, want 0 (from the labels) or 1..%d", s.Outputs, maxOutputs)
	}
	if s.Loss == "" {
		s.Loss = "cross_entropy"
	}
	if s.Loss != "cross_entropy" && s.Loss != "mse" {
		return fmt.Errorf("loss = %q, want \"cross_entropy\" or \"mse\"", s.Loss)
	}

	npy := s.DataX != "" || s.DataY != "" || s.EvalX != "" || s.EvalY != ""
	switch {
	case npy && s.Data != "":
		return errors.New("set either data (a directory of IDX files) or data_x/data_y (.npy files), not both")
	case npy && (s.DataX == "" || s.DataY == ""):
		return errors.New("data_x and data_y go together: features and labels of the training split")
	case (s.EvalX == "") != (s.EvalY == ""):
		return errors.New("eval_x and eval_y go together: features and labels of the test split")
	case !npy && s.Data == "":
		s.Data = DefaultData
	}

	if s.BatchSize == 0 {
		s.BatchSize = 64
	}
	if s.EvalBatchSize == 0 {
		s.EvalBatchSize = 1000
	}
	if s.BatchSize > maxBatch || s.EvalBatchSize > maxBatch {
		return fmt.Errorf("batch_size %d / eval_batch_size %d: at most %d", s.BatchSize, s.EvalBatchSize, maxBatch)
	}
	if s.WidenMB == nil {
		v := defaultWidenMB()
		s.WidenMB = &v
	}
	if *s.WidenMB < 0 || *s.WidenMB > maxWidenMB {
		return fmt.Errorf("widen_mb = %d: want 0 (never) to %d", *s.WidenMB, maxWidenMB)
	}

	if s.Optimizer == "" {
		s.Optimizer = "sgd"
	}
	switch s.Optimizer {
	case "sgd":
		if s.Betas != nil || s.Eps != nil || s.AverageMoments != nil || s.CohortSecondMoment != nil {
			return errors.New("betas, eps, average_moments and cohort_second_moment apply to optimizer = \"adam\" or \"adamw\"")
		}
		if s.LR == nil {
			s.LR = f64(0.05)
		}
		if s.Momentum == nil {
			s.Momentum = f64(0.9)
		}
		if s.WeightDecay == nil {
			s.WeightDecay = f64(0)
		}
		if s.Nesterov == nil {
			s.Nesterov = new(bool)
		}
		if m := *s.Momentum; !(m >= 0 && m < 1) {
			return fmt.Errorf("momentum = %v, want 0 <= momentum < 1", m)
		}
		if *s.Nesterov && *s.Momentum == 0 {
			return errors.New("nesterov needs a momentum above 0")
		}
	case "adam", "adamw":
		if s.Momentum != nil || s.Nesterov != nil {
			return fmt.Errorf("momentum and nesterov apply to optimizer = \"sgd\" (optimizer is %q; use betas)", s.Optimizer)
		}
		if s.LR == nil {
			s.LR = f64(0.001)
		}
		if s.WeightDecay == nil {
			s.WeightDecay = f64(0)
			if s.Optimizer == "adamw" {
				s.WeightDecay = f64(0.01)
			}
		}
		if s.Betas == nil {
			s.Betas = []float64{0.9, 0.999}
		}
		if len(s.Betas) != 2 || !(s.Betas[0] >= 0 && s.Betas[0] < 1) || !(s.Betas[1] >= 0 && s.Betas[1] < 1) {
			return fmt.Errorf("betas = %v, want two values in [0, 1)", s.Betas)
		}
		if s.Eps == nil {
			s.Eps = f64(1e-8)
		}
		if s.AverageMoments == nil {
			s.AverageMoments = new(bool)
			*s.AverageMoments = true
		}
		if s.CohortSecondMoment == nil {
			s.CohortSecondMoment = new(bool)
			*s.CohortSecondMoment = *s.AverageMoments
		}
		if *s.CohortSecondMoment && !*s.AverageMoments {
			return errors.New("cohort_second_moment needs average_moments: it estimates the cohort's gradient from the averaged first moment")
		}
		if e := *s.Eps; !(e > 0) || !finite(e) {
			return fmt.Errorf("eps = %v, want a finite number above 0", e)
		}
	default:
		return fmt.Errorf("optimizer = %q, want \"sgd\", \"adam\" or \"adamw\"", s.Optimizer)
	}
	if lr := *s.LR; !(lr > 0) || !finite(lr) {
		return fmt.Errorf("lr = %v, want a finite number above 0", lr)
	}
	if wd := *s.WeightDecay; !(wd >= 0) || !finite(wd) {
		return fmt.Errorf("weight_decay = %v, want a finite number, 0 or more", wd)
	}
	if g := s.MaxGradNorm; !(g >= 0) || !finite(g) {
		return fmt.Errorf("max_grad_norm = %v, want 0 (off) or a finite number above 0", g)
	}

	if err := s.fillSchedule(); err != nil {
		return err
	}

	if s.Threads < 0 || s.Threads > maxThreads {
		return fmt.Errorf("threads = %d, want 0 (cores / local ranks) or 1..%d", s.Threads, maxThreads)
	}
	if s.Device == "" {
		s.Device = "cpu"
	}
	if s.Device != "cpu" && !cudaDevice.MatchString(s.Device) {
		return fmt.Errorf("device = %q, want \"cpu\", \"cuda\" or \"cuda:N\"", s.Device)
	}
	return nil
}

func (s *Settings) fillSchedule() error {
	if s.LRSchedule == "" {
		s.LRSchedule = "constant"
	}
	cosine := s.LRTotalSteps != nil || s.LRMin != nil
	step := s.LRStepSize != nil || s.LRGamma != nil
	switch s.LRSchedule {
	case "constant":
		if cosine || step {
			return errors.New("lr_total_steps, lr_min, lr_step_size and lr_gamma need lr_schedule = \"cosine\" or \"step\"")
		}
	case "cosine":
		if step {
			return errors.New("lr_step_size and lr_gamma apply to lr_schedule = \"step\"")
		}
		if s.LRTotalSteps == nil || *s.LRTotalSteps == 0 {
			return errors.New("lr_schedule = \"cosine\" needs lr_total_steps (at least 1)")
		}
		if s.LRMin == nil {
			s.LRMin = f64(0)
		}
		if m := *s.LRMin; !(m >= 0 && m <= *s.LR) {
			return fmt.Errorf("lr_min = %v, want 0 <= lr_min <= lr (%v)", m, *s.LR)
		}
	case "step":
		if cosine {
			return errors.New("lr_total_steps and lr_min apply to lr_schedule = \"cosine\"")
		}
		if s.LRStepSize == nil || *s.LRStepSize == 0 {
			return errors.New("lr_schedule = \"step\" needs lr_step_size (at least 1)")
		}
		if s.LRGamma == nil {
			s.LRGamma = f64(0.1)
		}
		if g := *s.LRGamma; !(g > 0) || !finite(g) {
			return fmt.Errorf("lr_gamma = %v, want a finite number above 0", g)
		}
	default:
		return fmt.Errorf("lr_schedule = %q, want \"constant\", \"cosine\" or \"step\"", s.LRSchedule)
	}
	return nil
}

// lrAt is the learning rate of schedule step t: the schedule, times a
// linear warm-up over the first lr_warmup_steps steps.
func (s *Settings) lrAt(t uint64) float64 {
	base := *s.LR
	lr := base
	switch s.LRSchedule {
	case "cosine":
		total := *s.LRTotalSteps
		frac := float64(min(t, total)) / float64(total)
		lr = *s.LRMin + (base-*s.LRMin)*(1+math.Cos(math.Pi*frac))/2
	case "step":
		lr = base * math.Pow(*s.LRGamma, float64(t / *s.LRStepSize))
	}
	if w := s.LRWarmupSteps; t < w {
		lr *= float64(t+1) / float64(w)
	}
	return lr
}
