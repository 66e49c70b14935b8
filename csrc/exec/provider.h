/* provider.h — what the engine asks of a device: one om_provider table per device type.
 *
 * The engine (exec/engine.c) runs a plan through the provider of the plan's device and never
 * asks which device that is: it holds no device-specific branch. A provider is
 *   - memory of a call's frame: alloc / release / zero / copy (ordered on the call's stream
 *     where the device has streams);
 *   - the per-call execution state (begin: streams, library handles), kept in om_run;
 *   - running one node's kernel (run_node: one indirect call per node, the only one the
 *     engine's hot loop adds);
 *   - a plan's device part (plan_prepare / plan_release: each node's kernel, the constants
 *     on the device; plan_const: where a constant lives on the device).
 * Two are built in: the CPU (exec/cpu_provider.c: the op table's cpu kernels, fp32 twins for
 * half types) and CUDA (exec/device.c: an adapter over the dlopen'ed om_cuda_provider of
 * exec/cuda_provider.h, whose shared-object ABI this table does not change). Adding a device
 * is one more table: docs/adding-a-device.md.
 */
#ifndef OM_EXEC_PROVIDER_H
#define OM_EXEC_PROVIDER_H

#include "ops/op.h"

struct om_plan;

/* One call's (or one program's) execution state: the engine fills plan, stream and twin;
 * begin fills state, which only its provider reads. */
typedef struct om_run {
    const struct om_plan *plan;
    void *stream;                 /* the caller's stream (NULL: the device's default); unused on the CPU */
    char *twin;                   /* host frames: the frame's twin region (fp32 copies for half types) */
    union { void *p[16]; double d[16]; } state;   /* the provider's own (CUDA: handles, workspace) */
} om_run;

typedef struct om_provider {
    const char *name;             /* "cpu", "cuda": in messages ("input 'x' is on cuda:0") */
    om_device_type device;
    const char *shape_suffix;     /* after a shape in messages: "" on the CPU, " (cuda)" */
    /* 1: frames are host memory the engine may share between calls (its one spare frame,
     * cpu_frame_take/give_back in engine.c) and whose dead pages it hands back as a call
     * runs (plan.h: release_at); kernels are timed by the profiler; segmented plans
     * (plan.h: data-dependent sizes, whose counts are read on the host) run. */
    int host_frames;
    /* Ready to run tensors of this device (loads a provider on first use); the error says why not. */
    om_status *(*ready)(void);
    /* Run-time memory of a call, ordered on stream: NULL when out of memory. */
    void *(*alloc)(int device_id, size_t nbytes, void *stream);
    void (*release)(int device_id, void *p, void *stream);
    om_status *(*zero)(int device_id, void *p, size_t nbytes, void *stream);
    om_status *(*copy)(int device_id, void *dst, const void *src, size_t nbytes, void *stream);
    /* Before a program runs: fills r->state for r->plan on r->stream. */
    om_status *(*begin)(om_run *r);
    /* Runs node `node` of r->plan (ctx: its tensors, with this device's pointers). */
    om_status *(*run_node)(const om_run *r, int node, om_kernel_ctx *ctx);
    /* A plan's device part: prepared once per plan (a node without a kernel fails here, by
     * name), released with the plan; NULL where the device needs none. */
    om_status *(*plan_prepare)(const om_graph *g, struct om_plan *p);
    void (*plan_release)(struct om_plan *p);
    /* Where the device reads CONST value v of a prepared plan. */
    void *(*plan_const)(const struct om_plan *p, int v);
} om_provider;

/* The provider of a device type, ready to run (om_provider.ready): an unknown device or an
 * unavailable provider is an error that says why. */
om_status *om_provider_get(om_device_type device, const om_provider **out);
/* The provider's table without making it ready (releasing what it made); NULL: unknown device. */
const om_provider *om_provider_find(om_device_type device);

extern const om_provider om_cpu_provider;    /* exec/cpu_provider.c */
extern const om_provider om_cuda_adapter;    /* exec/device.c */

#endif
