/* onnx_import.c — ONNX ModelProto bytes → om_graph, through protobuf-c.
 *
 * Every problem with the bytes becomes an OM_INVALID_MODEL error that says what and
 * where; ops the table lacks become OM_UNSUPPORTED_OP naming op type and node, and so do
 * attributes (or attribute values) the node's op does not implement: each node is checked
 * against its op's attrs list (ops/op.h) before any rule or pass reads an attribute. The bytes
 * may come from anyone (a file a user was sent, a fuzzer): every field is checked once, in
 * om_onnx_check_model, before anything reads it, so that no consumer meets a NULL name, a
 * dim product that overflows or data shorter than its dims.
 */
#include "graph/ir.h"
#include "graph/onnx_tensor.h"
#include "ops/op.h"
#include "onnx.pb-c.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Checks everything about tp that a copy of its data relies on, without allocating: the
 * element count and byte size of its dims (overflow-checked), and that the data it holds has
 * exactly that length. A model can claim any dims; only the data it carries is real. */
static om_status *tensor_proto_check(const Onnx__TensorProto *tp, int64_t *numel, size_t *nbytes) {
    const char *name = tp->name ? tp->name : "";
    if (tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return om_error(OM_INVALID_MODEL, "tensor '%s' uses external data, which ortmod does not load", name);
    if (tp->n_dims > OM_MAX_RANK)
        return om_error(OM_INVALID_MODEL, "tensor '%s' has rank %zu (max %d)", name, tp->n_dims, OM_MAX_RANK);
    const om_dtype dt = (om_dtype)tp->data_type;
    const size_t esize = om_dtype_size(dt);
    if (!esize)
        return om_error(OM_INVALID_MODEL, "tensor '%s' has data type %d, which ortmod does not support", name,
                        tp->data_type);
    for (size_t i = 0; i < tp->n_dims; i++)
        if (tp->dims[i] < 0)
            return om_error(OM_INVALID_MODEL, "tensor '%s' has a negative dim (%lld at axis %zu)", name,
                            (long long)tp->dims[i], i);
    if (om_shape_size(tp->dims, (int)tp->n_dims, esize, numel, nbytes) != 0)
        return om_error(OM_INVALID_MODEL, "tensor '%s': the size of its dims overflows (more than %lld bytes)", name,
                        (long long)OM_MAX_TENSOR_BYTES);
    size_t have;
    const char *field = "int32_data";
    int widened = 0;
    if (tp->has_raw_data && tp->raw_data.len) {
        if (tp->raw_data.len != *nbytes)
            return om_error(OM_INVALID_MODEL, "tensor '%s' holds %zu bytes of raw data but its shape needs %zu", name,
                            tp->raw_data.len, *nbytes);
        return NULL;
    }
    switch (dt) {
    case OM_F32: have = tp->n_float_data, field = "float_data"; break;
    case OM_F64: have = tp->n_double_data, field = "double_data"; break;
    case OM_I64: have = tp->n_int64_data, field = "int64_data"; break;
    default: have = tp->n_int32_data, widened = 1; break;
    }
    if (have != (size_t)*numel)
        return om_error(OM_INVALID_MODEL, "tensor '%s' holds %zu elements of data (%s) but its shape needs %lld", name,
                        have, field, (long long)*numel);
    /* int32_data stores int32 and the narrower types widened: a value that does not fit the
     * element type would be truncated into another number */
    int64_t lo = INT32_MIN, hi = INT32_MAX;
    switch (dt) {
    case OM_U8: lo = 0, hi = 255; break;
    case OM_I8: lo = -128, hi = 127; break;
    case OM_BOOL: lo = 0, hi = 1; break;
    case OM_F16: case OM_BF16: lo = 0, hi = 65535; break;   /* the bits of each half */
    default: break;
    }
    if (widened)
        for (size_t i = 0; i < have; i++)
            if (tp->int32_data[i] < lo || tp->int32_data[i] > hi)
                return om_error(OM_INVALID_MODEL, "tensor '%s' (%s): element %zu of int32_data is %d, outside %lld..%lld",
                                name, om_dtype_name(dt), i, tp->int32_data[i], (long long)lo, (long long)hi);
    return NULL;
}

om_status *om_tensor_from_proto(const Onnx__TensorProto *tp, om_tensor *out) {
    memset(out, 0, sizeof(*out));
    int64_t numel;
    size_t nbytes;
    OM_TRY(tensor_proto_check(tp, &numel, &nbytes));   /* before allocating what the dims claim */
    const char *name = tp->name ? tp->name : "";
    out->dtype = (om_dtype)tp->data_type;
    out->rank = (int)tp->n_dims;
    for (size_t i = 0; i < tp->n_dims; i++) out->dims[i] = tp->dims[i];
    out->data = om_alloc(nbytes);
    if (!out->data) return om_error(OM_OUT_OF_MEMORY, "out of memory loading tensor '%s' (%zu bytes)", name, nbytes);
    if (tp->has_raw_data && tp->raw_data.len) {
        memcpy(out->data, tp->raw_data.data, nbytes);   /* little-endian hosts only, as ONNX stores it */
        return NULL;
    }
    if (numel == 0) return NULL;
    switch (out->dtype) {
    case OM_F32: memcpy(out->data, tp->float_data, nbytes); return NULL;
    case OM_F64: memcpy(out->data, tp->double_data, nbytes); return NULL;
    case OM_I64: memcpy(out->data, tp->int64_data, nbytes); return NULL;
    default: break;
    }
    /* int32 and the narrower types that int32_data stores widened (each value checked to fit) */
    const size_t esize = om_dtype_size(out->dtype);
    for (int64_t i = 0; i < numel; i++) {
        int32_t v = tp->int32_data[i];
        switch (esize) {
        case 4: ((int32_t *)out->data)[i] = v; break;
        case 2: ((uint16_t *)out->data)[i] = (uint16_t)v; break;
        default: ((uint8_t *)out->data)[i] = (uint8_t)v; break;
        }
    }
    return NULL;
}

static om_status *import_attr(const Onnx__AttributeProto *ap, const char *node, const char *op, om_attr *a) {
    memset(a, 0, sizeof(*a));
    a->name = om_strdup(ap->name);   /* (om_onnx_check_model: every attribute has a name) */
    if (!a->name) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    switch (ap->type) {
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: a->type = OM_ATTR_FLOAT; a->f = ap->f; break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: a->type = OM_ATTR_INT; a->i = ap->i; break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
        a->type = OM_ATTR_STRING;
        a->s = malloc(ap->s.len + 1);
        if (!a->s) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        if (ap->s.len) memcpy(a->s, ap->s.data, ap->s.len);
        a->s[ap->s.len] = 0;
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR:
        a->type = OM_ATTR_TENSOR;
        if (!ap->t) return om_error(OM_INVALID_MODEL, "node '%s': tensor attribute '%s' is empty", node, a->name);
        return om_error_context(om_tensor_from_proto(ap->t, &a->t), "node '%s' attribute '%s'", node, a->name);
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS:
        a->type = OM_ATTR_INTS;
        a->n = (int)ap->n_ints;
        a->ints = malloc(sizeof(int64_t) * (ap->n_ints + 1));
        if (!a->ints) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        if (ap->n_ints) memcpy(a->ints, ap->ints, sizeof(int64_t) * ap->n_ints);
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS:
        a->type = OM_ATTR_FLOATS;
        a->n = (int)ap->n_floats;
        a->floats = malloc(sizeof(float) * (ap->n_floats + 1));
        if (!a->floats) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        if (ap->n_floats) memcpy(a->floats, ap->floats, sizeof(float) * ap->n_floats);
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS:
        /* RNN's activations; which values an op takes is its attrs list's business */
        a->type = OM_ATTR_STRINGS;
        a->strs = calloc(ap->n_strings + 1, sizeof(char *));
        if (!a->strs) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < ap->n_strings; i++) {
            a->strs[i] = malloc(ap->strings[i].len + 1);
            if (!a->strs[i]) return om_error(OM_OUT_OF_MEMORY, "out of memory");
            a->n = (int)i + 1;   /* (attr_clear frees the first n) */
            if (ap->strings[i].len) memcpy(a->strs[i], ap->strings[i].data, ap->strings[i].len);
            a->strs[i][ap->strings[i].len] = 0;
        }
        break;
    default:
        /* graphs, sparse tensors: no op of the table reads one */
        return om_error(OM_UNSUPPORTED_OP, "node '%s' (%s): attribute '%s' is not implemented by ortmod (it has "
                        "ONNX attribute type %d, which no ortmod op reads)", node, op, a->name, (int)ap->type);
    }
    return NULL;
}

static om_dtype value_info_dtype(const Onnx__ValueInfoProto *vi) {
    if (vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && vi->type->tensor_type &&
        vi->type->tensor_type->has_elem_type)
        return (om_dtype)vi->type->tensor_type->elem_type;
    return OM_UNDEFINED;
}

static int value_info_rank(const Onnx__ValueInfoProto *vi) {
    if (vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && vi->type->tensor_type &&
        vi->type->tensor_type->shape)
        return (int)vi->type->tensor_type->shape->n_dim;
    return -1;
}

/* ---- the model check -------------------------------------------------------------------
 * Everything of a ModelProto that a reader relies on, checked once, before any of it is
 * used, for every client: the importer below, and the runner, which reads the unpacked
 * model itself (weights, input names) before it builds the training graph. */

/* A set of value names, to find each name's definition in O(1): open addressing. */
typedef struct name_set {
    const char **slot;
    char *kind;          /* per slot: what defined the name (a DEF_* below) */
    size_t cap;
} name_set;

enum { DEF_INITIALIZER = 1, DEF_INPUT, DEF_NODE };

static const char *def_name(int kind) {
    return kind == DEF_INITIALIZER ? "an initializer" : kind == DEF_INPUT ? "a graph input" : "an earlier node";
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The slot of name: where it is, or the empty slot where it would go. */
static size_t name_slot(const name_set *ns, const char *name) {
    size_t i = (size_t)name_hash(name) & (ns->cap - 1);
    while (ns->slot[i] && strcmp(ns->slot[i], name) != 0) i = (i + 1) & (ns->cap - 1);
    return i;
}

/* What defined name, or 0. */
static int name_kind(const name_set *ns, const char *name) {
    size_t i = name_slot(ns, name);
    return ns->slot[i] ? ns->kind[i] : 0;
}

static void name_add(name_set *ns, const char *name, int kind) {
    size_t i = name_slot(ns, name);
    ns->slot[i] = name;
    ns->kind[i] = (char)kind;
}

/* What errors call node k: its name, else its first output, else its position. */
static const char *node_label(const Onnx__NodeProto *np, size_t k, char *buf, size_t n) {
    if (np->name && *np->name) return np->name;
    if (np->n_output && np->output[0] && *np->output[0]) return np->output[0];
    snprintf(buf, n, "#%zu", k);
    return buf;
}

/* The default domain's opsets that ortmod reads: 13 is the oldest whose op signatures the op
 * table implements; ONNX had defined 23 by 2025, and a version far above that is not a newer
 * model but a corrupt field (2^62 would also wrap when stored as an int). */
#define OPSET_MIN 13
#define OPSET_MAX 100

static om_status *check_opsets(const Onnx__ModelProto *mp) {
    int have_default = 0;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *os = mp->opset_import[i];
        const char *domain = os->domain ? os->domain : "";
        const int dflt = !*domain || strcmp(domain, "ai.onnx") == 0;
        const int64_t v = os->version;
        if (dflt && have_default)
            return om_error(OM_INVALID_MODEL, "the model imports the default ONNX opset twice");
        have_default |= dflt;
        if (dflt && v < OPSET_MIN)
            return om_error(OM_INVALID_MODEL, "opset %lld is too old: ortmod needs opset %d or newer", (long long)v,
                            OPSET_MIN);
        if (v < 1 || v > OPSET_MAX)
            return om_error(OM_INVALID_MODEL, "opset version %lld of domain '%s' is outside 1..%d", (long long)v, domain,
                            OPSET_MAX);
    }
    return NULL;
}

static om_status *check_attrs(const Onnx__NodeProto *np, const char *node, const char *op) {
    if (np->n_attribute > 256)   /* no op has a tenth of that; the duplicate check below is quadratic */
        return om_error(OM_INVALID_MODEL, "node '%s' (%s) has %zu attributes", node, op, np->n_attribute);
    for (size_t a = 0; a < np->n_attribute; a++) {
        const Onnx__AttributeProto *ap = np->attribute[a];
        if (!ap->name || !*ap->name)
            return om_error(OM_INVALID_MODEL, "node '%s' (%s): attribute %zu has no name", node, op, a);
        for (size_t b = 0; b < a; b++)
            if (strcmp(np->attribute[b]->name, ap->name) == 0)
                return om_error(OM_INVALID_MODEL, "node '%s' (%s): attribute '%s' is given twice", node, op, ap->name);
        /* (each attribute's type and value against its op: om_node_check_attrs, after import) */
        if (ap->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING && ap->s.len && memchr(ap->s.data, 0, ap->s.len))
            return om_error(OM_INVALID_MODEL, "node '%s' (%s): string attribute '%s' holds a NUL byte", node, op,
                            ap->name);
        if (ap->n_ints > INT32_MAX || ap->n_floats > INT32_MAX)
            return om_error(OM_INVALID_MODEL, "node '%s' (%s): attribute '%s' is too long", node, op, ap->name);
        if (ap->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR && ap->t) {
            int64_t numel;
            size_t nbytes;
            om_status *st = tensor_proto_check(ap->t, &numel, &nbytes);
            if (st) return om_error_context(st, "node '%s' (%s) attribute '%s'", node, op, ap->name);
        }
    }
    return NULL;
}

om_status *om_onnx_check_model(const Onnx__ModelProto *mp) {
    const Onnx__GraphProto *gp = mp->graph;
    if (!gp) return om_error(OM_INVALID_MODEL, "the ONNX model has no graph");
    OM_TRY(check_opsets(mp));
    if (gp->n_sparse_initializer)
        return om_error(OM_INVALID_MODEL, "the graph has sparse initializers, which ortmod does not load");
    size_t n_names = gp->n_initializer + gp->n_input;
    for (size_t k = 0; k < gp->n_node; k++) n_names += gp->node[k]->n_output;
    name_set ns = {0};
    ns.cap = 16;
    while (ns.cap < 2 * n_names) ns.cap *= 2;
    ns.slot = calloc(ns.cap, sizeof *ns.slot);
    ns.kind = calloc(ns.cap, 1);
    om_status *st = NULL;
    if (!ns.slot || !ns.kind) { st = om_error(OM_OUT_OF_MEMORY, "out of memory checking the model"); goto done; }

    for (size_t i = 0; i < gp->n_initializer && !st; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        int64_t numel;
        size_t nbytes;
        if (!tp->name || !*tp->name) st = om_error(OM_INVALID_MODEL, "initializer %zu has no name", i);
        else if (name_kind(&ns, tp->name)) st = om_error(OM_INVALID_MODEL, "initializer '%s' is given twice", tp->name);
        else if ((st = tensor_proto_check(tp, &numel, &nbytes))) st = om_error_context(st, "initializer %zu", i);
        else name_add(&ns, tp->name, DEF_INITIALIZER);
    }
    for (size_t i = 0; i < gp->n_input && !st; i++) {
        const char *name = gp->input[i]->name;
        int kind = name && *name ? name_kind(&ns, name) : 0;
        if (!name || !*name) st = om_error(OM_INVALID_MODEL, "graph input %zu has no name", i);
        else if (kind == DEF_INPUT) st = om_error(OM_INVALID_MODEL, "graph input '%s' is listed twice", name);
        else if (!kind) name_add(&ns, name, DEF_INPUT);   /* an initializer listed as an input too: allowed (IR < 4) */
    }
    for (size_t k = 0; k < gp->n_node && !st; k++) {
        const Onnx__NodeProto *np = gp->node[k];
        char label[32];
        const char *name = node_label(np, k, label, sizeof label);
        if (!np->op_type || !*np->op_type) {
            st = om_error(OM_INVALID_MODEL, "node %zu ('%s') has no op_type", k, name);   /* (the label may be #k) */
            break;
        }
        const char *op = np->op_type;
        if (np->n_input > 64 || np->n_output > 64) {
            st = om_error(OM_INVALID_MODEL, "node '%s' (%s) has too many inputs or outputs", name, op);
            break;
        }
        for (size_t i = 0; i < np->n_input && !st; i++) {
            const char *in = np->input[i];
            if (!in) st = om_error(OM_INVALID_MODEL, "node '%s' (%s): input %zu has no name", name, op, i);
            else if (*in && !name_kind(&ns, in))
                st = om_error(OM_INVALID_MODEL,
                              "node '%s' (%s) reads '%s', which no earlier node, input or initializer defines", name, op,
                              in);
        }
        for (size_t j = 0; j < np->n_output && !st; j++) {
            const char *o = np->output[j];
            int kind = o && *o ? name_kind(&ns, o) : 0;
            if (!o) st = om_error(OM_INVALID_MODEL, "node '%s' (%s): output %zu has no name", name, op, j);
            else if (kind)
                st = om_error(OM_INVALID_MODEL, "node '%s' (%s) writes '%s', which %s already defines", name, op, o,
                              def_name(kind));
            else if (*o) name_add(&ns, o, DEF_NODE);
        }
        if (!st) st = check_attrs(np, name, op);
    }
    for (size_t i = 0; i < gp->n_output && !st; i++) {
        const char *name = gp->output[i]->name;
        if (!name || !*name) st = om_error(OM_INVALID_MODEL, "graph output %zu has no name", i);
        else if (!name_kind(&ns, name))
            st = om_error(OM_INVALID_MODEL, "graph output '%s' is not defined by any node", name);
    }
done:
    free(ns.slot);
    free(ns.kind);
    return st;
}

/* ---- import ------------------------------------------------------------------------------ */

/* The model passed om_onnx_check_model: every name below is a string, every value read is
 * defined, every tensor's data matches its dims. What is checked here needs the op table. */
static om_status *import_graph(const Onnx__ModelProto *mp, om_graph *g) {
    const Onnx__GraphProto *gp = mp->graph;
    g->opset = 0;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *os = mp->opset_import[i];
        if (!os->domain || !*os->domain || strcmp(os->domain, "ai.onnx") == 0) g->opset = (int)os->version;
    }

    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        int v = om_graph_add_value(g, tp->name, (om_dtype)tp->data_type);
        if (v < 0) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        om_tensor *t = calloc(1, sizeof(*t));
        if (!t) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        g->values[v].constant = t;
        OM_TRY(om_tensor_from_proto(tp, t));
    }
    g->inputs = malloc(sizeof(int) * (gp->n_input + 1));
    if (!g->inputs) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (om_graph_find_value(g, vi->name) >= 0) continue;   /* an initializer: a constant here */
        om_dtype dt = value_info_dtype(vi);
        if (!om_dtype_size(dt))
            return om_error(OM_INVALID_MODEL, "graph input '%s' has an unsupported or missing type", vi->name);
        int v = om_graph_add_value(g, vi->name, dt);
        if (v < 0) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        g->values[v].is_input = g->n_inputs;
        g->values[v].rank_hint = value_info_rank(vi);
        g->inputs[g->n_inputs++] = v;
    }

    for (size_t k = 0; k < gp->n_node; k++) {
        const Onnx__NodeProto *np = gp->node[k];
        char label[32];
        const char *name = node_label(np, k, label, sizeof label);
        const char *domain = np->domain ? np->domain : "";
        if (strcmp(domain, "ai.onnx") == 0) domain = "";
        const om_op_def *op = om_op_find(np->op_type, domain);
        /* ONNX lets only optional inputs and outputs be absent (an empty name), and the required
         * ones come first: the passes and kernels of a standard op read those without asking.
         * Internal ops mark absent values in other positions (a gradient op's unwanted inputs),
         * but never input 0, which every dtype rule reads (found by the fuzzer: FusedAttention). */
        if (op && op->min_in > 0 && np->n_input > 0 && !*np->input[0])
            return om_error(OM_INVALID_MODEL, "node '%s' (%s): input 0 is required, but its name is empty", name,
                            np->op_type);
        if (op && !*op->domain) {
            for (size_t i = 0; i < np->n_input && (int)i < op->min_in; i++)
                if (!*np->input[i])
                    return om_error(OM_INVALID_MODEL, "node '%s' (%s): input %zu is required, but its name is empty",
                                    name, np->op_type, i);
            for (size_t j = 0; j < np->n_output && (int)j < op->min_out; j++)
                if (!*np->output[j])
                    return om_error(OM_INVALID_MODEL, "node '%s' (%s): output %zu is required, but its name is empty",
                                    name, np->op_type, j);
        }
        int in[64], out[64];
        for (size_t i = 0; i < np->n_input; i++) {
            if (!*np->input[i]) { in[i] = -1; continue; }
            in[i] = om_graph_find_value(g, np->input[i]);
            if (in[i] < 0)
                return om_error(OM_INTERNAL, "node '%s' (%s) reads '%s', which the model check found defined", name,
                                np->op_type, np->input[i]);
        }
        for (size_t i = 0; i < np->n_output; i++) {
            if (!*np->output[i]) { out[i] = -1; continue; }
            out[i] = om_graph_add_value(g, np->output[i], OM_UNDEFINED);
            if (out[i] < 0) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        }
        /* ONNX's variadic Max/Min/Sum/Mean of a single input is that input: torch.export's
         * translation of x[mask] writes Max(indices) to broadcast its one index tensor */
        const char *op_type = np->op_type;
        if (!*domain && np->n_input == 1 && np->n_output == 1 &&
            (!strcmp(op_type, "Max") || !strcmp(op_type, "Min") || !strcmp(op_type, "Sum") || !strcmp(op_type, "Mean"))) {
            if (np->n_attribute)   /* these ops have none: refused as the attribute check would */
                return om_error(OM_UNSUPPORTED_OP, "node '%s' (%s): attribute '%s' is not implemented by ortmod (the op "
                                "takes none)", name, op_type, np->attribute[0]->name ? np->attribute[0]->name : "");
            op_type = "Identity";
        }
        int id;
        OM_TRY(om_graph_add_node(g, op_type, domain, name, in, (int)np->n_input, out, (int)np->n_output, &id));
        om_node *n = &g->nodes[id];
        n->attr = calloc(np->n_attribute + 1, sizeof(om_attr));
        if (!n->attr) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        for (size_t a = 0; a < np->n_attribute; a++) {
            n->n_attr++;
            OM_TRY(import_attr(np->attribute[a], name, np->op_type, &n->attr[a]));
        }
        OM_TRY(om_node_check_attrs(n));
    }

    g->outputs = malloc(sizeof(int) * (gp->n_output + 1));
    if (!g->outputs) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < gp->n_output; i++) {
        int v = om_graph_find_value(g, gp->output[i]->name);
        if (v < 0)
            return om_error(OM_INTERNAL, "graph output '%s' is not defined, yet the model check passed",
                            gp->output[i]->name);
        if (g->values[v].rank_hint < 0) g->values[v].rank_hint = value_info_rank(gp->output[i]);
        g->outputs[g->n_outputs++] = v;
    }
    return NULL;
}

om_status *om_graph_import_onnx(const void *bytes, size_t n, om_graph **out) {
    *out = NULL;
    if (!bytes || n == 0) return om_error(OM_INVALID_MODEL, "the ONNX model is empty");
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, n, bytes);
    if (!mp) return om_error(OM_INVALID_MODEL, "the bytes are not a valid ONNX model (protobuf parsing failed)");
    om_status *st = om_onnx_check_model(mp);
    om_graph *g = NULL;
    if (!st) {
        g = om_graph_new();
        st = g ? import_graph(mp, g) : om_error(OM_OUT_OF_MEMORY, "out of memory");
    }
    onnx__model_proto__free_unpacked(mp, NULL);
    if (!st) st = om_graph_infer_types(g);
    if (st) {
        om_graph_free(g);
        return st;
    }
    *out = g;
    return NULL;
}
