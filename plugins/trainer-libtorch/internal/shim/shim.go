//go:build cgo

package shim

/*
#cgo CFLAGS: -I${SRCDIR}/../../shim
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include "cohort_torch_shim.h"

typedef uint32_t (*ct_abi_fn)(void);
typedef const ct_api *(*ct_api_fn)(void);

static uint32_t go_ct_call_abi(void *f) { return ((ct_abi_fn)f)(); }
static const ct_api *go_ct_call_api(void *f) { return ((ct_api_fn)f)(); }

static const char *go_ct_torch_version(const ct_api *a) { return a->torch_version(); }
static int32_t go_ct_cuda_device_count(const ct_api *a) { return a->cuda_device_count(); }
static ct_model *go_ct_create(const ct_api *a, const ct_config *c, char *e, size_t n) { return a->create(c, e, n); }
static void go_ct_destroy(const ct_api *a, ct_model *m) { a->destroy(m); }
static int64_t go_ct_tensor_count(const ct_api *a, ct_model *m) { return a->tensor_count(m); }
static int go_ct_tensor_info(const ct_api *a, ct_model *m, int64_t i, ct_tensor_info *o, char *e, size_t n) {
	return a->tensor_info(m, i, o, e, n);
}
static int go_ct_attach(const ct_api *a, ct_model *m, void *base, uint64_t size, const uint64_t *off, int64_t k,
		int32_t force, int32_t *zc, char *e, size_t n) {
	return a->attach(m, base, size, off, k, force, zc, e, n);
}
static int32_t go_ct_device_index(const ct_api *a, ct_model *m) { return a->device_index(m); }
static int go_ct_attach_device(const ct_api *a, ct_model *m, void *base, uint64_t size, const int64_t *off, int64_t k,
		char *e, size_t n) {
	return a->attach_device(m, base, size, off, k, e, n);
}
static int go_ct_publish(const ct_api *a, ct_model *m, double *norm, char *e, size_t n) { return a->publish(m, norm, e, n); }
static int go_ct_adopt(const ct_api *a, ct_model *m, double alpha, int32_t credit, double *norm, char *e, size_t n) {
	return a->adopt(m, alpha, credit, norm, e, n);
}
static int go_ct_param_norm(const ct_api *a, ct_model *m, double *norm, char *e, size_t n) { return a->param_norm(m, norm, e, n); }
static int go_ct_train_step(const ct_api *a, ct_model *m, const float *x, int64_t b, const int64_t *y, const float *t,
		int64_t w, double lr, double *loss, char *e, size_t n) {
	return a->train_step(m, x, b, y, t, w, lr, loss, e, n);
}
static int go_ct_evaluate(const ct_api *a, ct_model *m, const float *x, int64_t b, const int64_t *y, const float *t,
		int64_t w, double *loss, int64_t *correct, char *e, size_t n) {
	return a->evaluate(m, x, b, y, t, w, loss, correct, e, n);
}
static int go_ct_forward(const ct_api *a, ct_model *m, const float *x, int64_t b, float *out, int64_t cap,
		int64_t *shape, int32_t *ndim, char *e, size_t n) {
	return a->forward(m, x, b, out, cap, shape, ndim, e, n);
}
static int go_ct_export(const ct_api *a, ct_model *m, const char *p, char *e, size_t n) {
	return a->export_model(m, p, e, n);
}
static int go_ct_epoch_end(const ct_api *a, ct_model *m, int64_t epoch, int32_t *ran, char *e, size_t n) {
	return a->epoch_end(m, epoch, ran, e, n);
}
static int go_ct_save(const ct_api *a, ct_model *m, const char *mp, const char *op, char *e, size_t n) {
	return a->save(m, mp, op, e, n);
}
static int go_ct_load(const ct_api *a, ct_model *m, const char *mp, const char *op, char *e, size_t n) {
	return a->load(m, mp, op, e, n);
}
static int go_ct_gather(const ct_api *a, const ct_data *d, const uint64_t *idx, int64_t n, float *x, int64_t *y,
		float *t, char *e, size_t en) {
	return a->gather(d, idx, n, x, y, t, e, en);
}
static int go_ct_train_steps_start(const ct_api *a, ct_model *m, int fd, const ct_data *d, const uint64_t *rows,
		int64_t nrows, int64_t batch, const double *lrs, int64_t max, double budget, const int32_t *waiting,
		const int32_t *cancel, ct_step *out, int64_t *done, int32_t want_norm, double *norm, int32_t *rc, char *e, size_t n) {
	return a->train_steps_start(m, fd, d, rows, nrows, batch, lrs, max, budget, waiting, cancel, out, done, want_norm, norm, rc, e, n);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cohortdl/cohort/shared/arena"
)

// ABI is the ABI version this plugin was built for; a shim reporting
// another one is refused before its function table is read.
const ABI = uint32(C.COHORT_TORCH_SHIM_ABI)

// ErrBufLen is the size of the buffer the shim writes its messages into.
const ErrBufLen = 4096

// Shim is the loaded C++ library.
type Shim struct {
	// Path is the absolute path it was loaded from.
	Path string
	api  *C.ct_api
	// TorchVersion is libtorch's version string.
	TorchVersion string
	// CUDADevices is how many CUDA devices libtorch sees.
	CUDADevices int
}

var (
	shimOnce   sync.Once
	loadedShim *Shim
	shimErr    error
)

// Load finds and loads the shim once per process; see Candidates
// for where it looks.
func Load() (*Shim, error) {
	shimOnce.Do(func() {
		passiveOpenMP()
		briefOpenBLASSpin()
		steadyHeap()
		loadedShim, shimErr = openShim(Candidates())
	})
	return loadedShim, shimErr
}

// openShim loads the first candidate that opens and whose ABI matches. The
// error lists every path with the reason it was refused.
func openShim(paths []string) (*Shim, error) {
	var tried []string
	for _, p := range paths {
		s, err := openShimAt(p)
		if err == nil {
			return s, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", p, err))
	}
	return nil, fmt.Errorf("libtorch trainer: cannot load the libtorch shim %s (ABI %d); tried: %s. Build it with `make -f plugins/trainer-libtorch/shim.mk` (LIBTORCH=/path for another libtorch) or point %s at it",
		File, ABI, strings.Join(tried, "; "), Env)
}

func openShimAt(path string) (*Shim, error) {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errors.New("no such file")
		}
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	cpath := C.CString(abs)
	defer C.free(unsafe.Pointer(cpath))
	h := C.dlopen(cpath, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("dlopen: %s", C.GoString(C.dlerror()))
	}
	// A library that loaded stays loaded, even when it is refused below:
	// what it pulled in (libtorch) does not support being unloaded.
	sym := func(name string) unsafe.Pointer {
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		return C.dlsym(h, cname)
	}
	abiFn, apiFn := sym("cohort_torch_shim_abi_version"), sym("cohort_torch_shim_api")
	if abiFn == nil || apiFn == nil {
		return nil, errors.New("not a cohort libtorch shim: it exports no cohort_torch_shim_abi_version / cohort_torch_shim_api")
	}
	if v := uint32(C.go_ct_call_abi(abiFn)); v != ABI {
		return nil, fmt.Errorf("shim ABI version %d, this plugin needs %d: rebuild the shim from this source tree", v, ABI)
	}
	api := C.go_ct_call_api(apiFn)
	if api == nil || uint32(api.abi) != ABI {
		return nil, errors.New("the shim's function table does not match its ABI version")
	}
	return &Shim{
		Path:         abs,
		api:          api,
		TorchVersion: C.GoString(C.go_ct_torch_version(api)),
		CUDADevices:  int(C.go_ct_cuda_device_count(api)),
	}, nil
}

// passiveOpenMP makes OpenMP's idle threads sleep instead of spin unless
// the environment already chose (OMP_WAIT_POLICY, read once when libgomp
// loads with the shim). Spinning threads of several ranks on one host, or
// of one rank on a busy host, fight for the cores: on a shared 2-core
// machine an epoch of the default MLP at 2 threads took 2.2-7 s spinning
// and 0.85 s passive.
func passiveOpenMP() {
	if _, set := os.LookupEnv("OMP_WAIT_POLICY"); !set {
		os.Setenv("OMP_WAIT_POLICY", "PASSIVE")
	}
}

// OpenBLASThreadTimeout is the OPENBLAS_THREAD_TIMEOUT the plugin sets
// when the environment has none: OpenBLAS's idle worker threads spin
// (sched_yield) for 2^n cycles before they sleep, 2^28 (about 0.1 s) by
// default, so between every two batches and through every round a worker
// holds a core the rank's other threads, and the host's other processes,
// want. 2^18 (about 0.1 ms) still spans the gaps between one step's
// matrix products. A lone rank at 2 threads on a 2-core machine went from
// 1.20 s to 0.92 s an epoch with it (make bench's lone-rank row, where
// plain libtorch gets the same setting and went from 1.04 to 0.89 s).
const OpenBLASThreadTimeout = "18"

// briefOpenBLASSpin sets OPENBLAS_THREAD_TIMEOUT (read once when OpenBLAS
// loads with the shim) unless the environment already chose.
func briefOpenBLASSpin() {
	if _, set := os.LookupEnv("OPENBLAS_THREAD_TIMEOUT"); !set {
		os.Setenv("OPENBLAS_THREAD_TIMEOUT", OpenBLASThreadTimeout)
	}
}

// steadyHeap makes the malloc settings above, unless the environment
// chose glibc's own.
func steadyHeap() {
	if mallocChosen(os.Environ()) {
		return
	}
	C.mallopt(C.M_MMAP_THRESHOLD, C.int(MallocMmapThreshold))
	C.mallopt(C.M_TRIM_THRESHOLD, C.int(MallocTrimThreshold))
}

// shimError turns a failed call's message buffer into an error.
func shimError(op string, buf []byte) error {
	msg := buf
	if i := indexNUL(buf); i >= 0 {
		msg = buf[:i]
	}
	if len(msg) == 0 {
		return fmt.Errorf("libtorch %s failed without a message", op)
	}
	return fmt.Errorf("libtorch %s: %s", op, msg)
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func errPtr(buf []byte) (*C.char, C.size_t) {
	return (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))
}

// Model is one model in the shim. Its methods are not safe for concurrent
// use; the trainer serializes them.
type Model struct {
	s *Shim
	m *C.ct_model
	// steps is TrainSteps' array of reports, kept between runs; wake
	// (read) and wakeW (written by the shim's thread) signal a run's end.
	steps       []C.ct_step
	wake, wakeW *os.File
	// stuck holds a run's pins forever once its end could not be read.
	stuck *runtime.Pinner
}

// cInt64s copies v into C memory; the caller frees it.
func cInt64s(v []int64) *C.int64_t {
	if len(v) == 0 {
		return nil
	}
	p := (*C.int64_t)(C.malloc(C.size_t(len(v)) * 8))
	copy(unsafe.Slice((*int64)(unsafe.Pointer(p)), len(v)), v)
	return p
}

func (s *Shim) NewModel(spec ModelSpec) (*Model, error) {
	var cfg C.ct_config
	cfg.struct_size = C.uint32_t(unsafe.Sizeof(cfg))
	cmodel := C.CString(spec.Model)
	defer C.free(unsafe.Pointer(cmodel))
	cdev := C.CString(spec.Device)
	defer C.free(unsafe.Pointer(cdev))
	hidden, shape := cInt64s(spec.Hidden), cInt64s(spec.InputShape)
	defer C.free(unsafe.Pointer(hidden))
	defer C.free(unsafe.Pointer(shape))
	cfg.model = cmodel
	cfg.hidden, cfg.n_hidden = hidden, C.int32_t(len(spec.Hidden))
	cfg.input_shape, cfg.input_ndim = shape, C.int32_t(len(spec.InputShape))
	cfg.outputs = C.int64_t(spec.Outputs)
	cfg.loss = C.int32_t(spec.Loss)
	cfg.optimizer = C.int32_t(spec.Optimizer)
	cfg.lr = C.double(spec.LR)
	cfg.momentum = C.double(spec.Momentum)
	if spec.Nesterov {
		cfg.nesterov = 1
	}
	cfg.weight_decay = C.double(spec.WeightDecay)
	cfg.beta1, cfg.beta2, cfg.eps = C.double(spec.Beta1), C.double(spec.Beta2), C.double(spec.Eps)
	cfg.max_grad_norm = C.double(spec.MaxGradNorm)
	cfg.seed = C.uint64_t(spec.Seed)
	cfg.threads = C.int32_t(spec.Threads)
	cfg.device = cdev
	cfg.rank = C.uint32_t(spec.Rank)
	if spec.AverageMoments {
		cfg.average_moments = 1
	}
	cfg.cohort_ranks = C.uint32_t(spec.CohortRanks)
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	m := C.go_ct_create(s.api, &cfg, e, n)
	if m == nil {
		return nil, shimError("model", buf)
	}
	return &Model{s: s, m: m}, nil
}

func (m *Model) Close() {
	if m == nil {
		return
	}
	if m.m != nil {
		// Joins the model's training thread, after its run if any.
		C.go_ct_destroy(m.s.api, m.m)
		m.m = nil
	}
	if m.wake != nil {
		m.wake.Close()
		m.wakeW.Close()
		m.wake, m.wakeW = nil, nil
	}
}

func (m *Model) Tensors() ([]TensorInfo, error) {
	count := int64(C.go_ct_tensor_count(m.s.api, m.m))
	out := make([]TensorInfo, 0, count)
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	for i := int64(0); i < count; i++ {
		var info C.ct_tensor_info
		rc := C.go_ct_tensor_info(m.s.api, m.m, C.int64_t(i), &info, e, n)
		if rc != 0 {
			return nil, shimError("tensor info", buf)
		}
		shape := make([]int64, int(info.ndim))
		if info.ndim > 0 {
			copy(shape, unsafe.Slice((*int64)(unsafe.Pointer(info.shape)), int(info.ndim)))
		}
		out = append(out, TensorInfo{
			Name:  C.GoString(info.name),
			DType: arena.DType(info.dtype),
			Role:  arena.Role(info.role),
			Shape: shape,
			Bytes: uint64(info.bytes),
		})
	}
	return out, nil
}

// DeviceIndex is the CUDA device the model is on, -1 on the CPU.
func (m *Model) DeviceIndex() int { return int(C.go_ct_device_index(m.s.api, m.m)) }

// AttachDevice, after Attach, moves the tensors with an offset of 0 or
// more into the device block at base (size bytes, on the model's device,
// kept by the caller until Close): they become views of it.
func (m *Model) AttachDevice(base unsafe.Pointer, size uint64, offsets []int64) error {
	var offp *C.int64_t
	if len(offsets) > 0 {
		offp = (*C.int64_t)(unsafe.Pointer(&offsets[0]))
	}
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	if rc := C.go_ct_attach_device(m.s.api, m.m, base, C.uint64_t(size), offp, C.int64_t(len(offsets)), e, n); rc != 0 {
		return shimError("attach device block", buf)
	}
	return nil
}

// Attach places the tensors in the mapped block at the given offsets.
func (m *Model) Attach(block []byte, offsets []uint64, forceCopy bool) (bool, error) {
	var base unsafe.Pointer
	if len(block) > 0 {
		base = unsafe.Pointer(&block[0])
	}
	var offp *C.uint64_t
	if len(offsets) > 0 {
		offp = (*C.uint64_t)(unsafe.Pointer(&offsets[0]))
	}
	var force, zc C.int32_t
	if forceCopy {
		force = 1
	}
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	rc := C.go_ct_attach(m.s.api, m.m, base, C.uint64_t(len(block)), offp, C.int64_t(len(offsets)), force, &zc, e, n)
	if rc != 0 {
		return false, shimError("attach", buf)
	}
	return zc == 1, nil
}

func (m *Model) Publish() (float64, error) {
	var norm C.double
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	rc := C.go_ct_publish(m.s.api, m.m, &norm, e, n)
	if rc != 0 {
		return 0, shimError("publish", buf)
	}
	return float64(norm), nil
}

// Adopt takes the arena's values (see the shim's adopt); credit keeps the
// steps trained since the last Publish on top of them.
func (m *Model) Adopt(alpha float64, credit bool) (float64, error) {
	var norm C.double
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	cr := C.int32_t(0)
	if credit {
		cr = 1
	}
	rc := C.go_ct_adopt(m.s.api, m.m, C.double(alpha), cr, &norm, e, n)
	if rc != 0 {
		return 0, shimError("adopt", buf)
	}
	return float64(norm), nil
}

func (m *Model) Norm() (float64, error) {
	var norm C.double
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	rc := C.go_ct_param_norm(m.s.api, m.m, &norm, e, n)
	if rc != 0 {
		return 0, shimError("norm", buf)
	}
	return float64(norm), nil
}

// batchPtrs are the C views of one batch's Go buffers; they are valid for
// the duration of one call.
func batchPtrs(x []float32, labels []int64, targets []float32) (*C.float, *C.int64_t, *C.float) {
	var xp, tp *C.float
	var yp *C.int64_t
	if len(x) > 0 {
		xp = (*C.float)(unsafe.Pointer(&x[0]))
	}
	if len(labels) > 0 {
		yp = (*C.int64_t)(unsafe.Pointer(&labels[0]))
	}
	if len(targets) > 0 {
		tp = (*C.float)(unsafe.Pointer(&targets[0]))
	}
	return xp, yp, tp
}

// TrainStep runs one optimizer step on rows samples.
func (m *Model) TrainStep(x []float32, rows int, labels []int64, targets []float32, width int, lr float64, buf []byte) (float64, error) {
	xp, yp, tp := batchPtrs(x, labels, targets)
	var loss C.double
	e, n := errPtr(buf)
	rc := C.go_ct_train_step(m.s.api, m.m, xp, C.int64_t(rows), yp, tp, C.int64_t(width), C.double(lr), &loss, e, n)
	if rc != 0 {
		return 0, shimError("train step", buf)
	}
	return float64(loss), nil
}

// TrainSteps trains rows (indices into d, in order) in batches of batch,
// one optimizer step each at lrs[i], on the model's own thread in the shim,
// which gathers each batch: a run of steps with no Go code, and so no Go
// scheduler, beside them, while this goroutine waits on a pipe, which
// leaves the Go runtime idle. It trains at most len(lrs) steps (out holds
// as many reports) and returns early, after at least one step, once
// budget has passed, and before any step while *waiting or *cancel is
// nonzero (other goroutines set them with sync/atomic while it runs).
// With wantNorm it also returns the parameters' norm after the steps. It
// returns the number of steps trained, also with an error.
func (m *Model) TrainSteps(d *Data, rows []uint64, batch int, lrs []float64, budget time.Duration, waiting, cancel *int32,
	wantNorm bool, out []Step, buf []byte) (int, float64, error) {
	if len(out) < len(lrs) || len(rows) == 0 || len(lrs) == 0 || len(buf) == 0 {
		return 0, 0, fmt.Errorf("libtorch train steps: %d rows, %d learning rates, room for %d reports", len(rows), len(lrs), len(out))
	}
	if m.stuck != nil {
		return 0, 0, errors.New("libtorch train steps: an earlier run's end was never read")
	}
	if m.wake == nil {
		r, w, err := os.Pipe()
		if err != nil {
			return 0, 0, fmt.Errorf("libtorch train steps: %w", err)
		}
		m.wake, m.wakeW = r, w
	}
	if cap(m.steps) < len(lrs) {
		m.steps = make([]C.ct_step, len(lrs))
	}
	// The shim's thread reads and writes all of this after the cgo call
	// returns, until it writes to the pipe: pinned until then.
	res := &stepsResult{}
	var pin runtime.Pinner
	ptr := func(p unsafe.Pointer) unsafe.Pointer { pin.Pin(p); return p }
	cd := d.c(&pin)
	want := C.int32_t(0)
	if wantNorm {
		want = 1
	}
	rc := C.go_ct_train_steps_start(m.s.api, m.m, C.int(m.wakeW.Fd()), (*C.ct_data)(ptr(unsafe.Pointer(cd))),
		(*C.uint64_t)(ptr(unsafe.Pointer(&rows[0]))), C.int64_t(len(rows)), C.int64_t(batch),
		(*C.double)(ptr(unsafe.Pointer(&lrs[0]))), C.int64_t(len(lrs)), C.double(float64(budget)/float64(time.Millisecond)),
		(*C.int32_t)(ptr(unsafe.Pointer(waiting))), (*C.int32_t)(ptr(unsafe.Pointer(cancel))),
		(*C.ct_step)(ptr(unsafe.Pointer(&m.steps[0]))), (*C.int64_t)(ptr(unsafe.Pointer(&res.done))), want,
		(*C.double)(ptr(unsafe.Pointer(&res.norm))), (*C.int32_t)(ptr(unsafe.Pointer(&res.rc))),
		(*C.char)(ptr(unsafe.Pointer(&buf[0]))), C.size_t(len(buf)))
	if rc != 0 {
		pin.Unpin()
		return 0, 0, shimError("train steps", buf)
	}
	var b [1]byte
	if _, err := io.ReadFull(m.wake, b[:]); err != nil {
		// The run may still write into the pinned memory: keep it pinned
		// for good, and the model unusable.
		m.stuck = &pin
		return 0, 0, fmt.Errorf("libtorch train steps: waiting for the run: %w", err)
	}
	pin.Unpin()
	k := min(max(int(res.done), 0), len(lrs))
	for i, s := range m.steps[:k] {
		out[i] = Step{Loss: float64(s.loss), Gather: msDuration(float64(s.gather_ms)), Total: msDuration(float64(s.step_ms)), Rows: int(s.rows)}
	}
	if res.rc != 0 {
		return k, 0, shimError("train steps", buf)
	}
	return k, float64(res.norm), nil
}

// c is d as the shim reads it, its arrays pinned by pin (cd itself too).
func (d *Data) c(pin *runtime.Pinner) *C.ct_data {
	cd := &C.ct_data{struct_size: C.uint32_t(unsafe.Sizeof(C.ct_data{})), n: C.int64_t(d.N), features: C.int64_t(d.Features), width: C.int64_t(d.Width)}
	ptr := func(p unsafe.Pointer) unsafe.Pointer { pin.Pin(p); return p }
	if len(d.U8) > 0 {
		cd.u8 = (*C.uint8_t)(ptr(unsafe.Pointer(&d.U8[0])))
	}
	if len(d.F32) > 0 {
		cd.f32 = (*C.float)(ptr(unsafe.Pointer(&d.F32[0])))
	}
	if len(d.Labels) > 0 {
		cd.labels = (*C.int64_t)(ptr(unsafe.Pointer(&d.Labels[0])))
	}
	if len(d.Targets) > 0 {
		cd.targets = (*C.float)(ptr(unsafe.Pointer(&d.Targets[0])))
	}
	pin.Pin(cd)
	return cd
}

// Gather copies the samples idx names out of d into x, and their labels
// into labels or their targets into targets (whichever d has), as a run
// of TrainSteps gathers each batch: rows further on are fetched from
// memory while earlier ones are copied, and bytes are scaled eight at a
// time where the CPU can (AVX2). Any goroutine may call it; buf holds the
// message of a failure and must not be in use elsewhere meanwhile.
func (s *Shim) Gather(d *Data, idx []uint64, x []float32, labels []int64, targets []float32, buf []byte) error {
	n := len(idx)
	if n == 0 {
		return nil
	}
	if len(x) < n*d.Features || (len(d.Labels) > 0 && len(labels) < n) || (len(d.Targets) > 0 && len(targets) < n*d.Width) || len(buf) == 0 {
		return fmt.Errorf("libtorch gather: %d samples of %d features into %d floats, %d labels, %d targets", n, d.Features, len(x), len(labels), len(targets))
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	cd := d.c(&pin)
	xp, yp, tp := batchPtrs(x, labels, targets)
	e, en := errPtr(buf)
	if C.go_ct_gather(s.api, cd, (*C.uint64_t)(unsafe.Pointer(&idx[0])), C.int64_t(n), xp, yp, tp, e, en) != 0 {
		return shimError("gather", buf)
	}
	return nil
}

// stepsResult is what a run of steps stores when it ends.
type stepsResult struct {
	done C.int64_t
	norm C.double
	rc   C.int32_t
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// Evaluate adds the summed loss and correct count of rows samples.
func (m *Model) Evaluate(x []float32, rows int, labels []int64, targets []float32, width int, buf []byte) (float64, int64, error) {
	xp, yp, tp := batchPtrs(x, labels, targets)
	var loss C.double
	var correct C.int64_t
	e, n := errPtr(buf)
	rc := C.go_ct_evaluate(m.s.api, m.m, xp, C.int64_t(rows), yp, tp, C.int64_t(width), &loss, &correct, e, n)
	if rc != 0 {
		return 0, 0, shimError("evaluate", buf)
	}
	return float64(loss), int64(correct), nil
}

// Forward runs the model in eval mode on rows samples and returns the
// output's shape and, when out is large enough, its values in out.
func (m *Model) Forward(x []float32, rows int, out []float32) ([]int64, error) {
	xp, _, _ := batchPtrs(x, nil, nil)
	var outp *C.float
	if len(out) > 0 {
		outp = (*C.float)(unsafe.Pointer(&out[0]))
	}
	var shape [8]C.int64_t
	var ndim C.int32_t
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	rc := C.go_ct_forward(m.s.api, m.m, xp, C.int64_t(rows), outp, C.int64_t(len(out)), &shape[0], &ndim, e, n)
	if rc != 0 {
		return nil, shimError("forward", buf)
	}
	dims := make([]int64, int(ndim))
	for i := range dims {
		dims[i] = int64(shape[i])
	}
	return dims, nil
}

func (m *Model) Save(modelPath, optimPath string) error {
	return m.pathCall("save checkpoint", modelPath, optimPath, func(mp, op *C.char, e *C.char, n C.size_t) C.int {
		return C.go_ct_save(m.s.api, m.m, mp, op, e, n)
	})
}

// Export writes the model as a TorchScript module with a forward, its
// tensors on the CPU.
func (m *Model) Export(path string) error {
	return m.pathCall("export the model", path, "", func(p, _ *C.char, e *C.char, n C.size_t) C.int {
		return C.go_ct_export(m.s.api, m.m, p, e, n)
	})
}

// EpochEnd runs a TorchScript model's epoch_end method, when it has one.
func (m *Model) EpochEnd(epoch uint64) (bool, error) {
	var ran C.int32_t
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	if rc := C.go_ct_epoch_end(m.s.api, m.m, C.int64_t(epoch), &ran, e, n); rc != 0 {
		return false, shimError("epoch_end", buf)
	}
	return ran != 0, nil
}

func (m *Model) Load(modelPath, optimPath string) error {
	return m.pathCall("load checkpoint", modelPath, optimPath, func(mp, op *C.char, e *C.char, n C.size_t) C.int {
		return C.go_ct_load(m.s.api, m.m, mp, op, e, n)
	})
}

func (m *Model) pathCall(op, a, b string, f func(a, b *C.char, e *C.char, n C.size_t) C.int) error {
	ca, cb := C.CString(a), C.CString(b)
	defer C.free(unsafe.Pointer(ca))
	defer C.free(unsafe.Pointer(cb))
	buf := make([]byte, ErrBufLen)
	e, n := errPtr(buf)
	rc := f(ca, cb, e, n)
	if rc != 0 {
		return shimError(op, buf)
	}
	return nil
}
