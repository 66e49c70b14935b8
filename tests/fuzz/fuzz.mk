# tests/fuzz/fuzz.mk — fuzzing and the sanitizer build (included by the Makefile). Each is the one
# build (CMakeLists.txt) configured into a build directory of its own.
#
#   make fuzz          libFuzzer, ASan + UBSan (+ LeakSanitizer): fuzz_onnx (the importer,
#                      passes, autodiff, planning, a forward and a backward) then
#                      fuzz_checkpoint (checkpoints and shards), FUZZ_SECONDS each (60).
#                      Installs Debian's clang and libFuzzer when missing. Findings go to
#                      build/fuzz/findings/, the grown corpus to build/fuzz/corpus-*/; a
#                      finding fails the target. Replay one: build/fuzz-clang/fuzz_onnx FILE.
#   make fuzz-replay   the committed corpus (tests/fuzz/corpus/) through both targets' replay
#                      drivers of the plain build (tests/test_fuzz_corpus.py runs it in make test).
#   make test-asan     the gcc ASan + UBSan build (ORTMOD_SANITIZE) of the extension, the runner
#                      and the replay drivers: the corpus with leak checking, then the
#                      hostile-input tests against them.
FUZZ_SECONDS ?= 60
FUZZ_DIR     := build/fuzz
FUZZ_BUILD   := build/fuzz-clang
SAN_BUILD    := build/san
FUZZ_TARGETS := onnx checkpoint
# a model may ask for any amount of memory: past 256 MiB malloc returns NULL (a clean
# out-of-memory error), which is what the engine must handle; leaks are findings
FUZZ_ASAN    := allocator_may_return_null=1:max_allocation_size_mb=256:detect_leaks=1:abort_on_error=0
FUZZ_UBSAN   := print_stacktrace=1:halt_on_error=1
# configure $(1) once with these options, then build its targets $(2)
build_in = test -f $(1)/build.ninja || cmake -S . -B $(1) -G Ninja -DPython_EXECUTABLE=$(abspath $(PY)) \
             -DORTMOD_CUDA=OFF $(3) > $(1).configure.log 2>&1 || { cat $(1).configure.log; rm -f $(1)/build.ninja; exit 1; }; \
           cmake --build $(1) --target $(2)

.PHONY: fuzz fuzz-build fuzz-clang fuzz-replay test-asan

fuzz-clang:
	@if ! command -v clang >/dev/null || [ ! -f "$$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]; then \
	  echo "installing Debian's clang and libFuzzer"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q clang libclang-rt-14-dev; \
	fi

# the engine with clang, instrumented for coverage and the sanitizers, and the libFuzzer targets
fuzz-build: fuzz-clang venv
	@$(call build_in,$(FUZZ_BUILD),$(foreach t,$(FUZZ_TARGETS),fuzz_$(t)),-DCMAKE_C_COMPILER=clang -DORTMOD_SANITIZE=ON -DORTMOD_FUZZ=ON "-DCMAKE_C_FLAGS=-w")

fuzz: fuzz-build
	@mkdir -p $(FUZZ_DIR)/findings
	@status=0; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus-$$t; \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s (log: $(FUZZ_DIR)/$$t.log)"; \
	  OMP_NUM_THREADS=1 FUZZ_RUNNER_DIR=tests/fuzz/runner ASAN_OPTIONS=$(FUZZ_ASAN) UBSAN_OPTIONS=$(FUZZ_UBSAN) \
	    $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=60 -rss_limit_mb=6144 -malloc_limit_mb=512 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/findings/$$t- \
	    $(FUZZ_DIR)/corpus-$$t tests/fuzz/corpus/$$t > $(FUZZ_DIR)/$$t.log 2>&1; rc=$$?; \
	  grep -E "stat::number_of_executed_units|stat::new_units_added|^Done|ERROR:|SUMMARY:|runtime error" \
	    $(FUZZ_DIR)/$$t.log | sed "s/^/  /"; \
	  if [ $$rc -ne 0 ]; then echo "fuzz_$$t: FINDING (status $$rc), see $(FUZZ_DIR)/$$t.log"; status=1; fi; \
	done; exit $$status

fuzz-replay: build
	@for t in $(FUZZ_TARGETS); do \
	  FUZZ_RUNNER_DIR=tests/fuzz/runner $(BUILD_DIR)/replay_$$t tests/fuzz/corpus/$$t || exit 1; \
	done

# The sanitizer build of a test subset: the extension is $(SAN_BUILD)/_C*.so, the runner
# $(SAN_BUILD)/ortmod-train; it compiles the whole engine once more.
test-asan: venv
	@start=$$(date +%s); \
	$(call build_in,$(SAN_BUILD),_C ortmod-train $(foreach t,$(FUZZ_TARGETS),replay_$(t)),-DORTMOD_SANITIZE=ON) || exit 1; \
	for t in $(FUZZ_TARGETS); do \
	  echo "corpus $$t under ASan + UBSan + LeakSanitizer:"; \
	  FUZZ_RUNNER_DIR=tests/fuzz/runner ASAN_OPTIONS=$(FUZZ_ASAN) UBSAN_OPTIONS=$(FUZZ_UBSAN) \
	    $(SAN_BUILD)/replay_$$t tests/fuzz/corpus/$$t || exit 1; \
	done; \
	ORTMOD_HOSTILE_SO=$$(ls $(SAN_BUILD)/_C*.so) ORTMOD_TRAIN_BINARY=$(SAN_BUILD)/ortmod-train \
	  LD_PRELOAD=$$(gcc -print-file-name=libasan.so) \
	  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=4096 \
	  UBSAN_OPTIONS=$(FUZZ_UBSAN) \
	  timeout 1500 $(PY) -m pytest -q tests/test_hostile_input.py -k "crafted or runner or checkpoint or bit_flip" \
	  || exit 1; \
	echo "test-asan: $$(( $$(date +%s) - start )) s"
