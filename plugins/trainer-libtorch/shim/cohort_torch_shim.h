/*
 * cohort_torch_shim.h: the C ABI between the cohort libtorch trainer plugin
 * (Go, which dlopens the shim at run time) and libcohort_torch_shim.so (C++
 * over libtorch).
 *
 * The shim exports exactly two symbols:
 *
 *   uint32_t            cohort_torch_shim_abi_version(void);
 *   const ct_api       *cohort_torch_shim_api(void);
 *
 * The loader calls the first and refuses a shim whose version is not
 * COHORT_TORCH_SHIM_ABI before it reads the table the second returns. Bump
 * COHORT_TORCH_SHIM_ABI on every change to this file that is not purely a
 * comment.
 *
 * Conventions:
 *   - Functions that can fail return 0 on success and -1 on failure, with a
 *     NUL-terminated message in err (at most errlen bytes, truncated). No
 *     C++ exception ever crosses this boundary: the shim catches c10::Error,
 *     std::exception and anything else.
 *   - A ct_model is used by one thread at a time; the caller serializes.
 *   - Pointers handed in (batches, labels, the config) are read during the
 *     call only, except the arena base given to attach, which must stay
 *     mapped until the next attach or destroy.
 *   - Element types use cohort's arena codes (CT_DTYPE_*), roles likewise.
 */
#ifndef COHORT_TORCH_SHIM_H
#define COHORT_TORCH_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COHORT_TORCH_SHIM_ABI 9u

/* Element types: the values of arena.DType in shared/arena. */
#define CT_DTYPE_F32 1
#define CT_DTYPE_F64 2
#define CT_DTYPE_BF16 3
#define CT_DTYPE_F16 4
#define CT_DTYPE_I64 5
#define CT_DTYPE_I32 6

/* Roles: the values of arena.Role. */
#define CT_ROLE_PARAMETER 1
#define CT_ROLE_BUFFER 2

#define CT_LOSS_CROSS_ENTROPY 1
#define CT_LOSS_MSE 2

#define CT_OPT_SGD 1
#define CT_OPT_ADAM 2
#define CT_OPT_ADAMW 3

typedef struct ct_model ct_model;

/* What ct_create builds. */
typedef struct ct_config {
  uint32_t struct_size; /* sizeof(ct_config), checked */
  /* "mlp", "cnn", or the path of a TorchScript module file. */
  const char *model;
  /* mlp: hidden layer widths. */
  const int64_t *hidden;
  int32_t n_hidden;
  /* Per-sample input shape the model's forward receives (the batch adds a
   * leading dimension): [features] for an mlp, [channels, height, width]
   * for the cnn, anything whose product is the feature count for a
   * TorchScript module. */
  const int64_t *input_shape;
  int32_t input_ndim;
  /* Output width of the built-in models (classes or targets). */
  int64_t outputs;
  int32_t loss;      /* CT_LOSS_* */
  int32_t optimizer; /* CT_OPT_* */
  double lr;
  double momentum;     /* sgd */
  int32_t nesterov;    /* sgd */
  double weight_decay; /* all */
  double beta1, beta2, eps; /* adam, adamw */
  double max_grad_norm;     /* 0: no clipping */
  uint64_t seed;            /* seeds libtorch: built-in models' weights, any model's dropout */
  int32_t threads;          /* intra-op threads (libtorch and OpenBLAS) */
  /* "cpu", "cuda" or "cuda:N"; "cuda" picks device rank % device count. */
  const char *device;
  uint32_t rank;
  /* adam, adamw: 1 adds each trained parameter's first moment (exp_avg) to
   * the layout, after the buffers, as a buffer named
   * "optimizer.exp_avg.<parameter>", so rounds average it too. */
  int32_t average_moments;
  /* With average_moments, the cohort's world size n > 0 turns on the
   * second moments' resize: after each round (adopt without credit), the
   * part of each second moment (exp_avg_sq) added since the previous round
   * is resized to what the round's ranks' batches in one would have given
   * (its noise divided by their count, its signal, the mean first moment
   * squared, kept). With n > 1 the layout ends with a buffer
   * "optimizer.cohort_members" of n f32, 1 at element rank (< n), 0
   * elsewhere; a round's mean of it is nonzero at the ranks it averaged,
   * which is how the shim counts them. 0: off. */
  uint32_t cohort_ranks;
} ct_config;

/* The training split as a run of train_steps_start and gather read it:
 * n samples of features values each, as bytes (each read as b / 255.0f,
 * as the plugin's own gather does) or as float32, and n class labels or
 * n * width float targets. Exactly one of u8 and f32 is set, and one of
 * labels and targets. A run reads it until it ends. */
typedef struct ct_data {
  uint32_t struct_size; /* sizeof(ct_data), checked */
  int64_t n;
  int64_t features;
  int64_t width; /* targets per sample (mse); 0 with labels */
  const uint8_t *u8;
  const float *f32;
  const int64_t *labels;
  const float *targets;
} ct_data;

/* What a run of train_steps_start reports of one step. */
typedef struct ct_step {
  double loss;
  double gather_ms; /* copying the batch out of the data set */
  double step_ms;   /* the gather and the optimizer step */
  int64_t rows;
} ct_step;

/* One tensor of the model, in layout order (parameters, then buffers).
 * name and shape belong to the model and live until ct_destroy. */
typedef struct ct_tensor_info {
  const char *name;
  int32_t dtype; /* CT_DTYPE_* */
  int32_t role;  /* CT_ROLE_* */
  int32_t ndim;
  const int64_t *shape;
  uint64_t bytes;
} ct_tensor_info;

typedef struct ct_api {
  uint32_t abi; /* COHORT_TORCH_SHIM_ABI again */
  /* libtorch's version string, e.g. "1.13.1". */
  const char *(*torch_version)(void);
  /* Number of CUDA devices libtorch sees (0 on a CPU build). */
  int32_t (*cuda_device_count)(void);

  ct_model *(*create)(const ct_config *cfg, char *err, size_t errlen);
  void (*destroy)(ct_model *m);

  int64_t (*tensor_count)(const ct_model *m);
  int (*tensor_info)(const ct_model *m, int64_t i, ct_tensor_info *out, char *err, size_t errlen);

  /* attach places the model's tensors in an arena block: it copies the
   * current values to base + offsets[i] and, unless force_copy is set or a
   * tensor is not on the CPU, makes the tensor a view of that memory.
   * *zero_copy is 1 when every tensor became a view. */
  int (*attach)(ct_model *m, void *base, uint64_t size, const uint64_t *offsets, int64_t n,
                int32_t force_copy, int32_t *zero_copy, char *err, size_t errlen);
  /* publish makes the arena hold the parameters (copying the tensors that
   * are not views) and keeps a copy of every float tensor for a later
   * blending adopt. *norm is the L2 norm of the parameters. */
  int (*publish)(ct_model *m, double *norm, char *err, size_t errlen);
  /* adopt makes the model use the arena's values; with alpha in (0,1) each
   * float tensor becomes (1-alpha)*published + alpha*arena instead. With
   * credit set (steps ran since publish, while the arena was averaged;
   * only for tensors that are not views), each float tensor t becomes
   * t + alpha*(arena - published), alpha 0 counting as 1: the steps since
   * publish stay on top of the average. */
  int (*adopt)(ct_model *m, double alpha, int32_t credit, double *norm, char *err, size_t errlen);
  int (*param_norm)(ct_model *m, double *norm, char *err, size_t errlen);

  /* train_step runs one optimizer step on a batch: x is batch rows of the
   * feature count (float32), labels batch class indices (cross entropy) or
   * targets batch rows of target_width float32 values (mse); the other is
   * NULL. lr is this step's learning rate. */
  int (*train_step)(ct_model *m, const float *x, int64_t batch, const int64_t *labels,
                    const float *targets, int64_t target_width, double lr, double *loss,
                    char *err, size_t errlen);
  /* evaluate runs the model in eval mode without gradients on n rows and
   * adds the summed loss and (cross entropy) the count of correct argmax
   * predictions. */
  int (*evaluate)(ct_model *m, const float *x, int64_t n, const int64_t *labels,
                  const float *targets, int64_t target_width, double *loss_sum,
                  int64_t *correct, char *err, size_t errlen);
  /* forward runs the model in eval mode on n rows and reports the output's
   * shape (*ndim dims, at most 8, into shape). When out is not NULL and
   * out_cap (in floats) is large enough, the output is copied there as
   * float32. */
  int (*forward)(ct_model *m, const float *x, int64_t n, float *out, int64_t out_cap,
                 int64_t *shape, int32_t *ndim, char *err, size_t errlen);

  /* save writes the model (a TorchScript archive: torch::save of the
   * module, or the TorchScript module itself) and the optimizer
   * (torch::save(optimizer)) to the two paths. */
  int (*save)(ct_model *m, const char *model_path, const char *optim_path, char *err, size_t errlen);
  /* load restores both, checking every tensor's name, shape and type
   * before it changes anything in the model. */
  int (*load)(ct_model *m, const char *model_path, const char *optim_path, char *err, size_t errlen);
  /* export_model writes the model as a TorchScript module with a forward
   * (torch.jit.load in Python, torch::jit::load in C++), its tensors on
   * the CPU: what the model's forward computes on the input it trains on. */
  int (*export_model)(ct_model *m, const char *path, char *err, size_t errlen);
  /* epoch_end runs a TorchScript model's epoch_end(epoch: int) method,
   * without gradients, when it has one; *ran says whether it did. */
  int (*epoch_end)(ct_model *m, int64_t epoch, int32_t *ran, char *err, size_t errlen);
  /* device_index is the CUDA device the model is on, -1 on the CPU. */
  int32_t (*device_index)(const ct_model *m);
  /* attach_device, after attach, moves the tensors with an offset of 0 or
   * more into the device block at base (size bytes, on the model's CUDA
   * device, which the caller owns and keeps until destroy): each is copied
   * there and becomes a view of it, so publish and adopt copy nothing for
   * them. Tensors with offset -1 stay as attach left them. */
  int (*attach_device)(ct_model *m, void *base, uint64_t size, const int64_t *offsets, int64_t n,
                       char *err, size_t errlen);
  /* train_steps_start starts a run of steps on the model's own training
   * thread (create starts and warms it for a CPU model, else the first
   * run starts it; destroy joins it) and returns at
   * once: 0 when it started, -1 with a message in err when it did not.
   * The run trains the samples rows names (indices into d, in order) in
   * batches of batch rows, the last one possibly short, one optimizer
   * step each, gathering each batch itself. lrs[i] is step i's learning
   * rate; there are max_steps of them, and out has room for as many
   * reports. It stops after max_steps steps, when the rows run out, once
   * the steps so far took budget_ms, or when *waiting or *cancel is
   * nonzero (both read atomically before every step, the first included:
   * another thread sets them while the run goes on). Then it stores the
   * number of steps it trained in *done (also on failure), out[0..*done)
   * describing them, with want_norm set and a step trained the
   * parameters' L2 norm in *norm, and 0 or -1 in *rc (with a message in
   * err, errlen bytes), and last writes one byte to notify_fd. Everything
   * the pointers reach must stay valid, and the model untouched by other
   * calls, until that byte is read. One run at a time. */
  int (*train_steps_start)(ct_model *m, int notify_fd, const ct_data *d, const uint64_t *rows, int64_t nrows,
                           int64_t batch, const double *lrs, int64_t max_steps, double budget_ms,
                           const int32_t *waiting, const int32_t *cancel, ct_step *out, int64_t *done,
                           int32_t want_norm, double *norm, int32_t *rc, char *err, size_t errlen);
  /* gather copies samples idx[0..n) of d into x (n * features float32)
   * and their labels into labels or their targets into targets (n * width
   * float32), whichever d has (the other may be NULL), as a run of steps
   * gathers each batch. It touches no model: any thread may call it. 0,
   * or -1 with a message in err (an index outside d). */
  int (*gather)(const ct_data *d, const uint64_t *idx, int64_t n, float *x, int64_t *labels, float *targets,
                char *err, size_t errlen);
} ct_api;

uint32_t cohort_torch_shim_abi_version(void);
const ct_api *cohort_torch_shim_api(void);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_TORCH_SHIM_H */
