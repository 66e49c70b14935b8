/* grads.c — what a loss-scaling optimizer does to gradients: one pass that both detects
 * inf/NaN and accumulates the squared norm, and one pass that unscales (and clips).
 *
 * The overflow check rides on the norm: squares of finite fp32/fp16/bf16 values summed in
 * fp64 cannot overflow (3.4e38^2 = 1.2e77, times 2^53 elements still fits), so the sum is
 * finite exactly when every element is. One read of each gradient gives both answers.
 * The sum uses 16 independent fp64 lanes per thread (vectorizable without -ffast-math);
 * parts are combined in part order, so a given thread count gives a deterministic result. */
#include "optim/optim_internal.h"

#include <math.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define OM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OM_CLONES
#endif

#define LANES 16

OM_CLONES static double sum_squares_f32(const float *restrict x, int64_t n) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            double d = (double)x[i + l];
            acc[l] += d * d;
        }
    for (; i < n; i++) acc[0] += (double)x[i] * (double)x[i];
    double s = 0.0;
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

OM_CLONES static double sum_squares_half(om_dtype dt, const uint16_t *x, int64_t n) {
    float buf[OM_OPTIM_BLOCK];
    double s = 0.0;
    for (int64_t i = 0; i < n; i += OM_OPTIM_BLOCK) {
        int64_t k = n - i < OM_OPTIM_BLOCK ? n - i : OM_OPTIM_BLOCK;
        om_load_f32(dt, x + i, buf, k);
        double acc[LANES] = {0};
        int64_t j = 0;
        for (; j + LANES <= k; j += LANES)
            for (int l = 0; l < LANES; l++) {
                double d = (double)buf[j + l];
                acc[l] += d * d;
            }
        for (; j < k; j++) acc[0] += (double)buf[j] * (double)buf[j];
        for (int l = 0; l < LANES; l++) s += acc[l];
    }
    return s;
}

typedef struct norm_job {
    const om_tensor *g;
    const int64_t *offsets;
    int n;
    double part_sum[OM_OPTIM_MAX_PARTS];
} norm_job;

static void norm_piece(void *ctx, int k, int64_t lo, int64_t hi, int part) {
    norm_job *j = ctx;
    const om_tensor *t = &j->g[k];
    double s = t->dtype == OM_F32 ? sum_squares_f32((const float *)t->data + lo, hi - lo)
                                  : sum_squares_half(t->dtype, (const uint16_t *)t->data + lo, hi - lo);
    j->part_sum[part] += s;
}

static void norm_range(void *ctx, int part, int64_t begin, int64_t end) {
    norm_job *j = ctx;
    om_visit_pieces(j->offsets, j->n, begin, end, part, ctx, norm_piece);
}

om_status *om_grads_check_and_norm(int n, const om_tensor *grads, float scale, int *found_inf, double *sq_norm) {
    return om_grads_check_and_norm_on(n, grads, scale, found_inf, sq_norm, NULL);
}

om_status *om_grads_check_and_norm_on(int n, const om_tensor *grads, float scale, int *found_inf, double *sq_norm,
                                      void *stream) {
    if (n < 0) return om_error(OM_INVALID_ARGUMENT, "grads_check_and_norm: negative tensor count %d", n);
    if (!found_inf || !sq_norm) return om_error(OM_INVALID_ARGUMENT, "grads_check_and_norm: NULL output");
    if (!(scale > 0.0f) || isinf(scale))
        return om_error(OM_INVALID_ARGUMENT, "grads_check_and_norm: scale must be finite and > 0, got %g", scale);
    *found_inf = 0;
    *sq_norm = 0.0;
    if (n == 0) return NULL;
    if (!grads) return om_error(OM_INVALID_ARGUMENT, "grads_check_and_norm: grads is NULL");
    for (int k = 0; k < n; k++) OM_TRY(om_optim_check_tensor(&grads[k], "grads_check_and_norm: grad", k, 0));
    const om_optim_provider *dev;
    int device;
    OM_TRY(om_optim_device("grads_check_and_norm", n, &grads, 1, &dev, &device));
    if (dev) {
        double s = 0.0;
        OM_TRY(dev->grads_check_and_norm(device, stream, n, grads, found_inf, &s));
        const double inv = 1.0 / (double)scale;
        *sq_norm = *found_inf ? INFINITY : s * inv * inv;
        return NULL;
    }
    norm_job *j = calloc(1, sizeof *j);
    if (!j) return om_error(OM_OUT_OF_MEMORY, "out of memory (grads_check_and_norm)");
    int64_t *off = NULL;
    om_status *st = om_optim_offsets(n, grads, &off);
    if (st) { free(j); return st; }
    j->g = grads;
    j->offsets = off;
    j->n = n;
    int parts = om_parallel_for(off[n], 1 << 16, j, norm_range);
    double s = 0.0;
    for (int p = 0; p < parts; p++) s += j->part_sum[p];
    free(off);
    free(j);
    double inv = 1.0 / (double)scale;
    if (!isfinite(s)) {
        *found_inf = 1;
        *sq_norm = INFINITY;
    } else {
        *sq_norm = s * inv * inv;
    }
    return NULL;
}

/* ---- scaling ------------------------------------------------------------------------ */

OM_CLONES static void scale_f32(float *restrict dst, const float *restrict src, int64_t n, float f) {
    for (int64_t i = 0; i < n; i++) dst[i] = src[i] * f;
}

/* in place: dst == src is allowed here (restrict-free twin of scale_f32) */
OM_CLONES static void scale_f32_inplace(float *x, int64_t n, float f) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * f;
}

OM_CLONES static void scale_convert(om_dtype sdt, const void *src, om_dtype ddt, void *dst, int64_t n, float f) {
    float buf[OM_OPTIM_BLOCK];
    size_t ss = om_dtype_size(sdt), ds = om_dtype_size(ddt);
    for (int64_t i = 0; i < n; i += OM_OPTIM_BLOCK) {
        int64_t k = n - i < OM_OPTIM_BLOCK ? n - i : OM_OPTIM_BLOCK;
        om_load_f32(sdt, (const char *)src + (size_t)i * ss, buf, k);
        for (int64_t l = 0; l < k; l++) buf[l] *= f;
        om_store_f32(ddt, buf, (char *)dst + (size_t)i * ds, k);
    }
}

typedef struct scale_job {
    const om_tensor *src;
    om_tensor *dst;
    const int64_t *offsets;
    int n;
    float factor;
} scale_job;

static void scale_piece(void *ctx, int k, int64_t lo, int64_t hi, int part) {
    scale_job *j = ctx;
    const om_tensor *s = &j->src[k];
    om_tensor *d = &j->dst[k];
    if (s->dtype == OM_F32 && d->dtype == OM_F32) {
        if (s->data == d->data) scale_f32_inplace((float *)d->data + lo, hi - lo, j->factor);
        else scale_f32((float *)d->data + lo, (const float *)s->data + lo, hi - lo, j->factor);
    } else {
        scale_convert(s->dtype, (const char *)s->data + (size_t)lo * om_dtype_size(s->dtype), d->dtype,
                      (char *)d->data + (size_t)lo * om_dtype_size(d->dtype), hi - lo, j->factor);
    }
}

static void scale_range(void *ctx, int part, int64_t begin, int64_t end) {
    scale_job *j = ctx;
    om_visit_pieces(j->offsets, j->n, begin, end, part, ctx, scale_piece);
}

static om_status *scale_run(const char *what, int n, const om_tensor *src, om_tensor *dst, float factor,
                            void *stream) {
    if (n < 0) return om_error(OM_INVALID_ARGUMENT, "%s: negative tensor count %d", what, n);
    if (n == 0) return NULL;
    if (!src || !dst) return om_error(OM_INVALID_ARGUMENT, "%s: tensors are NULL", what);
    for (int k = 0; k < n; k++) {
        OM_TRY(om_optim_check_tensor(&src[k], what, k, 0));
        if (dst != src) {
            OM_TRY(om_optim_check_tensor(&dst[k], what, k, 0));
            if (om_tensor_numel(&src[k]) != om_tensor_numel(&dst[k]))
                return om_error(OM_INVALID_ARGUMENT, "%s: tensor %d: source has %lld elements, destination %lld", what,
                                k, (long long)om_tensor_numel(&src[k]), (long long)om_tensor_numel(&dst[k]));
        }
    }
    const om_tensor *lists[2] = {src, dst};
    const om_optim_provider *dev;
    int device;
    OM_TRY(om_optim_device(what, n, lists, 2, &dev, &device));
    if (dev) return dev->grads_copy_scaled(device, stream, n, src, dst, factor);
    scale_job j = {.src = src, .dst = dst, .n = n, .factor = factor};
    int64_t *off = NULL;
    OM_TRY(om_optim_offsets(n, src, &off));
    j.offsets = off;
    om_parallel_for(off[n], 1 << 16, &j, scale_range);
    free(off);
    return NULL;
}

om_status *om_grads_scale_on(int n, om_tensor *grads, float factor, void *stream) {
    if (factor == 1.0f) {   /* still validate, so that callers see the same errors */
        for (int k = 0; k < n && grads; k++) OM_TRY(om_optim_check_tensor(&grads[k], "grads_scale: grad", k, 0));
        return NULL;
    }
    return scale_run("grads_scale: grad", n, grads, grads, factor, stream);
}

om_status *om_grads_scale(int n, om_tensor *grads, float factor) { return om_grads_scale_on(n, grads, factor, NULL); }

om_status *om_grads_copy_scaled_on(int n, const om_tensor *src, om_tensor *dst, float factor, void *stream) {
    return scale_run("grads_copy_scaled: tensor", n, src, dst, factor, stream);
}

om_status *om_grads_copy_scaled(int n, const om_tensor *src, om_tensor *dst, float factor) {
    return om_grads_copy_scaled_on(n, src, dst, factor, NULL);
}
