/* cpu_provider.c — the CPU as a provider (exec/provider.h), linked in.
 *
 * Kernels are the op table's `cpu` functions; a half-precision node an op computes in fp32 runs
 * on fp32 twins in the frame's twin region (om_cpu_run, ops/fold.c). Frames are host memory:
 * the engine shares one spare frame between calls and hands dead pages back as a call runs
 * (host_frames), so nothing here keeps state. There is no stream and no device part of a plan:
 * constants are read where the plan holds them.
 */
#include "exec/provider.h"
#include "plan/plan.h"

#include <string.h>

static om_status *cpu_ready(void) { return NULL; }

static void *cpu_alloc(int device_id, size_t nbytes, void *stream) {
    (void)device_id; (void)stream;
    return om_alloc(nbytes);
}

static void cpu_release(int device_id, void *p, void *stream) {
    (void)device_id; (void)stream;
    om_free(p);
}

static om_status *cpu_zero(int device_id, void *p, size_t nbytes, void *stream) {
    (void)device_id; (void)stream;
    memset(p, 0, nbytes);
    return NULL;
}

static om_status *cpu_copy(int device_id, void *dst, const void *src, size_t nbytes, void *stream) {
    (void)device_id; (void)stream;
    memcpy(dst, src, nbytes);
    return NULL;
}

static om_status *cpu_begin(om_run *r) {
    (void)r;
    return NULL;
}

static om_status *cpu_run_node(const om_run *r, int node, om_kernel_ctx *ctx) {
    (void)node;
    return om_cpu_run(ctx, r->twin, r->plan->twin_bytes);
}

static void *cpu_plan_const(const om_plan *p, int v) { return p->vt[v].data; }

const om_provider om_cpu_provider = {
    .name = "cpu", .device = OM_CPU, .shape_suffix = "", .host_frames = 1, .ready = cpu_ready, .alloc = cpu_alloc,
    .release = cpu_release, .zero = cpu_zero, .copy = cpu_copy, .begin = cpu_begin, .run_node = cpu_run_node,
    .plan_prepare = NULL, .plan_release = NULL, .plan_const = cpu_plan_const,
};
