/* ortmod_options.h — the engine's configuration: every setting the environment can make, in
 * one struct, read from the environment once and changeable through this API.
 *
 * Worked example: plan fewer shapes per engine and switch one pass off, for every engine
 * created from now on.
 *
 *     om_options o;
 *     om_status *st = om_options_get(&o);      // the options in force (an error: a bad variable)
 *     if (st) { fprintf(stderr, "%s\n", om_status_message(st)); om_status_free(st); return 1; }
 *     o.max_cached_plans = 8;
 *     snprintf(o.disable_passes, sizeof o.disable_passes, "cse");
 *     st = om_options_set(&o, OM_OPT_MAX_CACHED_PLANS | OM_OPT_DISABLE_PASSES);   // validated
 *
 * The environment is read once, on the first call that needs an option (the first engine, the
 * first parallel kernel, the first CUDA tensor), under a lock: a later setenv() changes nothing
 * until om_options_reload. Each field names its variable below; docs/options.md's table lists them
 * all. A variable set to a value its field does not take is an error naming the variable, and
 * that error comes back from om_options_get and from every om_engine_create until the field is
 * set (om_options_set) or the environment is fixed and reloaded; meanwhile the field holds its
 * default. (OMP_NUM_THREADS is the exception: it is OpenMP's, shared with torch and BLAS, so it is
 * read as the OpenMP runtimes read it, and a value they would ignore is ignored here too.)
 *
 * Which setting wins, for the thread counts: om_set_num_threads (ortmod.h; the Python binding
 * calls it with torch.get_num_threads()) over num_threads (OMP_NUM_THREADS) over the CPUs this
 * process may run on; optim_num_threads (ORTMOD_NUM_THREADS) only caps the optimizer kernels
 * below that.
 */
#ifndef ORTMOD_OPTIONS_H
#define ORTMOD_OPTIONS_H

#include <stdbool.h>

#include "ortmod.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum om_cuda_attention {
    OM_CUDA_ATTENTION_FLASH = 0,          /* "flash": the flash kernels where they apply (fp16/bf16, head dim <= 128) */
    OM_CUDA_ATTENTION_MATERIALIZED = 1,   /* "materialized": always cuBLAS with the scores in memory */
} om_cuda_attention;

typedef struct om_options {
    int max_cached_plans;          /* ORTMOD_MAX_CACHED_PLANS, 1..2^20, default 32: plans one engine keeps when
                                      om_engine_options.max_plans is 0 */
    int memory_opt_level;          /* ORTMODULE_MEMORY_OPT_LEVEL, 0..2, default 0: recompute level when
                                      om_engine_options.memory_opt_level is -1 */
    bool profile;                  /* ORTMOD_PROFILE (0/1, also false/true, no/yes, off/on), default off: engines
                                      start with om_engine_set_profiling on */
    char disable_passes[1024];     /* ORTMOD_DISABLE_PASSES, default "": pass names separated by ',' or ' ', or
                                      "all", that compiles skip; each must be a pass's name */
    int optim_num_threads;         /* ORTMOD_NUM_THREADS, 0..1024, default 0 (no cap): cap on the optimizer
                                      kernels' threads (also om_optim_set_num_threads) */
    int num_threads;               /* OMP_NUM_THREADS, 0..1024, default 0 (the CPUs): the pool's size while
                                      om_set_num_threads has not set one */
    char cuda_library[4096];       /* ORTMOD_CUDA_LIBRARY, default "" (libortmod_cuda.so next to the engine's own
                                      file): the CUDA provider loaded on the first CUDA tensor; fixed from then on */
    om_cuda_attention cuda_attention;   /* ORTMOD_CUDA_ATTENTION ("flash" or "materialized"), default flash;
                                           read by every attention call on CUDA */
} om_options;

/* One bit per field, for om_options_set. */
enum {
    OM_OPT_MAX_CACHED_PLANS = 1u << 0,
    OM_OPT_MEMORY_OPT_LEVEL = 1u << 1,
    OM_OPT_PROFILE = 1u << 2,
    OM_OPT_DISABLE_PASSES = 1u << 3,
    OM_OPT_OPTIM_NUM_THREADS = 1u << 4,
    OM_OPT_NUM_THREADS = 1u << 5,
    OM_OPT_CUDA_LIBRARY = 1u << 6,
    OM_OPT_CUDA_ATTENTION = 1u << 7,
    OM_OPT_ALL = (1u << 8) - 1,
};

/* Every field at its default, as with no variable set. */
om_options om_options_defaults(void);

/* Copies the options in force into *out, reading the environment first if nothing has yet.
 * Returns NULL, or an error naming every variable that holds a bad value (*out is filled
 * anyway, with those fields at their defaults). Thread-safe. */
om_status *om_options_get(om_options *out);

/* The environment's errors still standing for the fields named (OM_OPT_* bits), as
 * om_options_get returns them for all, or NULL: for a client that needs only some fields. */
om_status *om_options_check(unsigned fields);

/* Validates the fields of *opt named by fields (OM_OPT_* bits), then makes them the ones in
 * force; an error names the first bad field, and then nothing changes. Setting a field clears
 * the environment's error for it. cuda_library cannot change once the provider was loaded.
 * Thread-safe; engines created before keep what they were created with. */
om_status *om_options_set(const om_options *opt, unsigned fields);

/* Reads the environment again, replacing every field (also those om_options_set set); returns
 * what om_options_get would. */
om_status *om_options_reload(void);

#ifdef __cplusplus
}
#endif
#endif /* ORTMOD_OPTIONS_H */
