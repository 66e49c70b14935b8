/* engine.c — the public API: compile once, plan per shape set, run forward and backward
 * through the provider of the inputs' device (exec/provider.h: the CPU's, linked in, or a
 * device's). Nothing here asks which device that is. */
#include "autodiff/autodiff.h"
#include "core/options.h"
#include "exec/provider.h"
#include "ops/gemm.h"
#include "passes/pass.h"
#include "plan/backward_variants.h"
#include "plan/plan.h"
#include "plan/recompute.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The plan cache: one plan per input shape set, found by a hash of the shapes, evicted least
 * recently used past max_plans. A stash points at its plan's slot; an evicted plan that a
 * stash still uses is freed with the last such stash. */
typedef struct plan_slot {
    om_plan *plan;
    uint64_t key;                       /* plan_key() of the shapes (and counts) it was built for */
    int refs;                           /* live stashes on it */
    int cached;                         /* 0: evicted, freed when refs reaches 0 */
    struct plan_slot *hnext;            /* its hash bucket's chain */
    struct plan_slot *newer, *older;    /* the LRU list */
} plan_slot;


struct om_engine {
    om_graph *g;
    bool *grad_inputs;
    int has_backward;
    om_log_level log_level;
    om_log_fn log;
    void *log_user;
    uint64_t seed;
    uint64_t calls;             /* forward calls so far: varies the random streams */
    plan_slot **buckets;        /* n_buckets (a power of two) chains */
    plan_slot *newest, *oldest;
    int n_buckets, max_plans;
    long n_planned, n_evicted;  /* plans built, plans evicted, since the engine was made */
    om_pass_log pass_log;
    int n_exported_nodes;       /* forward nodes as imported, before any pass */
    int n_optimized_nodes;      /* forward nodes after the forward passes */
    char *report;               /* last om_engine_report_json result */
    int memory_opt_level, n_recomputed;
    int n_plans;                /* in the cache */
    /* CPU: one frame for all plans. A forward takes the spare (when it is large enough for its
     * plan) and its stash owns it until om_stash_free gives it back; a forward that finds none
     * (another forward's stash holds it) makes its own. Of the buffers given back, one stays as
     * the spare: the largest, as long as it is no larger than the largest cached plan's frame
     * (max_frame), its pages handed back to the system (om_release_pages) so that only its
     * address is kept. Plans hold no frame, in the cache or evicted. */
    void *spare_frame;
    size_t spare_bytes;         /* its capacity */
    size_t max_frame;           /* the largest stash_size of the cached CPU plans */
    pthread_mutex_t lock;       /* plans' arenas are shared: one call at a time */
    /* profiling (CPU): wall time and calls per (op, phase); NULL when off. Indexed by
     * prof_op[node] * 2 + (node is backward). */
    struct om_op_time { double ns, gemm_ns; long calls; } *prof;   /* gemm_ns: of ns, inside om_gemm */
    int *prof_op;
    /* A call's bookkeeping, reused call after call (every call runs under lock, so one set
     * serves them all; a step allocates nothing for it): where each value's bytes are and
     * which OUT values went to the caller (scratch_values entries each), and backward's
     * absent output gradients and their zeros (n_outputs + 1 each, made with the engine). */
    void **scratch_data;
    char *scratch_given;
    size_t scratch_values;
    void **scratch_zeros;
    char *scratch_absent;
    /* data-dependent nodes (plan/plan.h: segments): d_1..d_n_dd and each node's segment */
    int n_dd;
    int *dd_nodes, *seg_of_node;
};

struct om_stash {
    om_engine *eng;
    om_plan *plan;
    plan_slot *slot;            /* holds a reference on the plan */
    void *buf;
    size_t buf_bytes;           /* CPU: buf's capacity (the engine's frame may exceed this plan's) */
    om_tensor *inputs;          /* views of the forward's inputs (kept alive by keepalive) */
    void **keepalive;
    om_release_fn release;
    int n_inputs;
    int used;
    void *stream;               /* devices: the stream the forward ran on (the stash is ordered on it) */
    /* a segmented call (plan.h): the earlier segments' plans (a reference each) and frames, and
     * where every value was (what the last plan reads as OM_ST_EXTERN); 0 and NULL otherwise */
    int n_prev;
    plan_slot **prev_slot;
    void **prev_buf;
    void **ext_data;
};

static void logf_(om_engine *e, om_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void logf_(om_engine *e, om_log_level lvl, const char *fmt, ...) {
    if (!e->log || lvl < e->log_level) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    e->log(e->log_user, lvl, buf);
}

om_engine_options om_engine_default_options(void) {
    om_engine_options o;
    memset(&o, 0, sizeof o);
    o.log_level = OM_LOG_WARNING;
    o.memory_opt_level = -1;
    o.max_plans = 0;
    return o;
}

/* The importer checked every imported node against its op's attrs list (ops/op.h); the
 * nodes the passes and gradient rules made or rewrote must pass the same check: an attribute
 * set on a node whose op ignores it would be a silently dropped meaning, an ortmod bug. */
static om_status *check_compiled_attrs(const om_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        om_status *st = om_node_check_attrs(&g->nodes[i]);
        if (!st) continue;
        om_status *bug = om_error(OM_INTERNAL, "%s: set by ortmod's own passes or gradient rules (a bug in ortmod)",
                                  om_status_message(st));
        om_status_free(st);
        return bug;
    }
    return NULL;
}

om_status *om_engine_create(const void *onnx_bytes, size_t nbytes, const om_engine_options *opt,
                            om_engine **out) {
    *out = NULL;
    om_engine_options dflt = om_engine_default_options();
    if (!opt) opt = &dflt;
    om_engine *e = calloc(1, sizeof *e);
    if (!e) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&e->lock, NULL);
    e->log = opt->log;
    e->log_user = opt->log_user;
    e->log_level = opt->log_level;
    e->seed = opt->seed;
    om_status *st = NULL;
    /* the environment's settings (read once, ortmod_options.h): a bad variable refuses every engine */
    om_options conf;
    if ((st = om_options_get(&conf))) goto fail;
    e->max_plans = opt->max_plans ? opt->max_plans : conf.max_cached_plans;
    if (e->max_plans < 0 || e->max_plans > 1 << 20) {
        st = om_error(OM_INVALID_ARGUMENT, "max_plans: %d is not in 1..%d (0: the default)", e->max_plans, 1 << 20);
        goto fail;
    }
    for (e->n_buckets = 16; e->n_buckets < 2 * e->max_plans; e->n_buckets *= 2) {}
    e->buckets = calloc((size_t)e->n_buckets, sizeof(plan_slot *));
    if (!e->buckets) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto fail; }
    st = om_graph_import_onnx(onnx_bytes, nbytes, &e->g);
    if (st) goto fail;
    om_graph *g = e->g;
    g->callback = opt->callback;
    g->callback_user = opt->callback_user;
    if (opt->grad_inputs && opt->n_grad_inputs != g->n_inputs) {
        st = om_error(OM_INVALID_ARGUMENT, "grad_inputs has %d flags but the model has %d inputs", opt->n_grad_inputs,
                      g->n_inputs);
        goto fail;
    }
    e->grad_inputs = calloc((size_t)g->n_inputs + 1, sizeof(bool));
    e->scratch_zeros = calloc((size_t)g->n_outputs + 1, sizeof(void *));
    e->scratch_absent = calloc((size_t)g->n_outputs + 1, 1);
    if (!e->grad_inputs || !e->scratch_zeros || !e->scratch_absent) {
        st = om_error(OM_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    for (int i = 0; opt->grad_inputs && i < g->n_inputs; i++) {
        e->grad_inputs[i] = opt->grad_inputs[i];
        e->has_backward |= opt->grad_inputs[i];
    }
    logf_(e, OM_LOG_INFO, "imported %d nodes, %d inputs, %d outputs (opset %d)", g->n_nodes, g->n_inputs,
          g->n_outputs, g->opset);
    e->n_exported_nodes = g->n_nodes;
    if ((st = om_run_passes(g, OM_PASS_FORWARD, conf.disable_passes, &e->pass_log))) goto fail;
    e->n_optimized_nodes = g->n_nodes;
    logf_(e, OM_LOG_INFO, "forward passes: %d nodes -> %d", e->n_exported_nodes, g->n_nodes);
    if (e->has_backward) {
        if ((st = om_autodiff(g, e->grad_inputs))) goto fail;
        logf_(e, OM_LOG_INFO, "autodiff added %d backward nodes", g->n_nodes - g->n_fwd_nodes);
        if ((st = om_run_passes(g, OM_PASS_JOINT, conf.disable_passes, &e->pass_log))) goto fail;
        logf_(e, OM_LOG_INFO, "joint passes: %d forward + %d backward nodes", g->n_fwd_nodes, g->n_nodes - g->n_fwd_nodes);
        int level = opt->memory_opt_level < 0 ? conf.memory_opt_level : opt->memory_opt_level;
        if (level < 0 || level > 2) {
            st = om_error(OM_INVALID_ARGUMENT, "memory optimization level %d is not 0, 1 or 2", level);
            goto fail;
        }
        int n_rc = 0;
        if ((st = om_recompute(g, level, &n_rc))) goto fail;
        e->memory_opt_level = level;
        e->n_recomputed = n_rc;
        if (level) logf_(e, OM_LOG_INFO, "memory optimization level %d: %d forward nodes recomputed in backward", level, n_rc);
    } else {
        g->n_fwd_nodes = g->n_nodes;
    }
    if ((st = check_compiled_attrs(g))) goto fail;
    e->dd_nodes = malloc(sizeof(int) * ((size_t)g->n_nodes + 1));
    e->seg_of_node = malloc(sizeof(int) * ((size_t)g->n_nodes + 1));
    if (!e->dd_nodes || !e->seg_of_node) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto fail; }
    if ((st = om_plan_segments(g, e->seg_of_node, e->dd_nodes, &e->n_dd))) goto fail;
    if (e->n_dd) logf_(e, OM_LOG_INFO, "%d data-dependent nodes: each call runs in %d planned segments", e->n_dd, e->n_dd + 1);
    if (conf.profile) om_engine_set_profiling(e, true);
    *out = e;
    return NULL;
fail:
    om_engine_free(e);
    return st;
}

/* A plan and its device part: the planner builds the device-neutral plan, its device's
 * provider (exec/provider.h) adds, and frees, what it needs to run it. */
static void free_plan(om_plan *p) {
    if (!p) return;
    const om_provider *pv = om_provider_find(p->device);
    if (pv && pv->plan_release) pv->plan_release(p);
    om_plan_free(p);
}

/* "" or " (cuda)": after a shape in a message */
static const char *device_suffix(om_device_type d) {
    const om_provider *pv = om_provider_find(d);
    return pv ? pv->shape_suffix : " (unknown device)";
}

/* 1 when plan p's frames are host memory (the engine's shared frame: cpu_frame_take). */
static int host_frames(const om_plan *p) { return om_provider_find(p->device)->host_frames; }

static om_status *build_plan(const om_graph *g, const om_tensor *inputs, int n, bool has_backward,
                             const int64_t *extents, int n_known, om_plan **out) {
    OM_TRY(om_plan_build(g, inputs, n, has_backward, extents, n_known, out));
    const om_provider *pv = om_provider_find((*out)->device);
    om_status *st = pv && pv->plan_prepare ? pv->plan_prepare(g, *out) : NULL;
    if (st) {
        free_plan(*out);
        *out = NULL;
    }
    return st;
}

void om_engine_free(om_engine *e) {
    if (!e) return;
    for (plan_slot *sl = e->newest, *next; sl; sl = next) {   /* stashes never outlive their engine */
        next = sl->older;
        free_plan(sl->plan);
        free(sl);
    }
    free(e->buckets);
    om_free(e->spare_frame);
    om_pass_log_free(&e->pass_log);
    free(e->report);
    om_graph_free(e->g);
    free(e->grad_inputs);
    if (e->prof) om_gemm_timing(false);
    free(e->prof);
    free(e->prof_op);
    free(e->scratch_data);
    free(e->scratch_given);
    free(e->scratch_zeros);
    free(e->scratch_absent);
    free(e->dd_nodes);
    free(e->seg_of_node);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

int om_engine_num_inputs(const om_engine *e) { return e->g->n_inputs; }
int om_engine_num_outputs(const om_engine *e) { return e->g->n_outputs; }
const char *om_engine_input_name(const om_engine *e, int i) { return e->g->values[e->g->inputs[i]].name; }
const char *om_engine_output_name(const om_engine *e, int i) { return e->g->values[e->g->outputs[i]].name; }
om_dtype om_engine_input_dtype(const om_engine *e, int i) { return e->g->values[e->g->inputs[i]].dtype; }
om_dtype om_engine_output_dtype(const om_engine *e, int i) { return e->g->values[e->g->outputs[i]].dtype; }
int om_engine_output_differentiable(const om_engine *e, int i) {
    return e->has_backward && e->g->grad_of_output && e->g->grad_of_output[i] >= 0;
}

om_status *om_engine_export_onnx(const om_engine *e, const char *stage, void **bytes, size_t *n) {
    om_graph view = *e->g;   /* shallow: same nodes and values, other ends */
    int *ins = NULL, *outs = NULL;
    om_status *st;
    if (strcmp(stage, "optimized") == 0) {
        view.n_nodes = e->g->n_fwd_nodes;
        st = om_graph_export_onnx(&view, "ortmod_optimized", bytes, n);
    } else if (strcmp(stage, "execution") == 0) {
        const om_graph *g = e->g;
        ins = malloc(sizeof(int) * (size_t)(g->n_inputs + g->n_outputs + 1));
        outs = malloc(sizeof(int) * (size_t)(g->n_outputs + g->n_inputs + 1));
        if (!ins || !outs) { free(ins); free(outs); return om_error(OM_OUT_OF_MEMORY, "out of memory"); }
        view.n_inputs = view.n_outputs = 0;
        for (int i = 0; i < g->n_inputs; i++) ins[view.n_inputs++] = g->inputs[i];
        for (int i = 0; i < g->n_outputs; i++) {
            outs[view.n_outputs++] = g->outputs[i];
            if (e->has_backward && g->grad_of_output[i] >= 0) ins[view.n_inputs++] = g->grad_of_output[i];
        }
        for (int i = 0; e->has_backward && i < g->n_inputs; i++)
            if (g->grad_of_input[i] >= 0) outs[view.n_outputs++] = g->grad_of_input[i];
        view.inputs = ins;
        view.outputs = outs;
        st = om_graph_export_onnx(&view, "ortmod_execution", bytes, n);
    } else {
        return om_error(OM_INVALID_ARGUMENT, "unknown stage '%s' (expected 'optimized' or 'execution')", stage);
    }
    free(ins);
    free(outs);
    return st;
}

uint64_t om_engine_rng_offset(const om_engine *e) { return e->calls; }
void om_engine_set_rng_offset(om_engine *e, uint64_t offset) {
    pthread_mutex_lock(&e->lock);
    e->calls = offset;
    pthread_mutex_unlock(&e->lock);
}

/* ---- running ---------------------------------------------------------------------- */

static om_status *check_inputs(const om_engine *e, const om_tensor *inputs, int n) {
    const om_graph *g = e->g;
    if (n != g->n_inputs)
        return om_error(OM_INVALID_ARGUMENT, "the model takes %d inputs, got %d", g->n_inputs, n);
    for (int i = 0; i < n; i++) {
        const om_value *v = &g->values[g->inputs[i]];
        if (inputs[i].dtype != v->dtype)
            return om_error(OM_INVALID_ARGUMENT, "input '%s' has dtype %s but the model was compiled for %s", v->name,
                            om_dtype_name(inputs[i].dtype), om_dtype_name(v->dtype));
        const om_provider *pv = om_provider_find(inputs[i].device), *pv0 = om_provider_find(inputs[0].device);
        if (!pv) return om_error(OM_INVALID_ARGUMENT, "input '%s' is on an unknown device", v->name);
        if (inputs[i].device != inputs[0].device ||
            (!pv->host_frames && inputs[i].device_id != inputs[0].device_id))   /* one host; devices by id */
            return om_error(OM_INVALID_ARGUMENT, "input '%s' is on %s:%d but input '%s' is on %s:%d: every input "
                            "must be on one device", v->name, pv->name, inputs[i].device_id,
                            g->values[g->inputs[0]].name, pv0 ? pv0->name : "?", inputs[0].device_id);
        if (inputs[i].rank < 0 || inputs[i].rank > OM_MAX_RANK)
            return om_error(OM_INVALID_ARGUMENT, "input '%s' has rank %d (max %d)", v->name, inputs[i].rank, OM_MAX_RANK);
        if (!inputs[i].data && om_tensor_numel(&inputs[i]) > 0)
            return om_error(OM_INVALID_ARGUMENT, "input '%s' has no data", v->name);
    }
    if (n) {
        const om_provider *pv;
        om_status *st = om_provider_get(inputs[0].device, &pv);
        if (st) return om_error_context(st, "input '%s' is a %s tensor", g->values[g->inputs[0]].name, pv->name);
    }
    return NULL;
}

static uint64_t plan_key(const om_tensor *inputs, int n, const int64_t *extents, int n_known) {
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a over what om_plan_matches compares */
#define MIX(x) (h = (h ^ (uint64_t)(x)) * 0x100000001b3ull)
    MIX(n);
    for (int i = 0; i < n; i++) {
        MIX(inputs[i].dtype);
        MIX(inputs[i].rank);
        for (int d = 0; d < inputs[i].rank; d++) MIX(inputs[i].dims[d]);
    }
    if (n) {
        MIX(inputs[0].device);
        MIX(inputs[0].device_id);
    }
    MIX(n_known);
    for (int i = 0; i < n_known; i++) MIX(extents[i]);
#undef MIX
    return h ^ (h >> 29);
}

static void lru_unlink(om_engine *e, plan_slot *sl) {
    if (sl->newer) sl->newer->older = sl->older;
    else e->newest = sl->older;
    if (sl->older) sl->older->newer = sl->newer;
    else e->oldest = sl->newer;
    sl->newer = sl->older = NULL;
}

static void lru_push_newest(om_engine *e, plan_slot *sl) {
    sl->older = e->newest;
    sl->newer = NULL;
    if (e->newest) e->newest->newer = sl;
    e->newest = sl;
    if (!e->oldest) e->oldest = sl;
}

/* Takes the least recently used plan out of the cache; it is freed now, or with the last
 * stash that still uses it. */
static void evict_oldest(om_engine *e) {
    plan_slot *sl = e->oldest;
    plan_slot **pp = &e->buckets[sl->key & (uint64_t)(e->n_buckets - 1)];
    while (*pp != sl) pp = &(*pp)->hnext;
    *pp = sl->hnext;
    lru_unlink(e, sl);
    sl->cached = 0;
    e->n_plans--;
    e->n_evicted++;
    if (host_frames(sl->plan) && sl->plan->stash_size == e->max_frame) {   /* it may have been the largest */
        e->max_frame = 0;
        for (const plan_slot *o = e->newest; o; o = o->older)
            if (host_frames(o->plan) && o->plan->stash_size > e->max_frame) e->max_frame = o->plan->stash_size;
        if (e->spare_frame && e->spare_bytes > e->max_frame) {   /* no cached plan needs that much */
            om_free(e->spare_frame);
            e->spare_frame = NULL;
            e->spare_bytes = 0;
        }
    }
    if (e->n_evicted == 1)
        logf_(e, OM_LOG_INFO, "plan cache full (%d shape sets): evicting the least recently used; every new shape set "
              "from now on costs a plan (ORTMOD_MAX_CACHED_PLANS sets the limit)", e->max_plans);
    if (!sl->refs) {
        free_plan(sl->plan);
        free(sl);
    }
}

/* Under e->lock. */
/* The plan for these input shapes and, in a segmented graph, segment n_known for these counts. */
static om_status *find_plan(om_engine *e, const om_tensor *inputs, int n, const int64_t *extents, int n_known,
                            plan_slot **out) {
    const uint64_t key = plan_key(inputs, n, extents, n_known);
    plan_slot **bucket = &e->buckets[key & (uint64_t)(e->n_buckets - 1)];
    for (plan_slot *sl = *bucket; sl; sl = sl->hnext)
        if (sl->key == key && om_plan_matches(sl->plan, inputs, n, extents, n_known)) {
            if (e->newest != sl) {
                lru_unlink(e, sl);
                lru_push_newest(e, sl);
            }
            *out = sl;
            return NULL;
        }
    plan_slot *sl = calloc(1, sizeof *sl);
    if (!sl) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    om_status *st = build_plan(e->g, inputs, n, e->has_backward, extents, n_known, &sl->plan);
    if (st) {
        free(sl);
        return st;
    }
    sl->key = key;
    sl->cached = 1;
    sl->hnext = *bucket;
    *bucket = sl;
    lru_push_newest(e, sl);
    e->n_plans++;
    e->n_planned++;
    const om_plan *p = sl->plan;
    if (host_frames(p) && p->stash_size > e->max_frame) e->max_frame = p->stash_size;
    logf_(e, OM_LOG_INFO, "planned shape set %ld (segment %d): %d forward + %d backward kernels, frame %zu bytes "
          "(stash %zu)", e->n_planned, n_known, p->n_fwd_prog, p->n_bwd_prog, p->stash_size, p->stash_value_bytes);
    while (e->n_plans > e->max_plans) evict_oldest(e);   /* never the new one: it is the newest */
    *out = sl;
    return NULL;
}

/* Under e->lock. A CPU frame of at least nbytes: the engine's spare when it is large enough,
 * else a new block (a spare too small for this plan goes: the new one replaces it). */
static void *cpu_frame_take(om_engine *e, size_t nbytes, size_t *cap) {
    if (e->spare_frame && e->spare_bytes >= nbytes) {   /* steady state: the last frame given back */
        void *b = e->spare_frame;
        *cap = e->spare_bytes;
        e->spare_frame = NULL;
        e->spare_bytes = 0;
        return b;
    }
    om_free(e->spare_frame);
    e->spare_frame = NULL;
    e->spare_bytes = 0;
    *cap = nbytes;
    return om_alloc_frame(nbytes);
}

/* Under e->lock. A CPU frame no call uses any more: it becomes the spare, pages released, if it
 * is larger than the spare and no larger than a cached plan needs; else it is freed. */
static void cpu_frame_give_back(om_engine *e, void *buf, size_t cap) {
    if (!buf) return;
    if (cap > e->max_frame || (e->spare_frame && e->spare_bytes >= cap)) {
        om_free(buf);
        return;
    }
    om_free(e->spare_frame);
    om_release_pages(buf, cap, e->memory_opt_level > 0);   /* kept for its address, not its pages */
    e->spare_frame = buf;
    e->spare_bytes = cap;
}

typedef struct frame {          /* where every value's bytes are during one call */
    void **data;
    om_plan *plan;
    const om_provider *pv;      /* the plan's device's (exec/provider.h) */
    char *twin;                 /* host frames: the frame's twin region (fp32 copies for half-precision nodes) */
    char *base;                 /* host frames: the frame's buffer, whose dead pages go back as the call runs */
    int release_now;            /* memory levels >= 1: dead pages leave the resident set at once */
    void *stream;
} frame;

/* CPU: after node k ran, the frame bytes that nothing later in the call touches leave the
 * resident set (plan.h: release_at), as eager frees a saved tensor once backward used it. */
static void release_after(const frame *f, int k) {
    const om_plan *p = f->plan;
    if (!f->base || !p->release_at) return;
    for (int r = p->release_at[k]; r < p->release_at[k + 1]; r++) {
        om_release_pages(f->base + p->release_range[2 * r], p->release_range[2 * r + 1], f->release_now);
    }
}

/* Engine-owned run-time memory: the provider's (host memory, or a device pool ordered on the
 * call's stream). */
static void *frame_alloc(frame *f, size_t nb) { return f->pv->alloc(f->plan->device_id, nb, f->stream); }

static void frame_release(frame *f, void *p) {
    if (p) f->pv->release(f->plan->device_id, p, f->stream);
}

static void *resolve(frame *f, int v) {
    om_plan *p = f->plan;
    while (p->storage[v] == OM_ST_ALIAS) v = p->alias_of[v];
    return f->data[v];
}

/* ---- profiling -------------------------------------------------------------------------
 * Off by default (two clock reads per kernel when on). A device's kernels run asynchronously,
 * so only host kernels (om_provider.host_frames) are timed. */
void om_engine_set_profiling(om_engine *e, bool on) {
    pthread_mutex_lock(&e->lock);
    if (e->prof) om_gemm_timing(false);
    free(e->prof);
    free(e->prof_op);
    e->prof = NULL;
    e->prof_op = NULL;
    if (on) {
        e->prof = calloc((size_t)om_op_count() * 2, sizeof *e->prof);
        e->prof_op = malloc(sizeof(int) * ((size_t)e->g->n_nodes + 1));
        if (!e->prof || !e->prof_op) {
            free(e->prof); free(e->prof_op);
            e->prof = NULL; e->prof_op = NULL;
        } else {
            for (int i = 0; i < e->g->n_nodes; i++) {
                int k = 0;
                while (k < om_op_count() && om_op_at(k) != e->g->nodes[i].op) k++;
                e->prof_op[i] = k < om_op_count() ? k : 0;
            }
            om_gemm_timing(true);
        }
    }
    pthread_mutex_unlock(&e->lock);
}

static void profile_add(om_engine *e, int node, const struct timespec *t0, int64_t gemm0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    struct om_op_time *t = &e->prof[e->prof_op[node] * 2 + (node >= e->g->n_fwd_nodes)];
    const double ns = (double)(t1.tv_sec - t0->tv_sec) * 1e9 + (double)(t1.tv_nsec - t0->tv_nsec);
    const double gemm = (double)(om_gemm_time_ns() - gemm0);
    t->ns += ns;
    t->gemm_ns += gemm < ns ? gemm : ns;   /* the count is process-wide: never more than the kernel took */
    t->calls++;
}

static om_status *run_program(om_engine *e, frame *f, const int *prog, int n_prog, uint64_t call, int training) {
    const om_graph *g = e->g;
    om_tensor in[64], out[64];
    const om_provider *pv = f->pv;
    om_run run = {.plan = f->plan, .stream = f->stream, .twin = f->twin};
    OM_TRY(pv->begin(&run));
    const int timed = e->prof && pv->host_frames;   /* a device's kernels run asynchronously: not timed */
    for (int s = 0; s < n_prog; s++) {
        const om_node *n = &g->nodes[prog[s]];
        for (int i = 0; i < n->n_in; i++) {
            if (n->in[i] < 0) { memset(&in[i], 0, sizeof in[i]); continue; }
            in[i] = f->plan->vt[n->in[i]];
            in[i].data = resolve(f, n->in[i]);
        }
        for (int j = 0; j < n->n_out; j++) {
            if (n->out[j] < 0) { memset(&out[j], 0, sizeof out[j]); continue; }
            out[j] = f->plan->vt[n->out[j]];
            out[j].data = resolve(f, n->out[j]);
        }
        om_kernel_ctx ctx = {.g = g, .node = n, .n_in = n->n_in, .n_out = n->n_out, .in = in, .out = out,
                             .seed = om_rand_u64(e->seed ^ call, (uint64_t)prog[s]), .training = training,
                             .device = f->plan->device, .device_id = f->plan->device_id};
        if (om_kernel_nothing_to_do(&ctx)) continue;   /* empty outputs: its loops would run for nothing */
        om_status *st;
        struct timespec t0;
        int64_t gemm0 = 0;
        if (timed) {
            gemm0 = om_gemm_time_ns();
            clock_gettime(CLOCK_MONOTONIC, &t0);
        }
        st = pv->run_node(&run, prog[s], &ctx);   /* the one indirect call per node */
        if (timed) profile_add(e, prog[s], &t0, gemm0);
        if (st) return om_error_context(st, "%s node '%s'", n->op->name, n->name);
        release_after(f, prog[s]);
    }
    return NULL;
}

/* Hands value v to the caller as t: the OUT buffer itself the first time, a copy otherwise. */
static om_status *hand_out(frame *f, int v, char *given, om_tensor *t) {
    om_plan *p = f->plan;
    *t = p->vt[v];
    t->device = p->device;
    t->device_id = p->device_id;
    if (p->storage[v] == OM_ST_OUT && !given[v]) {
        t->data = f->data[v];
        given[v] = 1;
        return NULL;
    }
    size_t nb = om_tensor_nbytes(t);
    t->data = frame_alloc(f, nb);
    if (!t->data) return om_error(OM_OUT_OF_MEMORY, "out of memory for an output of %zu bytes", nb);
    void *src = resolve(f, v);
    if (!nb) return NULL;
    om_status *st = f->pv->copy(p->device_id, t->data, src, nb, f->stream);
    if (st) { frame_release(f, t->data); t->data = NULL; }
    return st;
}

/* Under e->lock: f's value table and *given (per value: handed to the caller) are e's scratch,
 * zeroed for this call. */
static om_status *frame_init(om_engine *e, frame *f, om_plan *p, void *stream, char **given) {
    f->plan = p;
    f->stream = stream;
    OM_TRY(om_provider_get(p->device, &f->pv));
    const size_t n = (size_t)p->n_values + 1;
    if (n > e->scratch_values) {
        void **data = realloc(e->scratch_data, n * sizeof(void *));
        if (data) e->scratch_data = data;
        char *g = data ? realloc(e->scratch_given, n) : NULL;
        if (g) e->scratch_given = g;
        if (!g) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        e->scratch_values = n;
    }
    f->data = e->scratch_data;
    memset(f->data, 0, n * sizeof(void *));
    *given = e->scratch_given;
    memset(*given, 0, n);
    for (int v = 0; v < p->n_values; v++)
        if (p->storage[v] == OM_ST_CONST) f->data[v] = f->pv->plan_const(p, v);
    return NULL;
}

/* Frees OUT buffers not handed to the caller (after a failure, or unused duplicates). */
static void frame_free(frame *f, const char *given) {
    for (int v = 0; f->data && v < f->plan->n_values; v++)
        if (f->plan->storage[v] == OM_ST_OUT && (!given || !given[v])) frame_release(f, f->data[v]);
}

om_status *om_engine_forward(om_engine *e, const om_tensor *inputs, int n_inputs, bool training,
                             om_tensor *outputs, om_stash **stash_out, void **keepalive, om_release_fn release) {
    return om_engine_forward_stream(e, inputs, n_inputs, training, outputs, stash_out, keepalive, release, NULL);
}

/* Under e->lock: drops a call's or a stash's reference on a plan; an evicted plan goes with the
 * last one. */
static void slot_unref(plan_slot *sl) {
    if (!sl) return;
    if (--sl->refs == 0 && !sl->cached) {
        free_plan(sl->plan);
        free(sl);
    }
}

/* d_(j+1)'s count (plan.h: segments), from its inputs as segment j left them. */
static om_status *count_at_boundary(om_engine *e, frame *f, int j, int64_t *extent) {
    const om_node *n = &e->g->nodes[e->dd_nodes[j]];
    om_tensor in[8];
    if (n->n_in > 8 || !n->op->count)
        return om_error(OM_INTERNAL, "%s node '%s': a data-dependent op without a count", n->op->name, n->name);
    for (int i = 0; i < n->n_in; i++) {
        memset(&in[i], 0, sizeof in[i]);
        if (n->in[i] < 0) continue;
        in[i] = f->plan->vt[n->in[i]];
        in[i].data = resolve(f, n->in[i]);
    }
    om_kernel_ctx ctx = {.g = e->g, .node = n, .n_in = n->n_in, .n_out = n->n_out, .in = in, .extent = -1};
    om_status *st = n->op->count(&ctx, extent);
    return st ? om_error_context(st, "%s node '%s'", n->op->name, n->name) : NULL;
}

om_status *om_engine_forward_stream(om_engine *e, const om_tensor *inputs, int n_inputs, bool training,
                                    om_tensor *outputs, om_stash **stash_out, void **keepalive, om_release_fn release,
                                    void *stream) {
    *stash_out = NULL;
    OM_TRY(check_inputs(e, inputs, n_inputs));
    const om_graph *g = e->g;
    const int m = e->n_dd;   /* segments 0..m (plan.h); m = 0 for most graphs */
    const om_provider *pv0 = n_inputs ? om_provider_find(inputs[0].device) : NULL;
    if (m && pv0 && !pv0->host_frames) {   /* the counts are read on the host between segments */
        const om_node *d = &g->nodes[e->dd_nodes[0]];
        return om_error(OM_UNSUPPORTED_OP, "%s node '%s': an output whose size depends on values (a data-dependent "
                        "shape) runs on the CPU only; the %s provider has no segmented plans yet: run the model on "
                        "the CPU", d->op->name, d->name, pv0->name);
    }
    pthread_mutex_lock(&e->lock);
    om_plan *p = NULL;
    frame f = {0};
    char *given = NULL;
    /* per segment: its plan's slot (referenced through the call), its frame, its frame's capacity;
     * and the counts found so far. One block; for an unsegmented graph, the locals. */
    plan_slot *slot0 = NULL, **slots = &slot0;
    void *buf0 = NULL, **bufs = &buf0;
    size_t cap0 = 0, *caps = &cap0;
    int64_t *ext = NULL;
    void *block = NULL;
    om_status *st = NULL;
    for (int i = 0; i < g->n_outputs; i++) memset(&outputs[i], 0, sizeof(om_tensor));
    if (m) {
        block = calloc((size_t)m + 1, sizeof(plan_slot *) + sizeof(void *) + sizeof(size_t) + sizeof(int64_t));
        if (!block) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
        slots = block;
        bufs = (void **)(slots + m + 1);
        caps = (size_t *)(bufs + m + 1);
        ext = (int64_t *)(caps + m + 1);
    }
    uint64_t call = ++e->calls;
    for (int j = 0; j <= m; j++) {
        if ((st = find_plan(e, inputs, n_inputs, ext, j, &slots[j]))) goto done;
        slots[j]->refs++;   /* a later segment's new plan must not evict it while the call runs */
        p = slots[j]->plan;
        if (j == 0) {
            if ((st = frame_init(e, &f, p, stream, &given))) goto done;
            for (int i = 0; i < n_inputs; i++) f.data[g->inputs[i]] = inputs[i].data;
        } else {   /* the earlier segments' values stay where they are in f.data (OM_ST_EXTERN here) */
            f.plan = p;
            for (int v = 0; v < p->n_values; v++)
                if (p->storage[v] == OM_ST_CONST) f.data[v] = f.pv->plan_const(p, v);
        }
        caps[j] = p->stash_size;
        if (!f.pv->host_frames) bufs[j] = frame_alloc(&f, p->stash_size);
        else if (j == m) bufs[j] = cpu_frame_take(e, p->stash_size, &caps[j]);
        else bufs[j] = om_alloc_frame(p->stash_size ? p->stash_size : 64);   /* an earlier segment's own */
        if (!given || !bufs[j]) {
            st = om_error(OM_OUT_OF_MEMORY, "out of memory for the forward's buffers (%zu bytes for these input "
                          "shapes)", p->stash_size);
            goto done;
        }
        f.twin = (char *)bufs[j] + p->twin_offset;
        if (f.pv->host_frames) f.base = bufs[j];
        f.release_now = e->memory_opt_level > 0;
        for (int v = 0; v < p->n_values; v++) {
            if (p->storage[v] == OM_ST_FWD || p->storage[v] == OM_ST_STASH) f.data[v] = (char *)bufs[j] + p->offset[v];
            else if (p->storage[v] == OM_ST_OUT && g->values[v].producer >= 0 && g->values[v].producer < g->n_fwd_nodes) {
                f.data[v] = frame_alloc(&f, om_tensor_nbytes(&p->vt[v]));
                if (!f.data[v]) {
                    st = om_error(OM_OUT_OF_MEMORY, "out of memory for output '%s' (%zu bytes)", g->values[v].name,
                                  om_tensor_nbytes(&p->vt[v]));
                    goto done;
                }
            }
        }
        if ((st = run_program(e, &f, p->fwd_prog, p->n_fwd_prog, call, training))) goto done;
        /* the outputs this segment computed (the last one: the rest, inputs and constants too) */
        for (int i = 0; i < g->n_outputs; i++) {
            int v = g->outputs[i], k = g->values[v].producer;
            if ((k >= 0 && k < g->n_nodes ? e->seg_of_node[k] : m) != j) continue;
            if ((st = hand_out(&f, v, given, &outputs[i]))) goto done;
        }
        if (j == m) break;
        for (int v = 0; v < p->n_values; v++)   /* later plans read these in place, by address */
            if (p->storage[v] == OM_ST_ALIAS) f.data[v] = resolve(&f, v);
        if ((st = count_at_boundary(e, &f, j, &ext[j]))) goto done;
    }
    if (training && e->has_backward) {
        /* one block: the stash, its inputs, their keepalives, then (segmented) the earlier
         * segments' slots and frames and the value table (om_stash_free frees it) */
        size_t nv = m ? (size_t)p->n_values + 1 : 0;
        om_stash *s = calloc(1, sizeof *s + sizeof(om_tensor) * ((size_t)n_inputs + 1)
                                    + sizeof(void *) * ((size_t)n_inputs + 1)
                                    + sizeof(void *) * (2 * (size_t)m + nv));
        om_tensor *ins = s ? (om_tensor *)(s + 1) : NULL;
        void **keep = s ? (void **)(ins + n_inputs + 1) : NULL;
        if (!s) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
        memcpy(ins, inputs, sizeof(om_tensor) * (size_t)n_inputs);
        if (keepalive) memcpy(keep, keepalive, sizeof(void *) * (size_t)n_inputs);
        s->eng = e;
        s->plan = p;
        s->slot = slots[m];   /* the call's reference on every plan passes to the stash */
        s->buf = bufs[m];
        s->buf_bytes = caps[m];
        if (m) {
            s->n_prev = m;
            s->prev_slot = (plan_slot **)(keep + n_inputs + 1);
            s->prev_buf = (void **)(s->prev_slot + m);
            s->ext_data = s->prev_buf + m;
            memcpy(s->prev_slot, slots, sizeof(plan_slot *) * (size_t)m);
            memcpy(s->prev_buf, bufs, sizeof(void *) * (size_t)m);
            memcpy(s->ext_data, f.data, sizeof(void *) * (size_t)p->n_values);
        }
        for (int j = 0; j <= m; j++) { slots[j] = NULL; bufs[j] = NULL; }
        s->inputs = ins;
        s->keepalive = keep;
        s->release = release;
        s->n_inputs = n_inputs;
        s->stream = stream;
        *stash_out = s;
    }
done:
    if (st)
        for (int i = 0; i < g->n_outputs; i++) { frame_release(&f, outputs[i].data); outputs[i].data = NULL; }
    for (int j = m; j >= 0; j--) {
        if (!slots[j]) continue;
        if (f.data) {   /* OUT buffers of its plan not handed to the caller */
            f.plan = slots[j]->plan;
            frame_free(&f, given);
        }
        if (bufs[j] && !f.pv->host_frames) frame_release(&f, bufs[j]);
        else if (bufs[j] && j == m) cpu_frame_give_back(e, bufs[j], caps[j]);
        else om_free(bufs[j]);
        slot_unref(slots[j]);
    }
    free(block);
    pthread_mutex_unlock(&e->lock);
    return st;
}

/* ---- backward with absent output gradients ---------------------------------------------
 * The planner picks the program (plan/backward_variants.h); here it runs. */

/* Zero-fills the outputs of node k (a skipped backward node whose zero result is read). */
static om_status *zero_fill_outputs(frame *f, const om_graph *g, int k) {
    const om_node *n = &g->nodes[k];
    for (int j = 0; j < n->n_out; j++) {
        int v = n->out[j];
        if (v < 0) continue;
        size_t nb = om_tensor_nbytes(&f->plan->vt[v]);
        void *d = resolve(f, v);
        if (!nb || !d) continue;
        OM_TRY(f->pv->zero(f->plan->device_id, d, nb, f->stream));
    }
    return NULL;
}

/* Runs a variant program: node ids, with -(k+1) entries zero-filling node k's outputs. */
static om_status *run_variant(om_engine *e, frame *f, const om_bwd_variant *var) {
    for (int s = 0; s < var->n_prog;) {
        if (var->prog[s] < 0) {
            OM_TRY(zero_fill_outputs(f, e->g, -var->prog[s] - 1));
            release_after(f, -var->prog[s] - 1);
            s++;
            continue;
        }
        int run_end = s;
        while (run_end < var->n_prog && var->prog[run_end] >= 0) run_end++;
        OM_TRY(run_program(e, f, var->prog + s, run_end - s, 0, 1));
        s = run_end;
    }
    return NULL;
}

static om_status *backward_on(om_engine *e, om_stash *s, const om_tensor *grad_outputs, om_tensor *input_grads,
                               void *stream, int stream_given);

om_status *om_engine_backward(om_engine *e, om_stash *s, const om_tensor *grad_outputs, om_tensor *input_grads) {
    return backward_on(e, s, grad_outputs, input_grads, NULL, 0);
}

om_status *om_engine_backward_stream(om_engine *e, om_stash *s, const om_tensor *grad_outputs, om_tensor *input_grads,
                                     void *stream) {
    return backward_on(e, s, grad_outputs, input_grads, stream, 1);
}

/* stream_given 0: the forward's stream (what om_engine_backward means by no stream) */
static om_status *backward_on(om_engine *e, om_stash *s, const om_tensor *grad_outputs, om_tensor *input_grads,
                               void *stream, int stream_given) {
    const om_graph *g = e->g;
    if (!s || s->eng != e) return om_error(OM_INVALID_ARGUMENT, "the stash does not belong to this engine");
    for (int i = 0; i < g->n_inputs; i++) memset(&input_grads[i], 0, sizeof(om_tensor));
    om_plan *p = s->plan;
    pthread_mutex_lock(&e->lock);
    /* checked under the lock: two threads backwarding one stash must not both pass (the
     * backward writes its own values into the stash's buffer and consumes stashed ones) */
    if (s->used) {
        pthread_mutex_unlock(&e->lock);
        return om_error(OM_INVALID_ARGUMENT,
                        "backward through this forward ran already (a forward takes one backward: run the forward "
                        "again)");
    }
    frame f = {0};
    char *given = NULL;
    void **zeros = e->scratch_zeros;
    char *absent = e->scratch_absent;   /* per output: no gradient given (zeros) */
    memset(zeros, 0, sizeof(void *) * ((size_t)g->n_outputs + 1));
    memset(absent, 0, (size_t)g->n_outputs + 1);
    if (s && stream_given) s->stream = stream;   /* the stash is freed in order on this stream */
    om_status *st = frame_init(e, &f, p, s->stream, &given);
    if (st) goto done;
    for (int i = 0; i < s->n_inputs; i++) f.data[g->inputs[i]] = s->inputs[i].data;
    for (int v = 0; s->ext_data && v < p->n_values; v++)   /* earlier segments' values, where they were written */
        if (p->storage[v] == OM_ST_EXTERN) f.data[v] = s->ext_data[v];
    for (int i = 0; i < g->n_outputs; i++) {
        int sv = p->seed_of_output[i];
        if (sv < 0) continue;
        const om_tensor *want = &p->vt[sv];
        if (grad_outputs && grad_outputs[i].data) {
            const om_tensor *got = &grad_outputs[i];
            if (got->dtype != want->dtype || !om_shape_equal(got, want) || got->device != p->device) {
                char a[128], b[128];
                om_shape_str(got, a, sizeof a);
                om_shape_str(want, b, sizeof b);
                st = om_error(OM_INVALID_ARGUMENT, "gradient for output '%s' is %s%s, expected %s%s",
                              g->values[g->outputs[i]].name, a, device_suffix(got->device), b,
                              device_suffix(p->device));
                goto done;
            }
            f.data[sv] = got->data;
        } else {
            absent[i] = 1;
            size_t nb = om_tensor_nbytes(want);
            zeros[i] = frame_alloc(&f, nb);
            if (!zeros[i]) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
            if ((st = f.pv->zero(p->device_id, zeros[i], nb, f.stream))) goto done;
            f.data[sv] = zeros[i];
        }
    }
    f.twin = (char *)s->buf + p->twin_offset;
    if (f.pv->host_frames) f.base = s->buf;
    f.release_now = e->memory_opt_level > 0;
    for (int v = 0; v < p->n_values; v++) {
        if (p->storage[v] == OM_ST_STASH) f.data[v] = (char *)s->buf + p->offset[v];
        else if (p->storage[v] == OM_ST_BWD) f.data[v] = (char *)s->buf + p->offset[v];
        else if (p->storage[v] == OM_ST_OUT && g->values[v].producer >= g->n_fwd_nodes) {
            f.data[v] = frame_alloc(&f, om_tensor_nbytes(&p->vt[v]));
            if (!f.data[v]) { st = om_error(OM_OUT_OF_MEMORY, "out of memory for gradients"); goto done; }
        }
    }
    const om_bwd_variant *var = NULL;   /* NULL: the whole backward program runs */
    if ((st = om_plan_backward_variant(g, p, absent, &var))) goto done;
    /* the kernels overwrite stashed values in place (a value's last reader may reuse its
     * memory): from here on the stash is spent, whether or not the backward succeeds. An
     * error above (a gradient of the wrong shape) leaves it usable for a corrected call. */
    s->used = 1;
    st = var ? run_variant(e, &f, var) : run_program(e, &f, p->bwd_prog, p->n_bwd_prog, 0, 1);
    if (st) goto done;
    for (int i = 0; i < g->n_inputs; i++) {
        int v = g->grad_of_input[i];
        if (v < 0 || (var && var->zero_grad[i])) continue;
        if ((st = hand_out(&f, v, given, &input_grads[i]))) {
            for (int k = 0; k < i; k++) { frame_release(&f, input_grads[k].data); input_grads[k].data = NULL; }
            goto done;
        }
    }
done:
    if (f.data) {
        /* OUT values of the forward side are not ours here */
        for (int v = 0; v < p->n_values; v++)
            if (p->storage[v] == OM_ST_OUT && !(g->values[v].producer >= g->n_fwd_nodes)) f.data[v] = NULL;
        frame_free(&f, given);
    }
    for (int i = 0; i < g->n_outputs; i++) {
        frame_release(&f, zeros[i]);
        zeros[i] = NULL;
    }
    pthread_mutex_unlock(&e->lock);
    return st;
}

void om_stash_free(om_stash *s) {
    if (!s) return;
    if (s->release)
        for (int i = 0; i < s->n_inputs; i++)
            if (s->keepalive[i]) s->release(s->keepalive[i]);
    const om_provider *pv = om_provider_find(s->plan->device);
    if (!pv->host_frames) {   /* a device frame goes back to its pool, ordered on the stash's stream */
        pv->release(s->plan->device_id, s->buf, s->stream);
        s->buf = NULL;
    }
    pthread_mutex_lock(&s->eng->lock);
    for (int j = 0; j < s->n_prev; j++) {   /* a segmented call's earlier plans and frames */
        om_free(s->prev_buf[j]);
        slot_unref(s->prev_slot[j]);
    }
    plan_slot *sl = s->slot;
    const int last = --sl->refs == 0 && !sl->cached;   /* the plan was evicted while this stash lived */
    cpu_frame_give_back(s->eng, s->buf, s->buf_bytes);   /* CPU: the next forward takes it, or it goes */
    pthread_mutex_unlock(&s->eng->lock);
    if (last) {
        free_plan(sl->plan);
        free(sl);
    }
    free(s);
}

/* ---- report ----------------------------------------------------------------------- */

typedef struct sbuf { char *s; size_t len, cap; int oom; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = 1; return; }
        if (b->s && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
        char *t = realloc(b->s, cap);
        if (!t) { b->oom = 1; return; }
        b->s = t;
        b->cap = cap;
    }
}

static void sb_json_str(sbuf *b, const char *s) {
    sb_printf(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') sb_printf(b, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) sb_printf(b, "\\u%04x", *s);
        else sb_printf(b, "%c", *s);
    }
    sb_printf(b, "\"");
}

static const char *storage_name(om_storage s) {
    switch (s) {
    case OM_ST_FWD: return "forward_arena";
    case OM_ST_BWD: return "backward_arena";
    case OM_ST_STASH: return "stash";
    case OM_ST_OUT: return "output";
    default: return "other";
    }
}

static void op_counts(sbuf *b, const om_graph *g, int from, int to) {
    sb_printf(b, "{");
    int first = 1;
    for (int i = 0; i < om_op_count(); i++) {
        const om_op_def *op = om_op_at(i);
        int n = 0;
        for (int k = from; k < to; k++) n += g->nodes[k].op == op;
        if (!n) continue;
        sb_printf(b, "%s\"%s\": %d", first ? "" : ", ", op->name, n);
        first = 0;
    }
    sb_printf(b, "}");
}

/* "profile": {"forward_ms", "backward_ms", "forward_gemm_ms", "backward_gemm_ms",
 *             "ops": [{op, phase, calls, ms, gemm_ms}] slowest first}; gemm_ms: of ms, inside om_gemm */
static void profile_json(sbuf *b, const om_engine *e) {
    int n = om_op_count() * 2;
    double fwd = 0, bwd = 0, fwd_gemm = 0, bwd_gemm = 0;
    for (int i = 0; i < n; i++) {
        *(i % 2 ? &bwd : &fwd) += e->prof[i].ns;
        *(i % 2 ? &bwd_gemm : &fwd_gemm) += e->prof[i].gemm_ns;
    }
    sb_printf(b, ", \"profile\": {\"forward_ms\": %.3f, \"backward_ms\": %.3f, \"forward_gemm_ms\": %.3f, "
              "\"backward_gemm_ms\": %.3f, \"ops\": [", fwd / 1e6, bwd / 1e6, fwd_gemm / 1e6, bwd_gemm / 1e6);
    char *taken = calloc((size_t)n, 1);
    for (int r = 0; taken; r++) {   /* selection by time: the table is small */
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && e->prof[i].calls && (best < 0 || e->prof[i].ns > e->prof[best].ns)) best = i;
        if (best < 0) break;
        taken[best] = 1;
        sb_printf(b, "%s{\"op\": \"%s\", \"phase\": \"%s\", \"calls\": %ld, \"ms\": %.3f, \"gemm_ms\": %.3f}",
                  r ? ", " : "", om_op_at(best / 2)->name, best % 2 ? "backward" : "forward", e->prof[best].calls,
                  e->prof[best].ns / 1e6, e->prof[best].gemm_ns / 1e6);
    }
    free(taken);
    sb_printf(b, "]}");
}

const char *om_engine_report_json(om_engine *e) {
    const om_graph *g = e->g;
    sbuf b = {0};
    pthread_mutex_lock(&e->lock);
    sb_printf(&b, "{\"exported_nodes\": %d, \"optimized_nodes\": %d, \"forward_nodes\": %d, \"backward_nodes\": %d, ",
              e->n_exported_nodes, e->n_optimized_nodes, g->n_fwd_nodes, g->n_nodes - g->n_fwd_nodes);
    sb_printf(&b, "\"memory_opt_level\": %d, \"recomputed_nodes\": %d, ", e->memory_opt_level, e->n_recomputed);
    sb_printf(&b, "\"passes\": [%s], ", e->pass_log.text ? e->pass_log.text : "");
    sb_printf(&b, "\"forward_ops\": ");
    op_counts(&b, g, 0, g->n_fwd_nodes);
    sb_printf(&b, ", \"backward_ops\": ");
    op_counts(&b, g, g->n_fwd_nodes, g->n_nodes);
    sb_printf(&b, ", \"data_dependent_nodes\": %d", e->n_dd);
    sb_printf(&b, ", \"plan_cache\": {\"plans\": %d, \"max_plans\": %d, \"planned\": %ld, \"evicted\": %ld}",
              e->n_plans, e->max_plans, e->n_planned, e->n_evicted);
    /* CPU: the one frame the plans share, when no call holds it (bytes of address space, its
     * pages handed back), and the largest frame a cached plan needs */
    sb_printf(&b, ", \"shared_frame\": {\"spare_bytes\": %zu, \"largest_plan_frame_bytes\": %zu}",
              e->spare_frame ? e->spare_bytes : 0, e->max_frame);
    sb_printf(&b, ", \"plans\": [");
    int i = 0;
    for (const plan_slot *sl = e->oldest; sl; sl = sl->newer, i++) {   /* least recently used first */
        const om_plan *p = sl->plan;
        size_t out_fwd = 0, out_bwd = 0;
        for (int v = 0; v < p->n_values; v++) {
            if (p->storage[v] != OM_ST_OUT) continue;
            size_t nb = om_tensor_nbytes(&p->vt[v]);
            if (g->values[v].producer >= g->n_fwd_nodes) out_bwd += nb;
            else out_fwd += nb;
        }
        size_t peak_fwd = p->stash_size + out_fwd;
        size_t peak_bwd = p->stash_size + out_bwd + out_fwd;
        sb_printf(&b, "%s{\"input_shapes\": [", i ? ", " : "");
        for (int k = 0; k < p->n_inputs; k++) {
            sb_printf(&b, "%s[", k ? ", " : "");
            for (int d = 0; d < p->input_shapes[k].rank; d++)
                sb_printf(&b, "%s%lld", d ? ", " : "", (long long)p->input_shapes[k].dims[d]);
            sb_printf(&b, "]");
        }
        sb_printf(&b, "], \"segment\": %d, \"counts\": [", p->segment);   /* plan.h: segments */
        for (int k = 0; k < p->segment; k++) sb_printf(&b, "%s%lld", k ? ", " : "", (long long)p->extents[k]);
        sb_printf(&b, "], \"forward_kernels\": %d, \"backward_kernels\": %d, \"frame_bytes\": %zu, "
                      "\"stash_bytes\": %zu, \"forward_output_bytes\": %zu, "
                      "\"gradient_bytes\": %zu, \"peak_bytes\": %zu, \"release_ranges\": %d, \"largest_buffers\": [",
                  p->n_fwd_prog, p->n_bwd_prog, p->stash_size, p->stash_value_bytes, out_fwd, out_bwd,
                  peak_fwd > peak_bwd ? peak_fwd : peak_bwd, p->n_release);
        /* the ten largest run-time buffers, by a simple selection (plans are small) */
        char *taken = calloc((size_t)p->n_values + 1, 1);
        for (int r = 0; taken && r < 10; r++) {
            int best = -1;
            size_t best_nb = 0;
            for (int v = 0; v < p->n_values; v++) {
                om_storage s = p->storage[v];
                if (taken[v] || (s != OM_ST_FWD && s != OM_ST_BWD && s != OM_ST_STASH && s != OM_ST_OUT)) continue;
                size_t nb = om_tensor_nbytes(&p->vt[v]);
                if (nb > best_nb) { best = v; best_nb = nb; }
            }
            if (best < 0) break;
            taken[best] = 1;
            sb_printf(&b, "%s{\"name\": ", r ? ", " : "");
            sb_json_str(&b, g->values[best].name);
            sb_printf(&b, ", \"bytes\": %zu, \"where\": \"%s\"", best_nb, storage_name(p->storage[best]));
            if (p->bytes_of && p->bytes_of[best] != best) {   /* no bytes of its own: an in-place op's output */
                sb_printf(&b, ", \"in_place_of\": ");
                sb_json_str(&b, g->values[p->bytes_of[best]].name);
            }
            sb_printf(&b, "}");
        }
        free(taken);
        sb_printf(&b, "]}");
    }
    sb_printf(&b, "]");
    if (e->prof) profile_json(&b, e);
    sb_printf(&b, "}");
    pthread_mutex_unlock(&e->lock);
    if (b.oom) { free(b.s); return NULL; }
    free(e->report);
    e->report = b.s;
    return e->report;
}
