/* device.h — the engine side of execution providers other than the CPU.
 *
 * The CPU provider is the op table's `cpu` kernels, linked in. The CUDA provider lives in a
 * separate shared object, ortmod/libortmod_cuda.so (built from cuda/ when the CUDA toolkit is
 * present), loaded with dlopen the first time the engine sees a CUDA tensor; a CPU-only build
 * or run never touches it. Its interface is cuda/provider.h.
 *
 * Streams: every CUDA call takes the caller's stream (torch.cuda.current_stream(), passed from
 * Python as an int; 0 = the legacy default stream). Work is only enqueued: the engine never
 * synchronizes the host with the device in a step.
 */
#ifndef OM_EXEC_DEVICE_H
#define OM_EXEC_DEVICE_H

#include "../../cuda/provider.h"

/* The loaded and initialized CUDA provider, loading it on first use. Thread-safe. On failure
 * the error says why (library missing, no driver, ABI mismatch) and is the same every call. */
om_status *om_cuda_get(const om_cuda_provider **out);
/* 1 when the provider was loaded (does not try to load it). */
int om_cuda_loaded(void);

/* Device parts of a plan (plan.c calls these for plans of CUDA inputs): kernels per node,
 * constants uploaded once (scratch lives in each call's frame). */
struct om_plan;
om_status *om_device_plan_prepare(const om_graph *g, struct om_plan *p, int n_nodes);
void om_device_plan_release(struct om_plan *p);

/* om_engine_forward_stream, om_engine_backward_stream and om_device_free_data are public:
 * ortmod.h, "CUDA streams". */
#endif
