// cohort-torch-ref-epoch: the plain-libtorch reference the plugin's
// benchmark compares against. The same model (784-256-ReLU-10), optimizer
// (SGD lr 0.05, momentum 0.9), batch size and per-step work (gather a
// shuffled batch, forward, cross entropy, backward, step, read the loss) as
// one epoch through the plugin, in one C++ process with no plugin boundary.
//
//   cohort-torch-ref-epoch IMAGES LABELS N FEATURES EPOCHS THREADS BATCH [WARMUP]
//
// IMAGES is N*FEATURES raw uint8 pixels, LABELS N raw uint8 labels. WARMUP
// batches (50 unless given) train before the first timed epoch. Prints
// one JSON line: {"ms_per_epoch": [...], "threads": T, "final_loss": L}.

#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace {

std::vector<uint8_t> read_all(const std::string &path, size_t want) {
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> b(want);
  if (!f.read(reinterpret_cast<char *>(b.data()), static_cast<std::streamsize>(want))) {
    throw std::runtime_error("cannot read " + std::to_string(want) + " bytes from " + path);
  }
  return b;
}

} // namespace

int main(int argc, char **argv) try {
  if (argc != 8 && argc != 9) {
    std::cerr << "usage: " << argv[0] << " IMAGES LABELS N FEATURES EPOCHS THREADS BATCH [WARMUP]\n";
    return 2;
  }
  const int64_t warmup = argc == 9 ? std::stoll(argv[8]) : 50;
  const int64_t n = std::stoll(argv[3]), features = std::stoll(argv[4]);
  const int epochs = std::stoi(argv[5]), threads = std::stoi(argv[6]);
  const int64_t batch = std::stoll(argv[7]);
  at::set_num_threads(threads);
  using SetFn = void (*)(int);
  if (auto f = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    f(threads);
  }

  auto px = read_all(argv[1], static_cast<size_t>(n * features));
  auto lb = read_all(argv[2], static_cast<size_t>(n));
  auto x = torch::from_blob(px.data(), {n, features}, torch::kUInt8).to(torch::kFloat).div_(255.0);
  auto y = torch::from_blob(lb.data(), {n}, torch::kUInt8).to(torch::kLong);

  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(features, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // The batch is gathered row by row into reused buffers, as the plugin
  // does on its side (index_select runs an OpenMP region per call, which
  // on a small shared machine costs more than the copy itself).
  auto xb_all = torch::empty({batch, features}, torch::kFloat);
  auto yb_all = torch::empty({batch}, torch::kLong);
  const float *xp = x.data_ptr<float>();
  const int64_t *yp = y.data_ptr<int64_t>();
  auto step = [&](const torch::Tensor &idx) {
    const int64_t rows = idx.size(0);
    const int64_t *ip = idx.data_ptr<int64_t>();
    float *xd = xb_all.data_ptr<float>();
    int64_t *yd = yb_all.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(xd + r * features, xp + ip[r] * features, features * sizeof(float));
      yd[r] = yp[ip[r]];
    }
    auto xb = xb_all.slice(0, 0, rows);
    auto yb = yb_all.slice(0, 0, rows);
    // Gradients dropped, not zeroed, as the plugin does (and torch.optim
    // by default since PyTorch 2.0).
    for (auto &p : model->parameters()) {
      p.mutable_grad().reset();
    }
    auto loss = torch::nn::functional::cross_entropy(model->forward(xb), yb);
    loss.backward();
    opt.step();
    return loss.item<double>();
  };

  // Warm up thread pools and allocators, as the plugin benchmark does
  // (the comparison with a whole cohort run, which starts cold, asks none).
  auto warm = torch::randperm(n, torch::kLong);
  for (int64_t b = 0; b < warmup * batch && b < n; b += batch) {
    step(warm.slice(0, b, std::min(b + batch, n)));
  }

  std::vector<double> ms;
  double last = 0;
  for (int e = 0; e < epochs; ++e) {
    auto start = std::chrono::steady_clock::now();
    auto perm = torch::randperm(n, torch::kLong);
    for (int64_t b = 0; b < n; b += batch) {
      last = step(perm.slice(0, b, std::min(b + batch, n)));
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("{\"ms_per_epoch\": [");
  for (size_t i = 0; i < ms.size(); ++i) {
    std::printf("%s%.3f", i ? ", " : "", ms[i]);
  }
  std::printf("], \"threads\": %d, \"final_loss\": %.6f}\n", threads, last);
  return 0;
} catch (const std::exception &e) {
  std::cerr << "cohort-torch-ref-epoch: " << e.what() << "\n";
  return 1;
}
