# bench.mk — `make bench` (the Makefile does `-include bench/bench.mk`). Runs the CPU training
# benchmark (eager vs torch.compile vs ORTModule, binding overhead, GEMM roofline) and the
# memory benchmark with the project's venv; the extension must be built (`make build`).
BENCH_PY ?= .venv/bin/python
BENCH_ARGS ?=

.PHONY: bench bench-train bench-memory
bench: bench-train bench-memory

bench-train:
	$(BENCH_PY) bench/bench_train.py $(BENCH_ARGS)

bench-memory:
	$(BENCH_PY) bench/bench_memory.py
