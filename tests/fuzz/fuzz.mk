# tests/fuzz/fuzz.mk — fuzzing and the sanitizer build (included by the Makefile).
#
#   make fuzz          libFuzzer, ASan + UBSan (+ LeakSanitizer): fuzz_onnx (the importer,
#                      passes, autodiff, planning, a forward and a backward) then
#                      fuzz_checkpoint (checkpoints and shards), FUZZ_SECONDS each (60).
#                      Installs Debian's clang and libFuzzer when missing. Findings go to
#                      build/fuzz/findings/, the grown corpus to build/fuzz/corpus-*/; a
#                      finding fails the target. Replay one: build/fuzz/fuzz_onnx FILE.
#   make fuzz-replay   the committed corpus (tests/fuzz/corpus/) through both targets,
#                      plain gcc build (tests/test_fuzz_corpus.py runs it in make test).
#   make test-asan     gcc ASan + UBSan builds of the extension and the runner; the corpus
#                      with leak checking, then the hostile-input tests against them.
FUZZ_SECONDS ?= 60
FUZZ_DIR     := build/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_WARN    := -Wall -Wno-unused-parameter -Wno-missing-field-initializers -Wno-sign-compare
FUZZ_INC     := -D_GNU_SOURCE -Icsrc -Icsrc/include -Icsrc/graph/gen
FUZZ_LIBS    := -lprotobuf-c -lopenblas -lm -lpthread
FUZZ_TARGETS := onnx checkpoint
# a model may ask for any amount of memory: past 256 MiB malloc returns NULL (a clean
# out-of-memory error), which is what the engine must handle; leaks are findings
FUZZ_ASAN    := allocator_may_return_null=1:max_allocation_size_mb=256:detect_leaks=1:abort_on_error=0
FUZZ_UBSAN   := print_stacktrace=1:halt_on_error=1
# objects of the engine and runner, but not the CLI's main
fuzz_objs     = $$(find $(1) -name '*.o' ! -path '*/runner/main.o' | sort)

.PHONY: fuzz fuzz-build fuzz-clang fuzz-replay test-asan

fuzz-clang:
	@if ! command -v clang >/dev/null || [ ! -f "$$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]; then \
	  echo "installing Debian's clang and libFuzzer"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q clang libclang-rt-14-dev; \
	fi

# the engine and runner objects with clang, instrumented for coverage and the sanitizers
# (runner.mk's rules, another object directory; its ortmod-train links too, unused here)
fuzz-build: fuzz-clang
	@test -f csrc/graph/gen/onnx.pb-c.c || $(PY) setup.py -q build_ext --inplace
	@$(MAKE) -s --no-print-directory -f runner.mk runner RUNNER_CC=clang RUNNER_OBJDIR=build/fuzz-obj \
	  RUNNER_BIN=$(FUZZ_DIR)/ortmod-train-fuzz \
	  "RUNNER_CFLAGS=-std=c11 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $(FUZZ_SAN) $(FUZZ_INC) -w" \
	  "RUNNER_LIBS=$(FUZZ_SAN) $(FUZZ_LIBS)"
	@for t in $(FUZZ_TARGETS); do \
	  clang -std=c11 -O1 -g -fsanitize=fuzzer $(FUZZ_SAN) $(FUZZ_INC) $(FUZZ_WARN) -o $(FUZZ_DIR)/fuzz_$$t \
	    tests/fuzz/fuzz_$$t.c $(call fuzz_objs,build/fuzz-obj) $(FUZZ_LIBS) || exit 1; \
	done

fuzz: fuzz-build
	@mkdir -p $(FUZZ_DIR)/findings
	@status=0; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus-$$t; \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s (log: $(FUZZ_DIR)/$$t.log)"; \
	  OMP_NUM_THREADS=1 FUZZ_RUNNER_DIR=tests/fuzz/runner ASAN_OPTIONS=$(FUZZ_ASAN) UBSAN_OPTIONS=$(FUZZ_UBSAN) \
	    $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=60 -rss_limit_mb=6144 -malloc_limit_mb=512 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/findings/$$t- \
	    $(FUZZ_DIR)/corpus-$$t tests/fuzz/corpus/$$t > $(FUZZ_DIR)/$$t.log 2>&1; rc=$$?; \
	  grep -E "stat::number_of_executed_units|stat::new_units_added|^Done|ERROR:|SUMMARY:|runtime error" \
	    $(FUZZ_DIR)/$$t.log | sed "s/^/  /"; \
	  if [ $$rc -ne 0 ]; then echo "fuzz_$$t: FINDING (status $$rc), see $(FUZZ_DIR)/$$t.log"; status=1; fi; \
	done; exit $$status

fuzz-replay: runner
	@mkdir -p $(FUZZ_DIR)
	@for t in $(FUZZ_TARGETS); do \
	  gcc -std=c11 -O1 -g $(FUZZ_INC) $(FUZZ_WARN) -o $(FUZZ_DIR)/replay_$$t tests/fuzz/replay.c tests/fuzz/fuzz_$$t.c \
	    $(call fuzz_objs,$(RUNNER_OBJDIR)) $(FUZZ_LIBS) || exit 1; \
	  FUZZ_RUNNER_DIR=tests/fuzz/runner $(FUZZ_DIR)/replay_$$t tests/fuzz/corpus/$$t || exit 1; \
	done

# Sanitizer builds of a test subset. The extension goes to build/san (setup.py's ORTMOD_DEBUG=1),
# the runner to build/ortmod-train-san; both compile the whole engine once more.
SAN_RUNNER := build/ortmod-train-san
test-asan:
	@start=$$(date +%s); \
	ORTMOD_DEBUG=1 $(PY) setup.py -q build_ext --build-lib build/san --build-temp build/san-tmp 2>&1 \
	  | grep -v -E "^(running|copying|creating)" || true; \
	$(MAKE) -s --no-print-directory -f runner.mk runner RUNNER_OBJDIR=build/runner-obj-san RUNNER_BIN=$(SAN_RUNNER) \
	  "RUNNER_CFLAGS=-std=c11 -O1 -g -fno-omit-frame-pointer -fno-wrapv $(FUZZ_SAN) $(FUZZ_INC) -w" \
	  "RUNNER_LIBS=$(FUZZ_SAN) $(FUZZ_LIBS)" || exit 1; \
	mkdir -p $(FUZZ_DIR); \
	for t in $(FUZZ_TARGETS); do \
	  gcc -std=c11 -O1 -g $(FUZZ_SAN) $(FUZZ_INC) $(FUZZ_WARN) -o $(FUZZ_DIR)/replay_asan_$$t tests/fuzz/replay.c \
	    tests/fuzz/fuzz_$$t.c $(call fuzz_objs,build/runner-obj-san) $(FUZZ_LIBS) || exit 1; \
	  echo "corpus $$t under ASan + UBSan + LeakSanitizer:"; \
	  FUZZ_RUNNER_DIR=tests/fuzz/runner ASAN_OPTIONS=$(FUZZ_ASAN) UBSAN_OPTIONS=$(FUZZ_UBSAN) \
	    $(FUZZ_DIR)/replay_asan_$$t tests/fuzz/corpus/$$t || exit 1; \
	done; \
	ORTMOD_HOSTILE_SO=$$(ls build/san/ortmod/_C*.so) ORTMOD_TRAIN_BINARY=$(SAN_RUNNER) \
	  LD_PRELOAD=$$(gcc -print-file-name=libasan.so) \
	  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=4096 \
	  UBSAN_OPTIONS=$(FUZZ_UBSAN) \
	  timeout 1500 $(PY) -m pytest -q tests/test_hostile_input.py -k "crafted or runner or checkpoint or bit_flip" \
	  || exit 1; \
	echo "test-asan: $$(( $$(date +%s) - start )) s"
