# runner.mk — builds the native training runner, build/ortmod-train (included by the Makefile;
# also usable alone: make -f runner.mk runner). Needs csrc/graph/gen/onnx.pb-c.c, which
# `setup.py build_ext` generates from the installed onnx package's onnx.proto.
# Objects go to build/runner-obj/ (one per source, with header dependencies), so a rebuild
# after an edit compiles only what changed; `make -j` compiles in parallel.
RUNNER_PREV_GOAL := $(.DEFAULT_GOAL)
RUNNER_INCLUDED  := $(filter-out $(lastword $(MAKEFILE_LIST)),$(MAKEFILE_LIST))
RUNNER_BIN    := build/ortmod-train
RUNNER_OBJDIR := build/runner-obj
RUNNER_CC     ?= gcc
RUNNER_CFLAGS := -std=c11 -O2 -D_GNU_SOURCE -Icsrc -Icsrc/include -Icsrc/graph/gen \
                 -Wall -Wno-unused-parameter -Wno-missing-field-initializers -Wno-sign-compare
RUNNER_LIBS   := -lprotobuf-c -lopenblas -lm -lpthread
RUNNER_SRCS    = $(sort $(wildcard $(foreach d,core graph ops passes autodiff plan exec optim runner,csrc/$(d)/*.c))) \
                 csrc/graph/gen/onnx.pb-c.c
RUNNER_OBJS    = $(patsubst csrc/%.c,$(RUNNER_OBJDIR)/%.o,$(RUNNER_SRCS))

.PHONY: runner runner-clean
runner: $(RUNNER_BIN)

$(RUNNER_BIN): $(RUNNER_OBJS)
	@mkdir -p $(dir $@)
	$(RUNNER_CC) -o $@ $(RUNNER_OBJS) $(RUNNER_LIBS)

csrc/graph/gen/onnx.pb-c.c:
	@echo "runner: $@ is missing: run '.venv/bin/python setup.py build_ext --inplace' first"; exit 1

$(RUNNER_OBJDIR)/%.o: csrc/%.c
	@mkdir -p $(dir $@)
	$(RUNNER_CC) $(RUNNER_CFLAGS) -MMD -MP -c -o $@ $<

runner-clean:
	rm -rf $(RUNNER_OBJDIR) $(RUNNER_BIN)

-include $(wildcard $(RUNNER_OBJDIR)/*/*.d $(RUNNER_OBJDIR)/*/*/*.d)

# included from another Makefile: leave its default goal alone, wherever the include sits
ifneq ($(RUNNER_INCLUDED),)
.DEFAULT_GOAL := $(RUNNER_PREV_GOAL)
endif
