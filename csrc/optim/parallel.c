/* parallel.c — the optimizer kernels' threading: a parallel-for over one concatenated
 * element range, on plain pthreads (the build has no OpenMP).
 *
 * Threads are created per call. An optimizer step over a large model touches hundreds
 * of MB, so thread start-up (~20 us) is noise there; small calls (below the grain) stay
 * on the calling thread and pay nothing. */
#include "optim/optim_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

static int g_num_threads = 0;   /* 0: not decided yet */

static int default_num_threads(void) {
    const char *env = getenv("ORTMOD_NUM_THREADS");
    if (env && *env) {
        int n = atoi(env);
        if (n > 0) return n < OM_OPTIM_MAX_PARTS ? n : OM_OPTIM_MAX_PARTS;
    }
    cpu_set_t set;
    int n = 1;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n < 1) n = 1;
    return n < OM_OPTIM_MAX_PARTS ? n : OM_OPTIM_MAX_PARTS;
}

int om_optim_num_threads(void) {
    int n = __atomic_load_n(&g_num_threads, __ATOMIC_RELAXED);
    if (n <= 0) {
        n = default_num_threads();
        __atomic_store_n(&g_num_threads, n, __ATOMIC_RELAXED);
    }
    return n;
}

void om_optim_set_num_threads(int n) {
    if (n > OM_OPTIM_MAX_PARTS) n = OM_OPTIM_MAX_PARTS;
    __atomic_store_n(&g_num_threads, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

typedef struct range_task {
    void *ctx;
    om_range_fn fn;
    int part;
    int64_t begin, end;
} range_task;

static void *range_thread(void *arg) {
    range_task *t = arg;
    t->fn(t->ctx, t->part, t->begin, t->end);
    return NULL;
}

int om_parallel_for(int64_t total, int64_t grain, void *ctx, om_range_fn fn) {
    if (total <= 0) return 0;
    if (grain < 64) grain = 64;
    int64_t parts = om_optim_num_threads();
    if (parts > (total + grain - 1) / grain) parts = (total + grain - 1) / grain;
    if (parts <= 1) {
        fn(ctx, 0, 0, total);
        return 1;
    }
    int64_t per = (total + parts - 1) / parts;
    per = (per + 63) / 64 * 64;            /* part boundaries on 64-element multiples */
    range_task tasks[OM_OPTIM_MAX_PARTS];
    pthread_t tids[OM_OPTIM_MAX_PARTS];
    int started[OM_OPTIM_MAX_PARTS] = {0};
    int np = 0;
    for (int64_t b = 0; b < total && np < OM_OPTIM_MAX_PARTS; b += per, np++) {
        tasks[np] = (range_task){ctx, fn, np, b, b + per < total ? b + per : total};
    }
    for (int i = 1; i < np; i++) started[i] = pthread_create(&tids[i], NULL, range_thread, &tasks[i]) == 0;
    fn(ctx, 0, tasks[0].begin, tasks[0].end);
    for (int i = 1; i < np; i++) {
        if (started[i]) pthread_join(tids[i], NULL);
        else range_thread(&tasks[i]);
    }
    return np;
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
