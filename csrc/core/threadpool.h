/* threadpool.h — the engine's one thread pool: persistent pthread workers, the calling
 * thread participating.
 *
 *     typedef struct { const float *x; float *y; } relu_args;
 *     static void relu_range(void *c, int64_t lo, int64_t hi) {   // one contiguous range
 *         const relu_args *a = c;
 *         for (int64_t i = lo; i < hi; i++) a->y[i] = a->x[i] > 0 ? a->x[i] : 0;
 *     }
 *     relu_args a = {x, y};
 *     om_pool_for(n, OM_GRAIN, relu_range, &a);   // returns when every range is done
 *
 * Rules:
 *   - fn(ctx, lo, hi) is called on disjoint ranges covering [0, n) exactly once; ranges
 *     are at least `grain` long (except the last) and contiguous, so a kernel can keep
 *     per-range state (a partial sum per range is how reductions are written: size the
 *     partials with om_pool_ranges(n, grain) and index them with om_pool_range_id()).
 *   - n <= grain, one thread, or a call from inside a parallel range (nested) runs fn(ctx, 0, n)
 *     on the calling thread: no oversubscription, never a deadlock.
 *   - Two threads calling at once: the second runs serially rather than waiting.
 *   - The thread count follows om_set_num_threads (public, ortmod.h). BLAS itself runs
 *     single-threaded: om_gemm (ops/gemm.h) shares big products out over this pool, so
 *     the process holds one team of threads, not two fighting for the cores.
 *     Default: om_options.num_threads (OMP_NUM_THREADS) when set, else the CPUs this process may run on.
 */
#ifndef OM_THREADPOOL_H
#define OM_THREADPOOL_H

#include <stdint.h>

#include "ortmod.h"

/* Elements per range below which threading costs more than it saves (a wake-up is ~2-5 µs;
 * 32K floats of a simple op take ~5-10 µs on one core). */
#define OM_GRAIN ((int64_t)32768)

typedef void (*om_pool_fn)(void *ctx, int64_t lo, int64_t hi);

void om_pool_for(int64_t n, int64_t grain, om_pool_fn fn, void *ctx);

/* How many ranges om_pool_for(n, grain, ...) will use (1 when it runs serially), and,
 * inside fn, the index of the current range in [0, that count). Ranges are numbered in
 * order of lo, so per-range partial results combine in a fixed order: results do not
 * depend on which thread ran what. */
int om_pool_ranges(int64_t n, int64_t grain);
/* om_pool_for with exactly R ranges (R from om_pool_ranges, kept by the caller that sized
 * per-range partials with it: the count cannot change under it if another thread resizes
 * the pool meanwhile). R < 1 counts as 1; R > n as n. */
void om_pool_run(int64_t n, int R, om_pool_fn fn, void *ctx);
int om_pool_range_id(void);
/* 1 inside a parallel range (nested calls run serially). */
int om_pool_in_parallel(void);

/* Running the pool's jobs on an OpenMP runtime (om_pool_use_openmp) is public: ortmod.h,
 * "threads". */

#endif
