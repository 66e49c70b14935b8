/* optim.c — module functions behind ortmod.optim (multi-tensor optimizer steps).
 *
 * Each function takes lists of tensors — DLPack capsules (what torch.utils.dlpack.to_dlpack
 * returns; ~10x cheaper per tensor than Tensor.__dlpack__) or objects with __dlpack__ —
 * reads torch's own storage in place (parameters and optimizer state are updated where
 * torch keeps them, so every tensor must be dense), runs one engine call with the GIL
 * released, then calls every managed tensor's deleter. Errors from the engine become
 * ortmod._C.InvalidInputError (a ValueError) or EngineError. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlpack/dlpack.h>

#include "binding.h"

#include <limits.h>
#include <stdint.h>

#include "ortmod_optim.h"

/* The tensors of one argument list and the DLPack tensors that own them. */
typedef struct tensor_list {
    Py_ssize_t n;
    om_tensor *t;
    DLManagedTensor **mt;
} tensor_list;

static void tensor_list_free(tensor_list *l) {
    if (l->mt)
        for (Py_ssize_t i = 0; i < l->n; i++)
            if (l->mt[i] && l->mt[i]->deleter) l->mt[i]->deleter(l->mt[i]);
    PyMem_Free(l->t);
    PyMem_Free(l->mt);
    l->t = NULL;
    l->mt = NULL;
    l->n = 0;
}

/* Reads one capsule/tensor into l->t[i] and takes ownership of its managed tensor.
 * Returns 0, or -1 with an exception set. */
static int read_tensor(PyObject *obj, const char *what, Py_ssize_t i, tensor_list *l) {
    char label[96];
    snprintf(label, sizeof label, "%s[%zd]", what, i);
    DLManagedTensor *mt = om_py_take_dlpack(obj, label);
    if (!mt) return -1;
    l->mt[i] = mt;   /* ours now: tensor_list_free calls its deleter */
    DLTensor *d = &mt->dl_tensor;
    om_tensor *t = &l->t[i];
    memset(t, 0, sizeof *t);
    if (d->device.device_type != kDLCPU && d->device.device_type != kDLCUDA) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] is on device type %d; the optimizer runs on the CPU and on CUDA",
                     what, i, (int)d->device.device_type);
        return -1;
    }
    if (om_py_dl_dtype(d->dtype, &t->dtype) < 0 || (t->dtype != OM_F32 && t->dtype != OM_F16 && t->dtype != OM_BF16)) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] has a dtype (DLPack code %d, %d bits) the optimizer does not support; "
                     "expected float32, float16 or bfloat16", what, i, (int)d->dtype.code, (int)d->dtype.bits);
        return -1;
    }
    if (d->ndim > OM_MAX_RANK) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] has rank %d; at most %d", what, i, d->ndim, OM_MAX_RANK);
        return -1;
    }
    t->rank = d->ndim;
    int64_t expect = 1, numel = 1;
    for (int k = 0; k < d->ndim; k++) numel *= d->shape[k];
    for (int k = d->ndim - 1; k >= 0; k--) {
        t->dims[k] = d->shape[k];
        if (d->strides && numel && d->shape[k] != 1 && d->strides[k] != expect) {   /* an empty tensor is dense */
            PyErr_Format(PyExc_ValueError, "%s[%zd] is not contiguous; the optimizer updates tensors in place and "
                         "needs them dense", what, i);
            return -1;
        }
        expect *= d->shape[k];
    }
    t->data = (char *)d->data + d->byte_offset;
    t->device = d->device.device_type == kDLCUDA ? OM_CUDA : OM_CPU;
    t->device_id = d->device.device_id;
    return 0;
}

/* seq: a list/tuple of tensors. n_expect >= 0: its required length. Returns 0 or -1. */
static int read_list(PyObject *seq_obj, const char *what, Py_ssize_t n_expect, tensor_list *l) {
    l->n = 0;
    l->t = NULL;
    l->mt = NULL;
    PyObject *seq = PySequence_Fast(seq_obj, "expected a list of tensors");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n_expect >= 0 && n != n_expect) {
        PyErr_Format(PyExc_ValueError, "%s has %zd tensors, expected %zd", what, n, n_expect);
        Py_DECREF(seq);
        return -1;
    }
    if (n > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: too many tensors (%zd)", what, n);
        Py_DECREF(seq);
        return -1;
    }
    l->t = PyMem_Calloc(n ? (size_t)n : 1, sizeof *l->t);
    l->mt = PyMem_Calloc(n ? (size_t)n : 1, sizeof *l->mt);
    if (!l->t || !l->mt) {
        Py_DECREF(seq);
        tensor_list_free(l);
        PyErr_NoMemory();
        return -1;
    }
    l->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_tensor(PySequence_Fast_GET_ITEM(seq, i), what, i, l) < 0) {
            Py_DECREF(seq);
            tensor_list_free(l);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

PyDoc_STRVAR(adam_step_doc,
"adam_step(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, weight_decay,\n"
"          bias_correction, mode, step, grad_scale=1.0, stream=0)\n\n"
"One Adam/AdamW update of every tensor of a parameter group, in place (one engine call,\n"
"GIL released). params: float32/float16/bfloat16; grads: any of those; exp_avgs and\n"
"exp_avg_sqs: float32. mode: 0 L2 regularization, 1 AdamW (transformers), 2 AdamW (torch).\n"
"step: the group's step, already incremented. Gradients are divided by grad_scale. CUDA tensors\n"
"(all of one device): the update is enqueued on stream (torch.cuda.current_stream().cuda_stream).");

static PyObject *py_adam_step(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"params", "grads", "exp_avgs", "exp_avg_sqs", "lr", "beta1", "beta2", "eps",
                             "weight_decay", "bias_correction", "mode", "step", "grad_scale", "stream", NULL};
    PyObject *po, *go, *mo, *vo;
    om_adam_hparams_d h = {0};
    int bias_correction = 1, mode = 1;
    long long step = 0;
    unsigned long long stream = 0;
    h.grad_scale = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOdddddpiL|dK:adam_step", kwlist, &po, &go, &mo, &vo, &h.lr,
                                     &h.beta1, &h.beta2, &h.eps, &h.weight_decay, &bias_correction, &mode, &step,
                                     &h.grad_scale, &stream))
        return NULL;
    h.bias_correction = bias_correction;
    h.mode = (om_adam_mode)mode;
    h.step = step;
    tensor_list p = {0}, g = {0}, m = {0}, v = {0};
    PyObject *ret = NULL;
    if (read_list(po, "params", -1, &p) < 0) goto out;
    if (read_list(go, "grads", p.n, &g) < 0) goto out;
    if (read_list(mo, "exp_avgs", p.n, &m) < 0) goto out;
    if (read_list(vo, "exp_avg_sqs", p.n, &v) < 0) goto out;
    om_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = om_adam_step_d_on(&h, (int)p.n, p.t, g.t, m.t, v.t, (void *)(uintptr_t)stream);
    Py_END_ALLOW_THREADS
    if (st) { om_py_raise_status(module, st); goto out; }
    ret = Py_NewRef(Py_None);
out:
    tensor_list_free(&p);
    tensor_list_free(&g);
    tensor_list_free(&m);
    tensor_list_free(&v);
    return ret;
}

PyDoc_STRVAR(grads_check_and_norm_doc,
"grads_check_and_norm(grads, scale=1.0, stream=0) -> (found_inf, sq_norm)\n\n"
"One pass over the gradients: found_inf is True if any element is inf or NaN; sq_norm is\n"
"the squared global L2 norm of grads/scale (fp64 accumulation; inf when found_inf). CUDA\n"
"gradients: enqueued on stream, whose work up to here the call then waits for.");

static PyObject *py_grads_check_and_norm(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"grads", "scale", "stream", NULL};
    PyObject *go;
    float scale = 1.0f;
    unsigned long long stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|fK:grads_check_and_norm", kwlist, &go, &scale, &stream))
        return NULL;
    tensor_list g = {0};
    if (read_list(go, "grads", -1, &g) < 0) return NULL;
    int found_inf = 0;
    double sq = 0.0;
    om_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = om_grads_check_and_norm_on((int)g.n, g.t, scale, &found_inf, &sq, (void *)(uintptr_t)stream);
    Py_END_ALLOW_THREADS
    tensor_list_free(&g);
    if (st) return om_py_raise_status(module, st);
    return Py_BuildValue("(Od)", found_inf ? Py_True : Py_False, sq);
}

PyDoc_STRVAR(grads_scale_doc, "grads_scale(grads, factor, stream=0)\n\ngrads *= factor, in place, in one pass (GIL released).");

static PyObject *py_grads_scale(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"grads", "factor", "stream", NULL};
    PyObject *go;
    float factor;
    unsigned long long stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Of|K:grads_scale", kwlist, &go, &factor, &stream)) return NULL;
    tensor_list g = {0};
    if (read_list(go, "grads", -1, &g) < 0) return NULL;
    om_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = om_grads_scale_on((int)g.n, g.t, factor, (void *)(uintptr_t)stream);
    Py_END_ALLOW_THREADS
    tensor_list_free(&g);
    if (st) return om_py_raise_status(module, st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(grads_copy_scaled_doc,
"grads_copy_scaled(src, dst, factor, stream=0)\n\ndst[i] = src[i] * factor (dtypes may differ: fp16 -> fp32 master gradients), one pass.");

static PyObject *py_grads_copy_scaled(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"src", "dst", "factor", "stream", NULL};
    PyObject *so, *dobj;
    float factor;
    unsigned long long stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOf|K:grads_copy_scaled", kwlist, &so, &dobj, &factor, &stream))
        return NULL;
    tensor_list s = {0}, d = {0};
    if (read_list(so, "src", -1, &s) < 0) return NULL;
    if (read_list(dobj, "dst", s.n, &d) < 0) { tensor_list_free(&s); return NULL; }
    om_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = om_grads_copy_scaled_on((int)s.n, s.t, d.t, factor, (void *)(uintptr_t)stream);
    Py_END_ALLOW_THREADS
    tensor_list_free(&s);
    tensor_list_free(&d);
    if (st) return om_py_raise_status(module, st);
    Py_RETURN_NONE;
}

static PyObject *py_optim_num_threads(PyObject *module, PyObject *unused) {
    return PyLong_FromLong(om_optim_num_threads());
}

static PyObject *py_optim_set_num_threads(PyObject *module, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {   /* as options.optim_num_threads = -1 refuses it, never 0 in silence */
        PyErr_Format(PyExc_ValueError, "optim_set_num_threads: %lld is not a number of threads (0: no cap)", n);
        return NULL;
    }
    om_optim_set_num_threads(n > INT_MAX ? INT_MAX : (int)n);
    Py_RETURN_NONE;
}

PyMethodDef om_py_optim_methods[] = {
    {"adam_step", (PyCFunction)(void (*)(void))py_adam_step, METH_VARARGS | METH_KEYWORDS, adam_step_doc},
    {"grads_check_and_norm", (PyCFunction)(void (*)(void))py_grads_check_and_norm, METH_VARARGS | METH_KEYWORDS,
     grads_check_and_norm_doc},
    {"grads_scale", (PyCFunction)(void (*)(void))py_grads_scale, METH_VARARGS | METH_KEYWORDS, grads_scale_doc},
    {"grads_copy_scaled", (PyCFunction)(void (*)(void))py_grads_copy_scaled, METH_VARARGS | METH_KEYWORDS,
     grads_copy_scaled_doc},
    {"optim_num_threads", py_optim_num_threads, METH_NOARGS,
     "optim_num_threads() -> int: threads the optimizer kernels use."},
    {"optim_set_num_threads", py_optim_set_num_threads, METH_O,
     "optim_set_num_threads(n): cap on the optimizer kernels' threads (0: none; also set_options(optim_num_threads=), ORTMOD_NUM_THREADS)."},
    {NULL, NULL, 0, NULL},
};
