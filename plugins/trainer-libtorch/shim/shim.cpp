// libcohort_torch_shim: the libtorch side of cohort's trainer plugin, behind
// the C ABI of cohort_torch_shim.h. The Go plugin dlopens this library at run
// time, so only this file is rebuilt for another libtorch.
//
// Every entry point catches c10::Error, std::exception and anything else and
// returns the message through the err buffer: a C++ exception never unwinds
// into Go, and a bad model or input never aborts the process.

#include "cohort_torch_shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/script.h>
#include <torch/torch.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

namespace F = torch::nn::functional;

// ---------------------------------------------------------------- errors

void set_err(char *err, size_t errlen, std::string msg) {
  if (err == nullptr || errlen == 0) {
    return;
  }
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) {
    msg.pop_back();
  }
  size_t n = std::min(msg.size(), errlen - 1);
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

// guard runs f, turning every exception into -1 and a message.
template <class Fn>
int guard(char *err, size_t errlen, Fn &&f) {
  try {
    f();
    return 0;
  } catch (const c10::Error &e) {
    set_err(err, errlen, e.what_without_backtrace());
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
  } catch (...) {
    set_err(err, errlen, "unknown C++ exception in the libtorch shim");
  }
  return -1;
}

[[noreturn]] void fail(const std::string &msg) { throw std::runtime_error(msg); }

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) {
    o << (i ? ", " : "") << s[i];
  }
  o << ']';
  return o.str();
}

// ---------------------------------------------------------------- types

int32_t arena_dtype(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return CT_DTYPE_F32;
  case at::kDouble:
    return CT_DTYPE_F64;
  case at::kBFloat16:
    return CT_DTYPE_BF16;
  case at::kHalf:
    return CT_DTYPE_F16;
  case at::kLong:
    return CT_DTYPE_I64;
  case at::kInt:
    return CT_DTYPE_I32;
  default:
    return 0;
  }
}

// ---------------------------------------------------------------- models

// MLP: in -> hidden... (ReLU after each) -> out, layers fc1, fc2, ...
struct MLPImpl : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;

  MLPImpl(int64_t in, const std::vector<int64_t> &hidden, int64_t out) {
    int64_t prev = in;
    for (size_t i = 0; i <= hidden.size(); ++i) {
      int64_t width = i < hidden.size() ? hidden[i] : out;
      layers.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(prev, width)));
      prev = width;
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x.flatten(1);
    for (size_t i = 0; i + 1 < layers.size(); ++i) {
      x = torch::relu(layers[i]->forward(x));
    }
    return layers.back()->forward(x);
  }
};

// CNN: conv 3x3 (16) -> ReLU -> maxpool 2 -> conv 3x3 (32) -> ReLU -> maxpool 2
// -> fc1 (128) -> ReLU -> fc2 (out), for [channels, height, width] inputs.
struct CNNImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

  CNNImpl(int64_t c, int64_t h, int64_t w, int64_t out) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, 16, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(32 * (h / 4) * (w / 4), 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, out));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = F::max_pool2d(torch::relu(conv1->forward(x)), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(conv2->forward(x)), F::MaxPool2dFuncOptions(2));
    x = torch::relu(fc1->forward(x.flatten(1)));
    return fc2->forward(x);
  }
};

// One tensor of the model as the arena sees it.
struct Entry {
  std::string name;
  torch::Tensor t; // the module's own tensor (same TensorImpl)
  int32_t role = 0;
  int32_t dtype = 0;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  bool view = false;     // t's data lives in the arena
  torch::Tensor arena;   // the arena's memory for this tensor (CPU)
  torch::Tensor published; // t as of the last publish (float tensors)
  torch::Tensor param;     // for an optimizer moment: the parameter it belongs to
  // For a first moment under cohort_second_moment: the parameter's second
  // moment and Adam step as the last round left them.
  torch::Tensor v_round;
  int64_t step_round = 0;
};

// bind_moment makes e.t the first moment (exp_avg) of e.param in an Adam or
// AdamW state S: the state's values, if it has any, go into e.t, which the
// optimizer then updates in place; a parameter without a state gets a fresh
// one (step 0, zero moments), as the optimizer's first step would make.
template <class S>
void bind_moment(torch::optim::Optimizer &opt, Entry &e) {
  auto &state = opt.state();
  const std::string key = c10::guts::to_string(e.param.unsafeGetTensorImpl());
  auto it = state.find(key);
  if (it == state.end()) {
    auto st = std::make_unique<S>();
    st->step(0);
    st->exp_avg(e.t.zero_());
    st->exp_avg_sq(torch::zeros_like(e.param, torch::MemoryFormat::Preserve));
    e.v_round = st->exp_avg_sq().clone();
    e.step_round = 0;
    state[key] = std::move(st);
    return;
  }
  auto &st = static_cast<S &>(*it->second);
  if (st.exp_avg().unsafeGetTensorImpl() != e.t.unsafeGetTensorImpl()) {
    e.t.copy_(st.exp_avg());
    st.exp_avg(e.t);
  }
  e.v_round = st.exp_avg_sq().clone();
  e.step_round = st.step();
}

// cohort_second_moment gives e.param's second moment, after a round left
// the cohort's mean first moment in e.t, the size it would have had on the
// cohort's batch (n ranks' batches in one). The part of v added since the
// last round, fresh = sum of w_j g_j^2 over this rank's steps (w_j the EMA
// weights, summing to w), estimates w(mu^2 + s^2) with s^2 the noise of one
// rank's batch; the cohort's batch has the noise s^2/n. mu^2 is estimated
// by the mean first moment squared (bias-corrected: an average over the
// last ~1/(1-beta1) steps of n ranks, whose own noise is small), clamped to
// [0, fresh/w] so that the result stays between fresh/n and fresh.
// Only the fresh part is corrected: what the last round left was already,
// and correcting it again would shrink it at every round.
template <class S>
void cohort_second_moment(torch::optim::Optimizer &opt, Entry &e, double n, double beta1, double beta2) {
  auto it = opt.state().find(c10::guts::to_string(e.param.unsafeGetTensorImpl()));
  if (it == opt.state().end()) {
    return;
  }
  auto &st = static_cast<S &>(*it->second);
  const int64_t step = st.step();
  const int64_t k = step - e.step_round;
  auto v = st.exp_avg_sq();
  if (k > 0 && step > 0 && n > 1) {
    const double decay = std::pow(beta2, static_cast<double>(k));
    const double w = 1 - decay;
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(step));
    auto old = e.v_round.mul(decay);
    auto fresh = v.sub(old).clamp_min_(0);
    auto mu2 = e.t.div(bc1).square_().mul_(w);
    mu2 = torch::minimum(mu2, fresh);
    v.copy_(old.add_(fresh, 1 / n).add_(mu2, 1 - 1 / n));
  }
  e.v_round.copy_(v);
  e.step_round = step;
}

// An OpenBLAS thread pool: process-wide, and not sized by libtorch. Debian
// links libtorch to libblas.so.3 and libopenblas.so.0, which may be two
// copies of OpenBLAS with a pool each.
struct BlasPool {
  void (*set)(int);
  int (*get)();
};

const std::vector<BlasPool> &blas_pools() {
  static const std::vector<BlasPool> pools = [] {
    std::vector<BlasPool> out;
    for (const char *lib : {"libopenblas.so.0", "libblas.so.3", "libopenblasp.so.0"}) {
      void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
      if (h == nullptr) {
        continue;
      }
      auto set = reinterpret_cast<void (*)(int)>(dlsym(h, "openblas_set_num_threads"));
      auto get = reinterpret_cast<int (*)()>(dlsym(h, "openblas_get_num_threads"));
      bool dup = std::any_of(out.begin(), out.end(), [&](const BlasPool &p) { return p.set == set; });
      if (set == nullptr || get == nullptr || dup) {
        dlclose(h);
        continue;
      }
      out.push_back({set, get}); // h stays open: the pointers outlive this call
    }
    return out;
  }();
  return pools;
}

// use_threads makes the calling OS thread compute with n intra-op threads
// (libtorch and OpenBLAS); every entry point that computes calls it with
// the model's setting. Setting the count once in create is not enough:
// libtorch's OpenMP backend keeps it per OS thread (omp_set_num_threads sets
// the calling thread's ICV, and a thread's first parallel op copies the
// process-wide value of that moment), and a Go caller lands on whatever OS
// thread the scheduler picks -- one that served a model with another
// setting keeps that model's count. The count changes the bits, not only the
// speed: some kernels split their reductions by it (BatchNorm's batch
// statistics are summed in one slice per thread), so training on, and a
// restore from a checkpoint, would not reproduce.
void use_threads(int n) {
  if (n <= 0) {
    return; // libtorch's default
  }
#if AT_PARALLEL_OPENMP
  if (at::get_num_threads() != n) {
    at::set_num_threads(n);
  }
#else
  // The other backends keep one pool for the process, which warns when
  // resized after its first use: ask once per thread and setting.
  thread_local int asked = 0;
  if (asked != n) {
    if (at::get_num_threads() != n) {
      at::set_num_threads(n);
    }
    asked = n;
  }
#endif
  for (const auto &p : blas_pools()) {
    if (p.get() != n) {
      p.set(n);
    }
  }
}

torch::Device pick_device(const std::string &spec, uint32_t rank) {
  if (spec.empty() || spec == "cpu") {
    return torch::Device(torch::kCPU);
  }
  if (spec.rfind("cuda", 0) != 0) {
    fail("device \"" + spec + "\": want \"cpu\", \"cuda\" or \"cuda:N\"");
  }
  int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (count == 0) {
    fail("device \"" + spec + "\": this libtorch (" TORCH_VERSION
         ") sees no CUDA device; build the shim against a CUDA libtorch (LIBTORCH=/path) on a GPU host, or use device = \"cpu\"");
  }
  if (spec == "cuda") {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank % count));
  }
  torch::Device d(spec); // throws on a malformed spec
  if (d.index() >= count) {
    fail("device \"" + spec + "\": only " + std::to_string(count) + " CUDA devices");
  }
  return d;
}

} // namespace

// TrainThread is a model's own thread for its runs of steps
// (train_steps_start): one OS thread for the model's life, so libtorch's
// per-thread state (its OpenMP team, its pthreadpool) starts once, and no
// Go code, nor the Go scheduler, runs beside the steps. Signals are
// blocked on it: the Go runtime handles the process's on its own threads.
class TrainThread {
 public:
  ~TrainThread() { stop(); }

  // start hands f to the thread; a run must have ended before the next.
  void start(std::function<void()> f) {
    std::lock_guard<std::mutex> l(mu_);
    if (quit_) {
      fail("train steps: the model is being destroyed");
    }
    if (job_) {
      fail("train steps: a run is already waiting to start");
    }
    job_ = std::move(f);
    if (!th_.joinable()) {
      th_ = std::thread([this] { loop(); });
    }
    cv_.notify_one();
  }

  // run runs f on the thread and waits for it, rethrowing what it threw.
  void run(std::function<void()> f) {
    // Shared: the thread may still be inside the task when get returns.
    auto task = std::make_shared<std::packaged_task<void()>>(std::move(f));
    auto done = task->get_future();
    start([task] { (*task)(); });
    done.get();
  }

  // stop joins the thread after the run it is in, if any.
  void stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      quit_ = true;
    }
    cv_.notify_one();
    if (th_.joinable()) {
      th_.join();
    }
  }

 private:
  void loop() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return quit_ || job_; });
        if (!job_) {
          return;
        }
        f = std::move(job_);
        job_ = nullptr;
      }
      f();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool quit_ = false;
  std::thread th_;
};

struct ct_model {
  std::shared_ptr<torch::nn::Module> native;
  std::function<torch::Tensor(const torch::Tensor &)> native_forward;
  std::unique_ptr<torch::jit::Module> script;
  std::vector<Entry> entries;
  std::vector<torch::Tensor> trainable;
  std::unique_ptr<torch::optim::Optimizer> opt;
  int32_t loss = 0;
  double max_grad_norm = 0;
  torch::Device device{torch::kCPU};
  torch::ScalarType input_type = torch::kFloat;
  int threads = 0; // intra-op threads of every call (0: libtorch's default); see use_threads
  std::vector<int64_t> input_shape; // per sample
  int64_t features = 0;
  bool training = true;
  bool attached = false;
  int32_t optimizer = 0; // CT_OPT_*
  int64_t members = -1; // index of the "optimizer.cohort_members" entry; -1: none
  int64_t rank = 0;      // this rank's element of it
  double beta1 = 0, beta2 = 0;
  // A run's batch, gathered from the data set (kept between runs).
  std::vector<float> batch_x, batch_t;
  std::vector<int64_t> batch_y;
  // Last, so that it is destroyed (and joined) first.
  TrainThread trainer;

  // bind_moments ties the layout's moment entries to the optimizer's state
  // (after create, and after a load replaced the state).
  void bind_moments() {
    torch::NoGradGuard ng;
    for (auto &e : entries) {
      if (!e.param.defined()) {
        continue;
      }
      if (optimizer == CT_OPT_ADAM) {
        bind_moment<torch::optim::AdamParamState>(*opt, e);
      } else {
        bind_moment<torch::optim::AdamWParamState>(*opt, e);
      }
    }
  }

  // in_files reports whether entry i is saved in the model's file: an
  // optimizer moment is restored with the optimizer, and the members entry
  // is set anew at every round.
  bool in_files(size_t i) const { return !entries[i].param.defined() && static_cast<int64_t>(i) != members; }

  // round_members reads how many ranks the last round averaged from the
  // members entry: every rank puts 1 at its own element and 0 elsewhere, so
  // a round leaves the mean over the ranks it averaged, nonzero at theirs
  // (a blend or a credited adopt keeps it so). The world size would
  // overstate it while ranks are dead, and a broadcast averages nobody's
  // batches (1: the root's values). The entry is set back for the next
  // round.
  double round_members() {
    torch::NoGradGuard ng;
    Entry &e = entries[members];
    double n = static_cast<double>(e.t.count_nonzero().item<int64_t>());
    e.t.zero_();
    e.t[rank].fill_(1);
    return n;
  }

  // after_round runs cohort_second_moment on every first moment in the
  // layout, once a round of n ranks has left their mean in them. With n <= 1
  // nothing is resized, but the second moments are taken as they stand, so
  // the next round resizes only what its own steps added.
  void after_round(double n) {
    torch::NoGradGuard ng;
    for (auto &e : entries) {
      if (!e.param.defined()) {
        continue;
      }
      if (optimizer == CT_OPT_ADAM) {
        cohort_second_moment<torch::optim::AdamParamState>(*opt, e, n, beta1, beta2);
      } else {
        cohort_second_moment<torch::optim::AdamWParamState>(*opt, e, n, beta1, beta2);
      }
    }
  }

  void set_training(bool on) {
    if (training == on) {
      return;
    }
    if (native) {
      native->train(on);
    } else {
      script->train(on);
    }
    training = on;
  }

  // input views n rows of x as the model's input batch on its device.
  torch::Tensor input(const float *x, int64_t n) {
    if (x == nullptr || n <= 0) {
      fail("empty batch");
    }
    std::vector<int64_t> shape{n};
    shape.insert(shape.end(), input_shape.begin(), input_shape.end());
    auto t = torch::from_blob(const_cast<float *>(x), shape, torch::kFloat);
    if (input_type != torch::kFloat || device != torch::Device(torch::kCPU)) {
      t = t.to(device, input_type);
    }
    return t;
  }

  torch::Tensor forward(const torch::Tensor &x) {
    if (native) {
      return native_forward(x);
    }
    auto out = script->forward({x});
    if (!out.isTensor()) {
      fail("the TorchScript module's forward returned " + out.tagKind() + ", not a tensor");
    }
    return out.toTensor();
  }

  // loss_of computes the loss of out against a batch of labels or targets.
  torch::Tensor loss_of(const torch::Tensor &out, const int64_t *labels, const float *targets, int64_t n,
                        int64_t width, bool sum) {
    if (loss == CT_LOSS_CROSS_ENTROPY) {
      if (labels == nullptr) {
        fail("cross_entropy needs class labels");
      }
      if (out.dim() != 2 || out.size(0) != n) {
        fail("cross_entropy needs the model to output [batch, classes] = [" + std::to_string(n) +
             ", C]; it output " + shape_str(out.sizes()));
      }
      const int64_t classes = out.size(1);
      for (int64_t i = 0; i < n; ++i) {
        if (labels[i] < 0 || labels[i] >= classes) {
          fail("label " + std::to_string(labels[i]) + " does not fit the model's " + std::to_string(classes) +
               " outputs (classes 0.." + std::to_string(classes - 1) + ")");
        }
      }
      auto y = torch::from_blob(const_cast<int64_t *>(labels), {n}, torch::kLong);
      return at::cross_entropy_loss(out, y.to(out.device()), {}, sum ? at::Reduction::Sum : at::Reduction::Mean);
    }
    if (targets == nullptr) {
      fail("mse needs float targets");
    }
    if (out.dim() < 1 || out.size(0) != n || out.numel() != n * width) {
      fail("mse: the model output " + shape_str(out.sizes()) + " for a batch of " + std::to_string(n) +
           ", but the targets have " + std::to_string(width) + " values per sample");
    }
    auto t = torch::from_blob(const_cast<float *>(targets), {n, width}, torch::kFloat).to(out.device(), out.scalar_type());
    return at::mse_loss(out.reshape({n, width}), t, sum ? at::Reduction::Sum : at::Reduction::Mean);
  }

  double norm() {
    torch::NoGradGuard ng;
    double s = 0;
    for (auto &e : entries) {
      if (e.role == CT_ROLE_PARAMETER && e.t.is_floating_point()) {
        double v = e.t.norm().item<double>();
        s += v * v;
      }
    }
    return std::sqrt(s);
  }
};

namespace {

ct_model *create(const ct_config *cfg, char *err, size_t errlen) {
  ct_model *out = nullptr;
  guard(err, errlen, [&] {
    if (cfg == nullptr || cfg->struct_size != sizeof(ct_config)) {
      fail("ct_config of " + std::to_string(cfg ? cfg->struct_size : 0) + " bytes, the shim expects " +
           std::to_string(sizeof(ct_config)) + ": the plugin and the shim were built from different headers");
    }
    auto m = std::make_unique<ct_model>();
    m->threads = std::max(cfg->threads, 0);
    use_threads(m->threads);
    m->device = pick_device(cfg->device ? cfg->device : "cpu", cfg->rank);
    m->loss = cfg->loss;
    m->max_grad_norm = cfg->max_grad_norm;
    if (m->loss != CT_LOSS_CROSS_ENTROPY && m->loss != CT_LOSS_MSE) {
      fail("unknown loss code " + std::to_string(m->loss));
    }
    if (cfg->input_ndim <= 0 || cfg->input_shape == nullptr) {
      fail("no input shape");
    }
    m->input_shape.assign(cfg->input_shape, cfg->input_shape + cfg->input_ndim);
    m->features = 1;
    for (int64_t d : m->input_shape) {
      if (d <= 0) {
        fail("input shape " + shape_str(m->input_shape) + " has a dimension below 1");
      }
      m->features *= d;
    }
    std::string model = cfg->model ? cfg->model : "";
    // Seeded for every model: the built-in ones draw their initial weights,
    // and any model's dropout draws its masks, from this generator.
    torch::manual_seed(cfg->seed);
    if (model == "mlp" || model == "cnn") {
      if (cfg->outputs <= 0) {
        fail(model + ": " + std::to_string(cfg->outputs) + " outputs");
      }
      if (model == "mlp") {
        std::vector<int64_t> hidden(cfg->hidden, cfg->hidden + std::max(cfg->n_hidden, 0));
        auto mlp = std::make_shared<MLPImpl>(m->features, hidden, cfg->outputs);
        m->native = mlp;
        m->native_forward = [mlp](const torch::Tensor &x) { return mlp->forward(x); };
      } else {
        if (m->input_shape.size() != 3 || m->input_shape[1] < 4 || m->input_shape[2] < 4) {
          fail("cnn needs [channels, height, width] inputs of at least 4x4; the data gives " +
               shape_str(m->input_shape));
        }
        auto cnn = std::make_shared<CNNImpl>(m->input_shape[0], m->input_shape[1], m->input_shape[2], cfg->outputs);
        m->native = cnn;
        m->native_forward = [cnn](const torch::Tensor &x) { return cnn->forward(x); };
      }
      m->native->to(m->device);
      m->native->train(true);
    } else {
      m->script = std::make_unique<torch::jit::Module>(torch::jit::load(model, m->device));
      m->script->train(true);
    }
    m->training = true;

    // The layout: parameters, then buffers, each tensor once.
    std::unordered_set<const void *> seen;
    auto add = [&](const std::string &name, const torch::Tensor &t, int32_t role) {
      if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) {
        return;
      }
      int32_t dt = arena_dtype(t.scalar_type());
      if (dt == 0) {
        fail("tensor \"" + name + "\" is " + std::string(c10::toString(t.scalar_type())) +
             ", which the arena cannot hold (f32, f64, bf16, f16, i64, i32)");
      }
      Entry e;
      e.name = name;
      e.t = t;
      e.role = role;
      e.dtype = dt;
      e.shape = t.sizes().vec();
      e.bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
      m->entries.push_back(std::move(e));
      if (role == CT_ROLE_PARAMETER && t.requires_grad()) {
        m->trainable.push_back(t);
      }
    };
    if (m->native) {
      for (const auto &p : m->native->named_parameters(true)) {
        add(p.key(), p.value(), CT_ROLE_PARAMETER);
      }
      for (const auto &b : m->native->named_buffers(true)) {
        add(b.key(), b.value(), CT_ROLE_BUFFER);
      }
    } else {
      for (const auto &p : m->script->named_parameters(true)) {
        add(p.name, p.value, CT_ROLE_PARAMETER);
      }
      for (const auto &b : m->script->named_buffers(true)) {
        add(b.name, b.value, CT_ROLE_BUFFER);
      }
    }
    if (m->trainable.empty()) {
      fail("model \"" + model + "\" has no trainable parameters");
    }
    for (auto &e : m->entries) {
      if (e.role == CT_ROLE_PARAMETER && e.t.is_floating_point()) {
        m->input_type = e.t.scalar_type();
        break;
      }
    }

    switch (cfg->optimizer) {
    case CT_OPT_SGD:
      m->opt = std::make_unique<torch::optim::SGD>(
          m->trainable, torch::optim::SGDOptions(cfg->lr)
                            .momentum(cfg->momentum)
                            .nesterov(cfg->nesterov != 0)
                            .weight_decay(cfg->weight_decay));
      break;
    case CT_OPT_ADAM:
      m->opt = std::make_unique<torch::optim::Adam>(
          m->trainable, torch::optim::AdamOptions(cfg->lr)
                            .betas(std::make_tuple(cfg->beta1, cfg->beta2))
                            .eps(cfg->eps)
                            .weight_decay(cfg->weight_decay));
      break;
    case CT_OPT_ADAMW:
      m->opt = std::make_unique<torch::optim::AdamW>(
          m->trainable, torch::optim::AdamWOptions(cfg->lr)
                            .betas(std::make_tuple(cfg->beta1, cfg->beta2))
                            .eps(cfg->eps)
                            .weight_decay(cfg->weight_decay));
      break;
    default:
      fail("unknown optimizer code " + std::to_string(cfg->optimizer));
    }
    m->optimizer = cfg->optimizer;
    if (cfg->average_moments) {
      if (cfg->optimizer != CT_OPT_ADAM && cfg->optimizer != CT_OPT_ADAMW) {
        fail("average_moments needs adam or adamw");
      }
      const size_t n = m->entries.size();
      for (size_t i = 0; i < n; ++i) {
        const Entry &p = m->entries[i];
        if (p.role != CT_ROLE_PARAMETER || !p.t.requires_grad()) {
          continue;
        }
        Entry e;
        e.name = "optimizer.exp_avg." + p.name;
        e.t = torch::zeros_like(p.t, torch::MemoryFormat::Contiguous);
        e.param = p.t;
        e.role = CT_ROLE_BUFFER;
        e.dtype = p.dtype;
        e.shape = p.shape;
        e.bytes = p.bytes;
        m->entries.push_back(std::move(e));
      }
      m->bind_moments();
    }
    if (cfg->cohort_ranks > 0) {
      if (!cfg->average_moments) {
        fail("cohort_second_moment needs average_moments");
      }
      if (cfg->rank >= cfg->cohort_ranks) {
        fail("rank " + std::to_string(cfg->rank) + " is outside a cohort of " + std::to_string(cfg->cohort_ranks) +
             " ranks");
      }
      if (cfg->cohort_ranks > 1) {
        const int64_t n = cfg->cohort_ranks;
        Entry e;
        e.name = "optimizer.cohort_members";
        e.t = torch::zeros({n}, torch::TensorOptions().dtype(torch::kFloat).device(m->device));
        e.role = CT_ROLE_BUFFER;
        e.dtype = CT_DTYPE_F32;
        e.shape = {n};
        e.bytes = static_cast<uint64_t>(n) * sizeof(float);
        m->members = static_cast<int64_t>(m->entries.size());
        m->rank = cfg->rank;
        m->entries.push_back(std::move(e));
        m->round_members();
      }
      m->beta1 = cfg->beta1;
      m->beta2 = cfg->beta2;
    }
    // Start the training thread's libtorch state (its OpenMP team, and a
    // pthreadpool whose new worker spins for some 25 ms) with a pass over
    // the parameters now, not in the first steps. CUDA models train in the
    // plugin's own loop (train_step), and start no such thread.
    if (!m->device.is_cuda()) {
      ct_model *raw = m.get();
      m->trainer.run([raw] {
        use_threads(raw->threads);
        raw->norm();
      });
    }
    out = m.release();
  });
  return out;
}

void destroy(ct_model *m) {
  try {
    delete m;
  } catch (...) {
  }
}

int64_t tensor_count(const ct_model *m) { return m ? static_cast<int64_t>(m->entries.size()) : 0; }

int tensor_info(const ct_model *m, int64_t i, ct_tensor_info *out, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (m == nullptr || out == nullptr || i < 0 || i >= static_cast<int64_t>(m->entries.size())) {
      fail("no tensor " + std::to_string(i));
    }
    const Entry &e = m->entries[i];
    out->name = e.name.c_str();
    out->dtype = e.dtype;
    out->role = e.role;
    out->ndim = static_cast<int32_t>(e.shape.size());
    out->shape = e.shape.data();
    out->bytes = e.bytes;
  });
}

int attach(ct_model *m, void *base, uint64_t size, const uint64_t *offsets, int64_t n, int32_t force_copy,
           int32_t *zero_copy, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    if (n != static_cast<int64_t>(m->entries.size())) {
      fail("arena has " + std::to_string(n) + " tensors, the model " + std::to_string(m->entries.size()));
    }
    if (base == nullptr && size > 0) {
      fail("no arena memory");
    }
    for (int64_t i = 0; i < n; ++i) {
      const Entry &e = m->entries[i];
      uint64_t esize = e.t.element_size();
      if (offsets[i] > size || e.bytes > size - offsets[i] || offsets[i] % esize != 0) {
        fail("tensor \"" + e.name + "\": " + std::to_string(e.bytes) + " bytes at offset " +
             std::to_string(offsets[i]) + " do not fit an arena of " + std::to_string(size) + " bytes");
      }
    }
    torch::NoGradGuard ng;
    bool all = true;
    for (int64_t i = 0; i < n; ++i) {
      Entry &e = m->entries[i];
      auto mem = torch::from_blob(static_cast<char *>(base) + offsets[i], e.shape,
                                  torch::TensorOptions().dtype(e.t.scalar_type()).device(torch::kCPU));
      mem.copy_(e.t);
      if (!force_copy && e.t.device().is_cpu()) {
        e.t.set_data(mem);
        e.view = true;
      } else {
        if (e.view) {
          // A view of the previous arena, which is about to be unmapped.
          e.t.set_data(e.t.detach().clone());
        }
        e.view = false;
        all = false;
      }
      e.arena = mem;
      e.published = torch::Tensor();
    }
    m->attached = true;
    *zero_copy = all ? 1 : 0;
  });
}

int32_t device_index(const ct_model *m) { return m->device.is_cuda() ? m->device.index() : -1; }

int attach_device(ct_model *m, void *base, uint64_t size, const int64_t *offsets, int64_t n, char *err,
                  size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    if (!m->attached) {
      fail("attach_device before attach");
    }
    if (!m->device.is_cuda()) {
      fail("attach_device for a model on the CPU");
    }
    if (n != static_cast<int64_t>(m->entries.size())) {
      fail("device block for " + std::to_string(n) + " tensors, the model has " + std::to_string(m->entries.size()));
    }
    if (base == nullptr && size > 0) {
      fail("no device memory");
    }
    for (int64_t i = 0; i < n; ++i) {
      const Entry &e = m->entries[i];
      if (offsets[i] < 0) {
        continue;
      }
      uint64_t off = static_cast<uint64_t>(offsets[i]);
      if (off > size || e.bytes > size - off || off % e.t.element_size() != 0 || e.t.device() != m->device) {
        fail("tensor \"" + e.name + "\": " + std::to_string(e.bytes) + " bytes at offset " + std::to_string(off) +
             " do not fit a device block of " + std::to_string(size) + " bytes on the model's device");
      }
    }
    torch::NoGradGuard ng;
    for (int64_t i = 0; i < n; ++i) {
      if (offsets[i] < 0) {
        continue;
      }
      Entry &e = m->entries[i];
      auto mem = torch::from_blob(static_cast<char *>(base) + offsets[i], e.shape,
                                  torch::TensorOptions().dtype(e.t.scalar_type()).device(m->device));
      mem.copy_(e.t);
      e.t.set_data(mem);
      e.view = true;
      e.arena = mem;
      e.published = torch::Tensor();
    }
    // The averager reads the block from another process: nothing may be
    // left queued on the way in.
    torch::cuda::synchronize(m->device.index());
  });
}

int publish(ct_model *m, double *norm, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    if (!m->attached) {
      fail("publish before attach");
    }
    torch::NoGradGuard ng;
    for (auto &e : m->entries) {
      if (!e.view) {
        e.arena.copy_(e.t);
      }
      if (e.t.is_floating_point()) {
        if (!e.published.defined()) {
          e.published = torch::empty_like(e.t);
        }
        e.published.copy_(e.t);
      }
    }
    *norm = m->norm();
  });
}

int adopt(ct_model *m, double alpha, int32_t credit, double *norm, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    if (!m->attached) {
      fail("adopt before attach");
    }
    if (!(alpha >= 0 && alpha <= 1)) {
      fail("blend alpha " + std::to_string(alpha) + " is outside [0, 1]");
    }
    bool blend = alpha > 0 && alpha < 1;
    torch::NoGradGuard ng;
    for (auto &e : m->entries) {
      bool fl = e.t.is_floating_point();
      if (credit && !e.view && fl) {
        if (!e.published.defined()) {
          fail("adopt with credit before any publish");
        }
        double a = blend ? alpha : 1.0;
        e.t.add_(e.arena.to(e.t.device()).sub(e.published), a);
        continue;
      }
      if (credit && e.view) {
        fail("adopt with credit on tensor \"" + e.name + "\", which lives in the arena");
      }
      if (e.view) {
        if (blend && fl) {
          if (!e.published.defined()) {
            fail("adopt with blend alpha " + std::to_string(alpha) + " before any publish");
          }
          e.t.mul_(alpha).add_(e.published, 1 - alpha);
        }
      } else if (blend && fl) {
        e.t.mul_(1 - alpha).add_(e.arena.to(e.t.device()), alpha);
      } else if (!blend) {
        e.t.copy_(e.arena);
      }
    }
    if (m->members >= 0) {
      double n = m->round_members();
      if (!credit) {
        m->after_round(n);
      }
    }
    *norm = m->norm();
  });
}

int param_norm(ct_model *m, double *norm, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    *norm = m->norm();
  });
}

// drop_grads leaves opt's parameters without gradients, as
// torch.optim's zero_grad does by default since PyTorch 2.0, where
// libtorch 1.x's zero_grad fills them with zeros: backward then hands each
// parameter its gradient instead of adding it to zeros, which saves two
// passes over every gradient a step (on a 2-thread rank, two OpenMP
// regions a large tensor). The values are the same: 0 + g is g; a
// parameter the loss does not reach keeps no gradient, and the optimizer
// skips it, as torch.optim does.
void drop_grads(torch::optim::Optimizer &opt) {
  for (auto &g : opt.param_groups()) {
    for (auto &p : g.params()) {
      p.mutable_grad().reset();
    }
  }
}

// step trains one batch of rows on the calling thread and returns its loss.
double step(ct_model *m, const float *x, int64_t rows, const int64_t *labels, const float *targets, int64_t width,
            double lr) {
  m->set_training(true);
  auto out = m->forward(m->input(x, rows));
  auto l = m->loss_of(out, labels, targets, rows, width, false);
  drop_grads(*m->opt);
  l.backward();
  if (m->max_grad_norm > 0) {
    torch::nn::utils::clip_grad_norm_(m->trainable, m->max_grad_norm);
  }
  for (auto &g : m->opt->param_groups()) {
    g.options().set_lr(lr);
  }
  m->opt->step();
  return l.item<double>();
}

int train_step(ct_model *m, const float *x, int64_t batch, const int64_t *labels, const float *targets,
               int64_t width, double lr, double *loss, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    *loss = step(m, x, batch, labels, targets, width, lr);
  });
}

// u8_scale maps a byte to b / 255.0f, the value the plugin's own gather
// (and torch's x.float().div(255)) gives it.
const std::array<float, 256> &u8_scale() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i) {
      v[i] = static_cast<float>(i) / 255.0f;
    }
    return v;
  }();
  return t;
}

#if defined(__x86_64__)
// scale_avx2 scales the leading multiple of eight of f bytes as scale_row
// does, eight at a time, and returns how many it scaled. A division, not
// a multiplication by 1/255: IEEE division rounds exactly as the table's
// does, so the two agree bit for bit.
__attribute__((target("avx2"))) int64_t scale_avx2(const uint8_t *b, float *x, int64_t f) {
  const __m256 d = _mm256_set1_ps(255.0f);
  int64_t j = 0;
  for (; j + 8 <= f; j += 8) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(b + j));
    _mm256_storeu_ps(x + j, _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), d));
  }
  return j;
}
#endif

// scale_row writes f bytes as u8_scale's floats. The batch gather runs on
// the training thread between two steps; a table lookup per byte made a
// 64-image Fashion-MNIST batch cost more than copying it widened to
// float32, AVX2 makes it cost no more, reading a quarter of the memory.
void scale_row(const uint8_t *b, float *x, int64_t f) {
  int64_t j = 0;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    j = scale_avx2(b, x, f);
  }
#endif
  const auto &scale = u8_scale();
  for (; j < f; ++j) {
    x[j] = scale[b[j]];
  }
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// check_data refuses a data description this shim cannot read.
void check_data(const ct_data *d) {
  if (d == nullptr || d->struct_size != sizeof(ct_data)) {
    fail("the data description's size does not match this shim's");
  }
  if (d->n <= 0 || d->features <= 0 || (d->u8 == nullptr) == (d->f32 == nullptr) ||
      (d->labels == nullptr) == (d->targets == nullptr) || (d->targets != nullptr && d->width <= 0)) {
    fail("the data description is incomplete");
  }
}

// gatherAhead is how many rows ahead of the one it copies gather_rows asks
// the memory for: the rows of a shuffled batch lie anywhere in the data
// set, and one at a time each waits its own trip to memory (a 64-image
// Fashion-MNIST batch of bytes, between a lone rank's steps: 52-58 µs,
// against 39-41 µs fetching 8 ahead).
constexpr int64_t gatherAhead = 8;

// gather_rows copies samples idx[0..n) of d into x (as floats), y or t.
void gather_rows(const ct_data *d, const uint64_t *idx, int64_t n, float *x, int64_t *y, float *t) {
  const int64_t f = d->features, w = d->width;
  const size_t rowBytes = static_cast<size_t>(f) * (d->u8 ? 1 : sizeof(float));
  auto row = [&](uint64_t i) {
    return d->u8 ? static_cast<const void *>(d->u8 + i * f) : static_cast<const void *>(d->f32 + i * f);
  };
  for (int64_t r = 0; r < n; ++r) {
    if (idx[r] >= static_cast<uint64_t>(d->n)) {
      fail("sample " + std::to_string(idx[r]) + " is outside the data set's " + std::to_string(d->n));
    }
  }
  auto fetch = [&](uint64_t i) {
    const char *p = static_cast<const char *>(row(i));
    for (size_t o = 0; o < rowBytes; o += 64) {
      __builtin_prefetch(p + o);
    }
  };
  for (int64_t r = 0; r < std::min(n, gatherAhead); ++r) {
    fetch(idx[r]);
  }
  for (int64_t r = 0; r < n; ++r) {
    if (r + gatherAhead < n) {
      fetch(idx[r + gatherAhead]);
    }
    const uint64_t i = idx[r];
    if (d->f32) {
      std::memcpy(x + r * f, d->f32 + i * f, static_cast<size_t>(f) * sizeof(float));
    } else {
      scale_row(d->u8 + i * f, x + r * f, f);
    }
    if (d->labels) {
      y[r] = d->labels[i];
    } else {
      std::memcpy(t + r * w, d->targets + i * w, static_cast<size_t>(w) * sizeof(float));
    }
  }
}

int gather(const ct_data *d, const uint64_t *idx, int64_t n, float *x, int64_t *labels, float *targets, char *err,
           size_t errlen) {
  return guard(err, errlen, [&] {
    check_data(d);
    if (n < 0 || (n > 0 && (idx == nullptr || x == nullptr || (d->labels ? labels == nullptr : targets == nullptr)))) {
      fail("gather: bad arguments");
    }
    gather_rows(d, idx, n, x, labels, targets);
  });
}

// run_steps is a run of train_steps_start, on the model's training thread.
void run_steps(ct_model *m, const ct_data *d, const uint64_t *rows, int64_t nrows, int64_t batch, const double *lrs,
               int64_t max_steps, double budget_ms, const int32_t *waiting, const int32_t *cancel, ct_step *out,
               int64_t *done) {
  check_data(d);
  const int64_t f = d->features, w = d->width;
  if (batch <= 0 || nrows < 0 || max_steps < 0 || rows == nullptr || lrs == nullptr || out == nullptr) {
    fail("train steps: bad arguments");
  }
  use_threads(m->threads);
  const auto start = std::chrono::steady_clock::now();
  m->batch_x.resize(static_cast<size_t>(batch * f));
  m->batch_y.resize(d->labels ? static_cast<size_t>(batch) : 0);
  m->batch_t.resize(d->targets ? static_cast<size_t>(batch * w) : 0);
  for (int64_t k = 0, pos = 0; k < max_steps && pos < nrows; ++k) {
    if (__atomic_load_n(waiting, __ATOMIC_ACQUIRE) != 0 || __atomic_load_n(cancel, __ATOMIC_ACQUIRE) != 0 ||
        (k > 0 && ms_since(start) >= budget_ms)) {
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = std::min(batch, nrows - pos);
    gather_rows(d, rows + pos, n, m->batch_x.data(), m->batch_y.data(), m->batch_t.data());
    const double gather = ms_since(t0);
    const double loss = step(m, m->batch_x.data(), n, d->labels ? m->batch_y.data() : nullptr,
                             d->targets ? m->batch_t.data() : nullptr, w, lrs[k]);
    out[k] = ct_step{loss, gather, ms_since(t0), n};
    *done = k + 1;
    pos += n;
  }
}

int train_steps_start(ct_model *m, int notify_fd, const ct_data *d, const uint64_t *rows, int64_t nrows,
                      int64_t batch, const double *lrs, int64_t max_steps, double budget_ms, const int32_t *waiting,
                      const int32_t *cancel, ct_step *out, int64_t *done, int32_t want_norm, double *norm,
                      int32_t *rc, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (notify_fd < 0 || done == nullptr || rc == nullptr || waiting == nullptr || cancel == nullptr) {
      fail("train steps: bad arguments");
    }
    m->trainer.start([=] {
      *done = 0;
      int r = guard(err, errlen, [&] {
        run_steps(m, d, rows, nrows, batch, lrs, max_steps, budget_ms, waiting, cancel, out, done);
        if (want_norm && *done > 0 && norm != nullptr) {
          *norm = m->norm();
        }
      });
      *rc = r;
      const char b = 1;
      while (write(notify_fd, &b, 1) < 0 && (errno == EINTR || errno == EAGAIN)) {
      }
    });
  });
}

int evaluate(ct_model *m, const float *x, int64_t n, const int64_t *labels, const float *targets, int64_t width,
             double *loss_sum, int64_t *correct, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    torch::NoGradGuard ng;
    m->set_training(false);
    auto out = m->forward(m->input(x, n));
    auto l = m->loss_of(out, labels, targets, n, width, true).item<double>();
    if (m->loss == CT_LOSS_MSE) {
      l /= static_cast<double>(width);
    } else {
      auto y = torch::from_blob(const_cast<int64_t *>(labels), {n}, torch::kLong).to(out.device());
      *correct += out.argmax(1).eq(y).sum().item<int64_t>();
    }
    *loss_sum += l;
  });
}

int forward(ct_model *m, const float *x, int64_t n, float *out, int64_t out_cap, int64_t *shape, int32_t *ndim,
            char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    torch::NoGradGuard ng;
    m->set_training(false);
    auto y = m->forward(m->input(x, n)).to(torch::kCPU, torch::kFloat).contiguous();
    if (y.dim() > 8) {
      fail("the model output has " + std::to_string(y.dim()) + " dimensions");
    }
    *ndim = static_cast<int32_t>(y.dim());
    for (int64_t i = 0; i < y.dim(); ++i) {
      shape[i] = y.size(i);
    }
    if (out != nullptr && out_cap >= y.numel()) {
      std::memcpy(out, y.data_ptr<float>(), y.numel() * sizeof(float));
    }
  });
}

// read_nested reads the tensor named a.b.c from nested archives a / b.
torch::Tensor read_nested(torch::serialize::InputArchive &ar, const std::string &name, bool is_buffer) {
  auto dot = name.find('.');
  if (dot == std::string::npos) {
    torch::Tensor t;
    ar.read(name, t, is_buffer);
    return t;
  }
  torch::serialize::InputArchive child;
  ar.read(name.substr(0, dot), child);
  return read_nested(child, name.substr(dot + 1), is_buffer);
}

int save(ct_model *m, const char *model_path, const char *optim_path, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    if (m->native) {
      torch::serialize::OutputArchive ar;
      m->native->save(ar);
      ar.save_to(model_path);
    } else {
      m->script->save(model_path);
    }
    torch::serialize::OutputArchive oa;
    m->opt->save(oa);
    oa.save_to(optim_path);
  });
}

int load(ct_model *m, const char *model_path, const char *optim_path, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    std::vector<torch::Tensor> vals(m->entries.size());
    if (m->native) {
      torch::serialize::InputArchive ar;
      ar.load_from(model_path, m->device);
      for (size_t i = 0; i < m->entries.size(); ++i) {
        const Entry &e = m->entries[i];
        if (!m->in_files(i)) {
          continue;
        }
        try {
          vals[i] = read_nested(ar, e.name, e.role == CT_ROLE_BUFFER);
        } catch (const c10::Error &ex) {
          fail(std::string(model_path) + " has no tensor \"" + e.name + "\": not a checkpoint of this model");
        }
      }
    } else {
      auto loaded = torch::jit::load(model_path, m->device);
      std::unordered_map<std::string, torch::Tensor> byname;
      for (const auto &p : loaded.named_parameters(true)) {
        byname.emplace(p.name, p.value);
      }
      for (const auto &b : loaded.named_buffers(true)) {
        byname.emplace(b.name, b.value);
      }
      for (size_t i = 0; i < m->entries.size(); ++i) {
        if (!m->in_files(i)) {
          continue;
        }
        auto it = byname.find(m->entries[i].name);
        if (it == byname.end()) {
          fail(std::string(model_path) + " has no tensor \"" + m->entries[i].name + "\": not a checkpoint of this model");
        }
        vals[i] = it->second;
      }
    }
    for (size_t i = 0; i < m->entries.size(); ++i) {
      const Entry &e = m->entries[i];
      if (!m->in_files(i)) {
        continue;
      }
      if (!vals[i].defined() || vals[i].sizes().vec() != e.shape || vals[i].scalar_type() != e.t.scalar_type()) {
        fail(std::string(model_path) + ": tensor \"" + e.name + "\" is " +
             (vals[i].defined() ? std::string(c10::toString(vals[i].scalar_type())) + shape_str(vals[i].sizes()) : "missing") +
             ", the model has " + c10::toString(e.t.scalar_type()) + shape_str(e.shape));
      }
    }
    // The optimizer before the parameters: a file that does not fit fails
    // here and leaves the parameters as they were (the optimizer state is
    // cleared first, so a restore never mixes old and saved moments).
    torch::serialize::InputArchive oa;
    oa.load_from(optim_path, m->device);
    m->opt->state().clear();
    try {
      m->opt->load(oa);
    } catch (...) {
      m->bind_moments(); // fresh moments, still the arena's
      throw;
    }
    m->bind_moments();
    torch::NoGradGuard ng;
    for (size_t i = 0; i < m->entries.size(); ++i) {
      if (vals[i].defined()) {
        m->entries[i].t.copy_(vals[i]);
      }
    }
  });
}

// The C++ frontend's modules cannot be scripted or traced from C++, so
// export_model builds the built-in models again as TorchScript: their
// trained tensors (copied to the CPU) as parameters named after the layer
// (fc1_weight, ...) and a forward compiled from TorchScript source that
// computes what MLPImpl / CNNImpl::forward do, with aten ops only.
torch::jit::Module scripted(const std::shared_ptr<torch::nn::Module> &native) {
  torch::jit::Module s("CohortModel");
  auto put = [&s](const std::string &layer, const torch::nn::Module &mod) {
    for (const auto &p : mod.named_parameters(false)) {
      s.register_parameter(layer + "_" + p.key(), p.value().detach().to(torch::kCPU).clone(), false);
    }
  };
  std::ostringstream src;
  src << "def forward(self, x):\n";
  if (auto mlp = std::dynamic_pointer_cast<MLPImpl>(native)) {
    src << "    x = x.flatten(1)\n";
    for (size_t i = 0; i < mlp->layers.size(); ++i) {
      const std::string fc = "fc" + std::to_string(i + 1);
      put(fc, *mlp->layers[i]);
      std::string lin = "torch.addmm(self." + fc + "_bias, x, self." + fc + "_weight.t())";
      src << (i + 1 < mlp->layers.size() ? "    x = torch.relu(" + lin + ")\n" : "    return " + lin + "\n");
    }
  } else if (auto cnn = std::dynamic_pointer_cast<CNNImpl>(native)) {
    put("conv1", *cnn->conv1);
    put("conv2", *cnn->conv2);
    put("fc1", *cnn->fc1);
    put("fc2", *cnn->fc2);
    src << "    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv1_weight, self.conv1_bias, [1, 1], [1, 1])), [2, 2])\n"
        << "    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv2_weight, self.conv2_bias, [1, 1], [1, 1])), [2, 2])\n"
        << "    x = torch.relu(torch.addmm(self.fc1_bias, x.flatten(1), self.fc1_weight.t()))\n"
        << "    return torch.addmm(self.fc2_bias, x, self.fc2_weight.t())\n";
  } else {
    fail("export: the built-in model is neither the mlp nor the cnn");
  }
  s.define(src.str());
  s.eval();
  return s;
}

int export_model(ct_model *m, const char *path, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    if (m->native) {
      scripted(m->native).save(path);
    } else {
      m->script->save(path);
    }
  });
}

int epoch_end(ct_model *m, int64_t epoch, int32_t *ran, char *err, size_t errlen) {
  return guard(err, errlen, [&] {
    use_threads(m->threads);
    *ran = 0;
    if (!m->script) {
      return;
    }
    auto method = m->script->find_method("epoch_end");
    if (!method) {
      return;
    }
    torch::NoGradGuard ng;
    (*method)(std::vector<torch::jit::IValue>{torch::jit::IValue(epoch)});
    *ran = 1;
  });
}

const char *torch_version() { return TORCH_VERSION; }

int32_t cuda_device_count() {
  try {
    return static_cast<int32_t>(torch::cuda::device_count());
  } catch (...) {
    return 0;
  }
}

const ct_api api_table = {
    COHORT_TORCH_SHIM_ABI,
    torch_version,
    cuda_device_count,
    create,
    destroy,
    tensor_count,
    tensor_info,
    attach,
    publish,
    adopt,
    param_norm,
    train_step,
    evaluate,
    forward,
    save,
    load,
    export_model,
    epoch_end,
    device_index,
    attach_device,
    train_steps_start,
    gather,
};

} // namespace

extern "C" {

__attribute__((visibility("default"))) uint32_t cohort_torch_shim_abi_version(void) { return COHORT_TORCH_SHIM_ABI; }

__attribute__((visibility("default"))) const ct_api *cohort_torch_shim_api(void) { return &api_table; }

} // extern "C"
