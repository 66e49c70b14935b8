/* plan.c — shape inference, plan-time folding, dead-node removal, storage and arena
 * offsets for one set of input shapes. */
#include "plan/plan.h"
#include "plan/backward_variants.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_IO 64

void om_plan_free(om_plan *p) {
    if (!p) return;
    for (int v = 0; p->owned && v < p->n_values; v++)
        if (p->owned[v]) om_free(p->vt[v].data);
    free(p->input_shapes);
    free(p->extents);
    free(p->vt);
    free(p->storage);
    free(p->offset);
    free(p->alias_of);
    free(p->bytes_of);
    free(p->owned);
    free(p->fwd_prog);
    free(p->bwd_prog);
    free(p->seed_of_output);
    free(p->release_at);
    free(p->release_range);
    om_plan_free_variants(p);
    free(p);
}

om_status *om_plan_segments(const om_graph *g, int *seg, int *dd, int *n_dd) {
    int n_fwd = g->n_fwd_nodes ? g->n_fwd_nodes : g->n_nodes, m = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        const om_node *n = &g->nodes[k];
        if (n->op->flags & OM_OP_DATA_DEPENDENT) {
            if (k >= n_fwd)
                return om_error(OM_UNSUPPORTED_OP, "%s node '%s' is in the backward: a data-dependent size there is "
                                "not planned (only forward nodes start segments)", n->op->name, n->name);
            if (dd) dd[m] = k;
            m++;
        }
        if (seg) seg[k] = m;
    }
    *n_dd = m;
    return NULL;
}

int om_plan_matches(const om_plan *p, const om_tensor *inputs, int n_inputs, const int64_t *extents, int n_known) {
    if (p->n_inputs != n_inputs || p->segment != n_known) return 0;
    for (int i = 0; i < n_known; i++)
        if (p->extents[i] != extents[i]) return 0;
    for (int i = 0; i < n_inputs; i++)
        if (p->input_shapes[i].dtype != inputs[i].dtype || !om_shape_equal(&p->input_shapes[i], &inputs[i]))
            return 0;
    if (n_inputs && (inputs[0].device != p->device || (p->device != OM_CPU && inputs[0].device_id != p->device_id)))
        return 0;
    return 1;
}

/* Fills a kernel context's in/out tensors for node k from the plan's value table. */
static void bind_node(const om_graph *g, om_plan *p, int k, om_tensor *in, om_tensor *out) {
    const om_node *n = &g->nodes[k];
    for (int i = 0; i < n->n_in; i++) {
        if (n->in[i] < 0) memset(&in[i], 0, sizeof(om_tensor));
        else in[i] = p->vt[n->in[i]];
    }
    for (int j = 0; j < n->n_out; j++) {
        memset(&out[j], 0, sizeof(om_tensor));
        if (n->out[j] >= 0) out[j].dtype = g->values[n->out[j]].dtype;
    }
}

/* The output gradients (seeds) take their outputs' shapes, once the forward's are known. */
static void shape_seeds(const om_graph *g, om_plan *p) {
    for (int i = 0; g->grad_of_output && i < g->n_outputs; i++) {
        int s = g->grad_of_output[i];
        if (s < 0) continue;
        p->vt[s] = p->vt[g->outputs[i]];
        p->vt[s].data = NULL;
        p->storage[s] = OM_ST_SEED;
    }
}

/* Shape inference for every node in order; folds what is known at plan time. */
/* Nodes of later segments are skipped (their shapes wait for counts); those of earlier
 * segments are inferred again (the same shapes: the same counts) and, unless folded, their
 * outputs are OM_ST_EXTERN: an earlier plan of the call computes them. */
static om_status *infer_and_fold(const om_graph *g, om_plan *p, int n_nodes, char *folded, const int *seg) {
    om_tensor in[MAX_IO], out[MAX_IO];
    for (int k = 0; k < n_nodes; k++) {
        const om_node *n = &g->nodes[k];
        if (n->n_in > MAX_IO || n->n_out > MAX_IO)
            return om_error(OM_UNSUPPORTED_OP, "node '%s' has more than %d inputs or outputs", n->name, MAX_IO);
        if (seg[k] > p->segment) continue;
        if (k == g->n_fwd_nodes) shape_seeds(g, p);
        bind_node(g, p, k, in, out);
        int known = !(n->op->flags & OM_OP_RANDOM);
        if (!(n->op->flags & OM_OP_SHAPE_ONLY))
            for (int i = 0; i < n->n_in && known; i++)
                if (n->in[i] >= 0 && p->storage[n->in[i]] != OM_ST_CONST) known = 0;
        om_kernel_ctx ctx = {.g = g, .node = n, .n_in = n->n_in, .n_out = n->n_out, .in = in, .out = out, .extent = -1};
        if (n->op->flags & OM_OP_DATA_DEPENDENT) ctx.extent = p->extents[seg[k] - 1];   /* d_i starts segment i */
        if (!n->op->infer)
            return om_error(OM_INTERNAL, "op '%s' has no shape rule", n->op->name);
        om_status *st = n->op->infer(&ctx);
        if (st) return om_error_context(st, "%s node '%s'", n->op->name, n->name);
        for (int j = 0; j < n->n_out; j++) {
            int v = n->out[j];
            if (v < 0) continue;
            if (out[j].rank < 0 || out[j].rank > OM_MAX_RANK)
                return om_error(OM_INTERNAL, "%s node '%s': shape rule gave rank %d", n->op->name, n->name, out[j].rank);
            /* dims a model computes (Expand, Reshape, ConstantOfShape of its own numbers) can
             * claim any size: one that overflows would allocate a wrapped, small buffer */
            if (om_shape_size(out[j].dims, out[j].rank, om_dtype_size(out[j].dtype), NULL, NULL) != 0) {
                char shape[160];
                om_shape_str(&out[j], shape, sizeof shape);
                return om_error(OM_INVALID_ARGUMENT, "%s node '%s': output %d would be %s, larger than a tensor can be",
                                n->op->name, n->name, j, shape);
            }
            p->vt[v] = out[j];
            p->vt[v].data = NULL;
        }
        if (!known) {
            for (int j = 0; j < n->n_out && seg[k] < p->segment; j++)
                if (n->out[j] >= 0) p->storage[n->out[j]] = OM_ST_EXTERN;
            continue;
        }
        for (int j = 0; j < n->n_out; j++) {
            int v = n->out[j];
            if (v < 0) continue;
            out[j].data = om_alloc(om_tensor_nbytes(&out[j]));
            if (!out[j].data) return om_error(OM_OUT_OF_MEMORY, "out of memory folding node '%s'", n->name);
            p->vt[v].data = out[j].data;
            p->owned[v] = 1;
            p->storage[v] = OM_ST_CONST;
        }
        st = om_cpu_fold(&ctx);   /* fp16/bf16 math through fp32, as the CUDA kernels do it */
        if (st) return om_error_context(st, "%s node '%s'", n->op->name, n->name);
        folded[k] = 1;
    }
    /* no backward node (every gradient passes straight through: an output that is an input):
     * the loop never reached the first backward node, but the seeds still need shapes */
    if (n_nodes <= g->n_fwd_nodes && p->last_segment) shape_seeds(g, p);
    return NULL;
}

/* The CPU kernels compute in fp32/fp64: a node of a CPU plan that computes in fp16/bf16 runs
 * on fp32 twins of its half tensors (om_cpu_run). The twins of one node at a time live in the
 * frame's twin region, sized here for the largest node of the program. */
static void size_cpu_twins(const om_graph *g, om_plan *p, const int *prog, int n_prog) {
    om_tensor in[MAX_IO], out[MAX_IO];
    for (int s = 0; s < n_prog; s++) {
        const om_node *n = &g->nodes[prog[s]];
        bind_node(g, p, prog[s], in, out);
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0) out[j] = p->vt[n->out[j]];   /* shapes too: each twin is sized */
        size_t b = om_cpu_twin_bytes(n, in, out);
        if (b > p->twin_bytes) p->twin_bytes = b;
    }
}

/* Storage placed in the frame: the one timeline that in-place reuse may merge across. */
static int in_frame(om_storage s) { return s == OM_ST_FWD || s == OM_ST_STASH || s == OM_ST_BWD; }

static int root_of(const om_plan *p, int v) {
    while (p->storage[v] == OM_ST_ALIAS) v = p->alias_of[v];
    return v;
}

typedef struct interval { int v; int def, last; size_t size; } interval;

static int by_size_desc(const void *a, const void *b) {
    const interval *x = a, *y = b;
    return x->size < y->size ? 1 : x->size > y->size ? -1 : x->v - y->v;
}

/* Offsets for buffers whose lifetimes overlap must not overlap; others may share. */
static size_t place(om_plan *p, interval *iv, int n) {
    qsort(iv, (size_t)n, sizeof *iv, by_size_desc);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t off = 0;
        for (int again = 1; again;) {
            again = 0;
            for (int j = 0; j < i; j++) {
                if (iv[j].last < iv[i].def || iv[i].last < iv[j].def) continue;
                size_t o = p->offset[iv[j].v], e = o + iv[j].size;
                if (off < e && o < off + iv[i].size) { off = e; again = 1; }
            }
        }
        p->offset[iv[i].v] = off;
        if (off + iv[i].size > total) total = off + iv[i].size;
    }
    return total;
}

/* Ranges below this are not worth a system call: they go back with the whole frame. */
#define RELEASE_MIN_BYTES ((size_t)64 << 10)

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct use { int seg, def, last; } use;   /* a buffer placed over a segment of the frame */

static int by_seg_def(const void *a, const void *b) {
    const use *x = a, *y = b;
    return x->seg != y->seg ? (x->seg > y->seg) - (x->seg < y->seg) : (x->def > y->def) - (x->def < y->def);
}

typedef struct drop { int step, seg; } drop;      /* a segment that goes back after a step */

static int by_step_seg(const void *a, const void *b) {
    const drop *x = a, *y = b;
    return x->step != y->step ? (x->step > y->step) - (x->step < y->step) : (x->seg > y->seg) - (x->seg < y->seg);
}

/* The release schedule (om_plan.release_at). The frame is cut into segments at every buffer's
 * start and end; the buffers placed over one segment have disjoint lifetimes (place() sees to
 * it), so between the last step of one and the definition of the next, and after the last
 * one, nothing reads the segment: its pages can go back to the system after that step, and
 * the next buffer there gets zeroed pages when its kernel writes it. The resident part of the
 * frame then follows its live buffers, as eager PyTorch's memory follows its live tensors
 * (each tensor is freed when its last user ran, a saved one once backward used it). The bytes
 * of a result (a graph output or input gradient the frame holds) are copied out after their
 * program ended (hand_out): they stay until the end of the call. Steps are program positions
 * (forward steps, then backward steps); ranges are keyed by the node at the step, so that a
 * backward variant, which runs a subsequence of the program's nodes in order, releases after
 * the nodes it runs. Adjacent segments released after one step merge into one range. */
static om_status *release_schedule(om_plan *p, const interval *iv, int n_iv, const char *result, const int *share,
                                   int n_nodes) {
    om_status *st = NULL;
    int n_b = 0, n_u = 0, n_use = 0, n_drop = 0, n_steps = p->n_fwd_prog + p->n_bwd_prog;
    size_t *bound = malloc(sizeof(size_t) * (2 * (size_t)n_iv + 1));
    char *keep = calloc((size_t)p->n_values + 1, 1);   /* per root buffer: holds a result */
    use *uses = NULL;
    drop *drops = NULL;
    int *fill = NULL;
    p->release_at = calloc((size_t)n_nodes + 2, sizeof(int));
    if (!bound || !keep || !p->release_at) goto oom;
    for (int v = 0; v < p->n_values; v++)
        if (result[v] && p->storage[v] != OM_ST_OUT && p->storage[v] != OM_ST_CONST && p->storage[v] != OM_ST_INPUT &&
            p->storage[v] != OM_ST_SEED && p->storage[v] != OM_ST_NONE)
            keep[share[root_of(p, v)]] = 1;
    for (int i = 0; i < n_iv; i++) {
        if (!iv[i].size) continue;
        bound[n_b++] = p->offset[iv[i].v];
        bound[n_b++] = p->offset[iv[i].v] + iv[i].size;
    }
    qsort(bound, (size_t)n_b, sizeof *bound, cmp_size);
    for (int i = 0; i < n_b; i++)
        if (!n_u || bound[i] != bound[n_u - 1]) bound[n_u++] = bound[i];
    /* segment s is [bound[s], bound[s + 1]); count the (segment, buffer) pairs first */
    size_t n_pairs = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n_iv; i++) {
            if (!iv[i].size) continue;
            size_t lo = p->offset[iv[i].v], hi = lo + iv[i].size;
            int a = 0, b = n_u - 1;   /* the segment that starts at lo */
            while (a < b) {
                int m = (a + b) / 2;
                if (bound[m] < lo) a = m + 1;
                else b = m;
            }
            for (int sg = a; sg + 1 < n_u && bound[sg] < hi; sg++) {
                if (!pass) { n_pairs++; continue; }
                uses[n_use++] = (use){sg, iv[i].def, keep[iv[i].v] ? n_steps : iv[i].last};
            }
        }
        if (pass) break;
        if (n_pairs > (size_t)1 << 28) goto done;   /* absurdly fragmented: release only at the end */
        uses = malloc(sizeof(use) * (n_pairs + 1));
        drops = malloc(sizeof(drop) * (n_pairs + 1));
        if (!uses || !drops) goto oom;
    }
    qsort(uses, (size_t)n_use, sizeof *uses, by_seg_def);
    for (int i = 0; i < n_use; i++) {
        const int last_on_seg = i + 1 == n_use || uses[i + 1].seg != uses[i].seg;
        if (uses[i].last >= n_steps) continue;   /* a result, or used to the end */
        /* the next one starts at once: no time in which the pages would be free. Between the
         * forward's last step and the backward's first, the caller runs (its loss, other
         * modules' forwards and backwards): a gap however close the steps */
        if (!last_on_seg && uses[i + 1].def <= uses[i].last + 1 &&
            !(uses[i].last == p->n_fwd_prog - 1 && p->n_bwd_prog))
            continue;
        drops[n_drop++] = (drop){uses[i].last, uses[i].seg};
    }
    qsort(drops, (size_t)n_drop, sizeof *drops, by_step_seg);
    /* merge runs of adjacent segments per step into ranges; count per node, then fill */
    size_t *range = malloc(sizeof(size_t) * 3 * ((size_t)n_drop + 1));   /* (step, offset, bytes) */
    /* a huge-page frame (om_alloc_frame's block starts on one) releases whole huge pages; on
     * small pages, om_release_pages' own rounding to the address's pages is enough */
    size_t page = om_frame_page(p->stash_size);
    if (page < RELEASE_MIN_BYTES) page = 1;
    int n_range = 0;
    if (!range) goto oom;
    for (int i = 0; i < n_drop;) {
        int j = i + 1;
        while (j < n_drop && drops[j].step == drops[i].step && drops[j].seg == drops[j - 1].seg + 1) j++;
        /* whole pages of the frame only: a huge page that a live buffer shares stays */
        size_t lo = (bound[drops[i].seg] + page - 1) / page * page, hi = bound[drops[j - 1].seg + 1] / page * page;
        if (hi > lo && hi - lo >= RELEASE_MIN_BYTES) {
            range[3 * n_range] = (size_t)drops[i].step;
            range[3 * n_range + 1] = lo;
            range[3 * n_range + 2] = hi - lo;
            n_range++;
        }
        i = j;
    }
    p->release_range = malloc(sizeof(size_t) * 2 * ((size_t)n_range + 1));
    fill = malloc(sizeof(int) * ((size_t)n_nodes + 2));
    if (!p->release_range || !fill) { free(range); goto oom; }
    for (int r = 0; r < n_range; r++) {
        int step = (int)range[3 * r];
        p->release_at[(step < p->n_fwd_prog ? p->fwd_prog[step] : p->bwd_prog[step - p->n_fwd_prog]) + 1]++;
    }
    for (int k = 0; k <= n_nodes; k++) p->release_at[k + 1] += p->release_at[k];
    memcpy(fill, p->release_at, sizeof(int) * ((size_t)n_nodes + 1));
    for (int r = 0; r < n_range; r++) {
        int step = (int)range[3 * r];
        int at = fill[step < p->n_fwd_prog ? p->fwd_prog[step] : p->bwd_prog[step - p->n_fwd_prog]]++;
        p->release_range[2 * at] = range[3 * r + 1];
        p->release_range[2 * at + 1] = range[3 * r + 2];
    }
    p->n_release = n_range;
    free(range);
    goto done;
oom:
    st = om_error(OM_OUT_OF_MEMORY, "out of memory building a plan");
done:
    free(bound);
    free(keep);
    free(uses);
    free(drops);
    free(fill);
    return st;
}

static size_t aligned_bytes(const om_tensor *t) { return (om_tensor_nbytes(t) + 63) & ~(size_t)63; }

om_status *om_plan_build(const om_graph *g, const om_tensor *inputs, int n_inputs, bool has_backward,
                         const int64_t *extents, int n_known, om_plan **out) {
    *out = NULL;
    om_status *st = NULL;
    int nv = g->n_values, nn = has_backward ? g->n_nodes : (g->n_fwd_nodes ? g->n_fwd_nodes : g->n_nodes);
    int n_fwd = g->n_fwd_nodes ? g->n_fwd_nodes : g->n_nodes;
    om_plan *p = calloc(1, sizeof *p);
    char *folded = calloc((size_t)nn + 1, 1), *live = calloc((size_t)nn + 1, 1), *needed = calloc((size_t)nv + 1, 1);
    int *step_of = malloc(sizeof(int) * ((size_t)nn + 1)), *last = malloc(sizeof(int) * ((size_t)nv + 1));
    int *def = malloc(sizeof(int) * ((size_t)nv + 1)), *share = NULL;
    int *seg = malloc(sizeof(int) * ((size_t)g->n_nodes + 1)), n_dd = 0;
    char *result = NULL, *outside = calloc((size_t)nv + 1, 1);   /* read by a node of a later segment */
    interval *iv = malloc(sizeof(interval) * ((size_t)nv + 1));
    if (!p || !folded || !live || !needed || !step_of || !last || !def || !iv || !seg || !outside) goto oom;
    if ((st = om_plan_segments(g, seg, NULL, &n_dd))) goto fail;
    if (n_known < 0 || n_known > n_dd) {
        st = om_error(OM_INTERNAL, "a plan with %d data-dependent counts for a graph with %d", n_known, n_dd);
        goto fail;
    }
    p->segment = n_known;
    p->last_segment = n_known == n_dd;
    p->extents = malloc(sizeof(int64_t) * ((size_t)n_known + 1));
    if (!p->extents) goto oom;
    if (n_known) memcpy(p->extents, extents, sizeof(int64_t) * (size_t)n_known);
    p->n_inputs = n_inputs;
    p->n_values = nv;
    if (n_inputs) {   /* the engine checked that every input is on this device */
        p->device = inputs[0].device;
        p->device_id = inputs[0].device == OM_CPU ? 0 : inputs[0].device_id;
    }
    p->input_shapes = malloc(sizeof(om_tensor) * ((size_t)n_inputs + 1));
    p->vt = calloc((size_t)nv + 1, sizeof(om_tensor));
    p->storage = calloc((size_t)nv + 1, sizeof(om_storage));
    p->offset = calloc((size_t)nv + 1, sizeof(size_t));
    p->alias_of = malloc(sizeof(int) * ((size_t)nv + 1));
    p->owned = calloc((size_t)nv + 1, 1);
    p->fwd_prog = malloc(sizeof(int) * ((size_t)nn + 1));
    p->bwd_prog = malloc(sizeof(int) * ((size_t)nn + 1));
    p->seed_of_output = malloc(sizeof(int) * ((size_t)g->n_outputs + 1));
    if (!p->input_shapes || !p->vt || !p->storage || !p->offset || !p->alias_of || !p->owned || !p->fwd_prog ||
        !p->bwd_prog || !p->seed_of_output)
        goto oom;

    for (int i = 0; i < n_inputs; i++) {
        int v = g->inputs[i];
        p->input_shapes[i] = inputs[i];
        p->input_shapes[i].data = NULL;
        p->vt[v] = p->input_shapes[i];
        p->storage[v] = OM_ST_INPUT;
    }
    for (int v = 0; v < nv; v++) {
        p->alias_of[v] = -1;
        if (g->values[v].constant) {
            p->vt[v] = *g->values[v].constant;
            p->storage[v] = OM_ST_CONST;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) p->seed_of_output[i] = has_backward && g->grad_of_output ? g->grad_of_output[i] : -1;

    if ((st = infer_and_fold(g, p, nn, folded, seg))) goto fail;

    /* Dead-node removal: a runtime node runs only if something needs one of its outputs. */
    for (int i = 0; i < g->n_outputs; i++) needed[g->outputs[i]] = 1;
    if (has_backward && g->grad_of_input)
        for (int i = 0; i < g->n_inputs; i++)
            if (g->grad_of_input[i] >= 0) needed[g->grad_of_input[i]] = 1;
    for (int k = nn - 1; k >= 0; k--) {
        const om_node *n = &g->nodes[k];
        if (folded[k] || seg[k] < p->segment) continue;   /* an earlier plan ran it */
        if (seg[k] > p->segment) {   /* a later one: its shapes wait, so it is taken as live */
            for (int i = 0; i < n->n_in; i++)
                if (n->in[i] >= 0) needed[n->in[i]] = outside[n->in[i]] = 1;
            continue;
        }
        for (int j = 0; j < n->n_out && !live[k]; j++)
            if (n->out[j] >= 0 && needed[n->out[j]]) live[k] = 1;
        if (!live[k]) continue;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0) needed[n->in[i]] = 1;
    }
    p->n_fwd_prog = p->n_bwd_prog = 0;
    for (int k = 0; k < nn; k++) {
        step_of[k] = -1;
        if (!live[k] || seg[k] != p->segment) continue;
        if (k < n_fwd) p->fwd_prog[p->n_fwd_prog++] = k;
    }
    for (int k = n_fwd; k < nn; k++)
        if (live[k] && seg[k] == p->segment) p->bwd_prog[p->n_bwd_prog++] = k;
    if (p->device == OM_CPU) {
        size_cpu_twins(g, p, p->fwd_prog, p->n_fwd_prog);
        size_cpu_twins(g, p, p->bwd_prog, p->n_bwd_prog);
    }
    for (int i = 0; i < p->n_fwd_prog; i++) step_of[p->fwd_prog[i]] = i;
    for (int i = 0; i < p->n_bwd_prog; i++) step_of[p->bwd_prog[i]] = p->n_fwd_prog + i;

    /* Aliases: Reshape-like outputs share their input's memory when sizes agree. Not a
     * result handed to the caller (a graph output, an input's gradient): it is read after
     * its program ends, but lifetimes below end at the last node that reads a buffer, so
     * the bytes of an aliased result could already hold a later node's value (the gradient
     * of an unbatched MultiheadAttention's key/value input, the Unsqueeze's gradient of a
     * Reshape'd Add, came back holding the query's gradient). hand_out would copy an alias
     * anyway; the view's own kernel copies into the result's buffer instead. */
    result = calloc((size_t)nv + 1, 1);
    if (!result) goto oom;
    for (int i = 0; i < g->n_outputs; i++) result[g->outputs[i]] = 1;
    if (has_backward && g->grad_of_input)
        for (int i = 0; i < g->n_inputs; i++)
            if (g->grad_of_input[i] >= 0) result[g->grad_of_input[i]] = 1;
    for (int k = 0; k < nn; k++) {
        const om_node *n = &g->nodes[k];
        if (!live[k] || !(n->op->flags & OM_OP_ALIAS) || n->n_in < 1 || n->in[0] < 0 || n->out[0] < 0) continue;
        int a = n->in[0], b = n->out[0];
        if (result[b]) continue;
        if (aligned_bytes(&p->vt[a]) != aligned_bytes(&p->vt[b]) ||
            om_tensor_nbytes(&p->vt[a]) != om_tensor_nbytes(&p->vt[b]))
            continue;
        p->storage[b] = OM_ST_ALIAS;
        p->alias_of[b] = root_of(p, a);   /* point at the buffer's owner: one hop at run time */
    }

    /* Lifetimes per root buffer, in program steps (forward steps, then backward steps). */
    for (int v = 0; v < nv; v++) def[v] = last[v] = -1;
    for (int k = 0; k < nn; k++) {
        if (step_of[k] < 0) continue;
        const om_node *n = &g->nodes[k];
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0 && p->storage[n->out[j]] != OM_ST_ALIAS) def[n->out[j]] = last[n->out[j]] = step_of[k];
    }
    for (int k = 0; k < nn; k++) {
        if (step_of[k] < 0) continue;
        const om_node *n = &g->nodes[k];
        for (int i = 0; i < n->n_in; i++) {
            if (n->in[i] < 0) continue;
            int r = root_of(p, n->in[i]);
            if (step_of[k] > last[r]) last[r] = step_of[k];
        }
    }
    /* What a later segment reads stays to the end of this plan's frame (the call keeps the frame
     * until its backward ran): stash. */
    for (int v = 0; v < nv; v++)
        if (outside[v] && def[root_of(p, v)] >= 0)
            last[root_of(p, v)] = p->n_fwd_prog + p->n_bwd_prog;
    /* Storage classes for buffers produced at run time. */
    for (int v = 0; v < nv; v++) {
        if (def[v] < 0) continue;
        if (def[v] < p->n_fwd_prog) p->storage[v] = last[v] >= p->n_fwd_prog ? OM_ST_STASH : OM_ST_FWD;
        else p->storage[v] = OM_ST_BWD;
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        if (p->storage[v] == OM_ST_FWD) p->storage[v] = OM_ST_OUT;
    }
    if (has_backward && g->grad_of_input)
        for (int i = 0; i < g->n_inputs; i++) {
            int v = g->grad_of_input[i];
            if (v >= 0 && p->storage[v] == OM_ST_BWD) p->storage[v] = OM_ST_OUT;
        }

    /* In-place reuse: an INPLACE op's output takes its input's buffer (the pair the op names)
     * when that input dies at this node (same size and dtype); the merged buffer lives until
     * the output's last use. Forward scratch, stash and backward scratch are one timeline in
     * one frame (below), so a merge may cross them: the loss's log-probabilities take its
     * logits' bytes in the forward, and their gradient takes theirs in the backward (a forward
     * runs one backward, so the stash is never read again). share[] points each merged output
     * at the buffer that owns the bytes. */
    share = malloc(sizeof(int) * ((size_t)nv + 1));
    if (!share) goto oom;
    for (int v = 0; v < nv; v++) share[v] = v;
    for (int k = 0; k < nn; k++) {
        const om_node *n = &g->nodes[k];
        if (step_of[k] < 0 || !(n->op->flags & OM_OP_INPLACE)) continue;
        const int ii = n->op->inplace_in, oi = n->op->inplace_out;
        if (ii >= n->n_in || oi >= n->n_out || n->in[ii] < 0 || n->out[oi] < 0) continue;
        /* the shapes compared are the node's own (a reshaped view's root holds the same bytes) */
        int a = root_of(p, n->in[ii]), b = n->out[oi];
        if (!in_frame(p->storage[a]) || !in_frame(p->storage[b]) || last[a] != step_of[k]) continue;
        if (!om_shape_equal(&p->vt[n->in[ii]], &p->vt[b]) || p->vt[a].dtype != p->vt[b].dtype) continue;
        int owner = share[a];
        share[b] = owner;
        if (last[b] > last[owner]) last[owner] = last[b];
        /* bytes that the backward reaches are stash bytes, wherever they were first written */
        if (p->storage[b] != OM_ST_FWD && p->storage[owner] == OM_ST_FWD) p->storage[owner] = OM_ST_STASH;
    }
    /* One timeline, one buffer per forward call (the "frame"): forward scratch, the stash
     * and backward scratch are placed together. A stashed value lives from its forward step
     * to its last backward use, so the backward reuses the bytes of what it no longer needs
     * (the loss's saved log-probabilities once their gradient ran, ...), as eager PyTorch
     * frees saved tensors along its backward. Frames are recycled per plan. */
    int n_iv = 0;
    p->stash_value_bytes = 0;
    for (int v = 0; v < nv; v++) {
        om_storage s = p->storage[v];
        if ((s != OM_ST_FWD && s != OM_ST_BWD && s != OM_ST_STASH) || share[v] != v) continue;
        iv[n_iv++] = (interval){v, def[v], last[v], aligned_bytes(&p->vt[v])};
        if (s == OM_ST_STASH) p->stash_value_bytes += aligned_bytes(&p->vt[v]);
    }
    p->stash_size = place(p, iv, n_iv);
    p->twin_offset = (p->stash_size + 63) & ~(size_t)63;   /* the twin region ends the frame */
    if (p->twin_bytes) p->stash_size = p->twin_offset + p->twin_bytes;
    for (int v = 0; v < nv; v++)
        if (share[v] != v) p->offset[v] = p->offset[share[v]];
    if (p->device == OM_CPU && (st = release_schedule(p, iv, n_iv, result, share, nn))) goto fail;
    p->bytes_of = share;   /* the report names the merges */
    share = NULL;

    goto done;
oom:
    st = om_error(OM_OUT_OF_MEMORY, "out of memory building a plan");
fail:
    om_plan_free(p);
    p = NULL;
done:
    free(folded); free(live); free(needed); free(step_of); free(last); free(def); free(iv); free(share); free(result);
    free(seg); free(outside);
    *out = p;
    return st;
}
