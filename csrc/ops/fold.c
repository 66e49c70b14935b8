/* fold.c — running a node's CPU kernel whatever its dtype: at plan and compile time (folding)
 * and in every step of a CPU plan.
 *
 * Exports: om_cpu_run, om_cpu_fold, om_cpu_twin_bytes.
 *
 * The CPU kernels compute in fp32/fp64. A node that computes in fp16/bf16 (a bf16 model's
 * layers, an autocast region, a half model's attention scale folded at plan time) runs its
 * fp32 kernel on fp32 twins of its half tensors: half inputs are widened (exactly), the kernel
 * computes and accumulates in fp32, and each half output is rounded once, to nearest even.
 * That is the CUDA kernels' rule (load to fp32, compute, round once on store), so a plan means
 * the same on both providers, and it is eager PyTorch's rule for CPU half math too (its
 * kernels widen to fp32 per element; its bf16 GEMMs accumulate in fp32: a product of two bf16
 * values is exact in fp32, so sgemm on widened operands is a bf16 GEMM with fp32 accumulation).
 *
 * In a step the twins live in the plan's twin region of the frame (om_plan.twin_bytes, sized
 * by om_cpu_twin_bytes over the program), so the hot path allocates nothing.
 */
#include <stdlib.h>

#include "core/half.h"
#include "core/threadpool.h"
#include "ops/op.h"

#define FOLD_MAX_IO 64

typedef struct convert_job { om_dtype dt; uint16_t *h; float *f; } convert_job;

static void widen_range(void *c, int64_t lo, int64_t hi) {
    const convert_job *j = c;
    if (j->dt == OM_F16) for (int64_t i = lo; i < hi; i++) j->f[i] = om_f16_to_f32(j->h[i]);
    else for (int64_t i = lo; i < hi; i++) j->f[i] = om_bf16_to_f32(j->h[i]);
}

static void round_range(void *c, int64_t lo, int64_t hi) {
    const convert_job *j = c;
    if (j->dt == OM_F16) for (int64_t i = lo; i < hi; i++) j->h[i] = om_f32_to_f16(j->f[i]);
    else for (int64_t i = lo; i < hi; i++) j->h[i] = om_f32_to_bf16(j->f[i]);
}

/* Bytes one twin takes in a twin region (64-byte aligned, as the planner places values). */
static size_t twin_size(const om_tensor *t) {
    int64_t n = om_tensor_numel(t);
    return (((size_t)(n ? n : 1) * sizeof(float)) + 63) & ~(size_t)63;
}

/* A tensor of node n that needs an fp32 twin: present and half (and, when run, with data). */
static int needs_twin(const om_tensor *t, int present) {
    return present && om_dtype_is_half(t->dtype);
}

size_t om_cpu_twin_bytes(const om_node *n, const om_tensor *in, const om_tensor *out) {
    if (om_node_cpu_half(n, in, out) == OM_UNDEFINED) return 0;
    size_t total = 0;
    for (int i = 0; i < n->n_in; i++)
        if (needs_twin(&in[i], n->in[i] >= 0)) total += twin_size(&in[i]);
    for (int j = 0; j < n->n_out; j++)
        if (needs_twin(&out[j], n->out[j] >= 0)) total += twin_size(&out[j]);
    return total;
}

/* *twin = t, or t's fp32 twin placed at base + *at (advanced past it) when t needs one and has
 * data; 1 when it placed one. */
static int place_twin(const om_tensor *t, int present, char *base, size_t *at, om_tensor *twin) {
    *twin = *t;
    if (!needs_twin(t, present) || !t->data) return 0;
    twin->dtype = OM_F32;
    twin->data = base + *at;
    *at += twin_size(t);
    return 1;
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

om_status *om_cpu_run(om_kernel_ctx *ctx, void *scratch, size_t scratch_bytes) {
    const om_node *n = ctx->node;
    if (om_node_cpu_half(n, ctx->in, ctx->out) == OM_UNDEFINED) return n->op->cpu(ctx);
    if (ctx->n_in > FOLD_MAX_IO || ctx->n_out > FOLD_MAX_IO)
        return om_error(OM_UNSUPPORTED_OP, "node '%s' has more than %d inputs or outputs", n->name, FOLD_MAX_IO);
    const size_t need = om_cpu_twin_bytes(n, ctx->in, ctx->out);
    char *base = scratch;
    if (!base) {
        base = om_alloc(need);
        if (!base) return om_error(OM_OUT_OF_MEMORY, "out of memory for the fp32 copies of half-precision node '%s'",
                                   n->name);
    } else if (need > scratch_bytes) {
        return om_error(OM_INTERNAL, "node '%s': its fp32 copies need %zu bytes, the plan reserved %zu", n->name,
                        need, scratch_bytes);
    }
    om_tensor in[FOLD_MAX_IO], out[FOLD_MAX_IO];
    size_t at = 0;
    for (int i = 0; i < ctx->n_in; i++)
        if (place_twin(&ctx->in[i], n->in[i] >= 0, base, &at, &in[i])) {
            convert_job j = {ctx->in[i].dtype, ctx->in[i].data, in[i].data};
            om_pool_for(om_tensor_numel(&in[i]), OM_GRAIN, widen_range, &j);
        }
    for (int k = 0; k < ctx->n_out; k++) place_twin(&ctx->out[k], n->out[k] >= 0, base, &at, &out[k]);
    om_kernel_ctx c32 = *ctx;
    c32.in = in;
    c32.out = out;
    om_status *st = n->op->cpu(&c32);
    for (int k = 0; k < ctx->n_out && !st; k++) {
        if (!needs_twin(&ctx->out[k], n->out[k] >= 0) || !ctx->out[k].data) continue;
        convert_job j = {ctx->out[k].dtype, ctx->out[k].data, out[k].data};
        om_pool_for(om_tensor_numel(&ctx->out[k]), OM_GRAIN, round_range, &j);
    }
    if (!scratch) om_free(base);
    return st;
}

om_status *om_cpu_fold(om_kernel_ctx *ctx) {
    if (om_kernel_nothing_to_do(ctx)) return NULL;
    return om_cpu_run(ctx, NULL, 0);
}
