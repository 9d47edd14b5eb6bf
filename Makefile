# cohort's build. `make run` and `make test` work on a fresh Debian machine as
# root: each installs what it needs first.

GO          ?= go
BIN         := bin
PLUGINS     := $(BIN)/plugins
# The plugin binaries `make build` writes; their checksums go into
# $(PLUGINS)/SHA256SUMS, which workers check before starting them.
BUILTIN_PLUGINS := cohort-trainer-mock cohort-averaging-mock cohort-averaging-cpu cohort-averaging-nccl cohort-trainer-libtorch cohort-trainer-pytorch
TOOLS       := $(CURDIR)/.tools
# The control protocol is the core's own (core/wire/wirepb); the plugin
# contracts' generated code is internal to shared/plugin. Both generate from
# the repository root, placed by go_package.
PROTOS      := core/wire/wirepb/wire.proto $(wildcard shared/plugin/internal/pluginpb/*.proto)
PROTOC_GO   := protoc -I . --go_opt=module=github.com/cohortdl/cohort --go-grpc_opt=module=github.com/cohortdl/cohort
# Pinned code generators: the committed .pb.go files name these versions.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
FUZZTIME    ?= 20s
# cohort's version for `cohort version` where go's own VCS stamping is off
# (GOFLAGS=-buildvcs=false): the commit, a tag where one names it.
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
# go.work holds cohort, its plugin SDK (shared/, a module of its own) and
# each example (a vendor's module): package patterns do not cross into a
# nested module, so each is named.
EXAMPLES    := $(patsubst %/go.mod,./%/...,$(wildcard examples/*/go.mod))
# go-nvml's cgo build includes nvml.h, whose deprecation warnings run to
# thousands of lines on a fresh build cache.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# Debian packages the build, tests and the default run need.
# chromium: the status page's browser test (cmd/cohort/status_test.go).
# python3-grpcio, python3-protobuf: trainer-pytorch's run time (with
# python3-torch); protobuf-compiler-grpc: the Python SDK's generated gRPC
# code; python3-build, python3-setuptools, python3-wheel: its package.
DEB_PACKAGES := protobuf-compiler g++ libtorch-dev libopenblas0-pthread python3-torch dataset-fashion-mnist chromium \
	python3-grpcio python3-protobuf protobuf-compiler-grpc python3-build python3-setuptools python3-wheel

.PHONY: all build test run proto python-sdk proto-check bench bench-hosts fuzz deps clean tools slurm-check multihost scale soak chaos comeback-accuracy gpu-prep gpu-check

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

tools: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# The Python SDK's copy of the trainer contract (shared/python/gen.sh).
PY_PB       := shared/python/cohort_plugin/_pb

# proto regenerates the committed Go and Python code from the .proto files.
proto: deps tools
	PATH=$(TOOLS):$$PATH $(PROTOC_GO) --go_out=. --go-grpc_out=. $(PROTOS)
	shared/python/gen.sh $(PY_PB)

# proto-check fails when the committed generated code is stale.
proto-check: deps tools
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	PATH=$(TOOLS):$$PATH $(PROTOC_GO) --go_out=$$tmp --go-grpc_out=$$tmp $(PROTOS) && \
	shared/python/gen.sh $$tmp/$(PY_PB) && \
	stale=0; for f in $$(cd $$tmp && find . -name '*.go' -o -name '*.py'); do \
	  cmp -s $$tmp/$$f $$f || { echo "stale: $$f"; stale=1; }; \
	done; \
	if [ $$stale != 0 ]; then \
	  echo "generated protobuf code is stale: run 'make proto' and commit"; exit 1; \
	fi; echo "generated protobuf code is up to date"

build: deps
	@mkdir -p $(PLUGINS)
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/ ./cmd/cohort
	$(GO) build -o $(PLUGINS)/ ./cmd/cohort-trainer-mock ./cmd/cohort-averaging-mock
	@# GOEXPERIMENT=simd: the reduce's vector kernels (shared/reduce/numeric,
	@# AVX2 where the CPU has it; bit for bit the scalar kernels' values) and
	@# the ring's wide GHASH (shared/authframe, AVX-512 VPCLMULQDQ; GCM's
	@# tags to the bit).
	GOEXPERIMENT=simd $(GO) build -o $(PLUGINS)/cohort-averaging-cpu ./plugins/averaging-cpu
	$(GO) build -o $(PLUGINS)/cohort-averaging-nccl ./plugins/averaging-nccl
	$(GO) build -o $(PLUGINS)/cohort-trainer-libtorch ./plugins/trainer-libtorch
	$(GO) build -o $(PLUGINS)/cohort-trainer-pytorch ./plugins/trainer-pytorch
	$(MAKE) --no-print-directory -f plugins/trainer-libtorch/shim.mk SHIM_OUT=$(CURDIR)/$(PLUGINS)/libcohort_torch_shim.so
	@# Refresh the built plugins' lines, keeping those of plugins installed
	@# from packages ('cohort plugins install'); the shim is a library the
	@# trainer loads, not a plugin, and is not listed.
	cd $(PLUGINS) && { grep -v -E '  ($(subst $(eval) ,|,$(BUILTIN_PLUGINS)))$$' SHA256SUMS 2>/dev/null; sha256sum $(BUILTIN_PLUGINS); } > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS

test: deps proto-check
	@unformatted=$$("$$($(GO) env GOROOT)/bin/gofmt" -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./... ./shared/... $(EXAMPLES)
	$(GO) test -race -count=1 ./internal/... ./core/... ./shared/... ./plugins/... $(EXAMPLES)
	GOEXPERIMENT=simd $(GO) vet ./shared/authframe ./shared/reduce/... ./plugins/averaging-cpu/...
	GOEXPERIMENT=simd $(GO) test -count=1 ./shared/authframe ./shared/reduce/... ./plugins/averaging-cpu/...
	$(GO) test -count=1 ./cmd/... ./bench/... ./test/faults/...

# comeback-accuracy compares a libtorch run whose coordinator is killed
# in epochs 2 and 3 and brought back with the same run left alone
comeback-accuracy: build
	COHORT_COMEBACK_ACCURACY=1 $(GO) test -count=1 -v -run TestCoordinatorComebackAccuracy ./test/faults/

run: deps build
	$(BIN)/cohort run

# python-sdk builds the Python plugin SDK's wheel and sdist
# (cohort_plugin, shared/python) into $(BIN)/python, offline.
python-sdk: deps
	shared/python/package.sh $(BIN)/python

# fuzz runs every fuzz target for FUZZTIME each.
fuzz:
	@set -e; for pkg in $$($(GO) list ./... ./shared/...); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/^func //'); do \
	    echo "== $$pkg $$f"; $(GO) test -run=NONE -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=2s $$pkg; \
	  done; \
	done

# bench prints cohort's figures next to the peers' (../shared/peers),
# measured in the same run, as ratios; bench/pytorch puts trainer-pytorch's
# lone rank next to a plain PyTorch loop. The -netns rows (hosts as network
# namespaces on 1 Gbit/s shaped links) need root and say so when skipped;
# their rounds take a few hundred milliseconds, so they take the median of
# 15, where a core that comes late to one host moves a median of 5.
# bench/memory sums the PSS of the default run's processes.
bench: build
	$(GO) run ./bench/averaging -plugin $(PLUGINS)/cohort-averaging-cpu
	$(GO) run ./bench/averaging -netns -iters 15 -plugin $(PLUGINS)/cohort-averaging-cpu
	$(GO) run ./bench/training -cohort $(BIN)/cohort
	$(GO) run ./bench/pytorch -cohort $(BIN)/cohort
	$(GO) run ./bench/memory -cohort $(BIN)/cohort
	$(GO) run ./bench/hosts -cohort $(BIN)/cohort

# bench-hosts is `make bench`'s cross-host training rows alone: cohort
# against DDP on 4 network namespaces × 1 rank at 1 Gbit/s and 100 Mbit/s
# (tc tbf), on the MLP, the cnn, the transformer and a 5.8 M-parameter wide
# MLP; one JSON line per row. Root; about 25 minutes on 2 cores.
bench-hosts: build
	$(GO) run ./bench/hosts -cohort $(BIN)/cohort

# scale runs one coordinator (a child process) against 10, 100 and 1000
# simulated ranks speaking the control protocol, kills 1% of them, and
# prints one JSON line per size: formation, rounds, death detection,
# heartbeat handling, the coordinator's peak RSS and CPU time.
scale:
	$(GO) run ./bench/scale

# soak trains the default configuration for 200 epochs, evaluating every
# epoch, and fails when any of its processes (cohort run with its
# coordinator, each worker, each plugin) grew its PSS or its own memory
# (PSS less its share of mapped files, which moves with other processes) by
# more than 5% between epoch 10 and the end (the own memory also by more
# than 1 MB, the band a Go runtime's resident heap moves in), read off the
# least-squares line through every epoch's sample so that one sample's
# garbage-collector timing cannot decide it; it prints each one's figures at both points and
# a JSON line. 5-10 minutes on 2 cores on a quiet machine; not part of
# `make test`.
soak: build
	$(GO) run ./bench/soak -cohort $(BIN)/cohort

# chaos is the seeded fault soak (docs/reliability.md): 10 minutes of mock
# runs under a fault every 15-30 s, checked against the trainers' ledger and
# for anything left behind; one JSON line. Root: its coordinator and ranks
# run in network namespaces, whose links it cuts. Not part of `make test`
# or CI.
chaos: build
	$(GO) run ./bench/chaos -bin $(BIN)

# multihost runs cohort across three network namespaces on this machine
# (root): a mock run, libtorch with averaging-cpu, and a host killed
# mid-run; one JSON line per case.
multihost: build
	COHORT_MULTIHOST=1 $(GO) test -count=1 -v -run TestMultiHost ./test/multihost -args -cohort $(CURDIR)/$(BIN)/cohort

# slurm-check runs deploy/slurm/cohort.sbatch on a one-node Slurm cluster
# it starts on this machine (root; installs slurm-wlm and munge if missing).
slurm-check: build
	deploy/slurm/check.sh

# gpu-prep packs what plugins/averaging-nccl/gpu-check.sh runs into
# $(BIN)/gpu, small enough to carry to a GPU host without Go: stripped
# builds of cohort, the plugins it uses and bench/averaging, the NCCL
# backend's GPU tests as a test binary, in one xz archive with the
# plugins' SHA256SUMS, and Fashion-MNIST beside it. The libtorch shim is
# built there, against the host's CUDA libtorch.
GPU_PACK := $(BIN)/gpu/pack
GPU_LDFLAGS := -ldflags=-s\ -w
gpu-prep: deps
	rm -rf $(BIN)/gpu && mkdir -p $(GPU_PACK)/plugins $(GPU_PACK)/gpu
	$(GO) build $(GPU_LDFLAGS) -o $(GPU_PACK)/ ./cmd/cohort
	$(GO) build $(GPU_LDFLAGS) -o $(GPU_PACK)/gpu/bench-averaging ./bench/averaging
	$(GO) build $(GPU_LDFLAGS) -o $(GPU_PACK)/plugins/cohort-averaging-nccl ./plugins/averaging-nccl
	$(GO) build $(GPU_LDFLAGS) -o $(GPU_PACK)/plugins/cohort-trainer-libtorch ./plugins/trainer-libtorch
	GOEXPERIMENT=simd $(GO) build $(GPU_LDFLAGS) -o $(GPU_PACK)/plugins/cohort-averaging-cpu ./plugins/averaging-cpu
	cd $(GPU_PACK)/plugins && sha256sum cohort-* > SHA256SUMS
	$(GO) test -c -tags gpu $(GPU_LDFLAGS) -o $(GPU_PACK)/gpu/backend.test ./plugins/averaging-nccl/internal/backend
	tar -C $(GPU_PACK) -cJf $(BIN)/gpu/bundle.tar.xz . && rm -rf $(GPU_PACK)
	cp -r /usr/share/datasets/fashion-mnist $(BIN)/gpu/fashion-mnist
	@du -sh $(BIN)/gpu

# gpu-check runs the NCCL averager's checks on this host's GPUs (a CUDA
# PyTorch from pip supplies libtorch, NCCL, cuBLAS and the CUDA runtime);
# one JSON line per check. On a GPU machine lent without Go, carry
# $(BIN)/gpu and run plugins/averaging-nccl/gpu-check.sh $(BIN)/gpu there.
gpu-check: gpu-prep
	plugins/averaging-nccl/gpu-check.sh $(BIN)/gpu

clean:
	rm -rf $(BIN) $(TOOLS)
