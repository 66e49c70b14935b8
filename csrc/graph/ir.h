/* ir.h — the graph the engine optimizes, differentiates and plans.
 *
 * Values and nodes live in growable arrays and refer to each other by index (never by
 * pointer: arrays move as they grow). A value is produced by at most one node; graph
 * inputs and initializers have producer -1. Nodes are kept in topological order:
 * forward nodes first (index < n_fwd_nodes after autodiff), then backward nodes.
 */
#ifndef OM_IR_H
#define OM_IR_H

#include "core/core.h"
#include "ops/op_list.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct om_op_def;

typedef enum om_attr_type {
    OM_ATTR_FLOAT = 1, OM_ATTR_INT = 2, OM_ATTR_STRING = 3, OM_ATTR_TENSOR = 4,
    OM_ATTR_FLOATS = 6, OM_ATTR_INTS = 7, OM_ATTR_STRINGS = 8,   /* numbering as in ONNX AttributeProto */
} om_attr_type;

typedef struct om_attr {
    char *name;
    om_attr_type type;
    int64_t i;
    float f;
    char *s;
    int n;               /* length of ints / floats / strs */
    int64_t *ints;
    float *floats;
    char **strs;         /* OM_ATTR_STRINGS: n strings (RNN's activations) */
    om_tensor t;         /* OM_ATTR_TENSOR: t.data is owned by the attr */
} om_attr;

typedef struct om_value {
    char *name;
    om_dtype dtype;      /* known after import (graph inputs) and type inference */
    int producer;        /* node index, -1 for graph inputs and constants */
    int is_input;        /* index in graph inputs, or -1 */
    om_tensor *constant; /* initializers: owned tensor + data; NULL otherwise */
    int rank_hint;       /* rank declared by the model (graph inputs/outputs), -1 if unknown */
} om_value;

typedef struct om_node {
    const struct om_op_def *op;
    om_op_id op_id;      /* op's id (its index in the op table), resolved with op: passes match on it */
    char *name;
    int n_in, n_out;
    int *in, *out;       /* value ids; -1 marks an absent optional input/output */
    int n_attr;
    om_attr *attr;
    int backward;        /* emitted by autodiff */
    int dead;            /* removed by a pass; dropped by om_graph_compact */
} om_node;

typedef struct om_graph {
    om_value *values; int n_values, cap_values;
    om_node *nodes;   int n_nodes, cap_nodes;
    int *inputs;  int n_inputs;
    int *outputs; int n_outputs;
    int opset;
    /* set by autodiff */
    int n_fwd_nodes;
    int *grad_of_output;   /* per graph output: the value id fed with dL/d(output), or -1 */
    int *grad_of_input;    /* per graph input: the value id holding dL/d(input), or -1 */
    /* what runs PythonOp nodes (the engine's om_engine_options.callback); NULL in a client
     * that has none (the native runner): such nodes are refused at plan time */
    om_callback_fn callback;
    void *callback_user;
} om_graph;

/* How many in/out slots a node of an op with this arity gets: an op with a fixed arity is padded
 * with -1 (absent) to its maximum, since rules and kernels read optional inputs by position; a
 * variadic op (Concat, Split: up to 2^20) gets what it was given, since a slot per possible
 * position would be 4 MiB per node, written (-1) and so resident, for as long as the graph. */
#define OM_PAD_ARITY 64
static inline int om_node_slots(int given, int max) {
    int cap = max <= OM_PAD_ARITY && max > given ? max : given;
    return cap ? cap : 1;
}

om_graph *om_graph_new(void);
void      om_graph_free(om_graph *g);

/* Adds a value; returns its id or -1 when out of memory. name may be NULL (auto-named). */
int om_graph_add_value(om_graph *g, const char *name, om_dtype dtype);
/* Adds a node of op_type (looked up in the op table; domain "" or "com.microsoft" or
 * "ortmod"). in/out may contain -1. Returns the node id in *node_id. */
om_status *om_graph_add_node(om_graph *g, const char *op_type, const char *domain, const char *name,
                             const int *in, int n_in, const int *out, int n_out, int *node_id);
/* The same, for an op the engine names itself (autodiff, passes): by id, checked by the compiler. */
om_status *om_graph_add_op(om_graph *g, om_op_id op, const char *name, const int *in, int n_in, const int *out,
                           int n_out, int *node_id);
int om_graph_find_value(const om_graph *g, const char *name);   /* -1 if none */

/* Attributes: lookups return the default when absent. */
const om_attr *om_attr_find(const om_node *n, const char *name);
int64_t     om_attr_int(const om_node *n, const char *name, int64_t dflt);
float       om_attr_float(const om_node *n, const char *name, float dflt);
/* A float attribute as the number that was written into it, for math in double: ONNX keeps
 * float attributes in float32, and exporters round Python's doubles into them (BatchNorm's
 * momentum 0.9, epsilon 1e-5). Widened as they are, 0.9f is 0.899999976, and a float64
 * model's running statistics would carry float32's rounding (2.4e-7 relative). */
double      om_attr_real(const om_node *n, const char *name, double dflt);
/* The shortest decimal that rounds to f (0.9f -> 0.9): what an exporter's double most likely
 * was, exact for every value written with up to 7 significant digits. Header-only: the CUDA
 * provider widens its attributes the same way. */
static inline double om_float_decimal(float f) {
    if (!isfinite(f)) return (double)f;
    char buf[32];
    for (int digits = 1; digits < 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f) return d;
    }
    return (double)f;   /* 9 digits always round-trip: the float itself is the best guess */
}
const char *om_attr_string(const om_node *n, const char *name, const char *dflt);
/* Returns the count (-1 when absent); *vals points into the attr. */
int         om_attr_ints(const om_node *n, const char *name, const int64_t **vals);
/* A strings attribute: the count (-1 when absent or not strings); *vals points into the attr. */
int         om_attr_strings(const om_node *n, const char *name, const char *const **vals);

om_status *om_node_set_int(om_graph *g, int node, const char *name, int64_t v);
om_status *om_node_set_float(om_graph *g, int node, const char *name, float v);
om_status *om_node_set_ints(om_graph *g, int node, const char *name, const int64_t *v, int n);
om_status *om_node_set_string(om_graph *g, int node, const char *name, const char *s);
om_status *om_node_set_strings(om_graph *g, int node, const char *name, const char *const *s, int n);
/* Copies t (including its data) into a tensor attribute. */
om_status *om_node_set_tensor(om_graph *g, int node, const char *name, const om_tensor *t);

/* Makes sure output slot idx of node exists (growing n_out if needed) and returns its
 * value id; used by gradient rules that want optional forward outputs (saved mean, ...). */
int om_node_ensure_output(om_graph *g, int node, int idx, om_dtype dtype);

/* ONNX import (protobuf-c). On success *out is owned by the caller. */
om_status *om_graph_import_onnx(const void *bytes, size_t n, om_graph **out);
/* ONNX export of the graph as it is (values without data become graph inputs/outputs
 * as they are marked). *bytes is om_alloc'd. */
om_status *om_graph_export_onnx(const om_graph *g, const char *graph_name, void **bytes, size_t *n);

/* ---- rewriting (graph/rewrite.c), for passes ------------------------------------------
 * A pass marks nodes dead and rewrites nodes in place, then calls om_graph_compact, which
 * drops dead nodes, renumbers producers and keeps the topological order. A fused node
 * takes the index of the last node of its pattern: its inputs are defined before that,
 * and the pattern's consumers come after it. */

/* uses[v] = number of live node inputs reading v, plus one per graph output slot. Caller frees. */
int *om_graph_use_counts(const om_graph *g);
/* Every read of value `from` (node inputs, graph outputs) now reads `to`. */
void om_graph_replace_uses(om_graph *g, int from, int to);
/* Rewrites node idx as a new op with new inputs/outputs; attributes are cleared. */
om_status *om_graph_replace_node(om_graph *g, int idx, om_op_id op, const int *in, int n_in, const int *out,
                                 int n_out);
/* Drops dead nodes (and constants nothing reads), renumbers producers. */
om_status *om_graph_compact(om_graph *g);
/* 1 when values a and b hold equal constant tensors. */
int om_value_constants_equal(const om_graph *g, int a, int b);

/* Runs each node's dtype rule in order; fills value dtypes. */
om_status *om_graph_infer_types(om_graph *g);

#endif
