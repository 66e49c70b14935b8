/* device.c — loading the CUDA execution provider and the device parts of a plan.
 *
 * ortmod/libortmod_cuda.so is looked for next to the module that holds this code (the
 * ortmod._C extension, found with dladdr), or where om_options.cuda_library (ORTMOD_CUDA_LIBRARY) points. It is loaded
 * once, on the first CUDA tensor, and never unloaded (DLPack deleters may call into it until
 * the process exits). A CPU-only process never loads it.
 */
#include "exec/device.h"
#include "exec/provider.h"
#include "core/options.h"
#include "plan/plan.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const om_cuda_provider *cuda_provider;
static char cuda_error[1024];

static void cuda_load(void) {
    char path[4096];
    om_options conf;
    om_status_free(om_options_get(&conf));   /* a bad variable is om_engine_create's to report */
    om_options_note_cuda_loaded();
    if (conf.cuda_library[0]) {
        snprintf(path, sizeof path, "%s", conf.cuda_library);
    } else {
        Dl_info info;
        if (!dladdr((void *)&cuda_load, &info) || !info.dli_fname) {
            snprintf(cuda_error, sizeof cuda_error, "cannot locate the ortmod library to find libortmod_cuda.so");
            return;
        }
        snprintf(path, sizeof path, "%s", info.dli_fname);
        char *slash = strrchr(path, '/');
        if (slash) slash[1] = '\0';
        else path[0] = '\0';
        strncat(path, "libortmod_cuda.so", sizeof path - strlen(path) - 1);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cuda_error, sizeof cuda_error,
                 "the CUDA execution provider is not available: %s (build it with `make cuda` on a machine with "
                 "the CUDA toolkit)", dlerror());
        return;
    }
    om_cuda_provider_get_fn get = (om_cuda_provider_get_fn)dlsym(h, "om_cuda_provider_get");
    const om_cuda_provider *p = get ? get() : NULL;
    if (!p) {
        snprintf(cuda_error, sizeof cuda_error, "%s has no om_cuda_provider_get", path);
        return;
    }
    if (p->abi != OM_CUDA_ABI) {
        snprintf(cuda_error, sizeof cuda_error, "%s has provider ABI %d, this engine wants %d: rebuild it (make cuda)",
                 path, p->abi, OM_CUDA_ABI);
        return;
    }
    static const om_cuda_host host = {
        .abi = OM_CUDA_ABI, .error = om_error, .attr_int = om_attr_int, .attr_float = om_attr_float,
        .attr_string = om_attr_string, .attr_ints = om_attr_ints, .attr_strings = om_attr_strings,
        .attention_materialized = om_options_cuda_attention_materialized,
    };
    om_status *st = p->init(&host);
    if (st) {
        snprintf(cuda_error, sizeof cuda_error, "the CUDA execution provider failed to start: %s", om_status_message(st));
        om_status_free(st);
        return;
    }
    cuda_provider = p;
}

om_status *om_cuda_get(const om_cuda_provider **out) {
    pthread_once(&cuda_once, cuda_load);
    *out = cuda_provider;
    if (!cuda_provider) return om_error(OM_INVALID_ARGUMENT, "%s", cuda_error);
    return NULL;
}

int om_cuda_loaded(void) { return cuda_provider != NULL; }

void om_device_free_data(om_device_type device, int device_id, void *data, void *stream) {
    if (!data) return;
    if (device == OM_CPU) om_free(data);
    else if (cuda_provider) cuda_provider->free(device_id, data, stream);
}

/* ---- plans ------------------------------------------------------------------------
 * A CUDA plan's device part: om_plan holds it as an opaque pointer, so that the planner
 * depends on no provider. */
struct om_device_plan {
    om_cuda_kernel_fn *kernel;    /* per node id, its provider kernel */
    void **dev_const;             /* per value, the device copy of a CONST value's data (uploaded
                                     once at plan time; NULL where nothing reads it) */
};

om_status *om_device_plan_prepare(const om_graph *g, om_plan *p) {
    if (p->device != OM_CUDA) return NULL;
    const om_cuda_provider *cu;
    OM_TRY(om_cuda_get(&cu));
    struct om_device_plan *d = p->device_data = calloc(1, sizeof *d);
    if (!d) return om_error(OM_OUT_OF_MEMORY, "out of memory building a CUDA plan");
    d->kernel = calloc((size_t)g->n_nodes + 1, sizeof(om_cuda_kernel_fn));
    d->dev_const = calloc((size_t)p->n_values + 1, sizeof(void *));
    char *read = calloc((size_t)p->n_values + 1, 1);
    if (!d->kernel || !d->dev_const || !read) {
        free(read);
        return om_error(OM_OUT_OF_MEMORY, "out of memory building a CUDA plan");
    }
    /* every node that runs needs a kernel: a missing one fails here, naming the op */
    for (int pass = 0; pass < 2; pass++) {
        const int *prog = pass ? p->bwd_prog : p->fwd_prog;
        int n = pass ? p->n_bwd_prog : p->n_fwd_prog;
        for (int s = 0; s < n; s++) {
            const om_node *nd = &g->nodes[prog[s]];
            /* the client runs a callback op, from the host, on device pointers */
            om_cuda_kernel_fn k = nd->op->flags & OM_OP_CALLBACK ? NULL : cu->find_kernel(nd->op->name, nd->op->domain);
            if (!k && !(nd->op->flags & OM_OP_CALLBACK)) {
                free(read);
                return om_error(OM_UNSUPPORTED_OP, "op %s%s%s (node '%s') has no CUDA kernel yet; run the model on "
                                "the CPU, or add the kernel in cuda/", nd->op->domain[0] ? nd->op->domain : "",
                                nd->op->domain[0] ? "." : "", nd->op->name, nd->name ? nd->name : "");
            }
            d->kernel[prog[s]] = k;
            for (int i = 0; i < nd->n_in; i++)
                if (nd->in[i] >= 0) read[nd->in[i]] = 1;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) read[g->outputs[i]] = 1;
    if (g->grad_of_input)
        for (int i = 0; i < g->n_inputs; i++)
            if (g->grad_of_input[i] >= 0) read[g->grad_of_input[i]] = 1;
    om_status *st = NULL;
    /* constants the device reads: uploaded once (an alias of a constant reads its root) */
    for (int v = 0; v < p->n_values && !st; v++) {
        if (!read[v]) continue;
        int r = v;
        while (p->storage[r] == OM_ST_ALIAS) r = p->alias_of[r];
        if (p->storage[r] != OM_ST_CONST || d->dev_const[r] || !p->vt[r].data) continue;
        size_t nb = om_tensor_nbytes(&p->vt[r]);
        if ((st = cu->alloc_static(p->device_id, nb ? nb : 1, &d->dev_const[r]))) break;
        if (nb) st = cu->memcpy_sync(p->device_id, d->dev_const[r], p->vt[r].data, nb, OM_COPY_H2D);
    }
    free(read);
    return st;   /* scratch lives in each call's frame, from the provider's pool */
}

void om_device_plan_release(om_plan *p) {
    struct om_device_plan *d = p->device_data;
    if (!d) return;
    const om_cuda_provider *cu = cuda_provider;
    if (cu)
        for (int v = 0; d->dev_const && v < p->n_values; v++)
            if (d->dev_const[v]) cu->free_static(p->device_id, d->dev_const[v]);
    free(d->dev_const);
    free(d->kernel);
    free(d);
    p->device_data = NULL;
}

om_cuda_kernel_fn om_device_plan_kernel(const om_plan *p, int node) { return p->device_data->kernel[node]; }

void *om_device_plan_const(const om_plan *p, int v) { return p->device_data->dev_const[v]; }

/* ---- the CUDA provider as an om_provider (exec/provider.h) ---------------------------
 * An adapter over the loaded om_cuda_provider: its shared-object ABI (OM_CUDA_ABI) is not
 * the engine's table, so the .cu files do not change when the engine's interface does. */
static om_status *cuda_ready(void) {
    const om_cuda_provider *cu;
    return om_cuda_get(&cu);
}

static void *cuda_alloc(int device_id, size_t nbytes, void *stream) {
    void *p = NULL;
    om_status *st = cuda_provider->alloc(device_id, nbytes ? nbytes : 1, stream, &p);
    if (st) { om_status_free(st); return NULL; }
    return p;
}

static void cuda_release(int device_id, void *p, void *stream) {
    if (p && cuda_provider) cuda_provider->free(device_id, p, stream);
}

static om_status *cuda_zero(int device_id, void *p, size_t nbytes, void *stream) {
    return nbytes ? cuda_provider->memset_async(device_id, p, 0, nbytes, stream) : NULL;
}

static om_status *cuda_copy(int device_id, void *dst, const void *src, size_t nbytes, void *stream) {
    return cuda_provider->memcpy_async(device_id, dst, src, nbytes, OM_COPY_D2D, stream);
}

_Static_assert(sizeof(om_cuda_exec) <= sizeof(((om_run *)0)->state), "om_run.state must hold an om_cuda_exec");

static om_status *cuda_begin(om_run *r) {
    om_cuda_exec *x = (om_cuda_exec *)r->state.p;
    memset(x, 0, sizeof *x);
    return cuda_provider->exec_for(r->plan->device_id, r->stream, x);
}

static om_status *cuda_run_node(const om_run *r, int node, om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    if (n->op->flags & OM_OP_CALLBACK) return n->op->cpu(ctx);   /* the client runs it, from the host */
    const om_plan *p = r->plan;
    const void *in_host[64];
    om_cuda_exec x = *(const om_cuda_exec *)r->state.p;
    for (int i = 0; i < n->n_in; i++)   /* host copies of what was known at plan time */
        in_host[i] = n->in[i] >= 0 && p->storage[n->in[i]] == OM_ST_CONST ? p->vt[n->in[i]].data : NULL;
    x.in_host = in_host;
    return p->device_data->kernel[node](ctx, &x);
}

const om_provider om_cuda_adapter = {
    .name = "cuda", .device = OM_CUDA, .shape_suffix = " (cuda)", .host_frames = 0, .ready = cuda_ready, .alloc = cuda_alloc,
    .release = cuda_release, .zero = cuda_zero, .copy = cuda_copy, .begin = cuda_begin, .run_node = cuda_run_node,
    .plan_prepare = om_device_plan_prepare, .plan_release = om_device_plan_release, .plan_const = om_device_plan_const,
};

/* ---- the CUDA provider's optimizer passes (exec/optim_provider.h) ---------------------- */
static om_status *cuda_adam_step(int device, void *stream, const om_adam_consts *c, int n, om_tensor *params,
                                 const om_tensor *grads, om_tensor *exp_avg, om_tensor *exp_avg_sq) {
    return cuda_provider->adam_step(device, stream, c, n, params, grads, exp_avg, exp_avg_sq);
}

static om_status *cuda_grads_copy_scaled(int device, void *stream, int n, const om_tensor *src, om_tensor *dst,
                                         float factor) {
    return cuda_provider->grads_copy_scaled(device, stream, n, src, dst, factor);
}

static om_status *cuda_grads_check_and_norm(int device, void *stream, int n, const om_tensor *grads, int *found_inf,
                                            double *sq_sum) {
    return cuda_provider->grads_check_and_norm(device, stream, n, grads, found_inf, sq_sum);
}

static const om_optim_provider cuda_optim = {
    .name = "cuda", .adam_step = cuda_adam_step, .grads_copy_scaled = cuda_grads_copy_scaled,
    .grads_check_and_norm = cuda_grads_check_and_norm,
};

om_status *om_optim_provider_get(om_device_type device, const om_optim_provider **out) {
    *out = NULL;
    switch (device) {
    case OM_CPU: return NULL;
    case OM_CUDA: {
        const om_cuda_provider *cu;
        OM_TRY(om_cuda_get(&cu));
        *out = &cuda_optim;
        return NULL;
    }
    default: return om_error(OM_INVALID_ARGUMENT, "the optimizer takes no tensors of device type %d", (int)device);
    }
}

/* ---- the providers, by device type ---------------------------------------------------- */
const om_provider *om_provider_find(om_device_type device) {
    switch (device) {
    case OM_CPU: return &om_cpu_provider;
    case OM_CUDA: return &om_cuda_adapter;
    default: return NULL;
    }
}

om_status *om_provider_get(om_device_type device, const om_provider **out) {
    const om_provider *p = *out = om_provider_find(device);
    if (!p) return om_error(OM_INVALID_ARGUMENT, "unknown device type %d", (int)device);
    return p->ready();
}
