/* callback.c — ops the client computes: a user's torch.autograd.Function under ORTModule.
 *
 *   om_op_python_op        PythonOp      (domain ortmod)  (x_0..x_m-1) -> (y_0..y_n-1)
 *                          function_id = the client's id of what to run
 *                          output_dtypes = ONNX dtype per output (known from the trace)
 *   om_op_python_op_grad   PythonOpGrad  (domain ortmod)  (dy_0..dy_n-1, Shape(x_0)..Shape(x_m-1))
 *                          -> (dx_0..dx_m-1); function_id, input_dtypes
 *
 * The engine cannot know what a user's Function computes, so it does not try: the forward node
 * calls the client (om_engine_options.callback) with its inputs and planned outputs, the grad
 * node calls it with the output gradients and planned input gradients, and the client runs the
 * user's own forward and backward (ORT's PythonOp / PythonOpGrad). Which forward call a
 * backward belongs to is the client's to track: each engine forward runs each PythonOp once.
 *
 * Output shapes are the client's answer at plan time (OM_CALLBACK_INFER). The gradient rule
 * emits PythonOpGrad for every input whose gradient is wanted, whatever the user's backward
 * returns for it (None becomes zeros in the client). The flags keep the node where it is:
 * never folded (it has effects), merged with a twin (two calls are two calls) or recomputed.
 */
#include "ops/op.h"

#include <stdio.h>

#define PY_MAX_IO 64

static om_status *no_client(const om_node *n) {
    return om_error(OM_UNSUPPORTED_OP,
                    "node '%s' is a PythonOp (a custom torch.autograd.Function captured by ORTModule): it runs "
                    "only in a client that computes it in PyTorch, not in this one", n->name ? n->name : "?");
}

static om_status *check_function_id(const om_node *n, int64_t *id) {
    const om_attr *a = om_attr_find(n, "function_id");
    if (!a || a->type != OM_ATTR_INT || a->i < 0)
        return om_error(OM_INVALID_MODEL, "PythonOp node '%s' has no non-negative int attribute function_id",
                        n->name ? n->name : "?");
    *id = a->i;
    return NULL;
}

/* dtype attribute `name`[index] of node n, or OM_UNDEFINED when absent or out of range. */
static om_dtype dtype_attr(const om_node *n, const char *name, int index) {
    const int64_t *v = NULL;
    int k = om_attr_ints(n, name, &v);
    if (index < 0 || index >= k || om_dtype_size((om_dtype)v[index]) == 0) return OM_UNDEFINED;
    return (om_dtype)v[index];
}

/* ---- PythonOp ------------------------------------------------------------------------------ */

static om_dtype python_op_dtype(const om_graph *g, const om_node *n, int j) {
    (void)g;
    return dtype_attr(n, "output_dtypes", j);
}

static om_status *python_op_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    int64_t id = -1;
    OM_TRY(check_function_id(n, &id));
    if (!ctx->g->callback) return no_client(n);
    for (int j = 0; j < ctx->n_out; j++) {
        om_dtype dt = dtype_attr(n, "output_dtypes", j);
        if (dt == OM_UNDEFINED)
            return om_error(OM_INVALID_MODEL, "PythonOp node '%s': output_dtypes gives no dtype for output %d",
                            n->name, j);
        memset(&ctx->out[j], 0, sizeof ctx->out[j]);
        ctx->out[j].dtype = dt;
        ctx->out[j].rank = -1;
    }
    OM_TRY(ctx->g->callback(ctx->g->callback_user, OM_CALLBACK_INFER, id, ctx->in, ctx->n_in, ctx->out, ctx->n_out));
    for (int j = 0; j < ctx->n_out; j++) {
        om_tensor *t = &ctx->out[j];
        if (t->rank < 0 || t->rank > OM_MAX_RANK)
            return om_error(OM_RUNTIME, "PythonOp node '%s': output %d has rank %d (at most %d)", n->name, j, t->rank,
                            OM_MAX_RANK);
        for (int d = 0; d < t->rank; d++)
            if (t->dims[d] < 0)
                return om_error(OM_RUNTIME, "PythonOp node '%s': output %d has a negative dimension", n->name, j);
        t->data = NULL;
    }
    return NULL;
}

/* Runs the client for the node's kernel: n_in inputs and all outputs, tagged with the plan's device. */
static om_status *call_client(om_kernel_ctx *ctx, om_callback_phase phase, int n_in) {
    int64_t id = -1;
    OM_TRY(check_function_id(ctx->node, &id));
    if (!ctx->g->callback) return no_client(ctx->node);
    if (n_in > PY_MAX_IO || ctx->n_out > PY_MAX_IO)
        return om_error(OM_UNSUPPORTED_OP, "node '%s' has too many inputs or outputs", ctx->node->name);
    om_tensor in[PY_MAX_IO], out[PY_MAX_IO];
    for (int i = 0; i < n_in; i++) {
        in[i] = ctx->in[i];
        in[i].device = ctx->device;
        in[i].device_id = ctx->device_id;
    }
    for (int j = 0; j < ctx->n_out; j++) {
        out[j] = ctx->out[j];
        out[j].device = ctx->device;
        out[j].device_id = ctx->device_id;
        if (!out[j].data && om_tensor_numel(&out[j]) != 0) out[j].dtype = OM_UNDEFINED;   /* absent */
    }
    return ctx->g->callback(ctx->g->callback_user, phase, id, in, n_in, out, ctx->n_out);
}

static om_status *python_op_run(om_kernel_ctx *ctx) { return call_client(ctx, OM_CALLBACK_FORWARD, ctx->n_in); }

static om_status *python_op_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    int n_y = f->n_out, n_x = f->n_in;
    if (n_y + n_x > PY_MAX_IO) return om_error(OM_UNSUPPORTED_OP, "PythonOp node '%s' has too many inputs", f->name);
    int in[PY_MAX_IO], out[PY_MAX_IO], want[PY_MAX_IO];
    int64_t dtypes[PY_MAX_IO];
    int any = 0;
    for (int j = 0; j < n_y; j++) in[j] = c->dy[j];
    for (int i = 0; i < n_x; i++) {
        int x = c->g->nodes[c->node].in[i];
        om_dtype dt = x >= 0 ? c->g->values[x].dtype : OM_UNDEFINED;
        want[i] = x >= 0 && c->need_dx[i] && om_dtype_is_float(dt);
        any |= want[i];
        dtypes[i] = dt;
        in[n_y + i] = x >= 0 ? om_emit_shape(c, x) : -1;
        if (x >= 0 && in[n_y + i] < 0) return NULL;
    }
    if (!any) return NULL;
    int64_t id = om_attr_int(&c->g->nodes[c->node], "function_id", -1);
    int node = -1;
    if (om_emit_node(c, om_op_python_op_grad_id, in, n_y + n_x, out, n_x, &node) < 0) return NULL;
    om_emit_attr_int(c, "function_id", id);
    om_emit_attr_ints(c, "input_dtypes", dtypes, n_x);
    om_node *g = &c->g->nodes[node];
    for (int i = 0; i < n_x; i++) {
        if (want[i]) { c->dx[i] = g->out[i]; continue; }
        c->g->values[g->out[i]].producer = -1;   /* no gradient wanted: an absent output */
        g->out[i] = -1;
    }
    return NULL;
}

/* ---- PythonOpGrad -------------------------------------------------------------------------- */

static om_dtype python_op_grad_dtype(const om_graph *g, const om_node *n, int j) {
    (void)g;
    return dtype_attr(n, "input_dtypes", j);
}

static int grad_n_y(const om_node *n) { return n->n_in - n->n_out; }

static om_status *python_op_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    int n_y = grad_n_y(n);
    if (n_y < 0) return om_error(OM_INVALID_MODEL, "PythonOpGrad node '%s' has fewer inputs than outputs", n->name);
    for (int i = 0; i < ctx->n_out; i++) {
        om_tensor *t = &ctx->out[i];
        memset(t, 0, sizeof *t);
        t->dtype = dtype_attr(n, "input_dtypes", i);
        int64_t dims[OM_MAX_RANK];
        int r = om_read_ints(&ctx->in[n_y + i], dims, OM_MAX_RANK);
        if (r < 0) {
            if (n->out[i] < 0) continue;
            return om_error(OM_INTERNAL, "PythonOpGrad node '%s': the shape of input %d is not known at plan time",
                            n->name, i);
        }
        t->rank = r;
        memcpy(t->dims, dims, sizeof(int64_t) * (size_t)r);
    }
    return NULL;
}

static om_status *python_op_grad_run(om_kernel_ctx *ctx) {
    return call_client(ctx, OM_CALLBACK_BACKWARD, grad_n_y(ctx->node));
}

#define CALLBACK_FLAGS (OM_OP_CALLBACK | OM_OP_RANDOM | OM_OP_ANY_DTYPE)

const om_op_def om_op_python_op = {
    .name = "PythonOp", .domain = "ortmod", .min_in = 0, .max_in = PY_MAX_IO, .min_out = 1, .max_out = PY_MAX_IO,
    .flags = CALLBACK_FLAGS, .dtype = python_op_dtype, .infer = python_op_infer, .grad = python_op_grad,
    .cpu = python_op_run, .diff_inputs = ~0u,
    .attrs = "function_id:int output_dtypes:ints"};
const om_op_def om_op_python_op_grad = {
    .name = "PythonOpGrad", .domain = "ortmod", .min_in = 0, .max_in = PY_MAX_IO, .min_out = 1, .max_out = PY_MAX_IO,
    .flags = CALLBACK_FLAGS, .dtype = python_op_grad_dtype, .infer = python_op_grad_infer,
    .cpu = python_op_grad_run,
    .attrs = "function_id:int input_dtypes:ints"};
