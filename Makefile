# make setup: Debian packages, .venv, the build (idempotent; seconds when done).
# make test / make demo / make conformance run setup first.
PY      := .venv/bin/python
STAMP   := .venv/.ortmod-deps
APT_PKGS := cmake ninja-build protobuf-c-compiler libprotobuf-c-dev libopenblas-dev libdlpack-dev
# ml_dtypes (onnx's) below 0.7: 0.7.0's extension takes ~0.38 s to load under numpy 2.4 (it registers
# ufunc loops one by one, each a linear search), 0.6.0's 2 ms; every torch.export first call
# imports it through onnx (bench/first_call.py)
TORCH_PIN := 2.13.0
PY_LIBS  := onnx "ml_dtypes>=0.5.4,<0.7" onnxscript onnxruntime numpy pytest transformers expecttest \
            diffusers torch_geometric
# libraries that require torch: the release matrix's venvs install them with --no-deps (with their
# other requirements, TORCH_LIBS_DEPS), or pip would pull a CUDA torch's ~4 GB of nvidia-* wheels
TORCH_LIBS := accelerate
TORCH_LIBS_DEPS := psutil pyyaml "huggingface_hub>=0.21" safetensors packaging
PY_PKGS  := torch==$(TORCH_PIN) $(PY_LIBS) $(TORCH_LIBS) scikit-build-core
# the one build (CMakeLists.txt), configured once into BUILD_DIR; CMAKE_ARGS add -D options there
BUILD_DIR  := build/cmake
CMAKE_ARGS ?=
# where nvcc is found, the cuBLAS headers and libraries the CUDA provider builds against come from
# this wheel, installed into .venv (torch's CUDA wheels install the same one)
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUBLAS_PKG := $(if $(findstring release 12.,$(shell $(NVCC) --version 2>/dev/null)),nvidia-cublas-cu12,nvidia-cublas==13.10.0.20)

.PHONY: setup apt venv build runner cuda test test-export test-deepspeed test-wheel conformance demo bench clean \
	torch-venv torch-venvs test-torch test-compat test-matrix

-include bench/bench.mk
-include tests/fuzz/fuzz.mk
-include tests/modelfuzz/modelfuzz.mk

setup: apt venv build

apt:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

venv: $(STAMP)
$(STAMP): Makefile
	@test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check $(PY_PKGS)
	@if [ -n "$(NVCC)" ]; then $(PY) -m pip install -q --disable-pip-version-check --no-deps "$(CUBLAS_PKG)" \
	  || echo "cuBLAS wheel not installed: the CUDA provider will be skipped"; fi
	@touch $(STAMP)

# configure once (CMake reconfigures itself when CMakeLists.txt or a source list changes), build
# everything, install into the source tree: ortmod/_C*.so, ortmod/bin/ortmod-train and, where
# nvcc and cuBLAS are found, ortmod/libortmod_cuda.so (all ignored by git)
build: venv
	@mkdir -p $(BUILD_DIR)
	@test -f $(BUILD_DIR)/build.ninja || cmake -S . -B $(BUILD_DIR) -G Ninja \
	  -DPython_EXECUTABLE=$(abspath $(PY)) $(CMAKE_ARGS) > $(BUILD_DIR).configure.log 2>&1 \
	  || { cat $(BUILD_DIR).configure.log; rm -f $(BUILD_DIR)/build.ninja; exit 1; }
	@grep -h "CUDA provider" $(BUILD_DIR).configure.log 2>/dev/null || true
	@cmake --build $(BUILD_DIR)
	@cmake --install $(BUILD_DIR) --prefix . > /dev/null
	@$(PY) -c "import ortmod._C" || (echo "build failed: ortmod._C does not import"; exit 1)
runner cuda: build

# tests/test_deepspeed*.py are make test-deepspeed's (it installs DeepSpeed; .ci/run runs both).
# The suite runs on the TorchScript capture path (tests/conftest.py), the torch.export path's
# own tests and those of "auto" on theirs; make test-export runs every test on the torch.export
# path, the default's first choice (~18 min on one core).
test: setup
	timeout 1500 $(PY) -m pytest tests -q --ignore=tests/test_deepspeed.py --ignore=tests/test_deepspeed_multiprocess.py

test-export: setup
	ORTMOD_CAPTURE=export timeout 3000 $(PY) -m pytest tests -q --ignore=tests/test_deepspeed.py \
	  --ignore=tests/test_deepspeed_multiprocess.py

# DeepSpeed (ZeRO 0-3, fp32/bf16/fp16, with and without ORTModule and FP16_Optimizer), one process
# over gloo on the CPU, and ZeRO 1-3 in two (tests/test_deepspeed_multiprocess.py, ~30 s). Installs DeepSpeed into .venv first when it is missing, with no ops built
# (DS_BUILD_OPS=0: ~30 s); the tests then take ~3-4 min. Here a missing DeepSpeed fails the tests
# instead of skipping them (ORTMOD_REQUIRE_DEEPSPEED=1). The DeepSpeed tests run on each capture path.
DS_VERSION := 0.19.8
DS_PKG := deepspeed==$(DS_VERSION)
test-deepspeed: setup
	@$(PY) -c "import importlib.metadata as m, sys; sys.exit(m.version('deepspeed') != '$(DS_VERSION)')" \
	  2>/dev/null || (echo "installing $(DS_PKG) (DS_BUILD_OPS=0)"; \
	  DS_BUILD_OPS=0 $(PY) -m pip install -q --disable-pip-version-check $(DS_PKG))
	ORTMOD_REQUIRE_DEEPSPEED=1 DS_ACCELERATOR=cpu timeout 900 $(PY) -m pytest -q tests/test_deepspeed.py \
	  tests/test_deepspeed_multiprocess.py tests/test_optim_fp16.py
	ORTMOD_CAPTURE=export ORTMOD_REQUIRE_DEEPSPEED=1 DS_ACCELERATOR=cpu timeout 900 $(PY) -m pytest -q \
	  tests/test_deepspeed.py tests/test_deepspeed_multiprocess.py

# the product as a user installs it (tests/wheel/check.sh): a fresh venv, `pip install .` (the
# isolated build through scikit-build-core), then ortmod-train and the demo from outside the
# checkout, against the installed package. ~5-10 min: it compiles everything once more.
test-wheel: apt
	timeout 1800 bash tests/wheel/check.sh

# ---- the torch release matrix (docs/build.md, "The torch release matrix"): pyproject.toml declares exactly these ----
# make test-torch TORCH=2.14.1: the whole suite on that release; make test-compat TORCH=2.11.0: the
# compat job (capture paths, semantics, the fast conformance subset, the model zoo). Each release gets
# its own venv, .venv-torch-$(TORCH) (TORCH_VENV= to put it elsewhere), installed the light way: PyPI's
# builds other than 2.13.0 are CUDA builds (~4 GB with their nvidia-* wheels), so torch goes in with
# --no-deps, then the pure-Python libraries torch imports and its CUDA runtime wheels (a few MB), then
# scripts/torch_cpu_stubs.py stands in for the NVIDIA libraries a CPU run never calls (cuDNN, cuBLAS,
# NCCL, ...: ~3 GB). 1.8 GB a venv, 2-5 min (4.4 on 2 loaded cores). The extension links no
# libtorch: the one `make build` serves every release.
TORCH_RELEASES := 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1
TORCH ?= 2.14.1
TORCH_VENV ?= .venv-torch-$(TORCH)
TORCH_PY := $(TORCH_VENV)/bin/python
TORCH_IMPORT_DEPS := filelock "typing-extensions>=4.10" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5"
torch-venv: $(TORCH_VENV)/.ortmod-torch-$(TORCH)
$(TORCH_VENV)/.ortmod-torch-$(TORCH):
	@case " $(TORCH_RELEASES) " in *" $(TORCH) "*) ;; *) echo "TORCH=$(TORCH) is not one of the tested \
	  releases ($(TORCH_RELEASES))"; exit 1;; esac
	@test -x $(TORCH_PY) || python3 -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps torch==$(TORCH)
	$(TORCH_PY) -m pip install -q --disable-pip-version-check --no-cache-dir $(TORCH_IMPORT_DEPS) $(PY_LIBS) \
	  $(TORCH_LIBS_DEPS) 2>&1 | grep -v "requires nvidia\|requires cuda\|requires triton\|requires setuptools\|dependency conflicts" || true
	$(TORCH_PY) -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps $(TORCH_LIBS)
	@! $(TORCH_PY) -m pip list 2>/dev/null | grep -q "^triton \|^nvidia-cudnn" || { echo "a library pulled \
	  torch's CUDA wheels into $(TORCH_VENV): add it to TORCH_LIBS"; exit 1; }
	@reqs="$$(python3 scripts/torch_cpu_stubs.py --runtime-reqs $(TORCH_VENV))"; if [ -n "$$reqs" ]; then \
	  echo "CUDA runtime wheels: $$reqs"; eval $(TORCH_PY) -m pip install -q --disable-pip-version-check \
	  --no-cache-dir $$reqs 2>&1 | grep -v "requires\|dependency conflicts\|dependency resolver" || true; fi
	python3 scripts/torch_cpu_stubs.py $(TORCH_VENV)
	$(TORCH_PY) -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(v != '$(TORCH)' and \
	  f'{v} installed, $(TORCH) wanted')"
	@touch $@

# The CUDA provider's tests (test_cuda_build.py, test_cuda_emulated.py) are make test's: the provider
# links no torch, and in these venvs torch's import loads its CUDA runtime and the stand-in NVIDIA
# libraries process-wide, which the provider (its cuBLAS) and the emulator (its cuda* symbols) then
# bind to instead of their own ("undefined symbol: cublasLtCreate", "CUDA driver version is insufficient")
TORCH_SUITE_IGNORE := --ignore=tests/test_deepspeed.py --ignore=tests/test_deepspeed_multiprocess.py \
	--ignore=tests/test_cuda_build.py --ignore=tests/test_cuda_emulated.py
test-torch: build torch-venv
	timeout 1500 $(TORCH_PY) -m pytest tests -q $(TORCH_SUITE_IGNORE)

# the whole matrix, as .ci/run runs it: make torch-venvs (every release's venv but the pinned one's;
# downloads, little CPU: .ci/run starts it beside the suites), then make test-matrix (the whole
# suite on the newest release, the compat job on each older one)
MATRIX_NEWEST := 2.14.1
MATRIX_COMPAT := 2.10.0 2.11.0 2.12.1
torch-venvs:
	@for t in $(MATRIX_NEWEST) $(MATRIX_COMPAT); do $(MAKE) --no-print-directory torch-venv TORCH=$$t || exit 1; done
test-matrix: build torch-venvs
	$(MAKE) --no-print-directory test-torch TORCH=$(MATRIX_NEWEST)
	@for t in $(MATRIX_COMPAT); do $(MAKE) --no-print-directory test-compat TORCH=$$t || exit 1; done

# the compat job: both capture paths' own tests, custom autograd.Functions, semantics, the fast
# conformance subset and the model zoo's default selection, on the default capture path ("auto")
COMPAT_TESTS := tests/test_capture_export.py tests/test_autograd_function.py tests/test_semantics.py \
	tests/test_conformance.py tests/test_model_zoo.py tests/test_torch_compat.py tests/test_module.py
test-compat: build torch-venv
	timeout 1500 $(TORCH_PY) -m pytest $(COMPAT_TESTS) -q

# torch's own module test database and training-code patterns, eager vs ORTModule, with the
# scoreboards (tests/conformance/; ~10-30 min). Records go to build/conformance-*.json.
conformance: setup
	@mkdir -p build
	$(PY) -m tests.conformance.module_db --all -q --json build/conformance-module_db.json
	$(PY) -m tests.conformance.patterns --all -q --json build/conformance-patterns.json

demo: setup
	$(PY) demo/train_mlp.py

clean:
	rm -rf build ortmod/_C*.so ortmod/bin ortmod/libortmod_cuda.so
