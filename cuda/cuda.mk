# cuda/cuda.mk — the CUDA execution provider, ortmod/libortmod_cuda.so (included by the Makefile;
# also usable alone: make -f cuda/cuda.mk cuda). The work is in cuda/build.sh: it compiles every
# .cu (compile errors fail the build) when nvcc and the cuBLAS headers are there (installing the
# nvidia-cublas wheel into .venv when needed), and otherwise prints why it skipped and succeeds.
CUDA_PREV_GOAL := $(.DEFAULT_GOAL)
CUDA_INCLUDED  := $(filter-out $(lastword $(MAKEFILE_LIST)),$(MAKEFILE_LIST))

.PHONY: cuda cuda-clean
cuda:
	@bash cuda/build.sh

cuda-clean:
	rm -rf build/cuda-obj ortmod/libortmod_cuda.so

# included from another Makefile: leave its default goal alone
ifneq ($(CUDA_INCLUDED),)
.DEFAULT_GOAL := $(CUDA_PREV_GOAL)
endif
