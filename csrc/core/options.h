/* options.h — the engine's own view of ortmod_options.h: quick readers for values read on hot
 * paths, and the hooks that keep the options true to what the process already did. */
#ifndef OM_CORE_OPTIONS_H
#define OM_CORE_OPTIONS_H

#include "ortmod_options.h"

/* Fields read per call (the thread pool, the optimizer's partition, CUDA attention); an error
 * in the environment leaves the default here and is reported by om_engine_create (and, for
 * optim_num_threads, by every optimizer call on CPU tensors: csrc/optim/adam.c). */
int om_options_num_threads(void);
int om_options_optim_num_threads(void);
int om_options_cuda_attention_materialized(void);
/* om_optim_set_num_threads: n clamped to 0..1024. */
void om_options_set_optim_num_threads(int n);
/* The thread pool's hook: fn runs (outside the options' lock) after a set or reload changed
 * num_threads. One watcher; the last registration wins. */
typedef void (*om_options_watcher)(void);
void om_options_watch_num_threads(om_options_watcher fn);
/* exec/device.c, as it loads the CUDA provider: cuda_library is fixed from then on. */
void om_options_note_cuda_loaded(void);

#endif
