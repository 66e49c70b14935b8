# bench.mk — `make bench` (the Makefile does `-include bench/bench.mk`). Runs the CPU training
# benchmark (eager vs torch.compile vs ORTModule, binding overhead, GEMM roofline) and the
# memory benchmark with the project's venv; the extension must be built (`make build`).
BENCH_PY ?= .venv/bin/python
BENCH_ARGS ?=

.PHONY: bench bench-train bench-equal-gemm bench-memory bench-data-dependent
bench: bench-train bench-equal-gemm bench-memory bench-data-dependent

bench-train:
	$(BENCH_PY) bench/bench_train.py $(BENCH_ARGS)

# the goal ratios again with the engine's GEMMs on OpenBLAS pinned to eager's vector width
# (bench_train.py --gemm blas): what holds on a CPU where the engine's own kernel has no edge
bench-equal-gemm:
	$(BENCH_PY) bench/bench_train.py --gemm blas --modes eager,compile,ortmod --no-extras $(BENCH_ARGS)

bench-memory:
	$(BENCH_PY) bench/bench_memory.py

# NonZero models (issue 37): segmented plans, counts changing every step
bench-data-dependent:
	PYTHONPATH=. $(BENCH_PY) bench/bench_data_dependent.py
