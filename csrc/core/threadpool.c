/* threadpool.c — persistent pthread workers behind om_pool_for (see threadpool.h).
 *
 * One job at a time. A job is [0, n) cut into R ranges; every participant (the caller and
 * the workers) claims range indices from one 64-bit word, (generation << 32) | next, with a
 * compare-and-swap. The generation in the word is what makes late workers harmless: a
 * worker that wakes after its job finished (and the caller moved on) fails the CAS and
 * goes back to waiting, so job parameters can live in the pool itself and never dangle.
 *
 * Waiting: after a job a worker spins briefly (kernels come back to back within a step),
 * then sleeps on a condition variable. The caller waits for the last range by spinning,
 * then yielding: on a loaded machine a preempted worker must get the CPU back.
 */
#include "core/threadpool.h"
#include "core/options.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_THREADS 256
#define RANGES_PER_THREAD 4   /* a little slack so that a preempted thread delays less */
#define WORKER_SPIN 4000      /* pause iterations (~20-40 µs) before a worker sleeps */
#define CALLER_SPIN 20000     /* pause iterations before the caller starts yielding */


static struct {
    pthread_mutex_t submit;          /* one job at a time; held by the submitting caller */
    pthread_mutex_t mu;              /* sleeping workers */
    pthread_cond_t cv;
    atomic_uint_fast64_t claim;      /* (gen << 32) | next unclaimed range */
    atomic_uint gen;                 /* bumped per job and on shutdown */
    atomic_int sleeping;
    atomic_int stop;
    atomic_int done;                 /* ranges finished in the current job */
    /* current job (written by the submitter before publishing the claim word) */
    _Atomic(om_pool_fn) fn;
    _Atomic(void *) ctx;
    atomic_int_fast64_t n;
    atomic_int ranges;
    atomic_int nthreads;             /* wanted, caller included; 0 = not decided yet */
    int nworkers;                    /* started */
    pthread_t tids[MAX_THREADS];
} P = {
    .submit = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
};

/* When set (om_pool_use_openmp): jobs run as OpenMP parallel regions of the runtime that
 * torch already uses, on its threads, instead of on our workers. */
static _Atomic(om_openmp_parallel_fn) omp_parallel;

static _Thread_local int tls_in_parallel;
static _Thread_local int tls_range;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* 1 while om_set_num_threads holds a count of its own: the options' default then waits */
static atomic_int explicit_count;

static void pool_default_changed(void);

static int default_threads(void) {
    om_options_watch_num_threads(pool_default_changed);   /* from now on the default can change under us */
    int v = om_options_num_threads();   /* OMP_NUM_THREADS, ortmod_options.h */
    if (v > 0) return v < MAX_THREADS ? v : MAX_THREADS;
    int n = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n < MAX_THREADS ? n : MAX_THREADS;
}

static int threads_wanted(void) {
    int t = atomic_load_explicit(&P.nthreads, memory_order_relaxed);
    if (!t) {
        t = default_threads();
        int zero = 0;   /* the first caller decides; set_num_threads may have won the race */
        if (!atomic_compare_exchange_strong(&P.nthreads, &zero, t)) t = zero;
    }
    return t;
}

static inline void range_bounds(int64_t n, int R, int i, int64_t *lo, int64_t *hi) {
    /* n * i / R without overflow for any realistic n (n < 2^54) */
    *lo = (int64_t)((__int128)n * i / R);
    *hi = (int64_t)((__int128)n * (i + 1) / R);
}

/* Claims and runs ranges of the job of generation g until none is left. */
static void run_ranges(uint32_t g) {
    for (;;) {
        uint_fast64_t c = atomic_load(&P.claim);
        if ((uint32_t)(c >> 32) != g) return;
        const int R = atomic_load(&P.ranges);
        const int i = (int)(uint32_t)c;
        if (i >= R) return;
        om_pool_fn fn = atomic_load(&P.fn);
        void *ctx = atomic_load(&P.ctx);
        const int64_t n = atomic_load(&P.n);
        if (!atomic_compare_exchange_weak(&P.claim, &c, c + 1)) continue;
        int64_t lo, hi;
        range_bounds(n, R, i, &lo, &hi);
        tls_range = i;
        fn(ctx, lo, hi);
        atomic_fetch_add(&P.done, 1);
    }
}

/* arg: the generation when the worker was created. Reading P.gen here instead would race:
 * a thread that starts late (a loaded machine) could take a later generation as already
 * seen (the shutdown's included) and sleep through it. */
static void *worker_main(void *arg) {
    tls_in_parallel = 1;
    unsigned seen = (unsigned)(uintptr_t)arg;
    for (;;) {
        unsigned g = atomic_load(&P.gen);
        for (int s = 0; g == seen && s < WORKER_SPIN; s++) {
            CPU_RELAX();
            g = atomic_load(&P.gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&P.mu);
            atomic_fetch_add(&P.sleeping, 1);
            while ((g = atomic_load(&P.gen)) == seen) pthread_cond_wait(&P.cv, &P.mu);
            atomic_fetch_sub(&P.sleeping, 1);
            pthread_mutex_unlock(&P.mu);
        }
        seen = g;
        if (atomic_load(&P.stop)) return NULL;
        run_ranges(g);
    }
}

static void wake_workers(void) {
    if (atomic_load(&P.sleeping) > 0) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
}

/* Called with P.submit held. */
static void stop_workers(void) {
    if (!P.nworkers) return;
    atomic_store(&P.stop, 1);
    atomic_fetch_add(&P.gen, 1);
    pthread_mutex_lock(&P.mu);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.nworkers; i++) pthread_join(P.tids[i], NULL);
    P.nworkers = 0;
    atomic_store(&P.stop, 0);
}

/* A forked child has the pool's memory but none of its threads. */
static void atfork_child(void) {
    /* GNU OpenMP cannot start a team in a child forked after the parent used one */
    atomic_store(&omp_parallel, NULL);
    pthread_mutex_init(&P.submit, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv, NULL);
    atomic_store(&P.sleeping, 0);
    atomic_store(&P.stop, 0);
    P.nworkers = 0;
}
static void register_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }

/* Called with P.submit held: starts workers up to nthreads - 1; returns how many run. */
static int ensure_workers(void) {
    pthread_once(&atfork_once, register_atfork);
    const int want = threads_wanted() - 1;
    while (P.nworkers < want) {
        void *gen0 = (void *)(uintptr_t)atomic_load(&P.gen);
        if (pthread_create(&P.tids[P.nworkers], NULL, worker_main, gen0) != 0) break;
        P.nworkers++;
    }
    return P.nworkers;
}

int om_pool_ranges(int64_t n, int64_t grain) {
    if (grain < 1) grain = 1;
    if (n <= grain || tls_in_parallel) return 1;
    const int T = threads_wanted();
    if (T <= 1) return 1;
    const int64_t by_grain = (n + grain - 1) / grain;
    const int64_t cap = (int64_t)T * RANGES_PER_THREAD;
    return (int)(by_grain < cap ? by_grain : cap);
}

int om_pool_range_id(void) { return tls_range; }
int om_pool_in_parallel(void) { return tls_in_parallel; }

static void run_serial(int64_t n, int R, om_pool_fn fn, void *ctx) {
    /* the same ranges as a parallel run, so per-range partials give identical results */
    const int saved_in = tls_in_parallel, saved_range = tls_range;
    tls_in_parallel = 1;
    for (int i = 0; i < R; i++) {
        int64_t lo, hi;
        range_bounds(n, R, i, &lo, &hi);
        tls_range = i;
        fn(ctx, lo, hi);
    }
    tls_in_parallel = saved_in;
    tls_range = saved_range;
}

/* One job as an OpenMP region: every thread of the team (the caller is its master) claims
 * ranges from a counter on the caller's stack; the region ends when all are done. */
typedef struct omp_job {
    om_pool_fn fn;
    void *ctx;
    int64_t n;
    int R;
    atomic_int next;
} omp_job;

static void omp_region(void *arg) {
    omp_job *j = arg;
    const int saved_in = tls_in_parallel, saved_range = tls_range;
    tls_in_parallel = 1;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->R;) {
        int64_t lo, hi;
        range_bounds(j->n, j->R, i, &lo, &hi);
        tls_range = i;
        j->fn(j->ctx, lo, hi);
    }
    tls_in_parallel = saved_in;
    tls_range = saved_range;
}

__attribute__((visibility("default"))) void om_pool_use_openmp(om_openmp_parallel_fn parallel) {
    pthread_once(&atfork_once, register_atfork);
    om_openmp_parallel_fn old = atomic_exchange(&omp_parallel, parallel);
    if (parallel && !old) {   /* our workers are not needed any more */
        pthread_mutex_lock(&P.submit);
        stop_workers();
        pthread_mutex_unlock(&P.submit);
    }
}

__attribute__((visibility("default"))) int om_pool_uses_openmp(void) { return atomic_load(&omp_parallel) != NULL; }

void om_pool_for(int64_t n, int64_t grain, om_pool_fn fn, void *ctx) {
    om_pool_run(n, om_pool_ranges(n, grain), fn, ctx);
}

void om_pool_run(int64_t n, int R, om_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (R > n) R = (int)n;
    if (R <= 1 || tls_in_parallel) {
        if (R > 1) {   /* nested: the asked-for ranges, on this thread */
            run_serial(n, R, fn, ctx);
            return;
        }
        const int saved = tls_range;
        tls_range = 0;
        fn(ctx, 0, n);
        tls_range = saved;
        return;
    }
    om_openmp_parallel_fn parallel = atomic_load(&omp_parallel);
    if (parallel) {
        const int T = threads_wanted();
        omp_job j = {.fn = fn, .ctx = ctx, .n = n, .R = R};
        parallel(omp_region, &j, (unsigned)(T < R ? T : R), 0);
        return;
    }
    if (pthread_mutex_trylock(&P.submit) != 0) {   /* another thread's job is running */
        run_serial(n, R, fn, ctx);
        return;
    }
    if (ensure_workers() == 0) {
        pthread_mutex_unlock(&P.submit);
        run_serial(n, R, fn, ctx);
        return;
    }
    atomic_store(&P.fn, fn);
    atomic_store(&P.ctx, ctx);
    atomic_store(&P.n, n);
    atomic_store(&P.ranges, R);
    atomic_store(&P.done, 0);
    const uint32_t g = atomic_load(&P.gen) + 1;
    atomic_store(&P.claim, (uint_fast64_t)g << 32);
    atomic_store(&P.gen, g);
    wake_workers();

    const int saved_range = tls_range;
    tls_in_parallel = 1;
    run_ranges(g);
    for (int s = 0; atomic_load(&P.done) < R; s++) {
        if (s < CALLER_SPIN) CPU_RELAX();
        else sched_yield();
    }
    tls_in_parallel = 0;
    tls_range = saved_range;
    pthread_mutex_unlock(&P.submit);
}

/* Cheap when nothing changes (the binding may call it before every step). */
__attribute__((visibility("default"))) void om_set_num_threads(int n) {
    atomic_store(&explicit_count, n >= 1);
    if (n < 1) n = default_threads();
    if (n > MAX_THREADS) n = MAX_THREADS;
    if (atomic_load(&P.nthreads) != n) {
        pthread_mutex_lock(&P.submit);
        if (n < P.nworkers + 1) stop_workers();   /* restarted lazily, fewer */
        atomic_store(&P.nthreads, n);
        pthread_mutex_unlock(&P.submit);
    }
}

__attribute__((visibility("default"))) int om_get_num_threads(void) { return threads_wanted(); }

/* The options' num_threads changed (core/options.h's watcher): a pool on its default takes the new one. */
static void pool_default_changed(void) {
    if (!atomic_load(&explicit_count) && atomic_load(&P.nthreads)) om_set_num_threads(0);
}
