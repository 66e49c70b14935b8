/* module.c — the ortmod._C extension: the engine as Python objects.
 *
 * Multi-phase init, heap types and per-module state (PEP 489/573/630). Tensors cross as
 * DLPack capsules in both directions, read and handed over in place: no copies except
 * for a non-contiguous CPU input, which the engine needs dense. The GIL is released while
 * kernels run. CUDA tensors (kDLCUDA) run on the CUDA provider, enqueued on the stream the
 * caller passes (torch.cuda.current_stream().cuda_stream); device memory handed out comes
 * back to the provider's pool through the DLPack deleter, in order on that stream.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlpack/dlpack.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"

/* Only the public headers (csrc/include/) of the engine: tests/test_public_api.py. */
#include "ortmod.h"


typedef struct module_state {
    PyObject *EngineType;
    PyObject *StashType;
    PyObject *EngineError;
    PyObject *UnsupportedOpError;
    PyObject *InvalidInputError;
} module_state;

static module_state *state_of_type(PyTypeObject *t) { return (module_state *)PyType_GetModuleState(t); }

/* Raises the Python exception for st and frees st. Returns NULL for convenience. */
static PyObject *raise_status(module_state *ms, om_status *st) {
    PyObject *type = ms->EngineError;
    switch (om_status_code(st)) {
    case OM_UNSUPPORTED_OP: case OM_NO_GRADIENT: type = ms->UnsupportedOpError; break;
    case OM_INVALID_ARGUMENT: case OM_INVALID_MODEL: type = ms->InvalidInputError; break;
    case OM_OUT_OF_MEMORY: type = PyExc_MemoryError; break;
    default: break;
    }
    PyErr_SetString(type, om_status_message(st));
    om_status_free(st);
    return NULL;
}

PyObject *om_py_raise_status(PyObject *module, om_status *st) {
    return raise_status(PyModule_GetState(module), st);
}

/* ---- DLPack in ------------------------------------------------------------------ */

/* What keeps one input's memory alive while a stash needs it: the DLPack tensor itself when
 * the engine reads it in place (every step's case: nothing allocated), or, tagged with the low
 * bit (both are malloc'd, so that bit is free), an input_hold that also owns a dense copy. */
typedef struct input_hold {
    DLManagedTensor *mt;
    void *dense_copy;            /* om_alloc'd when the input was not contiguous */
} input_hold;

typedef void *input_keep;        /* a DLManagedTensor *, or an input_hold * | 1 */

static void input_hold_release(void *p) {
    if (!p) return;
    if (!((uintptr_t)p & 1)) {
        DLManagedTensor *mt = p;
        if (mt->deleter) mt->deleter(mt);
        return;
    }
    input_hold *h = (input_hold *)((uintptr_t)p & ~(uintptr_t)1);
    if (h->mt && h->mt->deleter) h->mt->deleter(h->mt);
    om_free(h->dense_copy);
    free(h);
}

static DLDataType om_to_dl_dtype(om_dtype dt) {
    DLDataType t = {kDLFloat, 32, 1};
    switch (dt) {
    case OM_F32: break;
    case OM_F64: t.bits = 64; break;
    case OM_F16: t.bits = 16; break;
    case OM_BF16: t.code = kDLBfloat; t.bits = 16; break;
    case OM_I64: t.code = kDLInt; t.bits = 64; break;
    case OM_I32: t.code = kDLInt; t.bits = 32; break;
    case OM_I8: t.code = kDLInt; t.bits = 8; break;
    case OM_U8: t.code = kDLUInt; t.bits = 8; break;
    case OM_BOOL: t.code = kDLBool_; t.bits = 8; break;
    default: break;
    }
    return t;
}

/* Copies a strided tensor into dense row-major memory (element size es). */
static void gather_strided(char *dst, const char *src, int rank, const int64_t *dims, const int64_t *strides, size_t es) {
    int64_t idx[OM_MAX_RANK] = {0};
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) numel *= dims[i];
    for (int64_t k = 0; k < numel; k++) {
        int64_t off = 0;
        for (int i = 0; i < rank; i++) off += idx[i] * strides[i];
        memcpy(dst + (size_t)k * es, src + (size_t)off * es, es);
        for (int i = rank - 1; i >= 0; i--) {
            if (++idx[i] < dims[i]) break;
            idx[i] = 0;
        }
    }
}

/* The DLPack tensor of obj (a capsule, or anything with __dlpack__), taken over. "<what> <index>"
 * names it in errors, formatted only then (a step's capsules never need it). */
static DLManagedTensor *take_dlpack_at(PyObject *obj, const char *what, Py_ssize_t index) {
    if (PyCapsule_CheckExact(obj) && PyCapsule_IsValid(obj, "dltensor")) {
        DLManagedTensor *mt = PyCapsule_GetPointer(obj, "dltensor");
        if (mt && PyCapsule_SetName(obj, "used_dltensor") == 0) return mt;
        return NULL;
    }
    char label[96];
    snprintf(label, sizeof label, "%s %zd", what, index);
    return om_py_take_dlpack(obj, label);
}

/* obj: a capsule or anything with __dlpack__. Fills t and what keeps its memory alive (an
 * input_keep). what names the argument in errors. Returns 0, or -1 with an exception set. */
static int tensor_from_py(PyObject *obj, const char *what, Py_ssize_t index, om_tensor *t, input_keep *hold) {
    *hold = NULL;
    DLManagedTensor *mt = take_dlpack_at(obj, what, index);
    if (!mt) return -1;   /* ours now: the keep calls its deleter */
    void *h = mt;
    DLTensor *d = &mt->dl_tensor;
    memset(t, 0, sizeof *t);
    if (d->device.device_type != kDLCPU && d->device.device_type != kDLCUDA) {
        input_hold_release(h);
        PyErr_Format(PyExc_ValueError, "%s %zd is on device type %d; ortmod runs on the CPU and on CUDA", what,
                     index, (int)d->device.device_type);
        return -1;
    }
    t->device = d->device.device_type == kDLCUDA ? OM_CUDA : OM_CPU;
    t->device_id = t->device == OM_CUDA ? d->device.device_id : 0;
    if (om_py_dl_dtype(d->dtype, &t->dtype) < 0) {
        input_hold_release(h);
        PyErr_Format(PyExc_TypeError, "%s %zd has a dtype (code %d, %d bits) that ortmod does not support", what,
                     index, (int)d->dtype.code, (int)d->dtype.bits);
        return -1;
    }
    if (d->ndim > OM_MAX_RANK) {
        input_hold_release(h);
        PyErr_Format(PyExc_ValueError, "%s %zd has rank %d; ortmod supports up to %d", what, index, d->ndim, OM_MAX_RANK);
        return -1;
    }
    t->rank = d->ndim;
    for (int i = 0; i < d->ndim; i++) t->dims[i] = d->shape[i];
    char *base = (char *)d->data + d->byte_offset;
    int dense = 1;
    if (d->strides) {
        int64_t expect = 1;
        for (int i = d->ndim - 1; i >= 0; i--) {
            if (d->shape[i] != 1 && d->strides[i] != expect) dense = 0;
            expect *= d->shape[i];
        }
    }
    if (dense) {
        /* torch hands an empty tensor over with data NULL, which the engine API reads as "no
         * tensor" (an absent output gradient): point it at a placeholder no kernel reads */
        static max_align_t empty_placeholder;
        t->data = base ? base : (om_tensor_numel(t) == 0 ? (void *)&empty_placeholder : NULL);
    } else if (t->device == OM_CUDA) {
        input_hold_release(h);
        PyErr_Format(PyExc_ValueError, "%s %zd is a non-contiguous CUDA tensor; pass a contiguous one "
                     "(.contiguous())", what, index);
        return -1;
    } else {
        size_t es = om_dtype_size(t->dtype);
        input_hold *copy = calloc(1, sizeof *copy);
        if (!copy) { input_hold_release(h); PyErr_NoMemory(); return -1; }
        copy->mt = mt;
        h = (void *)((uintptr_t)copy | 1);
        copy->dense_copy = om_alloc(om_tensor_nbytes(t));
        if (!copy->dense_copy) { input_hold_release(h); PyErr_NoMemory(); return -1; }
        gather_strided(copy->dense_copy, base, d->ndim, d->shape, d->strides, es);
        t->data = copy->dense_copy;
    }
    *hold = h;
    return 0;
}

/* Inputs, outputs and gradients of one call up to this many live on the C stack. */
#define SMALL_CALL 8

/* n zeroed elements of elem bytes: the caller's SMALL_CALL-element stack array where they fit,
 * else the heap (NULL when out of memory); call_array_free gives back the latter. */
static void *call_array(void *small, Py_ssize_t n, size_t elem) {
    if (n <= SMALL_CALL) return memset(small, 0, SMALL_CALL * elem);
    return calloc((size_t)n + 1, elem);
}

static void call_array_free(void *p, void *small) {
    if (p != small) free(p);
}

/* ---- DLPack out ----------------------------------------------------------------- */

typedef struct out_ctx {
    DLManagedTensor mt;
    int64_t shape[OM_MAX_RANK];
    om_device_type device;
    int device_id;
    void *stream;                /* CUDA: freed in order on the stream it was produced on */
} out_ctx;

static void out_deleter(DLManagedTensor *mt) {
    out_ctx *c = (out_ctx *)mt;
    om_device_free_data(c->device, c->device_id, mt->dl_tensor.data, c->stream);
    free(c);
}

static void free_tensor_data(om_tensor *t, void *stream) {
    om_device_free_data(t->device, t->device_id, t->data, stream);
    t->data = NULL;
}

static void capsule_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "used_dltensor")) return;   /* a consumer took it */
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (mt && mt->deleter) mt->deleter(mt);
    else PyErr_Clear();
}

/* A capsule over t's memory whose deleter decides what releasing means (out_deleter: the
 * engine's data goes back to it; view_deleter: nothing but the context). On failure: NULL
 * with an exception, and nothing but the context freed. */
static PyObject *make_capsule(const om_tensor *t, void (*deleter)(DLManagedTensor *), void *stream) {
    out_ctx *c = calloc(1, sizeof *c);
    if (!c) return PyErr_NoMemory();
    for (int i = 0; i < t->rank; i++) c->shape[i] = t->dims[i];
    c->device = t->device;
    c->device_id = t->device_id;
    c->stream = stream;
    c->mt.dl_tensor.data = t->data;
    c->mt.dl_tensor.device = t->device == OM_CUDA ? (DLDevice){kDLCUDA, t->device_id} : (DLDevice){kDLCPU, 0};
    c->mt.dl_tensor.ndim = t->rank;
    c->mt.dl_tensor.dtype = om_to_dl_dtype(t->dtype);
    c->mt.dl_tensor.shape = c->shape;
    c->mt.dl_tensor.strides = NULL;
    c->mt.manager_ctx = c;
    c->mt.deleter = deleter;
    PyObject *cap = PyCapsule_New(&c->mt, "dltensor", capsule_destructor);
    if (!cap) free(c);
    return cap;
}

/* Wraps an engine-owned tensor into a DLPack capsule; on failure frees t->data. */
static PyObject *capsule_from_tensor(om_tensor *t, void *stream) {
    PyObject *cap = make_capsule(t, out_deleter, stream);
    if (!cap) free_tensor_data(t, stream);
    t->data = NULL;
    return cap;
}

/* A capsule that views engine memory for the length of one callback: its deleter frees only
 * the DLPack struct, never the data. */
static void view_deleter(DLManagedTensor *mt) { free(mt->manager_ctx); }

static PyObject *view_capsule(const om_tensor *t) { return make_capsule(t, view_deleter, NULL); }

/* ---- Engine --------------------------------------------------------------------- */

typedef struct EngineObject {
    PyObject_HEAD
    om_engine *eng;
    PyObject *log;              /* callable(level, message) or NULL */
    PyObject *callback;         /* callable(phase, function_id, inputs, outputs) for PythonOp nodes, or NULL */
    PyObject *input_names, *output_names, *output_differentiable;
} EngineObject;

typedef struct StashObject {
    PyObject_HEAD
    PyObject *engine;           /* keeps the engine (and its plans) alive */
    om_stash *stash;
    /* 1 while a backward runs on stash: that backward frees it when done, with the GIL
     * released in between, so a second backward (another thread) must not start on it. Taken
     * with a compare-and-swap, so that it holds without a GIL too (free-threaded builds). */
    atomic_int busy;
} StashObject;

static void engine_log(void *user, om_log_level level, const char *msg) {
    EngineObject *self = user;
    PyGILState_STATE g = PyGILState_Ensure();
    if (self->log) {
        PyObject *r = PyObject_CallFunction(self->log, "is", (int)level, msg);
        if (!r) PyErr_WriteUnraisable(self->log);
        Py_XDECREF(r);
    }
    PyGILState_Release(g);
}

/* om_callback_fn: runs self->callback with the GIL held (taken only here, inside the node).
 *   INFER:    callback(0, id, [(dtype, shape) or None per input], [dtype per output]) -> [shape per output]
 *   FORWARD:  callback(1, id, [capsule per input], [capsule per output]) fills the outputs
 *   BACKWARD: callback(2, id, [capsule or None per output gradient], [capsule or None per input gradient])
 * Capsules view engine memory only for the call. A Python exception becomes an error status
 * with its text; the callable keeps the exception itself for the caller to re-raise. */
static PyObject *tensor_list(const om_tensor *t, int n, int shapes_only) {
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *item;
        if (t[i].dtype == OM_UNDEFINED || (!shapes_only && !t[i].data && om_tensor_numel(&t[i]) != 0)) {
            item = Py_NewRef(Py_None);
        } else if (shapes_only) {
            PyObject *shape = PyTuple_New(t[i].rank);
            for (int d = 0; shape && d < t[i].rank; d++) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t[i].dims[d]));
            item = shape ? Py_BuildValue("(iN)", (int)t[i].dtype, shape) : NULL;
        } else {
            item = view_capsule(&t[i]);
        }
        if (!item) { Py_CLEAR(list); break; }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static om_status *status_from_exception(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);        /* (PyErr_GetRaisedException is 3.12+) */
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
    if (!msg) PyErr_Clear();
    PyObject *full = PyUnicode_FromFormat("%s: %s", value ? Py_TYPE(value)->tp_name : "error", msg ? msg : "?");
    const char *full_msg = full ? PyUnicode_AsUTF8(full) : NULL;
    if (!full_msg) PyErr_Clear();
    om_status *st = om_status_new(OM_RUNTIME, full_msg ? full_msg : "error: out of memory describing it");
    Py_XDECREF(full);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return st;
}

static om_status *engine_callback(void *user, om_callback_phase phase, int64_t id, const om_tensor *in, int n_in,
                                  om_tensor *out, int n_out) {
    EngineObject *self = user;
    PyGILState_STATE gil = PyGILState_Ensure();
    om_status *st = NULL;
    PyObject *ins = NULL, *outs = NULL, *r = NULL;
    if (!self->callback) { st = om_status_new(OM_INTERNAL, "no callback for PythonOp"); goto done; }
    ins = tensor_list(in, n_in, phase == OM_CALLBACK_INFER);
    if (phase == OM_CALLBACK_INFER) {
        outs = PyList_New(n_out);
        for (int j = 0; outs && j < n_out; j++) PyList_SET_ITEM(outs, j, PyLong_FromLong((long)out[j].dtype));
    } else {
        outs = tensor_list(out, n_out, 0);
    }
    if (!ins || !outs) { st = status_from_exception(); goto done; }
    r = PyObject_CallFunction(self->callback, "iLOO", (int)phase, (long long)id, ins, outs);
    if (!r) { st = status_from_exception(); goto done; }
    if (phase != OM_CALLBACK_INFER) goto done;
    PyObject *seq = PySequence_Fast(r, "a PythonOp shape callback returns a sequence of shapes");
    if (!seq) { st = status_from_exception(); goto done; }
    if (PySequence_Fast_GET_SIZE(seq) != n_out) {
        st = om_status_newf(OM_RUNTIME, "the PythonOp shape callback gave %zd shapes for %d outputs",
                            PySequence_Fast_GET_SIZE(seq), n_out);
    }
    for (int j = 0; !st && j < n_out; j++) {
        PyObject *shape = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, j), "a shape is a sequence of ints");
        if (!shape) { st = status_from_exception(); break; }
        Py_ssize_t rank = PySequence_Fast_GET_SIZE(shape);
        if (rank > OM_MAX_RANK)
            st = om_status_newf(OM_RUNTIME, "PythonOp output %d has rank %zd (at most %d)", j, rank, OM_MAX_RANK);
        for (Py_ssize_t d = 0; !st && d < rank; d++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(shape, d));
            if (v == -1 && PyErr_Occurred()) st = status_from_exception();
            else out[j].dims[d] = v;
        }
        out[j].rank = (int)rank;
        Py_DECREF(shape);
    }
    Py_DECREF(seq);
done:
    Py_XDECREF(r);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    PyGILState_Release(gil);
    return st;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"onnx_bytes", "grad_inputs", "log_level", "seed", "log", "memory_opt_level", "callback",
                         "max_plans", NULL};
    Py_buffer buf;
    PyObject *grad_inputs = Py_None, *log = Py_None, *callback = Py_None;
    int log_level = OM_LOG_WARNING;
    unsigned long long seed = 0;
    int memory_opt_level = -1, max_plans = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|OiKOiOi", kw, &buf, &grad_inputs, &log_level, &seed, &log,
                                     &memory_opt_level, &callback, &max_plans))
        return -1;
    module_state *ms = state_of_type(Py_TYPE(self));
    bool *flags = NULL;
    Py_ssize_t n_flags = 0;
    int rc = -1;
    if (grad_inputs != Py_None) {
        PyObject *seq = PySequence_Fast(grad_inputs, "grad_inputs must be a sequence of bools");
        if (!seq) goto out;
        n_flags = PySequence_Fast_GET_SIZE(seq);
        flags = calloc((size_t)n_flags + 1, sizeof(bool));
        if (!flags) { Py_DECREF(seq); PyErr_NoMemory(); goto out; }
        for (Py_ssize_t i = 0; i < n_flags; i++) {
            int b = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, i));
            if (b < 0) { Py_DECREF(seq); goto out; }
            flags[i] = b;
        }
        Py_DECREF(seq);
    }
    if (log != Py_None) Py_XSETREF(self->log, Py_NewRef(log));
    if (callback != Py_None) Py_XSETREF(self->callback, Py_NewRef(callback));
    om_engine_options opt = om_engine_default_options();
    opt.grad_inputs = flags;
    opt.n_grad_inputs = (int)n_flags;
    opt.log_level = (om_log_level)log_level;
    opt.log = self->log ? engine_log : NULL;
    opt.log_user = self;
    opt.seed = seed;
    opt.memory_opt_level = memory_opt_level;
    opt.max_plans = max_plans;
    opt.callback = self->callback ? engine_callback : NULL;
    opt.callback_user = self;
    om_engine *eng = NULL;
    om_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = om_engine_create(buf.buf, (size_t)buf.len, &opt, &eng);
    Py_END_ALLOW_THREADS
    if (st) { raise_status(ms, st); goto out; }
    if (self->eng) om_engine_free(self->eng);
    self->eng = eng;
    int ni = om_engine_num_inputs(eng), no = om_engine_num_outputs(eng);
    PyObject *in = PyTuple_New(ni), *on = PyTuple_New(no), *od = PyTuple_New(no);
    if (!in || !on || !od) { Py_XDECREF(in); Py_XDECREF(on); Py_XDECREF(od); goto out; }
    for (int i = 0; i < ni; i++) PyTuple_SET_ITEM(in, i, PyUnicode_FromString(om_engine_input_name(eng, i)));
    for (int i = 0; i < no; i++) {
        PyTuple_SET_ITEM(on, i, PyUnicode_FromString(om_engine_output_name(eng, i)));
        PyTuple_SET_ITEM(od, i, PyBool_FromLong(om_engine_output_differentiable(eng, i)));
    }
    Py_XSETREF(self->input_names, in);
    Py_XSETREF(self->output_names, on);
    Py_XSETREF(self->output_differentiable, od);
    rc = 0;
out:
    free(flags);
    PyBuffer_Release(&buf);
    return rc;
}

static int Engine_traverse(EngineObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->log);
    Py_VISIT(self->callback);
    return 0;
}

static int Engine_clear(EngineObject *self) {
    Py_CLEAR(self->log);
    Py_CLEAR(self->callback);
    return 0;
}

static void Engine_dealloc(EngineObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Engine_clear(self);
    Py_CLEAR(self->input_names);
    Py_CLEAR(self->output_names);
    Py_CLEAR(self->output_differentiable);
    om_engine_free(self->eng);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int check_ready(EngineObject *self) {
    if (!self->eng) { PyErr_SetString(PyExc_RuntimeError, "Engine is not initialized"); return -1; }
    return 0;
}

/* stream: None or an int (a cudaStream_t as torch's Stream.cuda_stream gives it). */
static int parse_stream(PyObject *obj, void **stream, int *given) {
    *stream = NULL;
    *given = 0;
    if (!obj || obj == Py_None) return 0;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "stream must be an int (torch.cuda.Stream.cuda_stream) or None, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *stream = PyLong_AsVoidPtr(obj);
    if (PyErr_Occurred()) return -1;
    *given = 1;
    return 0;
}

/* forward and backward run every training step: METH_FASTCALL, positional only (as they were
 * under METH_VARARGS), so a call builds no argument tuple. The count check raises the
 * TypeError that PyArg_ParseTuple would. */
static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t min, Py_ssize_t max) {
    if (nargs >= min && nargs <= max) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %s %zd argument%s (%zd given)", name,
                 nargs < min ? (min == max ? "exactly" : "at least") : (min == max ? "exactly" : "at most"),
                 nargs < min ? min : max, (nargs < min ? min : max) == 1 ? "" : "s", nargs);
    return -1;
}

/* The optional converters of forward and backward: None, or a callable of one argument. */
static int parse_converter(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t i, PyObject **out) {
    *out = i < nargs && args[i] != Py_None ? args[i] : NULL;
    if (*out && !PyCallable_Check(*out)) {
        PyErr_Format(PyExc_TypeError, "a converter must be callable or None, got %.100s", Py_TYPE(*out)->tp_name);
        return -1;
    }
    return 0;
}

/* to_capsule(obj) (a new reference), or obj itself when there is no converter. */
static PyObject *to_capsule_of(PyObject *convert, PyObject *obj) {
    return convert ? PyObject_CallOneArg(convert, obj) : Py_NewRef(obj);
}

/* from_capsule(capsule), consuming the capsule reference, or the capsule when there is none. */
static PyObject *from_capsule_of(PyObject *convert, PyObject *cap) {
    if (!convert || !cap) return cap;
    PyObject *r = PyObject_CallOneArg(convert, cap);
    Py_DECREF(cap);   /* the tensor owns the DLPack tensor now (or, on failure, the capsule frees it) */
    return r;
}

/* forward(inputs, training, stream=None, to_capsule=None, from_capsule=None)
 *   -> (outputs, stash or None)
 * outputs: a list of capsules, or with from_capsule a tuple of from_capsule(capsule); inputs are
 * capsules, or objects that to_capsule turns into capsules (torch.utils.dlpack.to_dlpack), so
 * that a step's conversions run here rather than as Python loops around the call. */
static PyObject *Engine_forward(EngineObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int stream_given = 0;
    void *stream = NULL;
    PyObject *to_capsule, *from_capsule;
    if (check_nargs("forward", nargs, 2, 5) < 0) return NULL;
    PyObject *seq_in = args[0];
    int training = PyObject_IsTrue(args[1]);
    if (training < 0 || check_ready(self) < 0) return NULL;
    if (parse_stream(nargs > 2 ? args[2] : Py_None, &stream, &stream_given) < 0) return NULL;
    if (parse_converter(args, nargs, 3, &to_capsule) < 0 || parse_converter(args, nargs, 4, &from_capsule) < 0)
        return NULL;
    module_state *ms = state_of_type(Py_TYPE(self));
    PyObject *seq = PySequence_Fast(seq_in, "inputs must be a sequence of tensors");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int n_out = om_engine_num_outputs(self->eng);
    /* a step's few inputs and outputs: on the stack (the engine copies what it keeps) */
    om_tensor ins_small[SMALL_CALL], outs_small[SMALL_CALL];
    input_keep holds_small[SMALL_CALL];
    om_tensor *ins = call_array(ins_small, n, sizeof(om_tensor));
    input_keep *holds = call_array(holds_small, n, sizeof(input_keep));
    om_tensor *outs = call_array(outs_small, n_out, sizeof(om_tensor));
    PyObject *result = NULL, *list = NULL;
    om_stash *stash = NULL;
    if (!ins || !holds || !outs) { PyErr_NoMemory(); goto out; }
    if (n != om_engine_num_inputs(self->eng)) {
        PyErr_Format(PyExc_ValueError, "the model takes %d inputs, got %zd", om_engine_num_inputs(self->eng), n);
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *cap = to_capsule_of(to_capsule, PySequence_Fast_GET_ITEM(seq, i));
        int rc = cap ? tensor_from_py(cap, "input", i, &ins[i], &holds[i]) : -1;
        Py_XDECREF(cap);
        if (rc < 0) goto out;
    }
    om_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = om_engine_forward_stream(self->eng, ins, (int)n, training, outs, &stash, (void **)holds, input_hold_release,
                                  stream);
    Py_END_ALLOW_THREADS
    if (st) { raise_status(ms, st); goto out; }
    if (stash)   /* the stash owns the holds now */
        for (Py_ssize_t i = 0; i < n; i++) holds[i] = NULL;
    list = from_capsule ? PyTuple_New(n_out) : PyList_New(n_out);
    if (!list) goto out;
    for (int i = 0; i < n_out; i++) {
        PyObject *item = from_capsule_of(from_capsule, capsule_from_tensor(&outs[i], stream));
        if (!item) goto out;   /* the outputs not yet wrapped are freed below */
        if (from_capsule) PyTuple_SET_ITEM(list, i, item);
        else PyList_SET_ITEM(list, i, item);
    }
    PyObject *stash_obj = Py_None;
    if (stash) {
        StashObject *so = PyObject_GC_New(StashObject, (PyTypeObject *)ms->StashType);
        if (!so) goto out;
        so->engine = Py_NewRef(self);
        so->stash = stash;
        atomic_init(&so->busy, 0);
        stash = NULL;
        PyObject_GC_Track(so);
        stash_obj = (PyObject *)so;
    } else {
        Py_INCREF(stash_obj);
    }
    result = PyTuple_Pack(2, list, stash_obj);
    Py_DECREF(stash_obj);
out:
    if (!result && outs)
        for (int i = 0; i < n_out; i++) free_tensor_data(&outs[i], stream);
    om_stash_free(stash);
    for (Py_ssize_t i = 0; holds && i < n; i++) input_hold_release(holds[i]);
    Py_XDECREF(list);
    Py_DECREF(seq);
    call_array_free(ins, ins_small);
    call_array_free(holds, holds_small);
    call_array_free(outs, outs_small);
    return result;
}

/* backward(stash, grad_outputs, stream=None, to_capsule=None, from_capsule=None, keep=None, lead=0)
 *   -> per input: capsule or None (a list)
 * With from_capsule: a tuple of `lead` Nones, then per input from_capsule(capsule) or None, None
 * also where keep (a sequence of bools, one per input) is false: what an autograd.Function's
 * backward returns, built here. to_capsule converts the output gradients as forward's does. */
static PyObject *Engine_backward(EngineObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *stream = NULL;
    int stream_given = 0;
    PyObject *to_capsule, *from_capsule, *keep_in = NULL;
    Py_ssize_t lead = 0;
    if (check_nargs("backward", nargs, 2, 7) < 0 || check_ready(self) < 0) return NULL;
    PyObject *stash_obj = args[0], *seq_in = args[1];
    if (parse_stream(nargs > 2 ? args[2] : Py_None, &stream, &stream_given) < 0) return NULL;
    if (parse_converter(args, nargs, 3, &to_capsule) < 0 || parse_converter(args, nargs, 4, &from_capsule) < 0)
        return NULL;
    if (nargs > 5 && args[5] != Py_None) keep_in = args[5];
    if (nargs > 6) {
        lead = PyLong_AsSsize_t(args[6]);
        if (lead == -1 && PyErr_Occurred()) return NULL;
        if (lead < 0 || lead > 64) { PyErr_SetString(PyExc_ValueError, "lead must be in 0..64"); return NULL; }
    }
    if ((keep_in || lead) && !from_capsule) {
        PyErr_SetString(PyExc_TypeError, "keep and lead come with from_capsule");
        return NULL;
    }
    module_state *ms = state_of_type(Py_TYPE(self));
    if (!PyObject_TypeCheck(stash_obj, (PyTypeObject *)ms->StashType) || ((StashObject *)stash_obj)->engine != (PyObject *)self) {
        PyErr_SetString(PyExc_TypeError, "backward needs the stash that this engine's forward returned");
        return NULL;
    }
    StashObject *so = (StashObject *)stash_obj;
    int idle = 0;
    if (!atomic_compare_exchange_strong(&so->busy, &idle, 1)) {
        PyErr_SetString(ms->InvalidInputError,
                        "this forward's stash is already being used by a backward (in another thread): a forward "
                        "takes one backward");
        return NULL;
    }
    /* from here on every exit clears busy */
    if (!so->stash) {
        atomic_store(&so->busy, 0);
        PyErr_SetString(ms->InvalidInputError,
                        "this forward's stash was already used by a backward: the engine frees what backward needs "
                        "once it ran, so a second backward through the same forward (retain_graph=True, or a loss "
                        "backwarded twice) needs the forward to run again");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(seq_in, "grad_outputs must be a sequence");
    if (!seq) { atomic_store(&so->busy, 0); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int n_out = om_engine_num_outputs(self->eng), n_in = om_engine_num_inputs(self->eng);
    om_tensor gouts_small[SMALL_CALL], grads_small[SMALL_CALL];
    input_keep holds_small[SMALL_CALL];
    om_tensor *gouts = call_array(gouts_small, n_out, sizeof(om_tensor));
    input_keep *holds = call_array(holds_small, n_out, sizeof(input_keep));
    om_tensor *grads = call_array(grads_small, n_in, sizeof(om_tensor));
    PyObject *list = NULL, *keep = NULL;
    if (!gouts || !holds || !grads) { PyErr_NoMemory(); goto out; }
    if (n != n_out) {
        PyErr_Format(PyExc_ValueError, "backward needs %d output gradients, got %zd", n_out, n);
        goto out;
    }
    if (keep_in) {
        keep = PySequence_Fast(keep_in, "keep must be a sequence of bools");
        if (!keep) goto out;
        if (PySequence_Fast_GET_SIZE(keep) != n_in) {
            PyErr_Format(PyExc_ValueError, "keep has %zd flags for %d inputs", PySequence_Fast_GET_SIZE(keep), n_in);
            goto out;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (o == Py_None) continue;
        PyObject *cap = to_capsule_of(to_capsule, o);
        int rc = cap ? tensor_from_py(cap, "output gradient", i, &gouts[i], &holds[i]) : -1;
        Py_XDECREF(cap);
        if (rc < 0) goto out;
    }
    om_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = stream_given ? om_engine_backward_stream(self->eng, so->stash, gouts, grads, stream)
                      : om_engine_backward(self->eng, so->stash, gouts, grads);
    Py_END_ALLOW_THREADS
    if (st) { raise_status(ms, st); goto out; }
    om_stash_free(so->stash);   /* backward is done with what the forward kept */
    so->stash = NULL;
    if (!from_capsule) {
        list = PyList_New(n_in);
        if (!list) goto out;
        for (int i = 0; i < n_in; i++) {
            PyObject *item = grads[i].data ? capsule_from_tensor(&grads[i], stream) : Py_NewRef(Py_None);
            if (!item) { Py_CLEAR(list); goto out; }
            PyList_SET_ITEM(list, i, item);
        }
        goto out;
    }
    list = PyTuple_New(lead + n_in);
    if (!list) goto out;
    for (Py_ssize_t i = 0; i < lead; i++) PyTuple_SET_ITEM(list, i, Py_NewRef(Py_None));
    for (int i = 0; i < n_in; i++) {
        int kept = 1;
        if (keep && (kept = PyObject_IsTrue(PySequence_Fast_GET_ITEM(keep, i))) < 0) { Py_CLEAR(list); goto out; }
        PyObject *item = grads[i].data && kept ? from_capsule_of(from_capsule, capsule_from_tensor(&grads[i], stream))
                                               : Py_NewRef(Py_None);   /* not kept: freed below */
        if (!item) { Py_CLEAR(list); goto out; }
        PyTuple_SET_ITEM(list, lead + i, item);
    }
out:
    Py_XDECREF(keep);
    for (int i = 0; grads && i < n_in; i++) free_tensor_data(&grads[i], stream);
    for (int i = 0; holds && i < n_out; i++) input_hold_release(holds[i]);
    Py_DECREF(seq);
    call_array_free(gouts, gouts_small);
    call_array_free(holds, holds_small);
    call_array_free(grads, grads_small);
    atomic_store(&so->busy, 0);   /* after so->stash is freed and NULL: a next call sees "already used" */
    return list;
}

static PyObject *Engine_export_onnx(EngineObject *self, PyObject *args) {
    const char *stage;
    if (!PyArg_ParseTuple(args, "s", &stage) || check_ready(self) < 0) return NULL;
    void *bytes = NULL;
    size_t n = 0;
    om_status *st = om_engine_export_onnx(self->eng, stage, &bytes, &n);
    if (st) return raise_status(state_of_type(Py_TYPE(self)), st);
    PyObject *r = PyBytes_FromStringAndSize(bytes, (Py_ssize_t)n);
    om_free(bytes);
    return r;
}

static PyObject *Engine_report(EngineObject *self, PyObject *unused) {
    if (check_ready(self) < 0) return NULL;
    const char *r = om_engine_report_json(self->eng);
    if (!r) return PyErr_NoMemory();
    return PyUnicode_FromString(r);
}

static PyObject *Engine_set_profiling(EngineObject *self, PyObject *on) {
    if (check_ready(self) < 0) return NULL;
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    om_engine_set_profiling(self->eng, v);
    Py_RETURN_NONE;
}

static PyObject *Engine_get_input_names(EngineObject *self, void *c) { return Py_NewRef(self->input_names ? self->input_names : Py_None); }
static PyObject *Engine_get_output_names(EngineObject *self, void *c) { return Py_NewRef(self->output_names ? self->output_names : Py_None); }
static PyObject *Engine_get_output_diff(EngineObject *self, void *c) {
    return Py_NewRef(self->output_differentiable ? self->output_differentiable : Py_None);
}

static PyMethodDef Engine_methods[] = {
    {"forward", (PyCFunction)(void (*)(void))Engine_forward, METH_FASTCALL,
     "forward(inputs, training, stream=None, to_capsule=None, from_capsule=None) -> (outputs, stash)\n\nRuns the "
     "forward. inputs: tensors (DLPack) in graph-input order, read in place, all on one device; to_capsule, where given, "
     "turns each into a DLPack capsule first (torch.utils.dlpack.to_dlpack). outputs: DLPack capsules on that device "
     "(a list), or with from_capsule a tuple of from_capsule(capsule). stash: what backward needs (None unless training "
     "with grad inputs). stream: for CUDA inputs, the cudaStream_t (an int, e.g. "
     "torch.cuda.current_stream().cuda_stream) the kernels are enqueued on; None = the legacy default stream."},
    {"backward", (PyCFunction)(void (*)(void))Engine_backward, METH_FASTCALL,
     "backward(stash, grad_outputs, stream=None, to_capsule=None, from_capsule=None, keep=None, lead=0) -> grads\n\n"
     "One DLPack capsule per graph input that needs a gradient, None elsewhere (a list). A None output gradient counts as "
     "zeros. stream: as for forward; None = the forward's stream. to_capsule: as for forward. With from_capsule: a tuple "
     "of lead Nones, then per input from_capsule(capsule), or None where keep (one bool per input) is false."},
    {"export_onnx", (PyCFunction)Engine_export_onnx, METH_VARARGS,
     "export_onnx(stage) -> bytes: 'optimized' (forward) or 'execution' (forward + backward)."},
    {"report", (PyCFunction)Engine_report, METH_NOARGS,
     "report() -> str: JSON of what the passes and the planner did (node counts, fusions, memory per shape set)."},
    {"set_profiling", (PyCFunction)Engine_set_profiling, METH_O,
     "set_profiling(on): time every CPU kernel per op and phase (report()['profile']); turning it on resets it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Engine_getset[] = {
    {"input_names", (getter)Engine_get_input_names, NULL, "graph input names, in the order forward takes them", NULL},
    {"output_names", (getter)Engine_get_output_names, NULL, "graph output names", NULL},
    {"output_differentiable", (getter)Engine_get_output_diff, NULL, "per output: does a gradient flow back from it", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Engine_slots[] = {
    {Py_tp_doc, "Engine(onnx_bytes, grad_inputs=None, log_level=2, seed=0, log=None, memory_opt_level=-1, callback=None, max_plans=0)\n\n"
                "A compiled ONNX model: forward and backward graphs, and plans per input shape set (the\n"
                "max_plans most recently used; 0: ORTMOD_MAX_CACHED_PLANS or 32)."},
    {Py_tp_init, Engine_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Engine_dealloc},
    {Py_tp_traverse, Engine_traverse},
    {Py_tp_clear, Engine_clear},
    {Py_tp_methods, Engine_methods},
    {Py_tp_getset, Engine_getset},
    {0, NULL},
};

static PyType_Spec Engine_spec = {"ortmod._C.Engine", sizeof(EngineObject), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Engine_slots};

static int Stash_traverse(StashObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->engine);
    return 0;
}

static int Stash_clear(StashObject *self) {
    om_stash_free(self->stash);
    self->stash = NULL;
    Py_CLEAR(self->engine);
    return 0;
}

static void Stash_dealloc(StashObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Stash_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyType_Slot Stash_slots[] = {
    {Py_tp_doc, "What one forward keeps for its backward (opaque)."},
    {Py_tp_dealloc, Stash_dealloc},
    {Py_tp_traverse, Stash_traverse},
    {Py_tp_clear, Stash_clear},
    {0, NULL},
};

static PyType_Spec Stash_spec = {"ortmod._C.Stash", sizeof(StashObject), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Stash_slots};

/* ---- module --------------------------------------------------------------------- */

extern PyMethodDef om_py_optim_methods[];   /* python/optim.c */
extern PyMethodDef om_py_options_methods[]; /* python/options.c */

/* op_table() -> list of (name, domain, has_gradient_rule): the engine's op table, for docs. */
static PyObject *op_table(PyObject *m, PyObject *unused) {
    int n = om_op_table_size();
    PyObject *list = PyList_New(n);
    if (!list) return NULL;
    for (int i = 0; i < n; i++) {
        const char *name, *domain;
        bool has_gradient;
        om_op_table_entry(i, &name, &domain, &has_gradient, NULL);
        PyObject *t = Py_BuildValue("(ssO)", name, domain, has_gradient ? Py_True : Py_False);
        if (!t) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

/* op_attributes() -> list of (name, domain, attrs): per op of the table, the attributes it
 * implements (om_op_table_entry, ortmod.h), "" for none; for tests and docs. */
static PyObject *op_attributes(PyObject *m, PyObject *unused) {
    int n = om_op_table_size();
    PyObject *list = PyList_New(n);
    if (!list) return NULL;
    for (int i = 0; i < n; i++) {
        const char *name, *domain, *attrs;
        om_op_table_entry(i, &name, &domain, NULL, &attrs);
        PyObject *t = Py_BuildValue("(sss)", name, domain, attrs);
        if (!t) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

/* set_num_threads(n): the engine's pool uses n threads (ORTModule passes
 * torch.get_num_threads(), so that torch and the engine agree). */
static PyObject *set_num_threads(PyObject *m, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);   /* (not int: 2**32 would wrap to 0, 2**32 + 1 to 1) */
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "set_num_threads: %lld is not a thread count (at least 1)", n);
        return NULL;
    }
    om_set_num_threads(n > INT_MAX ? INT_MAX : (int)n);   /* the pool caps it at its maximum */
    Py_RETURN_NONE;
}

static PyObject *get_num_threads(PyObject *m, PyObject *unused) { return PyLong_FromLong(om_get_num_threads()); }

/* How many float32 GEMMs ran on the bf16 kernel (ortmod.h, testing): tests prove the path ran with it. */
static PyObject *gemm_bf16_count(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(om_gemm_bf16_count()); }
static PyObject *gemm_f32_count(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(om_gemm_f32_count()); }

/* use_openmp(address or None): run the pool's jobs as regions of the OpenMP runtime whose
 * GOMP_parallel entry point is at address (ortmod/_threads.py finds torch's). */
static PyObject *use_openmp(PyObject *m, PyObject *arg) {
    if (arg == Py_None) {
        om_pool_use_openmp(NULL);
        Py_RETURN_NONE;
    }
    void *p = PyLong_AsVoidPtr(arg);
    if (!p) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "use_openmp: the address is 0");
        return NULL;
    }
    om_pool_use_openmp((om_openmp_parallel_fn)p);
    Py_RETURN_NONE;
}

static PyObject *uses_openmp(PyObject *m, PyObject *unused) { return PyBool_FromLong(om_pool_uses_openmp()); }

/* steady_inputs(values, types, tensor_keys, template, input_slots, unwrap) -> list | None: the
 * tensor half of ORTModule's steady-state check (_entry.py, FastRecord.inputs), for CPU inputs.
 * None unless every value has exactly its recorded type and every tensor its recorded
 * (dtype, rank, requires_grad) on the CPU: tensor_keys holds (index, dtype, rank,
 * requires_grad, ...) per tensor value. Otherwise a copy of template with unwrap(values[i])
 * at each (pos, i) of input_slots: the engine's inputs for the call. */
static PyObject *steady_inputs(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    static PyObject *s_dtype, *s_ndim, *s_requires_grad, *s_is_cpu;
    if (!s_dtype && (!(s_dtype = PyUnicode_InternFromString("dtype")) || !(s_ndim = PyUnicode_InternFromString("ndim")) ||
                     !(s_requires_grad = PyUnicode_InternFromString("requires_grad")) ||
                     !(s_is_cpu = PyUnicode_InternFromString("is_cpu"))))
        return NULL;
    if (nargs != 6 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
        !PyList_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "steady_inputs(values: tuple, types: tuple, tensor_keys: tuple, template: "
                                         "list, input_slots: tuple, unwrap)");
        return NULL;
    }
    PyObject *values = args[0], *types = args[1], *keys = args[2];
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    if (n != PyTuple_GET_SIZE(types)) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)Py_TYPE(PyTuple_GET_ITEM(values, i)) != PyTuple_GET_ITEM(types, i)) Py_RETURN_NONE;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 4) {
            PyErr_SetString(PyExc_TypeError, "steady_inputs: a tensor key is (index, dtype, rank, requires_grad, ...)");
            return NULL;
        }
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, 0));
        if (i == -1 && PyErr_Occurred()) return NULL;
        if (i < 0 || i >= n) Py_RETURN_NONE;
        PyObject *v = PyTuple_GET_ITEM(values, i);
        PyObject *names[4] = {s_dtype, s_ndim, s_requires_grad, s_is_cpu};
        for (int a = 0; a < 4; a++) {
            PyObject *got = PyObject_GetAttr(v, names[a]);
            if (!got) return NULL;
            /* dtype and requires_grad are singletons (compared by identity), rank an int */
            int same = a == 3 ? got == Py_True
                     : a == 1 ? PyObject_RichCompareBool(got, PyTuple_GET_ITEM(key, 2), Py_EQ)
                              : got == PyTuple_GET_ITEM(key, a == 0 ? 1 : 3);
            Py_DECREF(got);
            if (same < 0) return NULL;
            if (!same) Py_RETURN_NONE;
        }
    }
    PyObject *tensors = PyList_GetSlice(args[3], 0, PyList_GET_SIZE(args[3]));
    if (!tensors) return NULL;
    PyObject *slots = args[4];
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(slots); k++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, k);
        Py_ssize_t pos, i;
        if (!PyTuple_Check(slot) || PyTuple_GET_SIZE(slot) != 2 ||
            ((pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(slot, 0))) == -1 && PyErr_Occurred()) ||
            ((i = PyLong_AsSsize_t(PyTuple_GET_ITEM(slot, 1))) == -1 && PyErr_Occurred()) ||
            pos < 0 || pos >= PyList_GET_SIZE(tensors) || i < 0 || i >= n) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "steady_inputs: an input slot is out of range");
            Py_DECREF(tensors);
            return NULL;
        }
        PyObject *t = PyObject_CallOneArg(args[5], PyTuple_GET_ITEM(values, i));
        if (!t) { Py_DECREF(tensors); return NULL; }
        PyList_SetItem(tensors, pos, t);   /* steals t, drops the template's item */
    }
    return tensors;
}

/* attrs_are(objects, name, expected) -> bool: whether getattr(objects[i], name) is expected[i]
 * for every i (same lengths). ORTModule's steady state asks it of the module's parameters
 * (requires_grad) and tensors (dtype) every call: a C loop of attribute reads where Python's
 * tuple(map(attrgetter)) builds a tuple per call (0.2 us each for two parameters, 3 us for 100). */
static PyObject *attrs_are(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "attrs_are takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *objs = PySequence_Fast(args[0], "attrs_are: objects must be a sequence");
    if (!objs) return NULL;
    PyObject *want = PySequence_Fast(args[2], "attrs_are: expected must be a sequence");
    if (!want) { Py_DECREF(objs); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(objs);
    int same = n == PySequence_Fast_GET_SIZE(want);
    for (Py_ssize_t i = 0; same && i < n; i++) {
        PyObject *v = PyObject_GetAttr(PySequence_Fast_GET_ITEM(objs, i), args[1]);
        if (!v) { Py_DECREF(objs); Py_DECREF(want); return NULL; }
        same = v == PySequence_Fast_GET_ITEM(want, i);
        Py_DECREF(v);
    }
    Py_DECREF(objs);
    Py_DECREF(want);
    return PyBool_FromLong(same);
}

static PyMethodDef module_methods[] = {
    {"set_num_threads", set_num_threads, METH_O, "set_num_threads(n): threads for the engine's kernels."},
    {"use_openmp", use_openmp, METH_O,
     "use_openmp(address | None): run the engine's parallel work on the OpenMP runtime whose GOMP_parallel is at "
     "address (None: the engine's own threads)."},
    {"uses_openmp", uses_openmp, METH_NOARGS, "uses_openmp() -> bool: the engine's parallel work runs on OpenMP."},
    {"steady_inputs", (PyCFunction)(void (*)(void))steady_inputs, METH_FASTCALL,
     "steady_inputs(values, types, tensor_keys, template, input_slots, unwrap) -> list | None: ORTModule's "
     "steady-state inputs check, for CPU tensors."},
    {"attrs_are", (PyCFunction)(void (*)(void))attrs_are, METH_FASTCALL,
     "attrs_are(objects, name, expected) -> bool: getattr(objects[i], name) is expected[i] for every i."},
    {"get_num_threads", get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"gemm_bf16_count", gemm_bf16_count, METH_NOARGS, "gemm_bf16_count() -> int: GEMMs run on the bf16 kernel"},
    {"gemm_f32_count", gemm_f32_count, METH_NOARGS, "gemm_f32_count() -> int: GEMMs run on the AVX-512 fp32 kernel"},
    {"op_table", op_table, METH_NOARGS, "op_table() -> [(name, domain, has_gradient_rule)]: the engine's op table."},
    {"op_attributes", op_attributes, METH_NOARGS,
     "op_attributes() -> [(name, domain, attrs)]: per op, the attributes it implements (\"name:type[=v1|v2]\", "
     "space-separated; see csrc/ops/op.h)."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *m) {
    if (PyModule_AddFunctions(m, om_py_optim_methods) < 0) return -1;
    if (PyModule_AddFunctions(m, om_py_options_methods) < 0) return -1;
    if (PyModule_AddFunctions(m, module_methods) < 0) return -1;
    module_state *ms = PyModule_GetState(m);
    ms->EngineType = PyType_FromModuleAndSpec(m, &Engine_spec, NULL);
    ms->StashType = PyType_FromModuleAndSpec(m, &Stash_spec, NULL);
    if (!ms->EngineType || !ms->StashType) return -1;
    ms->EngineError = PyErr_NewExceptionWithDoc("ortmod._C.EngineError", "An error reported by the ortmod engine.",
                                                PyExc_RuntimeError, NULL);
    if (!ms->EngineError) return -1;
    ms->UnsupportedOpError = PyErr_NewExceptionWithDoc(
        "ortmod._C.UnsupportedOpError", "The model uses an op (or an op's gradient) that ortmod does not support.",
        ms->EngineError, NULL);
    PyObject *bases = PyTuple_Pack(2, ms->EngineError, PyExc_ValueError);
    if (!bases) return -1;
    ms->InvalidInputError = PyErr_NewExceptionWithDoc(
        "ortmod._C.InvalidInputError", "An input (tensor, gradient or model file) is not what the engine expects.",
        bases, NULL);
    Py_DECREF(bases);
    if (!ms->UnsupportedOpError || !ms->InvalidInputError) return -1;
    if (PyModule_AddObjectRef(m, "Engine", ms->EngineType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "Stash", ms->StashType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "EngineError", ms->EngineError) < 0) return -1;
    if (PyModule_AddObjectRef(m, "UnsupportedOpError", ms->UnsupportedOpError) < 0) return -1;
    if (PyModule_AddObjectRef(m, "InvalidInputError", ms->InvalidInputError) < 0) return -1;
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg) {
    module_state *ms = PyModule_GetState(m);
    Py_VISIT(ms->EngineType);
    Py_VISIT(ms->StashType);
    Py_VISIT(ms->EngineError);
    Py_VISIT(ms->UnsupportedOpError);
    Py_VISIT(ms->InvalidInputError);
    return 0;
}

static int module_clear(PyObject *m) {
    module_state *ms = PyModule_GetState(m);
    Py_CLEAR(ms->EngineType);
    Py_CLEAR(ms->StashType);
    Py_CLEAR(ms->EngineError);
    Py_CLEAR(ms->UnsupportedOpError);
    Py_CLEAR(ms->InvalidInputError);
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "ortmod._C", "The ortmod engine: ONNX import, autodiff, planning and kernels, in C.",
    sizeof(module_state), NULL, module_slots, module_traverse, module_clear, module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&module_def); }
