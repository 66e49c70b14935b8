/* onnx_import.c — ONNX ModelProto bytes → om_graph, through protobuf-c.
 *
 * Every problem with the bytes becomes an OM_INVALID_MODEL error that says what and
 * where; ops the table lacks become OM_UNSUPPORTED_OP naming op type and node, and so do
 * attributes (or attribute values) the node's op does not implement: each node is checked
 * against its op's attrs list (ops/op.h) before any rule or pass reads an attribute.
 */
#include "graph/ir.h"
#include "graph/onnx_tensor.h"
#include "ops/op.h"
#include "onnx.pb-c.h"

#include <stdlib.h>

om_status *om_tensor_from_proto(const Onnx__TensorProto *tp, om_tensor *out) {
    memset(out, 0, sizeof(*out));
    const char *name = tp->name ? tp->name : "";
    if (tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return om_error(OM_INVALID_MODEL, "tensor '%s' uses external data, which ortmod does not load", name);
    if (tp->n_dims > OM_MAX_RANK)
        return om_error(OM_INVALID_MODEL, "tensor '%s' has rank %zu (max %d)", name, tp->n_dims, OM_MAX_RANK);
    out->dtype = (om_dtype)tp->data_type;
    size_t esize = om_dtype_size(out->dtype);
    if (!esize)
        return om_error(OM_INVALID_MODEL, "tensor '%s' has data type %d, which ortmod does not support", name,
                        tp->data_type);
    out->rank = (int)tp->n_dims;
    for (size_t i = 0; i < tp->n_dims; i++) {
        if (tp->dims[i] < 0) return om_error(OM_INVALID_MODEL, "tensor '%s' has a negative dim", name);
        out->dims[i] = tp->dims[i];
    }
    int64_t numel = om_tensor_numel(out);
    size_t nbytes = (size_t)numel * esize;
    out->data = om_alloc(nbytes);
    if (!out->data) return om_error(OM_OUT_OF_MEMORY, "out of memory loading tensor '%s'", name);
    size_t have;
    if (tp->has_raw_data && tp->raw_data.len) {
        have = tp->raw_data.len;
        if (have != nbytes) goto size_mismatch;
        memcpy(out->data, tp->raw_data.data, nbytes);   /* little-endian hosts only, as ONNX stores it */
        return NULL;
    }
    switch (out->dtype) {
    case OM_F32:
        have = tp->n_float_data;
        if (have != (size_t)numel) goto size_mismatch;
        memcpy(out->data, tp->float_data, nbytes);
        break;
    case OM_F64:
        have = tp->n_double_data;
        if (have != (size_t)numel) goto size_mismatch;
        memcpy(out->data, tp->double_data, nbytes);
        break;
    case OM_I64:
        have = tp->n_int64_data;
        if (have != (size_t)numel) goto size_mismatch;
        memcpy(out->data, tp->int64_data, nbytes);
        break;
    case OM_I32: case OM_U8: case OM_I8: case OM_BOOL: case OM_F16: case OM_BF16:
        /* these are stored widened in int32_data */
        have = tp->n_int32_data;
        if (have != (size_t)numel) goto size_mismatch;
        for (int64_t i = 0; i < numel; i++) {
            int32_t v = tp->int32_data[i];
            switch (esize) {
            case 4: ((int32_t *)out->data)[i] = v; break;
            case 2: ((uint16_t *)out->data)[i] = (uint16_t)v; break;
            default: ((uint8_t *)out->data)[i] = (uint8_t)v; break;
            }
        }
        break;
    default:
        have = 0;
        if (numel != 0) goto size_mismatch;
    }
    return NULL;
size_mismatch:
    om_free(out->data);
    out->data = NULL;
    return om_error(OM_INVALID_MODEL, "tensor '%s' holds %zu elements of data but its shape needs %lld", name,
                    have, (long long)numel);
}

static om_status *import_attr(const Onnx__AttributeProto *ap, const char *node, const char *op, om_attr *a) {
    memset(a, 0, sizeof(*a));
    a->name = om_strdup(ap->name ? ap->name : "");
    if (!a->name) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    switch (ap->type) {
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: a->type = OM_ATTR_FLOAT; a->f = ap->f; break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: a->type = OM_ATTR_INT; a->i = ap->i; break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
        a->type = OM_ATTR_STRING;
        a->s = malloc(ap->s.len + 1);
        if (!a->s) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        memcpy(a->s, ap->s.data, ap->s.len);
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
        memcpy(a->ints, ap->ints, sizeof(int64_t) * ap->n_ints);
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS:
        a->type = OM_ATTR_FLOATS;
        a->n = (int)ap->n_floats;
        a->floats = malloc(sizeof(float) * (ap->n_floats + 1));
        if (!a->floats) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        memcpy(a->floats, ap->floats, sizeof(float) * ap->n_floats);
        break;
    default:
        /* strings, graphs, sparse tensors: no op of the table reads one (LSTM's activations) */
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

static om_status *import_graph(const Onnx__ModelProto *mp, om_graph *g) {
    const Onnx__GraphProto *gp = mp->graph;
    if (!gp) return om_error(OM_INVALID_MODEL, "the ONNX model has no graph");
    g->opset = 0;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *os = mp->opset_import[i];
        if (!os->domain || !*os->domain || strcmp(os->domain, "ai.onnx") == 0) g->opset = (int)os->version;
    }
    if (g->opset && g->opset < 13)
        return om_error(OM_INVALID_MODEL, "opset %d is too old: ortmod needs opset 13 or newer", g->opset);

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
        const char *name = np->name && *np->name ? np->name : (np->n_output ? np->output[0] : "?");
        int in[64], out[64];
        if (np->n_input > 64 || np->n_output > 64)
            return om_error(OM_INVALID_MODEL, "node '%s' has too many inputs or outputs", name);
        for (size_t i = 0; i < np->n_input; i++) {
            if (!np->input[i] || !*np->input[i]) { in[i] = -1; continue; }
            in[i] = om_graph_find_value(g, np->input[i]);
            if (in[i] < 0)
                return om_error(OM_INVALID_MODEL,
                                "node '%s' (%s) reads '%s', which no earlier node, input or initializer defines",
                                name, np->op_type, np->input[i]);
        }
        for (size_t i = 0; i < np->n_output; i++) {
            if (!np->output[i] || !*np->output[i]) { out[i] = -1; continue; }
            out[i] = om_graph_add_value(g, np->output[i], OM_UNDEFINED);
            if (out[i] < 0) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        }
        const char *domain = np->domain ? np->domain : "";
        if (strcmp(domain, "ai.onnx") == 0) domain = "";
        int id;
        OM_TRY(om_graph_add_node(g, np->op_type, domain, name, in, (int)np->n_input, out, (int)np->n_output, &id));
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
            return om_error(OM_INVALID_MODEL, "graph output '%s' is not defined by any node", gp->output[i]->name);
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
    om_graph *g = om_graph_new();
    om_status *st = g ? import_graph(mp, g) : om_error(OM_OUT_OF_MEMORY, "out of memory");
    onnx__model_proto__free_unpacked(mp, NULL);
    if (!st) st = om_graph_infer_types(g);
    if (st) {
        om_graph_free(g);
        return st;
    }
    *out = g;
    return NULL;
}
