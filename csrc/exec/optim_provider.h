/* optim_provider.h — what the optimizer passes (csrc/optim/) ask of a device: its own small
 * table, apart from the engine's om_provider (exec/provider.h), since an optimizer call is
 * not a plan's. The CPU has none: csrc/optim runs its passes on the host itself. CUDA's is an
 * adapter over the loaded om_cuda_provider (exec/device.c), whose ABI it leaves as it is.
 */
#ifndef OM_EXEC_OPTIM_PROVIDER_H
#define OM_EXEC_OPTIM_PROVIDER_H

#include "ops/op.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Adam/AdamW step's constants, formed once per call by the engine (csrc/optim/adam.c),
 * so that every device runs the same fp32 update:
 *   mode 0: g += wd p; m = b1 m + w1 g; v = b2 v + w2 g^2; p -= step_size m / (sqrt v + eps)
 *   mode 1: as 0 without the g term; then p -= decay p
 *   mode 2: p *= decay; m += w1 (g - m); v = v b2 + w2 g^2; p += step_size m / (sqrt v / bc2_sqrt + eps)
 * with g = grad * inv_scale. Part of the CUDA provider's ABI (exec/cuda_provider.h). */
typedef struct om_adam_consts {
    int mode;
    float inv_scale, b1, w1, b2, w2, eps, wd, step_size, bc2_sqrt, decay;
} om_adam_consts;

/* The passes over n tensors of one device, enqueued on stream: an Adam step (params
 * f32/f16/bf16, grads any of those, moments f32), dst = src * factor (dst may be src), and the
 * gradients' inf/NaN check with their sum of squares (fp64), which reads its two results back. */
typedef struct om_optim_provider {
    const char *name;
    om_status *(*adam_step)(int device, void *stream, const om_adam_consts *c, int n, om_tensor *params,
                            const om_tensor *grads, om_tensor *exp_avg, om_tensor *exp_avg_sq);
    om_status *(*grads_copy_scaled)(int device, void *stream, int n, const om_tensor *src, om_tensor *dst,
                                    float factor);
    om_status *(*grads_check_and_norm)(int device, void *stream, int n, const om_tensor *grads, int *found_inf,
                                       double *sq_sum);
} om_optim_provider;

/* The optimizer passes of a device type: *out = NULL on the CPU (the host runs them); an
 * error when the device's provider is unavailable or the device unknown. */
om_status *om_optim_provider_get(om_device_type device, const om_optim_provider **out);

#ifdef __cplusplus
}
#endif
#endif
