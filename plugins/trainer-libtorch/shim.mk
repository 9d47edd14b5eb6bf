# Builds libcohort_torch_shim.so, the C++ side of the libtorch trainer plugin,
# and (target `ref`) the plain-libtorch reference loop the benchmark compares
# against. Run from anywhere:
#
#   make -f plugins/trainer-libtorch/shim.mk                        # Debian's libtorch-dev
#   make -f plugins/trainer-libtorch/shim.mk LIBTORCH=/opt/libtorch # another libtorch (CUDA, ...)
#   make -f plugins/trainer-libtorch/shim.mk SHIM_OUT=/tmp/x/libcohort_torch_shim.so
#
# SHIM_OUT defaults to bin/plugins/ of the repository, next to the plugin
# binary. Compile one file at a time on a shared machine (-j1 is fine).

SHIM_DIR  := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
REPO_ROOT := $(abspath $(SHIM_DIR)/../..)
SHIM_OUT  ?= $(REPO_ROOT)/bin/plugins/libcohort_torch_shim.so
REF_OUT   ?= $(dir $(SHIM_OUT))cohort-torch-ref-epoch
CXX       ?= g++
OPT       ?= -O2

ifdef LIBTORCH
  TORCH_INC  := -isystem $(LIBTORCH)/include -isystem $(LIBTORCH)/include/torch/csrc/api/include
  TORCH_LIBS := -L$(LIBTORCH)/lib -Wl,-rpath,$(LIBTORCH)/lib
  TORCH_CMAKE := $(LIBTORCH)/share/cmake/Torch/TorchConfig.cmake
  # CUDA builds register their kernels from libtorch_cuda's static
  # initialisers: link it even though no symbol of it is used directly.
  CUDA_LINK  := -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed
  TORCH_CUDA := $(if $(wildcard $(LIBTORCH)/lib/libtorch_cuda.so),$(CUDA_LINK))
  TORCH_HDR  := $(LIBTORCH)/include/torch/csrc/api/include/torch/torch.h
else
  TORCH_INC  := -isystem /usr/include/torch/csrc/api/include
  TORCH_LIBS :=
  TORCH_CMAKE := /usr/lib/$(shell $(CXX) -print-multiarch 2>/dev/null)/cmake/Torch/TorchConfig.cmake
  TORCH_CUDA :=
  TORCH_HDR  := /usr/include/torch/csrc/api/include/torch/torch.h
endif

# Official libtorch archives come in both C++ ABIs, and recent ones need
# C++20 (their headers use concepts): TorchConfig.cmake says which. The shim
# itself needs C++17.
TORCH_ABI := $(shell grep -o -m1 '_GLIBCXX_USE_CXX11_ABI=[01]' $(TORCH_CMAKE) 2>/dev/null)
TORCH_STD := $(shell grep -o -m1 'CXX_STANDARD [0-9]*' $(TORCH_CMAKE) 2>/dev/null | grep -o '[0-9]*$$')
CXXSTD    ?= c++$(if $(filter 20 23 26,$(TORCH_STD)),$(TORCH_STD),17)

CXXFLAGS_SHIM := -std=$(CXXSTD) $(OPT) -fPIC -fvisibility=hidden -Wall -Wno-unused-parameter \
  $(if $(TORCH_ABI),-D$(TORCH_ABI)) $(TORCH_INC) -I$(SHIM_DIR)/shim
LDFLAGS_SHIM  := -shared -Wl,--no-undefined -Wl,-z,defs $(TORCH_LIBS) $(TORCH_CUDA) -ltorch -ltorch_cpu -lc10 -ldl

.PHONY: shim ref check-torch clean-shim
shim: $(SHIM_OUT)
ref: $(REF_OUT)

check-torch:
	@test -f $(TORCH_HDR) || { echo "libtorch headers not found at $(TORCH_HDR): apt-get install libtorch-dev, or set LIBTORCH=/path/to/libtorch"; exit 1; }

$(SHIM_OUT): $(SHIM_DIR)/shim/shim.cpp $(SHIM_DIR)/shim/cohort_torch_shim.h | check-torch
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_SHIM) -o $@.tmp $< $(LDFLAGS_SHIM)
	mv -f $@.tmp $@

$(REF_OUT): $(SHIM_DIR)/bench/ref_epoch.cpp | check-torch
	@mkdir -p $(dir $@)
	$(CXX) $(subst -fvisibility=hidden,,$(CXXFLAGS_SHIM)) -o $@.tmp $< $(TORCH_LIBS) $(TORCH_CUDA) -ltorch -ltorch_cpu -lc10
	mv -f $@.tmp $@

clean-shim:
	rm -f $(SHIM_OUT) $(REF_OUT)
