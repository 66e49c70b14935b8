# make setup: Debian packages, .venv, the extension build (idempotent; seconds when done).
# make test / make demo / make conformance run setup first.
PY      := .venv/bin/python
STAMP   := .venv/.ortmod-deps
APT_PKGS := protobuf-c-compiler libprotobuf-c-dev libopenblas-dev libdlpack-dev
PY_PKGS  := torch==2.13.0 onnx onnxscript onnxruntime numpy pytest setuptools transformers expecttest

.PHONY: setup apt venv build test test-deepspeed conformance demo bench clean

-include runner.mk
-include cuda/cuda.mk
-include bench/bench.mk
-include tests/fuzz/fuzz.mk

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
	@touch $(STAMP)

build: venv
	@$(PY) setup.py -q build_ext --inplace 2>&1 | grep -v -E "^(running|copying|creating)" || true
	@$(PY) -c "import ortmod._C" || (echo "build failed"; exit 1)
	@$(MAKE) -s --no-print-directory runner
	@if [ -f cuda/cuda.mk ]; then $(MAKE) -s --no-print-directory cuda; fi

# tests/test_deepspeed.py is make test-deepspeed's (it installs DeepSpeed; .ci/run runs both)
test: setup
	timeout 1500 $(PY) -m pytest tests -q --ignore=tests/test_deepspeed.py

# DeepSpeed (ZeRO 0-3, fp32/bf16/fp16, with and without ORTModule and FP16_Optimizer), one process
# over gloo on the CPU. Installs DeepSpeed into .venv first when it is missing, with no ops built
# (DS_BUILD_OPS=0: ~30 s); the tests then take ~3-4 min. Here a missing DeepSpeed fails the tests
# instead of skipping them (ORTMOD_REQUIRE_DEEPSPEED=1).
DS_VERSION := 0.19.8
DS_PKG := deepspeed==$(DS_VERSION)
test-deepspeed: setup
	@$(PY) -c "import importlib.metadata as m, sys; sys.exit(m.version('deepspeed') != '$(DS_VERSION)')" \
	  2>/dev/null || (echo "installing $(DS_PKG) (DS_BUILD_OPS=0)"; \
	  DS_BUILD_OPS=0 $(PY) -m pip install -q --disable-pip-version-check $(DS_PKG))
	ORTMOD_REQUIRE_DEEPSPEED=1 DS_ACCELERATOR=cpu timeout 900 $(PY) -m pytest -q tests/test_deepspeed.py \
	  tests/test_optim_fp16.py

# torch's own module test database and training-code patterns, eager vs ORTModule, with the
# scoreboards (tests/conformance/; ~10-30 min). Records go to build/conformance-*.json.
conformance: setup
	@mkdir -p build
	$(PY) -m tests.conformance.module_db --all -q --json build/conformance-module_db.json
	$(PY) -m tests.conformance.patterns --all -q --json build/conformance-patterns.json

demo: setup
	$(PY) demo/train_mlp.py

clean:
	rm -rf build csrc/graph/gen ortmod/_C*.so
