/* broadcast.h — iterating over broadcast operands without per-element index math.
 *
 * A broadcast loop walks an iteration space (usually the output's dims) and, per operand,
 * a row-major tensor right-aligned against it whose size-1 (or missing) dims get stride 0.
 * om_bcast_init drops size-1 dims and merges neighbouring dims that every operand walks
 * the same way, so that what is left is a few "outer" dims and one contiguous "inner" run
 * in which each operand either advances by 1 or stays put (stride 0). Typical results:
 *
 *     (2,3,4) + (2,3,4)   -> 1 block of 24, both step 1        (same shape)
 *     (2,3,4) + ()        -> 1 block of 24, b step 0            (scalar)
 *     (2,3,4) + (4,)      -> 6 blocks of 4, b restarts per block (trailing contiguous)
 *     (2,3,4) + (3,1)     -> 6 blocks of 4, b step 0 inside a block
 *
 * Kernels then write one vectorizable inner loop per (step a, step b) combination:
 *
 *     om_bcast p;
 *     const om_tensor *ops[3] = {&out, &a, &b};
 *     om_bcast_init(&p, &out, ops, 3);
 *     OM_BINARY_LOOP(&p, float, out.data, float, a.data, float, b.data, x + y);
 *
 * Operand 0 is conventionally the output. Sum-reductions (SumToShape) use the same plan
 * with the reduced tensor as an operand whose strides are 0 along the summed axes.
 */
#ifndef OM_BROADCAST_H
#define OM_BROADCAST_H

#include "ops/op.h"

#define OM_BCAST_MAX_OPS 4

typedef struct om_bcast {
    int n_ops;
    int rank;                                   /* outer dims after merging */
    int64_t dims[OM_MAX_RANK];
    int64_t stride[OM_BCAST_MAX_OPS][OM_MAX_RANK];  /* element strides of the outer dims */
    int64_t inner;                              /* length of the innermost contiguous run */
    int step[OM_BCAST_MAX_OPS];                 /* 0 or 1: operand's stride inside a run */
    int64_t n_outer;                            /* number of runs (product of outer dims) */
} om_bcast;

/* Plans a loop over space's dims. Each ops[k] must be broadcastable to space (checked:
 * OM_INVALID_ARGUMENT otherwise; node may be NULL, used for the message). */
om_status *om_bcast_init(om_bcast *p, const om_node *node, const om_tensor *space,
                         const om_tensor *const *ops, int n_ops);

/* Element offsets of every operand at the start of run `block`; idx receives the odometer. */
static inline void om_bcast_start(const om_bcast *p, int64_t block, int64_t *idx, int64_t *off) {
    for (int k = 0; k < p->n_ops; k++) off[k] = 0;
    for (int d = p->rank - 1; d >= 0; d--) {
        int64_t i = block % p->dims[d];
        block /= p->dims[d];
        idx[d] = i;
        for (int k = 0; k < p->n_ops; k++) off[k] += i * p->stride[k][d];
    }
}

/* Advances the odometer by one run (no divisions). */
static inline void om_bcast_next(const om_bcast *p, int64_t *idx, int64_t *off) {
    for (int d = p->rank - 1; d >= 0; d--) {
        for (int k = 0; k < p->n_ops; k++) off[k] += p->stride[k][d];
        if (++idx[d] < p->dims[d]) return;
        for (int k = 0; k < p->n_ops; k++) off[k] -= idx[d] * p->stride[k][d];
        idx[d] = 0;
    }
}

/* ---- threading ---------------------------------------------------------------------
 * Kernels thread through the engine's pool (core/threadpool.h: om_pool_for), which shares
 * its thread count with OpenBLAS. OM_PARALLEL_FOR is an OpenMP pragma kept for loops not
 * yet moved to the pool: it is a no-op unless the build adds -fopenmp. OM_CHUNKED and
 * OM_BCAST_RUNS below run their inline bodies serially (a body cannot be handed to a
 * thread); hot loops use the range workers at the end of this file instead. */
#include "core/threadpool.h"

#ifdef _OPENMP
#define OM_PRAGMA_(x) _Pragma(#x)
#define OM_PARALLEL_FOR(cond) OM_PRAGMA_(omp parallel for schedule(static) if (cond))
#else
#define OM_PARALLEL_FOR(cond)
#endif

/* Per-ISA clones of a hot kernel: the loader picks AVX-512, AVX2+FMA or baseline SSE2 at
 * startup (ifunc), so the wheel needs no -march=native and vector loops still run 8 or 16
 * floats wide where the CPU allows. Only for GCC 12+ on x86-64 Linux; elsewhere a no-op. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && defined(__linux__) && \
    !defined(OM_NO_CLONES)
#define OM_VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OM_VEC_CLONES
#endif

/* Elements per parallel work item: big enough to amortize scheduling, small enough to
 * spread a 1M-element tensor over 16 cores. */
#define OM_CHUNK ((int64_t)32768)

/* Runs BODY (the variadic tail) for i in [0, n) in chunks. BODY sees om_lo, om_hi and should
 * loop `for (int64_t i = om_lo; i < om_hi; i++)`. Serial: the chunks run in parallel only
 * in an OpenMP build, which the standard build is not; hot kernels use om_pool_for. */
#define OM_CHUNKED(n, ...)                                                      \
    do {                                                                         \
        const int64_t om_n_ = (n);                                               \
        const int64_t om_nc_ = (om_n_ + OM_CHUNK - 1) / OM_CHUNK;                \
        OM_PARALLEL_FOR(om_nc_ > 1)                                              \
        for (int64_t om_c_ = 0; om_c_ < om_nc_; om_c_++) {                       \
            const int64_t om_lo = om_c_ * OM_CHUNK;                              \
            const int64_t om_hi = om_lo + OM_CHUNK < om_n_ ? om_lo + OM_CHUNK : om_n_; \
            __VA_ARGS__;                                                         \
        }                                                                        \
    } while (0)

/* Runs BODY (the variadic tail) once per run of the plan, runs grouped so that each work
 * item covers about OM_CHUNK elements. BODY sees `const int64_t *om_off` (per-operand element offsets of the
 * run's first element) and p->inner. Runs must write disjoint outputs (not for reductions
 * into a broadcast operand). */
#define OM_BCAST_RUNS(p, ...)                                                   \
    do {                                                                         \
        const om_bcast *om_p_ = (p);                                             \
        const int64_t om_per_ = om_p_->inner >= OM_CHUNK || om_p_->inner < 1 ? 1 : OM_CHUNK / om_p_->inner; \
        const int64_t om_nc_ = (om_p_->n_outer + om_per_ - 1) / om_per_;         \
        OM_PARALLEL_FOR(om_nc_ > 1)                                              \
        for (int64_t om_c_ = 0; om_c_ < om_nc_; om_c_++) {                       \
            int64_t om_idx_[OM_MAX_RANK], om_offv_[OM_BCAST_MAX_OPS];            \
            const int64_t om_b0_ = om_c_ * om_per_;                              \
            const int64_t om_b1_ = om_b0_ + om_per_ < om_p_->n_outer ? om_b0_ + om_per_ : om_p_->n_outer; \
            om_bcast_start(om_p_, om_b0_, om_idx_, om_offv_);                    \
            for (int64_t om_blk_ = om_b0_; om_blk_ < om_b1_; om_blk_++) {              \
                const int64_t *om_off = om_offv_;                                \
                __VA_ARGS__;                                                     \
                om_bcast_next(om_p_, om_idx_, om_offv_);                         \
            }                                                                    \
        }                                                                        \
    } while (0)

/* One broadcast run: out[i] = EXPR(x, y) (the variadic tail) over N elements, with each
 * operand stepping along the run (SA/SB nonzero) or held at its first element. The four
 * loops are the fast paths: both contiguous, one side constant (scalar operand, size-1
 * last dim), or both constant. Shared by OM_BINARY_LOOP and OM_BINARY_WORKER. */
#define OM_BINARY_RUN(TO, TA, TB, O, PA, PB, N, SA, SB, ...)                                   \
    do {                                                                                      \
        TO *restrict o = (O);                                                                 \
        const TA *restrict pa = (PA);                                                         \
        const TB *restrict pb = (PB);                                                         \
        if ((SA) && (SB)) {                                                                   \
            for (int64_t i = 0; i < (N); i++) {                                               \
                const TA x = pa[i]; const TB y = pb[i]; o[i] = (TO)(__VA_ARGS__);             \
            }                                                                                 \
        } else if (SA) {                                                                      \
            const TB y = pb[0];                                                               \
            for (int64_t i = 0; i < (N); i++) { const TA x = pa[i]; o[i] = (TO)(__VA_ARGS__); } \
        } else if (SB) {                                                                      \
            const TA x = pa[0];                                                               \
            for (int64_t i = 0; i < (N); i++) { const TB y = pb[i]; o[i] = (TO)(__VA_ARGS__); } \
        } else {                                                                              \
            const TA x = pa[0]; const TB y = pb[0];                                           \
            const TO v = (TO)(__VA_ARGS__);                                                   \
            for (int64_t i = 0; i < (N); i++) o[i] = v;                                       \
        }                                                                                     \
    } while (0)

/* out = EXPR(x, y) (the variadic tail) for x from A, y from B, broadcast by plan p
 * (operands: out, a, b).
 * The four inner loops are the fast paths: both contiguous (same shape, or trailing
 * contiguous blocks), and one side held constant (scalar operand, or size-1 last dim).
 * A single run with both sides contiguous (same shape) is split into parallel chunks. */
#define OM_BINARY_LOOP(p, TO, OUTP, TA, AP, TB, BP, ...)                        \
    do {                                                                         \
        TO *const om_o_ = (TO *)(OUTP);                                          \
        const TA *const om_a_ = (const TA *)(AP);                                \
        const TB *const om_bptr_ = (const TB *)(BP);                                \
        const om_bcast *om_bp_ = (p);                                            \
        const int64_t om_in_ = om_bp_->inner;                                    \
        const int om_sa_ = om_bp_->step[1], om_sb_ = om_bp_->step[2];            \
        if (om_bp_->n_outer == 1 && om_sa_ && om_sb_) {                          \
            OM_CHUNKED(om_in_, {                                                 \
                OM_BINARY_RUN(TO, TA, TB, om_o_ + om_lo, om_a_ + om_lo, om_bptr_ + om_lo, \
                              om_hi - om_lo, 1, 1, __VA_ARGS__);                 \
            });                                                                  \
        } else {                                                                 \
            OM_BCAST_RUNS(om_bp_, {                                              \
                OM_BINARY_RUN(TO, TA, TB, om_o_ + om_off[0], om_a_ + om_off[1],  \
                              om_bptr_ + om_off[2], om_in_, om_sa_, om_sb_, __VA_ARGS__); \
            });                                                                  \
        }                                                                        \
    } while (0)

/* ---- range workers for the pool ------------------------------------------------------
 * OM_BINARY_WORKER(name, TO, TA, TB, EXPR) defines `static void name(void *, lo, hi)` that
 * runs OM_BINARY_LOOP's paths over work items [lo, hi): elements when the plan is one
 * contiguous run of both operands, else whole runs. om_binary_run(p, name, out, a, b)
 * hands it to the pool with about OM_GRAIN elements per range. */
typedef struct om_bin_args {
    const om_bcast *p;
    void *o;
    const void *a, *b;
} om_bin_args;

static inline int om_bcast_flat(const om_bcast *p) { return p->n_outer == 1 && p->step[1] && p->step[2]; }

#define OM_BINARY_WORKER(name, TO, TA, TB, ...)                                               \
    OM_VEC_CLONES static void name(void *om_c_, int64_t om_lo, int64_t om_hi) {               \
        const om_bin_args *om_ba_ = (const om_bin_args *)om_c_;                               \
        const om_bcast *om_bp_ = om_ba_->p;                                                   \
        TO *const om_o_ = (TO *)om_ba_->o;                                                    \
        const TA *const om_a_ = (const TA *)om_ba_->a;                                        \
        const TB *const om_b_ = (const TB *)om_ba_->b;                                        \
        const int64_t om_in_ = om_bp_->inner;                                                 \
        const int om_sa_ = om_bp_->step[1], om_sb_ = om_bp_->step[2];                         \
        if (om_bcast_flat(om_bp_)) {   /* one contiguous run: work items are elements */     \
            OM_BINARY_RUN(TO, TA, TB, om_o_ + om_lo, om_a_ + om_lo, om_b_ + om_lo, om_hi - om_lo, 1, 1, \
                          __VA_ARGS__);                                                        \
            return;                                                                           \
        }                                                                                     \
        int64_t om_idx_[OM_MAX_RANK], om_off[OM_BCAST_MAX_OPS];                               \
        om_bcast_start(om_bp_, om_lo, om_idx_, om_off);                                       \
        for (int64_t om_r_ = om_lo; om_r_ < om_hi; om_r_++) {                                 \
            OM_BINARY_RUN(TO, TA, TB, om_o_ + om_off[0], om_a_ + om_off[1], om_b_ + om_off[2], om_in_, \
                          om_sa_, om_sb_, __VA_ARGS__);                                        \
            om_bcast_next(om_bp_, om_idx_, om_off);                                           \
        }                                                                                     \
    }

/* Work items of a plan for the pool: elements (flat) or runs, and the grain to match. */
static inline void om_bcast_items(const om_bcast *p, int flat, int64_t *n, int64_t *grain) {
    if (flat) {
        *n = p->inner;
        *grain = OM_GRAIN;
    } else {
        *n = p->n_outer;
        *grain = p->inner >= OM_GRAIN || p->inner < 1 ? 1 : OM_GRAIN / p->inner;
    }
}

static inline void om_binary_run(const om_bcast *p, om_pool_fn fn, void *out, const void *a, const void *b) {
    om_bin_args c = {p, out, a, b};
    int64_t n, grain;
    om_bcast_items(p, om_bcast_flat(p), &n, &grain);
    om_pool_for(n, grain, fn, &c);
}

/* Elementwise range workers over contiguous arrays: y[i] = EXPR(x = x[i]) and
 * y[i] = EXPR(g = a[i], s = b[i]). Inside EXPR, T names the element type. */
typedef struct om_ew_args {
    void *y;
    const void *a, *b;
} om_ew_args;

#define OM_UNARY_WORKER(name, TT, ...)                                                        \
    OM_VEC_CLONES static void name(void *om_c_, int64_t om_lo, int64_t om_hi) {               \
        typedef TT T;                                                                         \
        const om_ew_args *om_ea_ = (const om_ew_args *)om_c_;                                 \
        const T *restrict xp = (const T *)om_ea_->a;                                          \
        T *restrict yp = (T *)om_ea_->y;                                                      \
        for (int64_t i = om_lo; i < om_hi; i++) {                                             \
            const T x = xp[i];                                                                \
            yp[i] = (T)(__VA_ARGS__);                                                         \
        }                                                                                     \
    }

#define OM_GRAD2_WORKER(name, TT, ...)                                                        \
    OM_VEC_CLONES static void name(void *om_c_, int64_t om_lo, int64_t om_hi) {               \
        typedef TT T;                                                                         \
        const om_ew_args *om_ea_ = (const om_ew_args *)om_c_;                                 \
        const T *restrict dyp = (const T *)om_ea_->a;                                         \
        const T *restrict sp = (const T *)om_ea_->b;                                          \
        T *restrict dxp = (T *)om_ea_->y;                                                     \
        for (int64_t i = om_lo; i < om_hi; i++) {                                             \
            const T g = dyp[i];                                                               \
            const T s = sp[i];                                                                \
            dxp[i] = (T)(__VA_ARGS__);                                                        \
        }                                                                                     \
    }

static inline void om_ew_run(int64_t n, om_pool_fn fn, void *y, const void *a, const void *b) {
    om_ew_args c = {y, a, b};
    om_pool_for(n, OM_GRAIN, fn, &c);
}

#endif
