/* adam.c — multi-tensor Adam/AdamW step (ORT's three update rules), one call per
 * parameter group.
 *
 * All tensors of a call are treated as one concatenated element range that is split
 * evenly over threads (see parallel.c), so 148 tensors of very different sizes still
 * balance. The per-element update is written once as a macro over a vector type: GCC
 * vector extensions, 8 lanes in an AVX2 function and 4 in an SSE2 one (x86-64's baseline),
 * picked at run time with __builtin_cpu_supports — never -march=native. Only sqrt needs an
 * intrinsic: the auto-vectorizer will not touch sqrtf while it may set errno, and the
 * build does not pass -fno-math-errno (the optimize pragma does not reach builtins).
 * Each lane does exactly the scalar code's operations in the same order (no FMA
 * contraction under -std=c11), so vector, scalar tail and the non-x86 fallback agree
 * bit for bit. fp16/bf16 parameters or gradients go through small fp32 stack blocks
 * (OM_OPTIM_BLOCK elements): convert in, update in fp32, convert out. */
#include "optim/optim_internal.h"
#include "core/options.h"
#include "exec/provider.h"

#include <math.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define OM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OM_CLONES
#endif

om_adam_hparams om_adam_default_hparams(void) {
    om_adam_hparams h;
    h.lr = 1e-3f;
    h.beta1 = 0.9f;
    h.beta2 = 0.999f;
    h.eps = 1e-6f;
    h.weight_decay = 0.0f;
    h.bias_correction = 1;
    h.mode = OM_ADAMW_TRANSFORMERS;
    h.step = 1;
    h.grad_scale = 1.0f;
    return h;
}

/* Per-call constants, computed once in double and rounded to float (as torch does with
 * its Python-float scalars); a device gets the same (exec/optim_provider.h):
 *   inv_scale = 1 / grad_scale; b1, w1 = beta1, 1 - beta1; b2, w2 likewise; eps, wd;
 *   step_size: modes 0/1 lr * sqrt(bc2) / bc1, mode 2 -lr / bc1; bc2_sqrt (mode 2);
 *   decay: mode 2 1 - lr * wd (before), mode 1 lr * wd (after). */
typedef om_adam_consts adam_consts;

/* The update over fp32 arrays, n elements. mode is a literal at each call site, so each
 * instantiation has a branch-free body.
 *   mode 0: g += wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= s m / (sqrt v + eps)
 *   mode 1: as 0 without the g term; then p -= lr wd p
 *   mode 2: p *= 1 - lr wd; m = lerp(m, g, 1-b1); v as above; p -= lr/bc1 m / (sqrt v / sqrt bc2 + eps)
 * Mode 2 follows torch.optim.AdamW's operation order (lerp, addcmul, addcdiv) so the
 * two agree to rounding. */
static inline __attribute__((always_inline)) void adam_core(const int mode, int64_t n, float *restrict p,
                                                            const float *restrict g, float *restrict m,
                                                            float *restrict v, const adam_consts *c) {
    const float inv = c->inv_scale, b1 = c->b1, w1 = c->w1, b2 = c->b2, w2 = c->w2, eps = c->eps, wd = c->wd;
    const float ss = c->step_size, bc2s = c->bc2_sqrt, decay = c->decay;
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * inv;
        float pi = p[i];
        if (mode == 2) {
            pi = pi * decay;
            float mi = m[i] + w1 * (gi - m[i]);
            float vi = v[i] * b2 + w2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            float denom = sqrtf(vi) / bc2s + eps;
            p[i] = pi + ss * mi / denom;
        } else {
            if (mode == 0) gi = gi + wd * pi;
            float mi = b1 * m[i] + w1 * gi;
            float vi = b2 * v[i] + w2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            pi = pi - ss * mi / (sqrtf(vi) + eps);
            if (mode == 1) pi = pi - decay * pi;
            p[i] = pi;
        }
    }
}

typedef void (*adam_f32_fn)(int mode, int64_t n, float *restrict p, const float *restrict g, float *restrict m,
                            float *restrict v, const adam_consts *c);

static void adam_f32_scalar(int mode, int64_t n, float *restrict p, const float *restrict g, float *restrict m,
                            float *restrict v, const adam_consts *c) {
    if (mode == 0) adam_core(0, n, p, g, m, v, c);
    else if (mode == 1) adam_core(1, n, p, g, m, v, c);
    else adam_core(2, n, p, g, m, v, c);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* adam_core's body over VT vectors of W lanes; scalar operands broadcast. */
#define ADAM_VEC_LOOP(MODE, VT, W, SQRT)                                        \
    for (; i + (W) <= n; i += (W)) {                                            \
        VT gi, pi, mi, vi;                                                      \
        memcpy(&gi, g + i, sizeof gi);                                          \
        memcpy(&pi, p + i, sizeof pi);                                          \
        memcpy(&mi, m + i, sizeof mi);                                          \
        memcpy(&vi, v + i, sizeof vi);                                          \
        gi = gi * inv;                                                          \
        if ((MODE) == 2) {                                                      \
            pi = pi * decay;                                                    \
            mi = mi + w1 * (gi - mi);                                           \
            vi = vi * b2 + w2 * gi * gi;                                        \
            VT denom = SQRT(vi) / bc2s + eps;                                   \
            pi = pi + ss * mi / denom;                                          \
        } else {                                                                \
            if ((MODE) == 0) gi = gi + wd * pi;                                 \
            mi = b1 * mi + w1 * gi;                                             \
            vi = b2 * vi + w2 * gi * gi;                                        \
            pi = pi - ss * mi / (SQRT(vi) + eps);                               \
            if ((MODE) == 1) pi = pi - decay * pi;                              \
        }                                                                       \
        memcpy(p + i, &pi, sizeof pi);                                          \
        memcpy(m + i, &mi, sizeof mi);                                          \
        memcpy(v + i, &vi, sizeof vi);                                          \
    }

#define ADAM_VEC_FN(NAME, ATTR, VT, W, SQRT)                                                                   \
    ATTR static void NAME(int mode, int64_t n, float *restrict p, const float *restrict g, float *restrict m, \
                          float *restrict v, const adam_consts *c) {                                         \
        const float inv = c->inv_scale, b1 = c->b1, w1 = c->w1, b2 = c->b2, w2 = c->w2, eps = c->eps;        \
        const float wd = c->wd, ss = c->step_size, bc2s = c->bc2_sqrt, decay = c->decay;                     \
        int64_t i = 0;                                                                                        \
        if (mode == 0) { ADAM_VEC_LOOP(0, VT, W, SQRT) }                                                      \
        else if (mode == 1) { ADAM_VEC_LOOP(1, VT, W, SQRT) }                                                 \
        else { ADAM_VEC_LOOP(2, VT, W, SQRT) }                                                                \
        adam_f32_scalar(mode, n - i, p + i, g + i, m + i, v + i, c);                                          \
    }

typedef float om_v4f __attribute__((vector_size(16)));
typedef float om_v8f __attribute__((vector_size(32)));
#define SQRT_SSE(x) ((om_v4f)_mm_sqrt_ps((__m128)(x)))
#define SQRT_AVX(x) ((om_v8f)_mm256_sqrt_ps((__m256)(x)))

ADAM_VEC_FN(adam_f32_sse2, , om_v4f, 4, SQRT_SSE)
ADAM_VEC_FN(adam_f32_avx2, __attribute__((target("avx2"))), om_v8f, 8, SQRT_AVX)

static adam_f32_fn pick_adam_f32(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? adam_f32_avx2 : adam_f32_sse2;
}
#else
static adam_f32_fn pick_adam_f32(void) { return adam_f32_scalar; }
#endif

static adam_f32_fn adam_f32_kernel(void) {
    static adam_f32_fn fn = NULL;   /* benign race: every thread computes the same pointer */
    adam_f32_fn f = __atomic_load_n(&fn, __ATOMIC_RELAXED);
    if (!f) {
        f = pick_adam_f32();
        __atomic_store_n(&fn, f, __ATOMIC_RELAXED);
    }
    return f;
}

/* Any other dtype mix: through fp32 blocks. */
OM_CLONES static void adam_mixed(adam_f32_fn kernel, int mode, int64_t n, om_dtype pdt, void *p, om_dtype gdt,
                                 const void *g, float *restrict m, float *restrict v, const adam_consts *c) {
    float pb[OM_OPTIM_BLOCK], gb[OM_OPTIM_BLOCK];
    size_t ps = om_dtype_size(pdt), gs = om_dtype_size(gdt);
    for (int64_t i = 0; i < n; i += OM_OPTIM_BLOCK) {
        int64_t k = n - i < OM_OPTIM_BLOCK ? n - i : OM_OPTIM_BLOCK;
        void *pp = (char *)p + (size_t)i * ps;
        const void *gp = (const char *)g + (size_t)i * gs;
        const float *gf = gb;
        if (gdt == OM_F32) gf = gp;
        else om_load_f32(gdt, gp, gb, k);
        if (pdt == OM_F32) {
            kernel(mode, k, pp, gf, m + i, v + i, c);
        } else {
            om_load_f32(pdt, pp, pb, k);
            kernel(mode, k, pb, gf, m + i, v + i, c);
            om_store_f32(pdt, pb, pp, k);
        }
    }
}

typedef struct adam_job {
    int mode;
    adam_consts c;
    om_tensor *params;
    const om_tensor *grads;
    om_tensor *m, *v;
    const int64_t *offsets;
    int n;
} adam_job;

static void adam_piece(void *ctx, int k, int64_t lo, int64_t hi, int part) {
    adam_job *j = ctx;
    om_tensor *p = &j->params[k];
    const om_tensor *g = &j->grads[k];
    float *m = (float *)j->m[k].data + lo, *v = (float *)j->v[k].data + lo;
    if (p->dtype == OM_F32 && g->dtype == OM_F32) {
        adam_f32_kernel()(j->mode, hi - lo, (float *)p->data + lo, (const float *)g->data + lo, m, v, &j->c);
    } else {
        adam_mixed(adam_f32_kernel(), j->mode, hi - lo, p->dtype, (char *)p->data + (size_t)lo * om_dtype_size(p->dtype), g->dtype,
                   (const char *)g->data + (size_t)lo * om_dtype_size(g->dtype), m, v, &j->c);
    }
}

static void adam_range(void *ctx, int part, int64_t begin, int64_t end) {
    adam_job *j = ctx;
    om_visit_pieces(j->offsets, j->n, begin, end, part, ctx, adam_piece);
}

static const char *device_name(om_device_type d) {
    const om_provider *pv = om_provider_find(d);
    return pv ? pv->name : "an unknown device";
}

om_status *om_optim_device(const char *what, int n, const om_tensor *const *lists, int n_lists,
                           const om_optim_provider **dev, int *device) {
    *dev = NULL;
    *device = 0;
    const om_tensor *first = NULL;
    for (int l = 0; l < n_lists; l++)
        for (int k = 0; lists[l] && k < n; k++) {
            const om_tensor *t = &lists[l][k];
            if (!first) { first = t; continue; }
            if (t->device != first->device || (t->device != OM_CPU && t->device_id != first->device_id))
                return om_error(OM_INVALID_ARGUMENT, "%s: tensor %d is on %s:%d, the call's first on %s:%d; one call's "
                                "tensors share a device", what, k, device_name(t->device), t->device_id,
                                device_name(first->device), first->device_id);
        }
    /* the CPU kernels run om_optim_num_threads() parts: a bad ORTMOD_NUM_THREADS is an error here,
     * where its value is needed, never the default in silence */
    if (!first || first->device == OM_CPU) return om_options_check(OM_OPT_OPTIM_NUM_THREADS);
    *device = first->device_id;
    return om_optim_provider_get(first->device, dev);
}

om_status *om_optim_check_tensor(const om_tensor *t, const char *what, int i, int f32_only) {
    if (!om_provider_find(t->device))
        return om_error(OM_INVALID_ARGUMENT, "%s %d is on a device the optimizer does not take", what, i);
    if (t->rank < 0 || t->rank > OM_MAX_RANK)
        return om_error(OM_INVALID_ARGUMENT, "%s %d has rank %d (at most %d)", what, i, t->rank, OM_MAX_RANK);
    for (int d = 0; d < t->rank; d++)
        if (t->dims[d] < 0) return om_error(OM_INVALID_ARGUMENT, "%s %d has a negative dimension", what, i);
    if (f32_only ? t->dtype != OM_F32 : !om_is_float_dtype(t->dtype))
        return om_error(OM_INVALID_ARGUMENT, "%s %d has dtype %s; expected %s", what, i, om_dtype_name(t->dtype),
                        f32_only ? "float32" : "float32, float16 or bfloat16");
    if (!t->data && om_tensor_numel(t) > 0) return om_error(OM_INVALID_ARGUMENT, "%s %d has no data", what, i);
    return NULL;
}

om_status *om_optim_offsets(int n, const om_tensor *ts, int64_t **offsets) {
    int64_t *off = malloc(((size_t)n + 1) * sizeof *off);
    if (!off) return om_error(OM_OUT_OF_MEMORY, "out of memory (optimizer offsets)");
    off[0] = 0;
    for (int k = 0; k < n; k++) off[k + 1] = off[k] + om_tensor_numel(&ts[k]);
    *offsets = off;
    return NULL;
}

static om_status *check_hparams(const om_adam_hparams_d *h) {
    if (h->mode != OM_ADAM_L2_REGULARIZATION && h->mode != OM_ADAMW_TRANSFORMERS && h->mode != OM_ADAMW_TORCH)
        return om_error(OM_INVALID_ARGUMENT, "adam: unknown mode %d (0: L2 regularization, 1: AdamW transformers, "
                        "2: AdamW torch)", (int)h->mode);
    if (!(h->beta1 >= 0.0 && h->beta1 < 1.0) || !(h->beta2 >= 0.0 && h->beta2 < 1.0))
        return om_error(OM_INVALID_ARGUMENT, "adam: betas must be in [0, 1), got (%g, %g)", h->beta1, h->beta2);
    if (!(h->eps >= 0.0)) return om_error(OM_INVALID_ARGUMENT, "adam: eps must be >= 0, got %g", h->eps);
    if (!(h->lr >= 0.0)) return om_error(OM_INVALID_ARGUMENT, "adam: lr must be >= 0, got %g", h->lr);
    if (!(h->weight_decay >= 0.0))
        return om_error(OM_INVALID_ARGUMENT, "adam: weight_decay must be >= 0, got %g", h->weight_decay);
    if (h->bias_correction && h->step < 1)
        return om_error(OM_INVALID_ARGUMENT, "adam: step must be >= 1 with bias correction (the group's step is "
                        "incremented before the update), got %lld", (long long)h->step);
    if (!(h->grad_scale > 0.0) || isinf(h->grad_scale))
        return om_error(OM_INVALID_ARGUMENT, "adam: grad_scale must be finite and > 0, got %g", h->grad_scale);
    return NULL;
}

om_status *om_adam_step_d(const om_adam_hparams_d *h, int n, om_tensor *params, const om_tensor *grads,
                        om_tensor *exp_avg, om_tensor *exp_avg_sq) {
    return om_adam_step_d_on(h, n, params, grads, exp_avg, exp_avg_sq, NULL);
}

om_status *om_adam_step_d_on(const om_adam_hparams_d *h, int n, om_tensor *params, const om_tensor *grads,
                             om_tensor *exp_avg, om_tensor *exp_avg_sq, void *stream) {
    if (!h) return om_error(OM_INVALID_ARGUMENT, "adam: hparams is NULL");
    if (n < 0) return om_error(OM_INVALID_ARGUMENT, "adam: negative tensor count %d", n);
    if (n == 0) return NULL;
    if (!params || !grads || !exp_avg || !exp_avg_sq)
        return om_error(OM_INVALID_ARGUMENT, "adam: params, grads, exp_avg and exp_avg_sq must be non-NULL");
    OM_TRY(check_hparams(h));
    for (int k = 0; k < n; k++) {
        OM_TRY(om_optim_check_tensor(&params[k], "adam: param", k, 0));
        OM_TRY(om_optim_check_tensor(&grads[k], "adam: grad", k, 0));
        OM_TRY(om_optim_check_tensor(&exp_avg[k], "adam: exp_avg", k, 1));
        OM_TRY(om_optim_check_tensor(&exp_avg_sq[k], "adam: exp_avg_sq", k, 1));
        if (!om_shape_equal(&params[k], &grads[k])) {
            char a[128], b[128];
            om_shape_str(&params[k], a, sizeof a);
            om_shape_str(&grads[k], b, sizeof b);
            return om_error(OM_INVALID_ARGUMENT, "adam: param %d is %s but its grad is %s", k, a, b);
        }
        int64_t np = om_tensor_numel(&params[k]);
        if (om_tensor_numel(&exp_avg[k]) != np || om_tensor_numel(&exp_avg_sq[k]) != np)
            return om_error(OM_INVALID_ARGUMENT, "adam: param %d has %lld elements but exp_avg has %lld and exp_avg_sq %lld",
                            k, (long long)np, (long long)om_tensor_numel(&exp_avg[k]),
                            (long long)om_tensor_numel(&exp_avg_sq[k]));
    }

    const om_tensor *lists[4] = {params, grads, exp_avg, exp_avg_sq};
    const om_optim_provider *dev;
    int device;
    OM_TRY(om_optim_device("adam", n, lists, 4, &dev, &device));
    adam_job j = {.mode = (int)h->mode, .params = params, .grads = grads, .m = exp_avg, .v = exp_avg_sq, .n = n};
    j.c.mode = (int)h->mode;
    double lr = h->lr, b1 = h->beta1, b2 = h->beta2, wd = h->weight_decay;
    double bc1 = 1.0, bc2 = 1.0;
    if (h->bias_correction) {
        bc1 = 1.0 - pow(b1, (double)h->step);
        bc2 = 1.0 - pow(b2, (double)h->step);
    }
    j.c.inv_scale = (float)(1.0 / h->grad_scale);
    j.c.b1 = (float)b1;
    j.c.w1 = (float)(1.0 - b1);
    j.c.b2 = (float)b2;
    j.c.w2 = (float)(1.0 - b2);
    j.c.eps = (float)h->eps;
    j.c.wd = (float)wd;
    j.c.bc2_sqrt = (float)sqrt(bc2);
    if (h->mode == OM_ADAMW_TORCH) {
        j.c.step_size = (float)(-lr / bc1);
        j.c.decay = (float)(1.0 - lr * wd);
    } else {
        j.c.step_size = (float)(lr * sqrt(bc2) / bc1);
        j.c.decay = (float)(lr * wd);
    }
    if (dev) return dev->adam_step(device, stream, &j.c, n, params, grads, exp_avg, exp_avg_sq);
    int64_t *off = NULL;
    OM_TRY(om_optim_offsets(n, params, &off));
    j.offsets = off;
    om_parallel_for(off[n], 1 << 15, &j, adam_range);
    free(off);
    return NULL;
}

om_status *om_adam_step(const om_adam_hparams *h, int n, om_tensor *params, const om_tensor *grads,
                        om_tensor *exp_avg, om_tensor *exp_avg_sq) {
    if (!h) return om_error(OM_INVALID_ARGUMENT, "adam: hparams is NULL");
    om_adam_hparams_d d = {h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
                           h->bias_correction, h->mode, h->step, h->grad_scale};
    return om_adam_step_d(&d, n, params, grads, exp_avg, exp_avg_sq);
}
