/* onnx_export.c — om_graph → ONNX bytes, for the debug artifacts (save_onnx).
 *
 * The messages point into the graph's own strings and data; only the arrays of message
 * structs are allocated here, and freed once packed.
 */
#include "graph/ir.h"
#include "ops/op.h"
#include "onnx.pb-c.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct export_state {
    Onnx__NodeProto *nodes, **node_ptrs;
    Onnx__AttributeProto *attrs, **attr_ptrs;
    Onnx__TensorProto *tensors, **tensor_ptrs;
    Onnx__ValueInfoProto *vis, **vi_ptrs;
    Onnx__TypeProto *types;
    Onnx__TypeProto__Tensor *ttypes;
    Onnx__TensorShapeProto *shapes;
    Onnx__TensorShapeProto__Dimension *dims, **dim_ptrs;
    char (*dim_names)[24];
    ProtobufCBinaryData *strs;   /* strings attributes' elements, pointing into the attrs */
    int n_in_vi;
    char ***node_io;   /* per node: one array of name pointers for inputs then outputs */
} export_state;

static void tensor_proto(Onnx__TensorProto *tp, const om_tensor *t, char *name) {
    onnx__tensor_proto__init(tp);
    tp->name = name;
    tp->n_dims = (size_t)t->rank;
    tp->dims = (int64_t *)t->dims;
    tp->has_data_type = 1;
    tp->data_type = (int32_t)t->dtype;
    tp->has_raw_data = 1;
    tp->raw_data.len = om_tensor_nbytes(t);
    tp->raw_data.data = t->data;
}

static void value_info(export_state *s, int k, const om_graph *g, int v) {
    Onnx__ValueInfoProto *vi = &s->vis[k];
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(&s->types[k]);
    onnx__type_proto__tensor__init(&s->ttypes[k]);
    vi->name = g->values[v].name;
    s->ttypes[k].has_elem_type = 1;
    s->ttypes[k].elem_type = (int32_t)g->values[v].dtype;
    s->types[k].value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    s->types[k].tensor_type = &s->ttypes[k];
    vi->type = &s->types[k];
    s->vi_ptrs[k] = vi;
    /* every dim is dynamic: a symbolic name per graph input/output and axis */
    int rank = g->values[v].rank_hint;
    if (rank < 0 || rank > OM_MAX_RANK) return;
    Onnx__TensorShapeProto *sp = &s->shapes[k];
    onnx__tensor_shape_proto__init(sp);
    sp->n_dim = (size_t)rank;
    sp->dim = &s->dim_ptrs[k * OM_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        Onnx__TensorShapeProto__Dimension *dm = &s->dims[k * OM_MAX_RANK + d];
        onnx__tensor_shape_proto__dimension__init(dm);
        snprintf(s->dim_names[k * OM_MAX_RANK + d], 24, "%s%d_%d", k < s->n_in_vi ? "in" : "out", k, d);
        dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
        dm->dim_param = s->dim_names[k * OM_MAX_RANK + d];
        sp->dim[d] = dm;
    }
    s->ttypes[k].shape = sp;
}

static void free_state(export_state *s, int n_nodes) {
    if (s->node_io)
        for (int i = 0; i < n_nodes; i++) free(s->node_io[i]);
    free(s->node_io);
    free(s->nodes); free(s->node_ptrs);
    free(s->attrs); free(s->attr_ptrs);
    free(s->tensors); free(s->tensor_ptrs);
    free(s->vis); free(s->vi_ptrs);
    free(s->types); free(s->ttypes);
    free(s->shapes); free(s->dims); free(s->dim_ptrs); free(s->dim_names);
    free(s->strs);
}

om_status *om_graph_export_onnx(const om_graph *g, const char *graph_name, void **bytes, size_t *n) {
    export_state s = {0};
    int n_attr = 0, n_const = 0, n_strs = 0, n_vi = g->n_inputs + g->n_outputs;
    for (int i = 0; i < g->n_nodes; i++) {
        n_attr += g->nodes[i].n_attr;
        for (int k = 0; k < g->nodes[i].n_attr; k++)
            if (g->nodes[i].attr[k].type == OM_ATTR_STRINGS) n_strs += g->nodes[i].attr[k].n;
    }
    for (int i = 0; i < g->n_values; i++) n_const += g->values[i].constant != NULL;
    s.nodes = calloc((size_t)g->n_nodes + 1, sizeof *s.nodes);
    s.node_ptrs = calloc((size_t)g->n_nodes + 1, sizeof *s.node_ptrs);
    s.node_io = calloc((size_t)g->n_nodes + 1, sizeof *s.node_io);
    s.attrs = calloc((size_t)n_attr + 1, sizeof *s.attrs);
    s.attr_ptrs = calloc((size_t)n_attr + 1, sizeof *s.attr_ptrs);
    s.tensors = calloc((size_t)(n_const + n_attr) + 1, sizeof *s.tensors);
    s.tensor_ptrs = calloc((size_t)n_const + 1, sizeof *s.tensor_ptrs);
    s.vis = calloc((size_t)n_vi + 1, sizeof *s.vis);
    s.vi_ptrs = calloc((size_t)n_vi + 1, sizeof *s.vi_ptrs);
    s.types = calloc((size_t)n_vi + 1, sizeof *s.types);
    s.ttypes = calloc((size_t)n_vi + 1, sizeof *s.ttypes);
    s.shapes = calloc((size_t)n_vi + 1, sizeof *s.shapes);
    s.dims = calloc((size_t)(n_vi + 1) * OM_MAX_RANK, sizeof *s.dims);
    s.dim_ptrs = calloc((size_t)(n_vi + 1) * OM_MAX_RANK, sizeof *s.dim_ptrs);
    s.dim_names = calloc((size_t)(n_vi + 1) * OM_MAX_RANK, sizeof *s.dim_names);
    s.strs = calloc((size_t)n_strs + 1, sizeof *s.strs);
    s.n_in_vi = g->n_inputs;
    if (!s.nodes || !s.node_ptrs || !s.node_io || !s.attrs || !s.attr_ptrs || !s.tensors || !s.tensor_ptrs ||
        !s.vis || !s.vi_ptrs || !s.types || !s.ttypes || !s.shapes || !s.dims || !s.dim_ptrs || !s.dim_names || !s.strs) {
        free_state(&s, g->n_nodes);
        return om_error(OM_OUT_OF_MEMORY, "out of memory exporting ONNX");
    }
    static char empty[] = "";
    int ai = 0, ti = 0, si = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const om_node *nd = &g->nodes[i];
        Onnx__NodeProto *np = &s.nodes[i];
        onnx__node_proto__init(np);
        char **io = calloc((size_t)(nd->n_in + nd->n_out) + 1, sizeof(char *));
        if (!io) { free_state(&s, g->n_nodes); return om_error(OM_OUT_OF_MEMORY, "out of memory exporting ONNX"); }
        s.node_io[i] = io;
        for (int k = 0; k < nd->n_in; k++) io[k] = nd->in[k] >= 0 ? g->values[nd->in[k]].name : empty;
        for (int k = 0; k < nd->n_out; k++) io[nd->n_in + k] = nd->out[k] >= 0 ? g->values[nd->out[k]].name : empty;
        np->n_input = (size_t)nd->n_in;
        np->input = io;
        np->n_output = (size_t)nd->n_out;
        np->output = io + nd->n_in;
        np->name = nd->name;
        np->op_type = (char *)nd->op->name;
        np->domain = (char *)nd->op->domain;
        np->n_attribute = (size_t)nd->n_attr;
        np->attribute = &s.attr_ptrs[ai];
        for (int k = 0; k < nd->n_attr; k++, ai++) {
            const om_attr *a = &nd->attr[k];
            Onnx__AttributeProto *ap = &s.attrs[ai];
            onnx__attribute_proto__init(ap);
            s.attr_ptrs[ai] = ap;
            ap->name = a->name;
            ap->has_type = 1;
            ap->type = (Onnx__AttributeProto__AttributeType)a->type;
            switch (a->type) {
            case OM_ATTR_FLOAT: ap->has_f = 1; ap->f = a->f; break;
            case OM_ATTR_INT: ap->has_i = 1; ap->i = a->i; break;
            case OM_ATTR_STRING: ap->has_s = 1; ap->s.data = (uint8_t *)a->s; ap->s.len = strlen(a->s); break;
            case OM_ATTR_INTS: ap->n_ints = (size_t)a->n; ap->ints = a->ints; break;
            case OM_ATTR_FLOATS: ap->n_floats = (size_t)a->n; ap->floats = a->floats; break;
            case OM_ATTR_STRINGS:
                ap->n_strings = (size_t)a->n;
                ap->strings = &s.strs[si];
                for (int e = 0; e < a->n; e++, si++) {
                    s.strs[si].data = (uint8_t *)a->strs[e];
                    s.strs[si].len = strlen(a->strs[e]);
                }
                break;
            case OM_ATTR_TENSOR:
                tensor_proto(&s.tensors[n_const + ti], &a->t, empty);
                ap->t = &s.tensors[n_const + ti++];
                break;
            }
        }
        s.node_ptrs[i] = np;
    }
    int ci = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].constant) {
            tensor_proto(&s.tensors[ci], g->values[i].constant, g->values[i].name);
            s.tensor_ptrs[ci] = &s.tensors[ci];
            ci++;
        }
    for (int i = 0; i < g->n_inputs; i++) value_info(&s, i, g, g->inputs[i]);
    for (int i = 0; i < g->n_outputs; i++) value_info(&s, g->n_inputs + i, g, g->outputs[i]);

    Onnx__GraphProto gp;
    onnx__graph_proto__init(&gp);
    gp.name = (char *)(graph_name ? graph_name : "ortmod");
    gp.n_node = (size_t)g->n_nodes;
    gp.node = s.node_ptrs;
    gp.n_initializer = (size_t)n_const;
    gp.initializer = s.tensor_ptrs;
    gp.n_input = (size_t)g->n_inputs;
    gp.input = s.vi_ptrs;
    gp.n_output = (size_t)g->n_outputs;
    gp.output = s.vi_ptrs + g->n_inputs;

    Onnx__OperatorSetIdProto os[2], *osp[2] = {&os[0], &os[1]};
    onnx__operator_set_id_proto__init(&os[0]);
    onnx__operator_set_id_proto__init(&os[1]);
    os[0].domain = empty;
    os[0].has_version = 1;
    os[0].version = g->opset ? g->opset : 20;
    os[1].domain = (char *)"ortmod";
    os[1].has_version = 1;
    os[1].version = 1;

    Onnx__ModelProto mp;
    onnx__model_proto__init(&mp);
    mp.has_ir_version = 1;
    mp.ir_version = 9;
    mp.producer_name = (char *)"ortmod";
    mp.graph = &gp;
    mp.n_opset_import = 2;
    mp.opset_import = osp;

    size_t size = onnx__model_proto__get_packed_size(&mp);
    *bytes = om_alloc(size);
    if (!*bytes) { free_state(&s, g->n_nodes); return om_error(OM_OUT_OF_MEMORY, "out of memory exporting ONNX"); }
    *n = onnx__model_proto__pack(&mp, *bytes);
    free_state(&s, g->n_nodes);
    return NULL;
}
