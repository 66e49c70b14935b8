/* op.h — what one op is: the single source of truth the whole engine reads.
 *
 * Every op (ONNX or internal) is one om_op_def: its name, arity, dtype rule, shape rule,
 * gradient rule and kernels. A family file (ops/elementwise.c, ops/matmul.c, ...) defines
 * the ops and exports one const om_op_def each; ops/op_list.h lists them, with each op's
 * CUDA kernel — adding an op touches its family file, its cuda/<family>.cu and one list line.
 *
 *   dtype  — at compile time: output dtypes from input dtypes and attributes.
 *   infer  — at plan time, with concrete input shapes: output dtypes and shapes. Input
 *            data is available (in[i].data != NULL) only for values known at plan time
 *            (initializers, Constant, Shape and everything folded from them); a rule that
 *            needs data it cannot see (Reshape's shape) says so with an error.
 *   grad   — emits backward nodes into the graph (graph-to-graph autodiff).
 *   cpu    — the kernel. Outputs are allocated (dims filled by infer) before it runs.
 */
#ifndef OM_OP_H
#define OM_OP_H

#include "graph/ir.h"

typedef struct om_kernel_ctx {
    const om_graph *g;
    const om_node *node;
    int n_in, n_out;
    const om_tensor *in;   /* in[i].dtype == OM_UNDEFINED for an absent optional input */
    om_tensor *out;        /* out[j].data NULL (kernel must skip it) for an absent output */
    uint64_t seed;         /* per node and per run: random ops use om_rand_*(seed, i) */
    int training;          /* the forward runs in training mode */
    om_device_type device; /* where in/out live (CPU, or CUDA for OM_OP_CALLBACK ops in a CUDA plan) */
    int device_id;
    int64_t extent;        /* shape rules of OM_OP_DATA_DEPENDENT ops: the size count() found (-1: unknown) */
} om_kernel_ctx;

typedef struct om_grad_ctx {
    om_graph *g;
    int node;              /* the forward node being differentiated */
    const int *dy;         /* per output of node: value id of dL/d(out), or -1 (no gradient flows) */
    const int *need_dx;    /* per input of node: 1 if its gradient is wanted */
    int *dx;               /* per input: the rule sets the value id of dL/d(in); -1 = none */
} om_grad_ctx;

enum {
    OM_OP_ALIAS = 1 << 0,      /* output 0 may share input 0's memory (Reshape, Identity, ...) */
    OM_OP_RANDOM = 1 << 1,     /* never fold at plan time, never merge */
    OM_OP_SHAPE_ONLY = 1 << 2, /* reads only input shapes (Shape, Size): foldable once shapes are known */
    OM_OP_INPLACE = 1 << 3,    /* output inplace_out may overwrite input inplace_in (both 0 unless the def
                                  says otherwise) when both have the same shape and dtype and the input dies
                                  here: every read of an input element comes before the write of the same
                                  output element, none after it */
    OM_OP_ANY_DTYPE = 1 << 4,  /* the CPU kernel only moves or converts elements (by element size, or
                                  Cast), so it takes every dtype the shape rule allows, fp16/bf16 too.
                                  The other CPU kernels compute in fp32/fp64 only: on fp16/bf16 they run
                                  on fp32 twins, rounded once on store (om_cpu_run, ops/fold.c) */
    OM_OP_CALLBACK = 1 << 5,   /* the client computes it (ops/callback.c): its cpu kernel runs on the host in
                                  every plan, with pointers on the plan's device (ctx->device); never folded,
                                  merged or recomputed (it is also OM_OP_RANDOM) */
    OM_OP_DATA_DEPENDENT = 1 << 6, /* an output's size depends on input values (NonZero): the planner
                                  cuts the plan at the node (plan/plan.h: segments) and the executor
                                  asks count() for that size once the node's inputs exist; the shape
                                  rule reads it from ctx->extent. Also OM_OP_RANDOM (never folded) */
};

typedef struct om_op_def {
    const char *name;          /* ONNX op_type, or an internal name like "GeluGrad" */
    const char *domain;        /* "" for ONNX, "ortmod" for internal ops */
    int min_in, max_in;
    int min_out, max_out;
    unsigned flags;
    int inplace_in, inplace_out;   /* with OM_OP_INPLACE: which input's buffer which output may take */
    /* dtype rule; NULL means: every output has the dtype of input 0. */
    om_dtype (*dtype)(const om_graph *g, const om_node *n, int out_index);
    om_status *(*infer)(om_kernel_ctx *ctx);
    om_status *(*grad)(om_grad_ctx *ctx);     /* NULL: not differentiable (error if needed) */
    om_status *(*cpu)(om_kernel_ctx *ctx);
    /* OM_OP_DATA_DEPENDENT ops: the data-dependent extent of the output, from the inputs' values
     * (CPU memory); the shape rule then gets it as ctx->extent */
    om_status *(*count)(om_kernel_ctx *ctx, int64_t *extent);
    /* which inputs can carry a gradient: bit i set = input i differentiable (inputs 0..31);
     * ~0u: every input, however many (variadic ops: Concat, PythonOp).
     * 0 with grad==NULL: the op blocks gradients (Shape, Equal, ...). */
    unsigned diff_inputs;
    /* The attributes the op implements; a node carrying any other is refused by name when
     * the model is imported, before any pass (om_node_check_attrs): an attribute is never
     * ignored. A space-separated list of entries:
     *     name:type             the op implements every value (or refuses by name, at plan
     *                           time, a value it cannot run: Conv's group against W)
     *     name:type=v1|v2|...   the op implements only these values; any other is refused
     * type is the attribute's ONNX type, which the node's attribute must have exactly: int,
     * float, string, ints, floats or tensor; `=` lists take int, float and string values.
     * An attribute the op implements only at its ONNX default is listed with that default
     * ("stash_type:int=1"): exporters write defaults explicitly, and the default is then
     * accepted while every other value is refused, from this one table. NULL: no attribute.
     * Internal ops list what the passes and gradient rules set on them; the compiled graph
     * is checked against the same lists (exec/engine.c). */
    const char *attrs;
} om_op_def;

/* By name and domain, for the ONNX import: a linear search, done once per node. */
const om_op_def *om_op_find(const char *name, const char *domain);
om_op_id om_op_find_id(const char *name, const char *domain);   /* OM_OP_NONE when unknown */
/* By id: an index. */
const om_op_def *om_op_get(om_op_id id);
/* 1 for an op of OM_OP_CHEAP_LIST (ops/op_list.h): level-1 recompute runs it twice. */
int om_op_cheap(om_op_id id);

int om_op_count(void);
const om_op_def *om_op_at(int i);
/* Checks node n's attributes against its op's attrs list: an attribute the op does not
 * implement, a value it does not implement, a wrong type or a repeated name is an error
 * naming node, op and attribute (OM_UNSUPPORTED_OP; OM_INVALID_MODEL for the last two). */
om_status *om_node_check_attrs(const om_node *n);

/* ---- helpers for gradient rules (autodiff/emit.c) ----------------------------------
 * Each emits one node after the current last node and returns its first output's value
 * id; on failure it returns -1 and the error is kept for the autodiff pass to report.
 * Output dtypes come from the op's dtype rule. */
int om_emit(om_grad_ctx *c, om_op_id op, const int *in, int n_in);
int om_emit_node(om_grad_ctx *c, om_op_id op, const int *in, int n_in, int *out, int n_out,
                 int *node_id);    /* several outputs; out[] filled */
/* om_emit_node, then detaches the outputs whose want[j] is 0 (their out[j] = -1): a backward op
 * that can skip the gradients nobody needs. Returns the node id, -1 on error. */
int om_emit_partial(om_grad_ctx *c, om_op_id op, const int *in, int n_in, int *out, int n_out, const int *want);
int om_emit1(om_grad_ctx *c, om_op_id op, int a);
int om_emit2(om_grad_ctx *c, om_op_id op, int a, int b);
/* The last node emitted through c, to set attributes on (om_node_set_int(c->g, ...)). */
int om_emit_last(const om_grad_ctx *c);
/* Sets an int/ints/float attribute on the last emitted node. */
void om_emit_attr_int(om_grad_ctx *c, const char *name, int64_t v);
void om_emit_attr_ints(om_grad_ctx *c, const char *name, const int64_t *v, int n);
void om_emit_attr_float(om_grad_ctx *c, const char *name, float v);
void om_emit_attr_string(om_grad_ctx *c, const char *name, const char *v);
/* (each re-runs the node's dtype rule, so attributes like Cast's "to" take effect) */
/* Shape(x) as a value (folded at plan time: costs nothing at run time). */
int om_emit_shape(om_grad_ctx *c, int x);
/* dL/dx for x broadcast into y: sums dy over the broadcast axes back to x's shape
 * (an internal "SumToShape" node; a no-op copy when shapes already match). */
int om_emit_sum_to(om_grad_ctx *c, int dy, int x);
/* A scalar constant of dtype (a new constant value). */
int om_emit_scalar(om_grad_ctx *c, om_dtype dt, double v);
/* Records an error for the rule (returns it for convenience). */
om_status *om_grad_fail(om_grad_ctx *c, om_status *st);

/* ---- helpers for kernels and shape rules (ops/broadcast.c) -------------- */
/* ONNX multidirectional broadcasting of a and b into out (rank, dims). */
om_status *om_broadcast_shape(const om_tensor *a, const om_tensor *b, om_tensor *out);
/* Sets out's rank/dims = t's, dtype = dt. */
void om_set_shape(om_tensor *out, const om_tensor *like, om_dtype dt);
/* Normalizes a possibly negative axis for rank; error naming the node if out of range. */
om_status *om_norm_axis(const om_node *n, int64_t axis, int rank, int *out);
/* Reads an int64/int32 tensor (known at plan time) into vals; returns count or -1. */
int om_read_ints(const om_tensor *t, int64_t *vals, int max);
/* A shape read from a value's data (a Reshape/Expand/gradient shape input): OK when a tensor
 * of dtype dt can have it (om_shape_size), else an error naming node, op and input i. Shape
 * rules call it before any arithmetic on the dims, which are whatever the model wrote. */
om_status *om_check_shape_data(const om_node *n, int i, const int64_t *dims, int rank, om_dtype dt);
/* Error helpers naming the node and op. */
om_status *om_err_dtype(const om_node *n, int input, om_dtype got);
om_status *om_err_unsupported(const om_node *n, const char *what);

/* ---- dtype sets for dtype and shape rules: bit d set = dtype d allowed ---------------
 * The rules accept what the op means for every provider: fp16/bf16 are float dtypes (the
 * CUDA kernels load them to fp32 and round once on store). Which provider can run a node
 * is the planner's question, not the shape rule's (see OM_OP_ANY_DTYPE). */
#define OM_DT_BIT(d) (1u << (unsigned)(d))
#define OM_DT_HALF (OM_DT_BIT(OM_F16) | OM_DT_BIT(OM_BF16))
#define OM_DT_FLOAT (OM_DT_BIT(OM_F32) | OM_DT_BIT(OM_F64) | OM_DT_HALF)
#define OM_DT_INDEX (OM_DT_BIT(OM_I32) | OM_DT_BIT(OM_I64))
#define OM_DT_ARITH (OM_DT_FLOAT | OM_DT_INDEX)

static inline int om_dtype_in(om_dtype d, unsigned set) { return d > 0 && d < 32 && (set & OM_DT_BIT(d)); }
/* True for dtypes that carry gradients. */
static inline int om_dtype_is_float(om_dtype d) { return om_dtype_in(d, OM_DT_FLOAT); }
static inline int om_dtype_is_half(om_dtype d) { return d == OM_F16 || d == OM_BF16; }
/* The dtype statistics of a float tensor are kept in (LayerNorm's Mean/InvStdDev, ...):
 * fp32 for fp32 and fp16/bf16 inputs, fp64 for fp64. */
static inline om_dtype om_dtype_stat(om_dtype d) { return d == OM_F64 ? OM_F64 : OM_F32; }
/* The dtype a normalization's parameters (scale, bias, running statistics) must have for input
 * dtype x, given the first of them, p: x's, or float32 for an fp16/bf16 x — eager's mixed-type
 * layer_norm and batch_norm, which CPU autocast runs (it leaves them out of its casts); their
 * statistics and the parameters' gradients are then float32 too. */
static inline om_dtype om_norm_param_dtype(om_dtype x, const om_tensor *p) {
    return om_dtype_is_half(x) && p->dtype == OM_F32 ? OM_F32 : x;
}

/* The fp16/bf16 dtype that node n's CPU kernel would have to compute in, given its input
 * and output tensors (absent ones have dtype OM_UNDEFINED / out value -1); OM_UNDEFINED when
 * the CPU kernel can run it as it is: no half tensor, or an op that only moves elements
 * (OM_OP_ANY_DTYPE). Such a node runs through fp32 twins (om_cpu_run). */
static inline om_dtype om_node_cpu_half(const om_node *n, const om_tensor *in, const om_tensor *out) {
    if (n->op->flags & OM_OP_ANY_DTYPE) return OM_UNDEFINED;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] >= 0 && om_dtype_is_half(in[i].dtype)) return in[i].dtype;
    for (int j = 0; j < n->n_out; j++)
        if (n->out[j] >= 0 && om_dtype_is_half(out[j].dtype)) return out[j].dtype;
    return OM_UNDEFINED;
}

/* Runs node ctx->node's CPU kernel: directly, or for fp16/bf16 math (om_node_cpu_half) on fp32
 * twins of its half tensors, placed in scratch, rounding the fp32 results once (to nearest even)
 * into the half outputs — the CUDA kernels' rule (ops/fold.c). scratch holds at least
 * om_cpu_twin_bytes(node) bytes, or is NULL (then allocated and freed here). */
om_status *om_cpu_run(om_kernel_ctx *ctx, void *scratch, size_t scratch_bytes);
/* The scratch om_cpu_run needs for node n with these tensors (0 when it runs directly). */
size_t om_cpu_twin_bytes(const om_node *n, const om_tensor *in, const om_tensor *out);
/* om_cpu_run with its own scratch, for plan-time and compile-time folding (nothing to do for a
 * node whose outputs are all empty). */
om_status *om_cpu_fold(om_kernel_ctx *ctx);
/* 1 when node ctx->node has nothing to compute: every output it has holds no element (and it
 * is not a callback, whose client may do more than fill its outputs). A kernel's loops run
 * over the other dims too (Softmax over an empty axis of a [0, 2^40] tensor loops 2^40 times
 * for nothing), so callers skip such nodes rather than each kernel guarding itself. */
int om_kernel_nothing_to_do(const om_kernel_ctx *ctx);

/* Input i (tensor t) of node n must be a float dtype, and dtype want unless want is
 * OM_UNDEFINED. The error names node, op, input and dtype. */
om_status *om_check_float(const om_node *n, const om_tensor *t, int i, om_dtype want);
/* Input i of node n must have a dtype in set. */
om_status *om_check_dtype(const om_node *n, const om_tensor *t, int i, unsigned set);

/* Float dispatch of the CPU kernels: expands BODY with T = float or double (fp16/bf16 reach a
 * CPU kernel as fp32 twins: om_cpu_run). */
#define OM_DISPATCH_FLOAT(dt, node, BODY)                                       \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; BODY; } break;                              \
    case OM_F64: { typedef double T; BODY; } break;                             \
    default: return om_err_dtype((node), 0, (dt));                              \
    }

#endif
