/* runner_model.c — the ONNX side of the runner: load the model, pick the weights that
 * train, build the training graph (weights as inputs + the loss), check data features
 * against the graph inputs, and save the trained model.
 *
 * The training graph is a shallow copy of the original GraphProto whose input,
 * initializer, node and output lists are replaced by arrays built here; the messages
 * added (value infos, loss nodes, attributes) live in a small list that is freed after
 * packing, so the original unpacked model is never modified. */
#include "graph/onnx_tensor.h"
#include "runner/runner_internal.h"

#include <stdlib.h>

static const Onnx__TensorProto *find_init(const Onnx__GraphProto *g, const char *name) {
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name)) return g->initializer[i];
    return NULL;
}

/* A graph input that is not an initializer (a data input), or NULL. */
static const Onnx__ValueInfoProto *find_data_input(const Onnx__GraphProto *g, const char *name) {
    for (size_t i = 0; i < g->n_input; i++)
        if (g->input[i]->name && !strcmp(g->input[i]->name, name)) return find_init(g, name) ? NULL : g->input[i];
    return NULL;
}

static int in_list(char *const *list, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i], name)) return 1;
    return 0;
}

static int value_defined(const Onnx__GraphProto *g, const char *name) {
    for (size_t k = 0; k < g->n_node; k++)
        for (size_t j = 0; j < g->node[k]->n_output; j++)
            if (g->node[k]->output[j] && !strcmp(g->node[k]->output[j], name)) return 1;
    return find_data_input(g, name) != NULL;
}

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
static uint64_t fnv_str(uint64_t h, const char *s) { return fnv(h, s ? s : "", s ? strlen(s) + 1 : 1); }

om_status *rn_model_load(om_runner *r) {
    const char *path = r->p.model_path;
    void *bytes;
    om_status *st = om_onnx_read_model_file(path, &bytes, &r->model_len);   /* with its external data */
    r->model_bytes = bytes;
    if (st) return st;   /* (each message names the file) */
    if (r->model_len == 0) return om_error(OM_INVALID_MODEL, "model '%s' is empty", path);
    r->mp = onnx__model_proto__unpack(NULL, r->model_len, r->model_bytes);
    if (!r->mp) return om_error(OM_INVALID_MODEL, "model '%s' is not a valid ONNX model (protobuf parsing failed)", path);
    /* the same check the engine's importer makes, before this file reads names and weights */
    if ((st = om_onnx_check_model(r->mp))) return om_error_context(st, "model '%s'", path);
    const Onnx__GraphProto *g = r->mp->graph;
    if (!g || g->n_node == 0)
        return om_error(OM_INVALID_MODEL, "model '%s' is not a valid ONNX model (it has no graph or no nodes)", path);
    if (g->n_output == 0) return om_error(OM_INVALID_MODEL, "model '%s' has no outputs", path);

    for (int i = 0; i < r->p.n_weights_to_train; i++)
        if (!find_init(g, r->wt[i]))
            return om_error(OM_INVALID_ARGUMENT, "weights_to_train: '%s' is not an initializer of the model", r->wt[i]);
    for (int i = 0; i < r->p.n_weights_not_to_train; i++)
        if (!find_init(g, r->wnt[i]))
            return om_error(OM_INVALID_ARGUMENT, "weights_not_to_train: '%s' is not an initializer of the model",
                            r->wnt[i]);

    r->w = calloc(g->n_initializer + 1, sizeof(rn_weight));
    if (!r->w) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < g->n_initializer; i++) {
        const Onnx__TensorProto *tp = g->initializer[i];
        const char *name = tp->name ? tp->name : "";
        int listed = in_list(r->wt, r->p.n_weights_to_train, name);
        if (r->p.n_weights_to_train && !listed) continue;
        if (in_list(r->wnt, r->p.n_weights_not_to_train, name)) continue;
        if (tp->data_type != OM_F32) {
            if (listed)
                return om_error(OM_INVALID_ARGUMENT, "weights_to_train: '%s' is %s; only float32 weights train", name,
                                om_dtype_name((om_dtype)tp->data_type));
            continue;
        }
        rn_weight *w = &r->w[r->n_weights];
        w->name = om_strdup(name);
        if (!w->name) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        w->init_index = (int)i;
        st = om_tensor_from_proto(tp, &w->value);
        if (st) {
            /* not counted yet, so om_runner_free would not free it */
            free(w->name);
            w->name = NULL;
            return om_error_context(st, "model '%s'", path);
        }
        r->n_weights++;
    }
    if (r->n_weights == 0)
        return om_error(OM_INVALID_ARGUMENT, "model '%s' has no float32 initializer to train (with the weight lists given)",
                        path);

    const char *li = r->p.loss_input ? r->p.loss_input : g->output[0]->name;
    if (!li || !value_defined(g, li))
        return om_error(OM_INVALID_ARGUMENT, "loss_input: '%s' is not a value of the model", li ? li : "");
    r->loss_input = om_strdup(li);

    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t k = 0; k < g->n_node; k++) {
        const Onnx__NodeProto *n = g->node[k];
        h = fnv_str(h, n->op_type);
        for (size_t j = 0; j < n->n_input; j++) h = fnv_str(h, n->input[j]);
        for (size_t j = 0; j < n->n_output; j++) h = fnv_str(h, n->output[j]);
    }
    for (size_t i = 0; i < g->n_input; i++) h = fnv_str(h, g->input[i]->name);
    for (int i = 0; i < r->n_weights; i++) {
        h = fnv_str(h, r->w[i].name);
        h = fnv(h, r->w[i].value.dims, sizeof(int64_t) * (size_t)r->w[i].value.rank);
    }
    r->fingerprint = h;
    return NULL;
}

/* ---- checking data against the graph -------------------------------------------------- */

static om_dtype vi_dtype(const Onnx__ValueInfoProto *vi) {
    if (vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && vi->type->tensor_type &&
        vi->type->tensor_type->has_elem_type)
        return (om_dtype)vi->type->tensor_type->elem_type;
    return OM_UNDEFINED;
}

static const Onnx__TensorShapeProto *vi_shape(const Onnx__ValueInfoProto *vi) {
    if (vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && vi->type->tensor_type)
        return vi->type->tensor_type->shape;
    return NULL;
}

om_status *rn_model_check_feature(const om_runner *r, const rn_dataset *ds, int k, const char *dir) {
    const Onnx__GraphProto *g = r->mp->graph;
    const rn_feature *f = &ds->f[k];
    const int needs_label = r->p.loss != OM_LOSS_NONE;
    if (needs_label && !strcmp(f->name, r->p.label_name)) {
        if (r->p.loss == OM_LOSS_MSE && f->dtype != OM_F32)
            return om_error(OM_INVALID_ARGUMENT, "data '%s': label feature '%s' is %s; the mse loss needs float32", dir,
                            f->name, om_dtype_name(f->dtype));
        if (r->p.loss == OM_LOSS_SOFTMAX_CROSS_ENTROPY && f->dtype != OM_I64 && f->dtype != OM_I32 && f->dtype != OM_F32)
            return om_error(OM_INVALID_ARGUMENT,
                            "data '%s': label feature '%s' is %s; softmax cross-entropy takes int64/int32 class "
                            "indices or float32 one-hot rows", dir, f->name, om_dtype_name(f->dtype));
        return NULL;
    }
    const Onnx__ValueInfoProto *vi = find_data_input(g, f->name);
    if (!vi) {
        char names[1024] = "";
        size_t used = 0;
        for (size_t i = 0; i < g->n_input; i++)
            if (!find_init(g, g->input[i]->name))
                used += (size_t)snprintf(names + used, used < sizeof names ? sizeof names - used : 0, "%s'%s'",
                                         used ? ", " : "", g->input[i]->name);
        return om_error(OM_INVALID_ARGUMENT,
                        "data '%s': feature '%s' matches no graph input (the graph takes %s%s%s%s)", dir, f->name,
                        names, needs_label ? ", and the label '" : "", needs_label ? r->p.label_name : "",
                        needs_label ? "'" : "");
    }
    om_dtype want = vi_dtype(vi);
    if (want != OM_UNDEFINED && want != f->dtype)
        return om_error(OM_INVALID_ARGUMENT, "data '%s': feature '%s' is %s but graph input '%s' is %s", dir, f->name,
                        om_dtype_name(f->dtype), vi->name, om_dtype_name(want));
    const Onnx__TensorShapeProto *sh = vi_shape(vi);
    if (sh) {
        char got[128];
        om_tensor t;
        memset(&t, 0, sizeof t);
        t.dtype = f->dtype;
        t.rank = f->rank;
        memcpy(t.dims, f->dims, sizeof t.dims);
        om_shape_str(&t, got, sizeof got);
        if ((int)sh->n_dim != f->rank + 1)
            return om_error(OM_INVALID_ARGUMENT,
                            "data '%s': feature '%s' has per-sample shape %s (rank %d) but graph input '%s' has rank %d "
                            "(batch dim + %d sample dims)", dir, f->name, got, f->rank, vi->name, (int)sh->n_dim,
                            (int)sh->n_dim - 1);
        for (int d = 1; d < (int)sh->n_dim; d++) {
            const Onnx__TensorShapeProto__Dimension *dim = sh->dim[d];
            if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dim->dim_value > 0 &&
                dim->dim_value != f->dims[d - 1])
                return om_error(OM_INVALID_ARGUMENT,
                                "data '%s': feature '%s' has per-sample shape %s but graph input '%s' needs dim %d = %lld",
                                dir, f->name, got, vi->name, d, (long long)dim->dim_value);
        }
    }
    return NULL;
}

/* ---- the training graph ------------------------------------------------------------- */

typedef struct keep {
    void **p;
    int n, cap;
} keep;

static void *keep_add(keep *k, void *p) {
    if (!p) return NULL;
    if (om_grow((void **)&k->p, &k->cap, k->n, sizeof(void *))) { free(p); return NULL; }
    k->p[k->n++] = p;
    return p;
}
static void *kalloc(keep *k, size_t n) { return keep_add(k, calloc(1, n ? n : 1)); }
static char *kstr(keep *k, const char *s) { return keep_add(k, om_strdup(s)); }

/* A tensor ValueInfo: dims < 0 are symbolic (dim_param). rank -1: no shape. */
static Onnx__ValueInfoProto *make_vi(keep *k, const char *name, om_dtype dt, int rank, const int64_t *dims) {
    Onnx__ValueInfoProto *vi = kalloc(k, sizeof *vi);
    Onnx__TypeProto *tp = kalloc(k, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = kalloc(k, sizeof *tt);
    if (!vi || !tp || !tt) return NULL;
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    vi->name = kstr(k, name);
    vi->type = tp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    tt->has_elem_type = 1;
    tt->elem_type = (int32_t)dt;
    if (rank >= 0) {
        Onnx__TensorShapeProto *sh = kalloc(k, sizeof *sh);
        Onnx__TensorShapeProto__Dimension **dv = kalloc(k, sizeof(void *) * (size_t)(rank + 1));
        if (!sh || !dv) return NULL;
        onnx__tensor_shape_proto__init(sh);
        sh->n_dim = (size_t)rank;
        sh->dim = dv;
        for (int i = 0; i < rank; i++) {
            Onnx__TensorShapeProto__Dimension *d = kalloc(k, sizeof *d);
            if (!d) return NULL;
            onnx__tensor_shape_proto__dimension__init(d);
            if (dims[i] >= 0) {
                d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                d->dim_value = dims[i];
            } else {
                d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                d->dim_param = kstr(k, "batch");
            }
            dv[i] = d;
        }
        tt->shape = sh;
    }
    return vi;
}

static Onnx__NodeProto *make_node(keep *k, const char *op, const char *name, const char *const *in, int n_in,
                                  const char *out) {
    Onnx__NodeProto *n = kalloc(k, sizeof *n);
    char **ins = kalloc(k, sizeof(char *) * (size_t)n_in);
    char **outs = kalloc(k, sizeof(char *));
    if (!n || !ins || !outs) return NULL;
    onnx__node_proto__init(n);
    n->op_type = kstr(k, op);
    n->name = kstr(k, name);
    n->domain = kstr(k, "");
    for (int i = 0; i < n_in; i++) ins[i] = kstr(k, in[i]);
    n->n_input = (size_t)n_in;
    n->input = ins;
    outs[0] = kstr(k, out);
    n->n_output = 1;
    n->output = outs;
    return n;
}

static int node_attr(keep *k, Onnx__NodeProto *n, const char *name, int64_t i, const char *s) {
    Onnx__AttributeProto *a = kalloc(k, sizeof *a);
    Onnx__AttributeProto **arr = kalloc(k, sizeof(void *) * (n->n_attribute + 1));
    if (!a || !arr) return -1;
    onnx__attribute_proto__init(a);
    a->name = kstr(k, name);
    a->has_type = 1;
    if (s) {
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
        a->has_s = 1;
        a->s.data = (uint8_t *)kstr(k, s);
        a->s.len = strlen(s);
    } else {
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
        a->has_i = 1;
        a->i = i;
    }
    for (size_t j = 0; j < n->n_attribute; j++) arr[j] = n->attribute[j];
    arr[n->n_attribute++] = a;
    n->attribute = arr;
    return 0;
}

#define LOSS_OUT "ortmod_runner/loss"

/* ---- mixed precision: the training graph computes in fp16/bf16 -----------------------------
 * What autocast does in eager, for the whole graph: every float32 value that enters it (a data
 * input, a trained weight — the fp32 master the optimizer updates —, a constant) is cast to the
 * half type where it enters, a Cast to float32 inside the model casts to the half type instead,
 * and the loss and the prediction are cast back to float32 where they leave. The engine then
 * computes every node in half (fp32 math, rounded once per node); the weights' gradients come
 * back in float32 through the entry Casts' gradient. */

static char *suffixed(keep *k, const char *name, const char *sfx) {
    size_t a = strlen(name), b = strlen(sfx);
    char *s = kalloc(k, a + b + 1);
    if (s) { memcpy(s, name, a); memcpy(s + a, sfx, b + 1); }
    return s;
}

/* A copy of node n that k owns, with its own input and attribute arrays (so renaming an input or
 * changing an attribute leaves the loaded model alone). */
static Onnx__NodeProto *own_node(keep *k, const Onnx__NodeProto *n) {
    Onnx__NodeProto *c = kalloc(k, sizeof *c);
    char **in = kalloc(k, sizeof(char *) * (n->n_input + 1));
    Onnx__AttributeProto **at = kalloc(k, sizeof(void *) * (n->n_attribute + 1));
    if (!c || !in || !at) return NULL;
    *c = *n;
    memcpy(in, n->input, sizeof(char *) * n->n_input);
    memcpy(at, n->attribute, sizeof(void *) * n->n_attribute);
    c->input = in;
    c->attribute = at;
    return c;
}

static int is_float32_vi(const Onnx__ValueInfoProto *vi) {
    return vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && vi->type->tensor_type &&
           vi->type->tensor_type->elem_type == OM_F32;
}

/* Rewrites nodes[0..*nn) (which grows by n_src + n_out Casts, plus one per float32 Constant node)
 * as above. src: the float32 names that enter the graph; out: the names that leave it. */
static om_status *compute_in_half(keep *k, Onnx__NodeProto **nodes, size_t *nn, const char **src, size_t n_src,
                                  const char **out, size_t n_out, om_dtype half) {
    const size_t n0 = *nn;
    Onnx__NodeProto **front = kalloc(k, sizeof(void *) * (n0 + 1));   /* float32 Constants: they move first */
    Onnx__NodeProto **rest = kalloc(k, sizeof(void *) * (n0 + 1));
    const char **grown = kalloc(k, sizeof(char *) * (n_src + n0 + 1));
    if (!front || !rest || !grown) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    memcpy(grown, src, sizeof(char *) * n_src);
    src = grown;
    size_t n_front = 0, n_rest = 0;
    for (size_t i = 0; i < n0; i++) {
        Onnx__NodeProto *n = own_node(k, nodes[i]);
        if (!n) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        int constant = 0;
        for (size_t j = 0; j < n->n_attribute; j++) {
            const Onnx__AttributeProto *a = n->attribute[j];
            if (!strcmp(n->op_type, "Constant") && n->n_output == 1 && !strcmp(a->name, "value") && a->t &&
                a->t->data_type == OM_F32)
                constant = 1;
            if (strcmp(n->op_type, "Cast") || strcmp(a->name, "to") || a->i != OM_F32) continue;
            Onnx__AttributeProto *to = kalloc(k, sizeof *to);
            if (!to) return om_error(OM_OUT_OF_MEMORY, "out of memory");
            *to = *a;
            to->i = half;
            n->attribute[j] = to;
        }
        if (constant) {   /* has no inputs: running it first keeps the order topological */
            front[n_front++] = n;
            src[n_src++] = n->output[0];
        } else {
            rest[n_rest++] = n;
        }
    }
    /* nodes = float32 Constants, the entry Casts, the rest; uses of each source read its Cast */
    *nn = 0;
    for (size_t i = 0; i < n_front; i++) nodes[(*nn)++] = front[i];
    for (size_t s = 0; s < n_src; s++) {
        char *h = suffixed(k, src[s], "/ortmod_half");
        if (!h) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < n_rest; i++)
            for (size_t j = 0; j < rest[i]->n_input; j++)
                if (!strcmp(rest[i]->input[j], src[s])) rest[i]->input[j] = h;
        const char *in[] = {src[s]};
        Onnx__NodeProto *c = make_node(k, "Cast", h, in, 1, h);
        if (!c || node_attr(k, c, "to", half, NULL)) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        nodes[(*nn)++] = c;
    }
    for (size_t i = 0; i < n_rest; i++) nodes[(*nn)++] = rest[i];
    /* exits: the producer writes a half value that its readers take; a Cast gives the float32 one */
    for (size_t o = 0; o < n_out; o++) {
        char *h = suffixed(k, out[o], "/ortmod_half");
        if (!h) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < *nn; i++) {
            Onnx__NodeProto *n = nodes[i];
            for (size_t j = 0; j < n->n_input; j++)
                if (!strcmp(n->input[j], out[o])) n->input[j] = h;
            for (size_t j = 0; j < n->n_output; j++) {
                if (strcmp(n->output[j], out[o])) continue;
                char **outs = kalloc(k, sizeof(char *) * n->n_output);
                if (!outs) return om_error(OM_OUT_OF_MEMORY, "out of memory");
                memcpy(outs, n->output, sizeof(char *) * n->n_output);
                outs[j] = h;
                n->output = outs;
            }
        }
        const char *in[] = {h};
        Onnx__NodeProto *c = make_node(k, "Cast", suffixed(k, out[o], "/ortmod_float"), in, 1, out[o]);
        if (!c || node_attr(k, c, "to", OM_F32, NULL)) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        nodes[(*nn)++] = c;
    }
    return NULL;
}

om_status *rn_model_training_bytes(om_runner *r, om_dtype label_dtype, int label_rank, const int64_t *label_dims,
                                   void **bytes, size_t *nbytes) {
    *bytes = NULL;
    const Onnx__GraphProto *og = r->mp->graph;
    keep k = {0};
    om_status *st = NULL;
    Onnx__GraphProto g = *og;
    Onnx__ModelProto m = *r->mp;
    m.graph = &g;
    const int loss = r->p.loss;
    const char *pred = r->loss_input;

    /* inputs: the data inputs, then the weights, then the label */
    Onnx__ValueInfoProto **ins = kalloc(&k, sizeof(void *) * (og->n_input + (size_t)r->n_weights + 2));
    Onnx__TensorProto **inits = kalloc(&k, sizeof(void *) * (og->n_initializer + 2));
    const size_t n_entries = og->n_input + (size_t)r->n_weights + og->n_initializer + 4;
    Onnx__NodeProto **nodes = kalloc(&k, sizeof(void *) * (2 * og->n_node + 8 + n_entries + 2));
    Onnx__ValueInfoProto **outs = kalloc(&k, sizeof(void *) * 2);
    if (!ins || !inits || !nodes || !outs) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
    size_t ni = 0, nn = 0, no = 0, nz = 0;
    for (size_t i = 0; i < og->n_input; i++) {
        int trained = 0;
        for (int w = 0; w < r->n_weights; w++) trained |= !strcmp(r->w[w].name, og->input[i]->name);
        if (!trained && !find_init(og, og->input[i]->name)) ins[ni++] = og->input[i];
    }
    for (int w = 0; w < r->n_weights; w++) {
        if (!(ins[ni++] = make_vi(&k, r->w[w].name, OM_F32, r->w[w].value.rank, r->w[w].value.dims))) {
            st = om_error(OM_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
    }
    for (size_t i = 0; i < og->n_initializer; i++) {
        int trained = 0;
        for (int w = 0; w < r->n_weights; w++) trained |= r->w[w].init_index == (int)i;
        if (!trained) inits[nz++] = og->initializer[i];
    }
    for (size_t i = 0; i < og->n_node; i++) nodes[nn++] = og->node[i];

    if (loss != OM_LOSS_NONE) {
        int64_t ld[OM_MAX_RANK + 1];
        ld[0] = -1;
        for (int i = 0; i < label_rank; i++) ld[i + 1] = label_dims[i];
        if (!(ins[ni++] = make_vi(&k, r->p.label_name, label_dtype, label_rank + 1, ld))) {
            st = om_error(OM_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
    }
    const char *lab = r->p.label_name;
    Onnx__NodeProto *n;
#define NODE(op, nm, out, ...)                                                                        \
    do {                                                                                              \
        const char *in_[] = {__VA_ARGS__};                                                            \
        n = make_node(&k, op, nm, in_, (int)(sizeof in_ / sizeof in_[0]), out);                       \
        if (!n) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }                      \
        nodes[nn++] = n;                                                                              \
    } while (0)
    if (loss == OM_LOSS_SOFTMAX_CROSS_ENTROPY && !r->onehot) {
        NODE("SoftmaxCrossEntropyLoss", "ortmod_runner/SoftmaxCrossEntropyLoss", LOSS_OUT, pred, lab);
        node_attr(&k, n, "reduction", 0, "mean");
    } else if (loss == OM_LOSS_SOFTMAX_CROSS_ENTROPY) {
        /* one-hot rows: -mean over positions of sum_c y * log_softmax(x) = -C * mean(y * logp) */
        NODE("LogSoftmax", "ortmod_runner/LogSoftmax", "ortmod_runner/logp", pred);
        node_attr(&k, n, "axis", 1, NULL);
        NODE("Mul", "ortmod_runner/Mul_label", "ortmod_runner/ylogp", "ortmod_runner/logp", lab);
        NODE("ReduceMean", "ortmod_runner/ReduceMean", "ortmod_runner/mean", "ortmod_runner/ylogp");
        node_attr(&k, n, "keepdims", 0, NULL);
        NODE("Mul", "ortmod_runner/Mul_negC", LOSS_OUT, "ortmod_runner/mean", "ortmod_runner/neg_C");
        Onnx__TensorProto *c = kalloc(&k, sizeof *c);
        float *cv = kalloc(&k, sizeof(float));
        if (!c || !cv) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
        onnx__tensor_proto__init(c);
        *cv = -(float)(label_rank > 0 ? label_dims[0] : 1);
        c->name = kstr(&k, "ortmod_runner/neg_C");
        c->has_data_type = 1;
        c->data_type = OM_F32;
        c->n_float_data = 1;
        c->float_data = cv;
        inits[nz++] = c;
    } else if (loss == OM_LOSS_MSE) {
        NODE("Sub", "ortmod_runner/Sub", "ortmod_runner/diff", pred, lab);
        NODE("Mul", "ortmod_runner/Square", "ortmod_runner/sq", "ortmod_runner/diff", "ortmod_runner/diff");
        NODE("ReduceMean", "ortmod_runner/ReduceMean", LOSS_OUT, "ortmod_runner/sq");
        node_attr(&k, n, "keepdims", 0, NULL);
    }
#undef NODE
    if (loss != OM_LOSS_NONE) {
        if (!(outs[no++] = make_vi(&k, LOSS_OUT, OM_F32, 0, NULL))) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
    }
    if (!(outs[no++] = make_vi(&k, pred, OM_F32, -1, NULL))) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }

    if (r->p.use_mixed_precision) {
        const char **src = kalloc(&k, sizeof(char *) * n_entries);
        if (!src) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
        size_t n_src = 0;
        for (size_t i = 0; i < ni; i++)
            if (is_float32_vi(ins[i])) src[n_src++] = ins[i]->name;
        for (size_t i = 0; i < nz; i++)
            if (inits[i]->data_type == OM_F32) src[n_src++] = inits[i]->name;
        const char *exits[2];
        for (size_t i = 0; i < no; i++) exits[i] = outs[i]->name;
        if ((st = compute_in_half(&k, nodes, &nn, src, n_src, exits, no, r->p.mixed_precision_type))) goto done;
        g.n_value_info = 0;   /* intermediate types the model declared in float32 */
    }
    g.n_input = ni;
    g.input = ins;
    g.n_initializer = nz;
    g.initializer = inits;
    g.n_node = nn;
    g.node = nodes;
    g.n_output = no;
    g.output = outs;
    size_t len = onnx__model_proto__get_packed_size(&m);
    void *b = om_alloc(len ? len : 1);
    if (!b) { st = om_error(OM_OUT_OF_MEMORY, "out of memory"); goto done; }
    onnx__model_proto__pack(&m, b);
    *bytes = b;
    *nbytes = len;
done:
    for (int i = k.n - 1; i >= 0; i--) free(k.p[i]);
    free(k.p);
    return st;
}

/* ---- saving ------------------------------------------------------------------------- */

om_status *rn_model_save(om_runner *r, const char *path) {
    Onnx__GraphProto *g = r->mp->graph;
    typedef struct saved {
        protobuf_c_boolean has_raw;
        ProtobufCBinaryData raw;
        size_t n_float;
        float *floats;
    } saved;
    saved *sv = calloc((size_t)r->n_weights + 1, sizeof(saved));
    if (!sv) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (int w = 0; w < r->n_weights; w++) {
        Onnx__TensorProto *tp = g->initializer[r->w[w].init_index];
        sv[w] = (saved){tp->has_raw_data, tp->raw_data, tp->n_float_data, tp->float_data};
        tp->has_raw_data = 1;
        tp->raw_data.len = om_tensor_nbytes(&r->w[w].value);
        tp->raw_data.data = r->w[w].value.data;
        tp->n_float_data = 0;
        tp->float_data = NULL;
    }
    size_t len = onnx__model_proto__get_packed_size(r->mp);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf) onnx__model_proto__pack(r->mp, buf);
    for (int w = 0; w < r->n_weights; w++) {
        Onnx__TensorProto *tp = g->initializer[r->w[w].init_index];
        tp->has_raw_data = sv[w].has_raw;
        tp->raw_data = sv[w].raw;
        tp->n_float_data = sv[w].n_float;
        tp->float_data = sv[w].floats;
    }
    free(sv);
    if (!buf) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    om_status *st = rn_write_file_atomic(path, buf, len);
    free(buf);
    return st;
}
