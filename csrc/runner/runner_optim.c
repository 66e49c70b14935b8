/* runner_optim.c — the runner's own optimizers (SGD, Lamb; Adam/AdamW are the engine's
 * om_adam_step) and the learning-rate schedules. fp32 parameters and gradients. */
#include "runner/runner_internal.h"

#include <math.h>
#include <strings.h>

om_status *rn_optimizer_parse(const char *name, rn_optimizer *opt, int *default_adam_mode) {
    *default_adam_mode = OM_ADAM_L2_REGULARIZATION;
    if (!strcasecmp(name, "SGD")) *opt = RN_SGD;
    else if (!strcasecmp(name, "Adam")) *opt = RN_ADAM;
    else if (!strcasecmp(name, "AdamW")) { *opt = RN_ADAM; *default_adam_mode = OM_ADAMW_TRANSFORMERS; }
    else if (!strcasecmp(name, "Lamb")) *opt = RN_LAMB;
    else return om_error(OM_INVALID_ARGUMENT, "optimizer: unknown optimizer '%s' (expected SGD, Adam, AdamW or Lamb)", name);
    return NULL;
}

om_status *om_lr_warmup_mode_parse(const char *name, om_lr_warmup_mode *out) {
    static const char *names[] = {"None", "Constant", "Cosine", "Linear", "Poly"};
    for (int i = 0; i < 5; i++)
        if (name && !strcasecmp(name, names[i])) { *out = (om_lr_warmup_mode)i; return NULL; }
    return om_error(OM_INVALID_ARGUMENT, "warmup_mode: unknown mode '%s' (expected None, Constant, Cosine, Linear or Poly)",
                    name ? name : "");
}

float om_lr_schedule(om_lr_warmup_mode mode, float warmup_ratio, float poly_power, int64_t update, int64_t total) {
    if (mode == OM_WARMUP_NONE || total <= 0) return 1.0f;
    const double p = (double)update / (double)total, w = warmup_ratio;
    if (p < w) return (float)(p / w);
    switch (mode) {
    case OM_WARMUP_CONSTANT: return 1.0f;
    case OM_WARMUP_COSINE: return (float)(0.5 * (1.0 + cos(M_PI * p)));
    case OM_WARMUP_LINEAR: return w < 1 ? (float)fmax((1.0 - p) / (1.0 - w), 0.0) : 0.0f;
    case OM_WARMUP_POLY: {
        const double rest = w < 1 ? fmax((1.0 - p) / (1.0 - w), 0.0) : 0.0;
        const double end = 1e-7;   /* as a fraction of the peak rate */
        return (float)((1.0 - end) * pow(rest, poly_power) + end);
    }
    default: return 1.0f;
    }
}

static om_status *check_f32(const char *opt, int i, const om_tensor *p, const om_tensor *g) {
    if (p->dtype != OM_F32 || g->dtype != OM_F32)
        return om_error(OM_INVALID_ARGUMENT, "%s: tensor %d is %s with a %s gradient (fp32 only)", opt, i,
                        om_dtype_name(p->dtype), om_dtype_name(g->dtype));
    if (om_tensor_numel(p) != om_tensor_numel(g))
        return om_error(OM_INVALID_ARGUMENT, "%s: tensor %d and its gradient differ in size", opt, i);
    return NULL;
}

// params, grads, momentum_buf (may be NULL when momentum == 0): fp32, any shape
om_status *rn_sgd_step(int n, om_tensor *params, const om_tensor *grads, om_tensor *momentum_buf, float lr,
                       float momentum, float weight_decay) {
    for (int i = 0; i < n; i++) {
        OM_TRY(check_f32("SGD", i, &params[i], &grads[i]));
        float *restrict w = params[i].data;
        const float *restrict g = grads[i].data;
        float *restrict m = momentum != 0 && momentum_buf ? momentum_buf[i].data : NULL;
        const int64_t cnt = om_tensor_numel(&params[i]);
        for (int64_t k = 0; k < cnt; k++) {
            float d = g[k] + weight_decay * w[k];
            if (m) d = m[k] = momentum * m[k] + d;
            w[k] -= lr * d;
        }
    }
    return NULL;
}

/* Lamb (You et al. 2019), per tensor: u = m̂ / (sqrt(v̂) + eps) + wd * w,
 * w -= lr * (||w|| / ||u||) * u; the trust ratio is 1 when either norm is 0. */
om_status *rn_lamb_step(int n, om_tensor *params, const om_tensor *grads, om_tensor *m, om_tensor *v, float lr,
                        float beta1, float beta2, float eps, float weight_decay, int bias_correction, int64_t step) {
    const double bc1 = bias_correction ? 1.0 - pow(beta1, (double)step) : 1.0;
    const double bc2 = bias_correction ? 1.0 - pow(beta2, (double)step) : 1.0;
    for (int i = 0; i < n; i++) {
        OM_TRY(check_f32("Lamb", i, &params[i], &grads[i]));
        float *restrict w = params[i].data, *restrict mm = m[i].data, *restrict vv = v[i].data;
        const float *restrict g = grads[i].data;
        const int64_t cnt = om_tensor_numel(&params[i]);
        double wn = 0, un = 0;
        for (int64_t k = 0; k < cnt; k++) {
            mm[k] = beta1 * mm[k] + (1 - beta1) * g[k];
            vv[k] = beta2 * vv[k] + (1 - beta2) * g[k] * g[k];
            const double u = (mm[k] / bc1) / (sqrt(vv[k] / bc2) + eps) + weight_decay * w[k];
            wn += (double)w[k] * w[k];
            un += u * u;
        }
        const double ratio = wn > 0 && un > 0 ? sqrt(wn) / sqrt(un) : 1.0;
        for (int64_t k = 0; k < cnt; k++) {
            const double u = (mm[k] / bc1) / (sqrt(vv[k] / bc2) + eps) + weight_decay * w[k];
            w[k] -= (float)(lr * ratio * u);
        }
    }
    return NULL;
}
