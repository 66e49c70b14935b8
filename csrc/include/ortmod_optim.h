/* ortmod_optim.h — optimizer kernels of the engine library (multi-tensor, one call per
 * parameter group), shared by the Python optimizers (ortmod.optim) and the native runner.
 *
 *     om_adam_hparams h = om_adam_default_hparams();   // lr 1e-3, betas (0.9, 0.999), eps 1e-6, ...
 *     h.step = ++group_step;                             // incremented before the update
 *     om_status *st = om_adam_step(&h, n, params, grads, exp_avg, exp_avg_sq);
 */
#ifndef ORTMOD_OPTIM_H
#define ORTMOD_OPTIM_H
#include "ortmod.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum om_adam_mode {
    OM_ADAM_L2_REGULARIZATION = 0,  /* g += wd*p before the moments */
    OM_ADAMW_TRANSFORMERS = 1,      /* decoupled decay after the update (HF transformers' AdamW) */
    OM_ADAMW_TORCH = 2,             /* decoupled decay before the update (torch.optim.AdamW) */
} om_adam_mode;

typedef struct om_adam_hparams {
    float lr, beta1, beta2, eps, weight_decay;
    int bias_correction;            /* 0: bc1 = bc2 = 1 */
    om_adam_mode mode;
    int64_t step;                   /* the group's step, already incremented for this update */
    float grad_scale;               /* gradients are divided by this (loss scale); 1 = none */
} om_adam_hparams;

om_adam_hparams om_adam_default_hparams(void);

/* Updates n tensors in place: params (f32, f16 or bf16), grads (same dtype as its param
 * or f32 — any of f32/f16/bf16 is accepted, so fp32 master weights can read fp16 model
 * gradients directly), exp_avg and exp_avg_sq (f32). Math in fp32. Shapes must match per
 * tensor (exp_avg/exp_avg_sq: same element count). */
om_status *om_adam_step(const om_adam_hparams *h, int n, om_tensor *params, const om_tensor *grads,
                        om_tensor *exp_avg, om_tensor *exp_avg_sq);

/* The same step with hyperparameters in double: for callers that hold them as doubles
 * (Python floats). 1 - beta and the bias corrections are then formed from the exact
 * doubles, as torch.optim.AdamW does; with floats, 1 - 0.999f is off by 1.3e-5 relative,
 * which shows after a few dozen steps at rtol 1e-6. */
typedef struct om_adam_hparams_d {
    double lr, beta1, beta2, eps, weight_decay;
    int bias_correction;
    om_adam_mode mode;
    int64_t step;
    double grad_scale;
} om_adam_hparams_d;

om_status *om_adam_step_d(const om_adam_hparams_d *h, int n, om_tensor *params, const om_tensor *grads,
                          om_tensor *exp_avg, om_tensor *exp_avg_sq);

/* One pass over n gradients: *found_inf = 1 if any element is inf/NaN; *sq_norm = sum of
 * squares (fp64 accumulation) of the gradients after dividing by scale. */
om_status *om_grads_check_and_norm(int n, const om_tensor *grads, float scale, int *found_inf, double *sq_norm);

/* grads *= factor, in place (unscale and clip in one pass). */
om_status *om_grads_scale(int n, om_tensor *grads, float factor);

/* dst = src * factor per tensor pair (each f32, f16 or bf16; same element count): an fp16
 * gradient unscaled (and clipped) into its fp32 master gradient in one pass. */
om_status *om_grads_copy_scaled(int n, const om_tensor *src, om_tensor *dst, float factor);

/* CUDA tensors: every function above takes tensors of one device, CPU or CUDA (all of a call's
 * tensors on the same one). The _on forms enqueue CUDA work on stream (a cudaStream_t, e.g.
 * torch's current stream; NULL = the legacy default stream), which the forms above use.
 * om_grads_check_and_norm waits for its two results on the host: the one call that does. */
om_status *om_adam_step_d_on(const om_adam_hparams_d *h, int n, om_tensor *params, const om_tensor *grads,
                             om_tensor *exp_avg, om_tensor *exp_avg_sq, void *stream);
om_status *om_grads_check_and_norm_on(int n, const om_tensor *grads, float scale, int *found_inf, double *sq_norm,
                                      void *stream);
om_status *om_grads_scale_on(int n, om_tensor *grads, float factor, void *stream);
om_status *om_grads_copy_scaled_on(int n, const om_tensor *src, om_tensor *dst, float factor, void *stream);

/* Threads the optimizer kernels split large calls over (the engine's pool; small calls stay on
 * the calling thread): the pool's count, capped by om_options.optim_num_threads
 * (ORTMOD_NUM_THREADS, ortmod_options.h). set(n) sets that cap (clamped to 0..64; 0: no cap). */
int  om_optim_num_threads(void);
void om_optim_set_num_threads(int n);

#ifdef __cplusplus
}
#endif
#endif
