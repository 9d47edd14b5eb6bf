#!/usr/bin/env bash
# gpu-check.sh PACK: the NCCL averager's checks on a host with one or more
# GPUs and a CUDA build of PyTorch from pip. It runs prebuilt binaries only
# (such a host needs no Go toolchain): `make gpu-prep` writes PACK (default
# bin/gpu): bundle.tar.xz (cohort, its plugins with their SHA256SUMS,
# bench/averaging and the real backend's test binary, go test -c -tags
# gpu) and fashion-mnist/. It needs python3 with torch, make, g++, tar and
# xz. One JSON line per check; the whole takes well under 5 minutes. Exit
# status: 0 when no check failed.
set -u
PACK=$(cd "${1:-bin/gpu}" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
fails=0
json() { # check status detail
	python3 -c 'import json,sys; print(json.dumps({"check": sys.argv[1], "status": sys.argv[2], "detail": sys.argv[3][-2000:]}), flush=True)' "$1" "$2" "$3"
	[ "$2" = fail ] && fails=$((fails + 1))
	return 0
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
BIN=$work/bin
mkdir -p "$BIN"
if ! out=$(tar -C "$BIN" -xJf "$PACK/bundle.tar.xz" 2>&1); then
	json bundle fail "unpack $PACK/bundle.tar.xz: $out"
	exit 1
fi

# 1. The libtorch shim against the host's CUDA libtorch.
LIBTORCH=$(${PYTHON:-python3} -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>&1) || { json torch fail "$LIBTORCH"; exit 1; }
if out=$(timeout 240 make -s -f "$REPO/plugins/trainer-libtorch/shim.mk" LIBTORCH="$LIBTORCH" SHIM_OUT="$BIN/plugins/libcohort_torch_shim.so" 2>&1); then
	json shim ok "built against $LIBTORCH"
else
	json shim fail "$out"
fi

# 2. NCCL, the CUDA runtime and cuBLAS from the pip wheels torch brings.
SITE=$(dirname "$LIBTORCH")
NCCL_DIR=$(ls -d "$SITE"/nvidia/nccl/lib 2>/dev/null | head -1)
CUDART_DIR=$(ls -d "$SITE"/nvidia/cuda_runtime/lib "$SITE"/nvidia/cu1*/lib 2>/dev/null | head -1)
CUBLAS_DIR=$(ls -d "$SITE"/nvidia/cublas/lib "$SITE"/nvidia/cu1*/lib 2>/dev/null | head -1)
if [ -n "$NCCL_DIR" ] && [ -n "$CUDART_DIR" ] && [ -n "$CUBLAS_DIR" ]; then
	export COHORT_NCCL_LIBRARY=$NCCL_DIR COHORT_CUDART_LIBRARY=$CUDART_DIR COHORT_CUBLAS_LIBRARY=$CUBLAS_DIR
	json libraries ok "nccl $NCCL_DIR, cudart $CUDART_DIR, cublas $CUBLAS_DIR"
else
	json libraries fail "no nvidia/nccl/lib, nvidia/cuda_runtime/lib or nvidia/cublas/lib under $SITE; the plugin's own search follows"
fi
GPUS=$(${PYTHON:-python3} -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)

# 3. The real backend: a one-rank communicator over device memory, the
# device fold of four ranks against float64, another process's memory
# mapped by CUDA IPC and changed in place, and a two-rank init whose peer
# never comes, aborted within its deadline.
if out=$(timeout 120 "$BIN/gpu/backend.test" -test.run 'GPU' -test.v 2>&1); then
	json backend ok "$(echo "$out" | grep -E '^(---|\s+nccl_gpu)' | tr '\n' ' ')"
else
	json backend fail "$out"
fi

# 4. cohort run: 4 ranks, libtorch on the GPU(s), averaged by NCCL. Ranks
# that share a GPU fold there through CUDA IPC and one leader per GPU
# joins NCCL, so one GPU is enough. Fashion-MNIST from PACK, the built-in
# model, 3 epochs: the accuracy to reach is 85%.
cat > "$work/cohort.hcl" <<HCL
run {
  ranks  = 4
  epochs = 3
  out    = "$work/run"
}
coordinator { formation_timeout = "120s" }
worker {
  plugin_dir  = "$BIN/plugins"
  plugin_lock = ""
}
trainer "libtorch" {
  model  = "mlp"
  data   = "$PACK/fashion-mnist"
  device = "cuda"
}
averager "nccl" {
  init_timeout = "60s"
}
HCL
if out=$(cd "$work" && timeout 240 "$BIN/cohort" run --config "$work/cohort.hcl" 2>&1); then
	acc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["epochs"][-1].get("accuracy", 0))' "$work/run/summary.json" 2>&1)
	status=ok
	python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 0.85 else 1)' "$acc" 2>/dev/null || status=fail
	json cohort-run-4-ranks "$status" "accuracy $acc after 3 epochs on $GPUS GPU(s) (want >= 0.85): $(echo "$out" | tail -3 | tr '\n' ' ')"
	# The parameter bytes the rounds copied between device and host: with
	# the trainer's parameters in a device block the averager maps, none.
	copies=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["averaging"].get("host_copy_bytes", -1))' "$work/run/summary.json" 2>&1)
	if [ "$copies" = 0 ]; then
		json host-copies ok "no parameter byte crossed between device and host in the rounds"
	else
		json host-copies fail "$copies parameter bytes copied between device and host in the rounds: the parameters staged through the host arena (see the run's log for 'parameters stay on the GPU')"
	fi
else
	json cohort-run-4-ranks fail "$(echo "$out" | tail -40)"
fi

# 5. A round's time, 4 ranks x 100 MB on this host: the NCCL plugin
# against averaging-cpu (goal: <= 0.05), and the device's memory floor for
# the fold (bytes the leader's scale, adds and copies move / the HBM's
# bandwidth).
if out=$(timeout 240 "$BIN/gpu/bench-averaging" -ranks 4 -mb 100 -cross-mb 0 -iters 5 -no-gloo -settings '{"smoothing": 0}' \
	-plugin "$BIN/plugins/cohort-averaging-cpu" -nccl "$BIN/plugins/cohort-averaging-nccl" 2>&1); then
	row=$(echo "$out" | grep '^{"kind":"nccl"' | tail -1)
	floor=$(python3 - <<'PY' 2>&1
import torch
p = torch.cuda.get_device_properties(0)
bw = 2 * p.memory_clock_rate * 1e3 * p.memory_bus_width / 8  # bytes/s, DDR
moved = (2 + 3 * 3 + 3 * 2) * 100e6  # scale r+w, 3 axpys r+r+w, 3 copies r+w
print(f"hbm {bw / 1e12:.2f} TB/s, fold floor {moved / bw * 1e3:.2f} ms")
PY
)
	ratio=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ratio"])' "$row" 2>/dev/null || echo "?")
	status=ok
	python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= 0.05 else 1)' "$ratio" 2>/dev/null || status=missed
	json round-time "$status" "nccl / cpu = $ratio (goal <= 0.05); $floor; $row"
else
	json round-time fail "$(echo "$out" | tail -30)"
fi
exit $((fails > 0))
