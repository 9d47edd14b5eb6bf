#!/usr/bin/env bash
# gpu-check.sh BIN: the NCCL averager's checks on a host with one or more
# GPUs and a CUDA build of PyTorch from pip. It runs prebuilt binaries
# only (such a host needs no Go toolchain): `make gpu-prep` writes them
# under BIN (default bin): BIN/cohort, BIN/plugins/*, and the real
# backend's test binary BIN/gpu/backend.test (go test -c -tags gpu). It
# needs python3 with torch, make and g++. One JSON line per check; the
# whole takes well under 5 minutes. Exit status: 0 when no check failed.
set -u
BIN=$(cd "${1:-bin}" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
fails=0
json() { # check status detail
	python3 -c 'import json,sys; print(json.dumps({"check": sys.argv[1], "status": sys.argv[2], "detail": sys.argv[3][-2000:]}))' "$1" "$2" "$3"
	[ "$2" = fail ] && fails=$((fails + 1))
	return 0
}

# 1. The libtorch shim against the host's CUDA libtorch.
LIBTORCH=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>&1) || { json torch fail "$LIBTORCH"; exit 1; }
if out=$(timeout 240 make -s -f "$REPO/plugins/trainer-libtorch/shim.mk" LIBTORCH="$LIBTORCH" SHIM_OUT="$BIN/plugins/libcohort_torch_shim.so" 2>&1); then
	json shim ok "built against $LIBTORCH"
else
	json shim fail "$out"
fi

# 2. NCCL and the CUDA runtime from the pip wheels torch brings.
SITE=$(dirname "$LIBTORCH")
NCCL_DIR=$(ls -d "$SITE"/nvidia/nccl/lib 2>/dev/null | head -1)
CUDART_DIR=$(ls -d "$SITE"/nvidia/cuda_runtime/lib "$SITE"/nvidia/cu1*/lib 2>/dev/null | head -1)
if [ -n "$NCCL_DIR" ] && [ -n "$CUDART_DIR" ]; then
	export COHORT_NCCL_LIBRARY=$NCCL_DIR COHORT_CUDART_LIBRARY=$CUDART_DIR
	json libraries ok "nccl $NCCL_DIR, cudart $CUDART_DIR"
else
	json libraries fail "no nvidia/nccl/lib or nvidia/cuda_runtime/lib under $SITE; the plugin's own search follows"
fi
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)

# 3. The real backend: a one-rank communicator with weights, and a
# two-rank init whose peer never comes, aborted within its deadline.
if out=$(timeout 120 "$BIN/gpu/backend.test" -test.run 'GPU' -test.v 2>&1); then
	json backend ok "$(echo "$out" | grep -E '^(---|\s+nccl_gpu)' | tr '\n' ' ')"
else
	json backend fail "$out"
fi

# 4. cohort run, libtorch on the GPU, averaged by NCCL: one rank per
# GPU, since NCCL refuses two ranks of one communicator on one device and
# the fold of a device's ranks into one member is not built yet.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(1)
x = rng.standard_normal((4096, 32)).astype(np.float32)
y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
np.save(sys.argv[1] + "/x.npy", x); np.save(sys.argv[1] + "/y.npy", y)
PY
ranks=$((GPUS > 0 ? GPUS : 1))
cat > "$work/cohort.hcl" <<HCL
run {
  ranks  = $ranks
  epochs = 2
  out    = "$work/run"
}
coordinator { formation_timeout = "60s" }
worker {
  plugin_dir  = "$BIN/plugins"
  plugin_lock = ""
}
trainer "libtorch" {
  data_x = "$work/x.npy"
  data_y = "$work/y.npy"
  device = "cuda"
}
averager "nccl" {
  init_timeout = "60s"
}
HCL
if out=$(cd "$work" && timeout 180 "$BIN/cohort" run --config "$work/cohort.hcl" 2>&1); then
	json "cohort-run-$ranks-rank" ok "$(echo "$out" | tail -3 | tr '\n' ' ')"
	# The parameter bytes the rounds copied between device and host: the
	# device-resident path (CUDA IPC from the trainer) would make it 0.
	copies=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["averaging"].get("host_copy_bytes", -1))' "$work/run/summary.json" 2>&1)
	if [ "$copies" = 0 ]; then
		json host-copies ok "no parameter byte crossed between device and host in the rounds"
	else
		json host-copies not-built "$copies parameter bytes copied between device and host in the rounds: parameters still stage through the host arena"
	fi
else
	json "cohort-run-$ranks-rank" fail "$(echo "$out" | tail -40)"
fi
json "cohort-run-4-ranks-1-gpu" "not-built" "needs the device fold (ranks of one GPU reduce through CUDA IPC, one leader joins NCCL); NCCL refuses two ranks of a communicator on one device"
exit $((fails > 0))
