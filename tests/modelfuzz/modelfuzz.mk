# tests/modelfuzz/modelfuzz.mk — the differential fuzzer of whole training models (included by
# the Makefile; tests/modelfuzz/runner.py says how it works).
#
#   make fuzz-models FUZZ_MODELS=N FUZZ_SEED=S [FUZZ_JOBS=J]
#                      N random models from seed S on (each: eager fp32 in several ways, ORTModule
#                      fp32 and fp64, an eager fp64 referee; capture paths alternate by seed),
#                      J worker processes. Prints the counts (ok / refused by cause / mismatch /
#                      error / crash / hang); failing cases are shrunk into
#                      build/modelfuzz/findings/*.json (copy one into tests/modelfuzz/regressions/
#                      to have make test replay it). Fails when a model failed.
FUZZ_MODELS ?= 200
FUZZ_SEED   ?= 0
FUZZ_JOBS   ?= 1

.PHONY: fuzz-models

fuzz-models: build
	@mkdir -p build/modelfuzz
	$(PY) -m tests.modelfuzz.runner --models $(FUZZ_MODELS) --seed $(FUZZ_SEED) --jobs $(FUZZ_JOBS) -q \
	  --json build/modelfuzz/records-$(FUZZ_SEED)-$(FUZZ_MODELS).jsonl
