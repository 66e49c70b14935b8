/* parallel.c — the optimizer kernels' threading: a parallel-for over one concatenated
 * element range, run on the engine's thread pool (core/threadpool.h), so an optimizer step
 * uses the same threads as forward and backward instead of starting its own per call.
 *
 * Parts are whole multiples of 64 elements (the vector code's unit) and numbered in order
 * of their start, so per-part partial sums combine in a fixed order. */
#include "optim/optim_internal.h"

#include <stdlib.h>

#include "core/options.h"
#include "core/threadpool.h"

#define PART_UNIT 64

/* om_options.optim_num_threads (ORTMOD_NUM_THREADS); 0: no cap beyond the pool's */
static int max_parts(void) { return om_options_optim_num_threads(); }

int om_optim_num_threads(void) {
    int cap = max_parts(), pool = om_get_num_threads();
    return cap && cap < pool ? cap : pool;
}

void om_optim_set_num_threads(int n) { om_options_set_optim_num_threads(n > OM_OPTIM_MAX_PARTS ? OM_OPTIM_MAX_PARTS : n); }

typedef struct pool_job {
    void *ctx;
    om_range_fn fn;
    int64_t total;
} pool_job;

static void pool_range(void *c, int64_t lo, int64_t hi) {
    const pool_job *j = c;
    const int64_t begin = lo * PART_UNIT, end = hi * PART_UNIT < j->total ? hi * PART_UNIT : j->total;
    if (begin < end) j->fn(j->ctx, om_pool_range_id(), begin, end);
}

int om_parallel_for(int64_t total, int64_t grain, void *ctx, om_range_fn fn) {
    if (total <= 0) return 0;
    if (grain < PART_UNIT) grain = PART_UNIT;
    const int64_t units = (total + PART_UNIT - 1) / PART_UNIT;
    int parts = om_pool_ranges(units, grain / PART_UNIT);
    const int cap_option = max_parts(), cap = cap_option ? cap_option : OM_OPTIM_MAX_PARTS;
    if (parts > cap) parts = cap;
    if (parts <= 1) {
        fn(ctx, 0, 0, total);
        return 1;
    }
    pool_job j = {ctx, fn, total};
    om_pool_run(units, parts, pool_range, &j);
    return parts;
}

void om_visit_pieces(const int64_t *offsets, int n, int64_t begin, int64_t end, int part, void *ctx, om_piece_fn fn) {
    /* first tensor whose range contains begin: the last k with offsets[k] <= begin */
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= begin) lo = mid;
        else hi = mid - 1;
    }
    for (int k = lo; k < n && offsets[k] < end; k++) {
        int64_t a = begin > offsets[k] ? begin : offsets[k];
        int64_t b = end < offsets[k + 1] ? end : offsets[k + 1];
        if (a < b) fn(ctx, k, a - offsets[k], b - offsets[k], part);
    }
}
