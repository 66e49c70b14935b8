/* fuzz_onnx.c — libFuzzer target: ONNX model bytes through the importer, the passes,
 * autodiff and planning, then one forward and one backward on small inputs of the declared
 * shapes (what every client of the engine does: ORTModule, Engine(bytes), ortmod-train).
 *
 * An error status is the expected answer to a bad model; a crash, a hang, a sanitizer
 * report or a leak is a finding. Built and run by `make fuzz` (tests/fuzz/fuzz.mk). */
#include "core/core.h"
#include "onnx.pb-c.h"
#include "ortmod.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INPUTS 16
#define MAX_ELEMS (1 << 14)   /* per input: bigger declared shapes are not run */

typedef struct spec {
    om_dtype dtype;
    int rank;
    int64_t dims[OM_MAX_RANK];
} spec;

/* The declared graph inputs that are not initializers: dtype and a small concrete shape
 * (a dim of 1..64 as declared, anything else 2). Returns the count, or -1 when they are not
 * runnable (too many, too large, a rank past OM_MAX_RANK). */
static int input_specs(const uint8_t *data, size_t size, spec *out) {
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, size, data);
    if (!m) return -1;
    int n = 0;
    const Onnx__GraphProto *g = m->graph;
    for (size_t i = 0; g && i < g->n_input && n >= 0; i++) {
        const Onnx__ValueInfoProto *v = g->input[i];
        int is_init = 0;
        for (size_t k = 0; v->name && k < g->n_initializer && !is_init; k++)
            is_init = g->initializer[k]->name && !strcmp(g->initializer[k]->name, v->name);
        if (is_init) continue;
        if (n == MAX_INPUTS) { n = -1; break; }
        const Onnx__TypeProto__Tensor *tt = v->type ? v->type->tensor_type : NULL;
        spec *s = &out[n];
        s->dtype = tt && tt->has_elem_type ? (om_dtype)tt->elem_type : OM_F32;
        s->rank = 0;
        int64_t elems = 1;
        const size_t rank = tt && tt->shape ? tt->shape->n_dim : 0;
        if (rank > OM_MAX_RANK) { n = -1; break; }
        for (size_t d = 0; d < rank; d++) {
            const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
            int64_t x = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
                                dim->dim_value > 0 && dim->dim_value <= 64
                            ? dim->dim_value
                            : 2;
            s->dims[s->rank++] = x;
            elems *= x;
        }
        if (elems > MAX_ELEMS) { n = -1; break; }
        n++;
    }
    onnx__model_proto__free_unpacked(m, NULL);
    return n;
}

static size_t esize(om_dtype dt) {
    switch (dt) {
    case OM_F64: case OM_I64: return 8;
    case OM_F32: case OM_I32: return 4;
    case OM_F16: case OM_BF16: return 2;
    case OM_BOOL: case OM_U8: case OM_I8: return 1;
    default: return 0;
    }
}

static void fill(om_tensor *t, int64_t numel, uint32_t seed) {
    for (int64_t i = 0; i < numel; i++) {
        seed = seed * 1664525u + 1013904223u;
        const float f = (float)((int32_t)(seed >> 8) % 2000) / 500.0f;   /* -4..4 */
        switch (t->dtype) {
        case OM_F32: ((float *)t->data)[i] = f; break;
        case OM_F64: ((double *)t->data)[i] = f; break;
        case OM_I64: ((int64_t *)t->data)[i] = (seed >> 8) % 3; break;   /* small: valid indices */
        case OM_I32: ((int32_t *)t->data)[i] = (seed >> 8) % 3; break;
        default: memset((char *)t->data + i * esize(t->dtype), 0, esize(t->dtype)); break;
        }
    }
}

/* FUZZ_VERBOSE=1: one line per stage that answered (tests/test_fuzz_corpus.py reads them) */
static void drop_at(const char *stage, om_status *st) {
    if (getenv("FUZZ_VERBOSE")) printf("%s: %s\n", stage, st ? om_status_message(st) : "ok");
    om_status_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    spec specs[MAX_INPUTS];
    om_engine *eng = NULL;
    om_status *st = om_engine_create(data, size, NULL, &eng);
    if (st) { drop_at("create", st); return 0; }
    const int k = om_engine_num_inputs(eng);
    const int n_spec = input_specs(data, size, specs);
    om_engine_free(eng);
    if (n_spec < 0 || k > MAX_INPUTS) return 0;
    /* again with a gradient for every float input: autodiff, the joint passes, the backward plan */
    bool grads[MAX_INPUTS] = {0};
    int any = 0;
    for (int i = 0; i < k; i++) {
        om_dtype dt = i < n_spec ? specs[i].dtype : OM_F32;
        grads[i] = dt == OM_F32 || dt == OM_F64;
        any |= grads[i];
    }
    om_engine_options opt = om_engine_default_options();
    opt.grad_inputs = grads;
    opt.n_grad_inputs = k;
    opt.max_plans = 2;
    if ((st = om_engine_create(data, size, any ? &opt : NULL, &eng))) { drop_at("create with gradients", st); return 0; }
    om_tensor ins[MAX_INPUTS];
    memset(ins, 0, sizeof ins);
    int ok = 1;
    for (int i = 0; i < k && ok; i++) {
        om_tensor *t = &ins[i];
        t->dtype = i < n_spec ? specs[i].dtype : OM_F32;
        t->rank = i < n_spec ? specs[i].rank : 1;
        if (i < n_spec) memcpy(t->dims, specs[i].dims, sizeof t->dims);
        else t->dims[0] = 2;
        t->device = OM_CPU;
        int64_t numel;
        size_t nb;
        if (!esize(t->dtype) || om_shape_size(t->dims, t->rank, esize(t->dtype), &numel, &nb)) { ok = 0; break; }
        t->data = calloc(1, nb + 1);
        if (!t->data) { ok = 0; break; }
        fill(t, numel, (uint32_t)i * 7919u + (uint32_t)size);
    }
    const int n_out = om_engine_num_outputs(eng);
    om_tensor *outs = calloc((size_t)n_out + 1, sizeof(om_tensor));
    om_tensor *gin = calloc((size_t)k + 1, sizeof(om_tensor));
    om_stash *stash = NULL;
    if (ok && outs && gin && !(st = om_engine_forward(eng, ins, k, true, outs, &stash, NULL, NULL))) {
        if (stash) {
            om_tensor *gout = calloc((size_t)n_out + 1, sizeof(om_tensor));
            for (int i = 0; gout && i < n_out; i++) {   /* ones for float outputs, none for the others */
                if (outs[i].dtype != OM_F32) continue;
                gout[i] = outs[i];
                int64_t numel = om_tensor_numel(&outs[i]);
                gout[i].data = malloc(sizeof(float) * (size_t)(numel + 1));
                for (int64_t j = 0; gout[i].data && j < numel; j++) ((float *)gout[i].data)[j] = 1.0f;
            }
            if (gout && !(st = om_engine_backward(eng, stash, gout, gin))) {
                for (int i = 0; i < k; i++) om_free(gin[i].data);
                /* a second backward through one forward is refused, never run */
                st = om_engine_backward(eng, stash, gout, gin);
                if (!st) __builtin_trap();
                drop_at("second backward", st);
            } else {
                drop_at("backward", st);
            }
            for (int i = 0; gout && i < n_out; i++) free(gout[i].data);
            free(gout);
            om_stash_free(stash);
        }
        for (int i = 0; i < n_out; i++) om_free(outs[i].data);
        /* a second shape set plans again (and, past max_plans, evicts) */
        if (k && ins[0].rank && ins[0].dims[0] == 2) {
            ins[0].dims[0] = 1;
            if (!(st = om_engine_forward(eng, ins, k, false, outs, &stash, NULL, NULL)))
                for (int i = 0; i < n_out; i++) om_free(outs[i].data);
            drop_at("forward of another shape", st);
        }
    } else {
        drop_at("forward", st);
    }
    free(outs);
    free(gin);
    for (int i = 0; i < k; i++) free(ins[i].data);
    om_engine_free(eng);
    return 0;
}
