/* fold.c — running a node's CPU kernel to fold it (plan-time and compile-time folding),
 * whatever its dtype.
 *
 * Exports: om_cpu_fold.
 *
 * The CPU kernels compute in fp32/fp64. A node known at plan time that computes in fp16/bf16
 * (a half model's attention scale, a mask built from half constants) is still folded: its
 * kernel runs on fp32 copies of the half inputs and the fp32 results are rounded once, to
 * nearest even, into the half outputs — the CUDA kernels' load-to-fp32, compute, round-once
 * rule — so what the planner knows stays known on every provider (CUDA kernels read such
 * values on the host: scales, ratios, shapes).
 */
#include <stdlib.h>

#include "core/half.h"
#include "ops/op.h"

#define FOLD_MAX_IO 64

static void half_to_f32(om_dtype dt, const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = dt == OM_F16 ? om_f16_to_f32(src[i]) : om_bf16_to_f32(src[i]);
}

static void f32_to_half(om_dtype dt, const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = dt == OM_F16 ? om_f32_to_f16(src[i]) : om_f32_to_bf16(src[i]);
}

/* The fp32 twin of half tensor t: same dims, fp32 data (converted from t's when load). */
static om_status *f32_twin(const om_tensor *t, int load, om_tensor *twin) {
    *twin = *t;
    twin->dtype = OM_F32;
    const int64_t n = om_tensor_numel(t);
    twin->data = om_alloc((size_t)(n ? n : 1) * sizeof(float));
    if (!twin->data) return om_error(OM_OUT_OF_MEMORY, "out of memory folding a half-precision node");
    if (load && n) half_to_f32(t->dtype, t->data, twin->data, n);
    return NULL;
}

int om_kernel_nothing_to_do(const om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    if (n->op->flags & OM_OP_CALLBACK) return 0;
    int outputs = 0;
    for (int j = 0; j < ctx->n_out; j++) {
        if (n->out[j] < 0) continue;   /* absent */
        if (om_tensor_numel(&ctx->out[j]) != 0) return 0;
        outputs++;
    }
    return outputs > 0;
}

om_status *om_cpu_fold(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    if (om_kernel_nothing_to_do(ctx)) return NULL;
    if (om_node_cpu_half(n, ctx->in, ctx->out) == OM_UNDEFINED) return n->op->cpu(ctx);
    if (ctx->n_in > FOLD_MAX_IO || ctx->n_out > FOLD_MAX_IO)
        return om_error(OM_UNSUPPORTED_OP, "node '%s' has more than %d inputs or outputs", n->name, FOLD_MAX_IO);
    om_tensor in[FOLD_MAX_IO], out[FOLD_MAX_IO];
    om_status *st = NULL;
    int ni = 0, no = 0;   /* twins made so far (freed on every path) */
    for (; ni < ctx->n_in && !st; ni++) {
        in[ni] = ctx->in[ni];
        if (om_dtype_is_half(in[ni].dtype) && in[ni].data) st = f32_twin(&ctx->in[ni], 1, &in[ni]);
    }
    for (; no < ctx->n_out && !st; no++) {
        out[no] = ctx->out[no];
        if (om_dtype_is_half(out[no].dtype) && out[no].data) st = f32_twin(&ctx->out[no], 0, &out[no]);
    }
    if (!st) {
        om_kernel_ctx c32 = *ctx;
        c32.in = in;
        c32.out = out;
        st = n->op->cpu(&c32);
    }
    for (int j = 0; j < no; j++) {
        if (out[j].data == ctx->out[j].data) continue;
        if (!st) f32_to_half(ctx->out[j].dtype, out[j].data, ctx->out[j].data, om_tensor_numel(&ctx->out[j]));
        om_free(out[j].data);
    }
    for (int i = 0; i < ni; i++)
        if (in[i].data != ctx->in[i].data) om_free(in[i].data);
    return st;
}
