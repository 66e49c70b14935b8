/* device.h — the engine side of execution providers other than the CPU.
 *
 * The CPU provider is the op table's `cpu` kernels, linked in. The CUDA provider lives in a
 * separate shared object, ortmod/libortmod_cuda.so (built from cuda/ when the CUDA toolkit is
 * present), loaded with dlopen the first time the engine sees a CUDA tensor; a CPU-only build
 * or run never touches it. The engine defines the interface it implements, in
 * exec/cuda_provider.h (ggml-backend's split: the engine owns the vtable, the backend fills it
 * in), so nothing under csrc/ includes cuda/.
 *
 * Layering: exec/ uses plan/, never the other way round. A plan is device-neutral; what a
 * provider needs to run it (each node's kernel, the constants uploaded to the device) is the
 * plan's device part, which this file attaches to om_plan.device_data and releases, and which
 * only device.c can see into.
 *
 * Streams: every CUDA call takes the caller's stream (torch.cuda.current_stream(), passed from
 * Python as an int; 0 = the legacy default stream). Work is only enqueued: the engine never
 * synchronizes the host with the device in a step.
 */
#ifndef OM_EXEC_DEVICE_H
#define OM_EXEC_DEVICE_H

#include "exec/cuda_provider.h"

/* The loaded and initialized CUDA provider, loading it on first use. Thread-safe. On failure
 * the error says why (library missing, no driver, ABI mismatch) and is the same every call. */
om_status *om_cuda_get(const om_cuda_provider **out);
/* 1 when the provider was loaded (does not try to load it). */
int om_cuda_loaded(void);

/* The device part of plan p (built by om_plan_build for g, on CUDA inputs): every node that
 * runs gets its provider kernel (a missing one fails here, naming the op) and the constants
 * the device reads are uploaded once; scratch lives in each call's frame. Nothing to do for a
 * CPU plan. After a failure, what was made is freed by om_device_plan_release. */
struct om_plan;
om_status *om_device_plan_prepare(const om_graph *g, struct om_plan *p);
/* Frees p's device part, if any (om_plan_free does not: the planner cannot see into it). */
void om_device_plan_release(struct om_plan *p);
/* Run time, for a prepared CUDA plan: the kernel of node id `node` (NULL for a callback op,
 * which the client runs from the host), and the device copy of CONST value v (NULL where the
 * device reads nothing of v). */
om_cuda_kernel_fn om_device_plan_kernel(const struct om_plan *p, int node);
void *om_device_plan_const(const struct om_plan *p, int v);

/* om_engine_forward_stream, om_engine_backward_stream and om_device_free_data are public:
 * ortmod.h, "CUDA streams". */
#endif
