/* options.c — the engine's options (csrc/include/ortmod_options.h) as module functions, for
 * ortmod.options (ortmod/_options.py), which is what Python code uses:
 *
 *     get_options(field=None) -> dict   every field; raises InvalidInputError (a ValueError) naming
 *                                    each variable (or field's) of the environment that holds a bad value
 *     set_options(**fields)          validated; unknown names are a TypeError, bad values an
 *                                    InvalidInputError naming the field, and then nothing changes
 *     reload_options()               reads the environment again (errors as get_options raises
 *                                    them come later, from get_options and every Engine)
 *
 * Values: ints, profile a bool, disable_passes and cuda_library str, cuda_attention "flash" or
 * "materialized". */
#include "binding.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ortmod_options.h"

static const char *const ATTENTION_NAMES[] = {"flash", "materialized"};

static PyObject *options_dict(const om_options *o) {
    return Py_BuildValue("{s:i,s:i,s:O,s:s,s:i,s:i,s:s,s:s}", "max_cached_plans", o->max_cached_plans,
                         "memory_opt_level", o->memory_opt_level, "profile", o->profile ? Py_True : Py_False,
                         "disable_passes", o->disable_passes, "optim_num_threads", o->optim_num_threads, "num_threads",
                         o->num_threads, "cuda_library", o->cuda_library, "cuda_attention",
                         ATTENTION_NAMES[o->cuda_attention == OM_CUDA_ATTENTION_MATERIALIZED]);
}

static const struct { const char *name; unsigned bit; } FIELD_BITS[] = {
    {"max_cached_plans", OM_OPT_MAX_CACHED_PLANS}, {"memory_opt_level", OM_OPT_MEMORY_OPT_LEVEL},
    {"profile", OM_OPT_PROFILE}, {"disable_passes", OM_OPT_DISABLE_PASSES},
    {"optim_num_threads", OM_OPT_OPTIM_NUM_THREADS}, {"num_threads", OM_OPT_NUM_THREADS},
    {"cuda_library", OM_OPT_CUDA_LIBRARY}, {"cuda_attention", OM_OPT_CUDA_ATTENTION},
};

/* get_options(field=None): with a field, only that field's variable is checked. */
static PyObject *py_get_options(PyObject *module, PyObject *args) {
    const char *field = NULL;
    if (!PyArg_ParseTuple(args, "|z:get_options", &field)) return NULL;
    unsigned bits = OM_OPT_ALL;
    if (field) {
        bits = 0;
        for (size_t i = 0; i < sizeof FIELD_BITS / sizeof FIELD_BITS[0]; i++)
            if (!strcmp(field, FIELD_BITS[i].name)) bits = FIELD_BITS[i].bit;
        if (!bits) return PyErr_Format(PyExc_TypeError, "get_options: unknown option '%s'", field);
    }
    om_options o;
    om_status_free(om_options_get(&o));
    om_status *st = om_options_check(bits);
    if (st) return om_py_raise_status(module, st);
    return options_dict(&o);
}

static int int_field(PyObject *v, const char *name, int *out) {
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "set_options: %s must be an int, got %s", name, Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long n = PyLong_AsLongAndOverflow(v, &overflow);
    if (n == -1 && PyErr_Occurred()) return -1;
    if (overflow || n < INT_MIN || n > INT_MAX) n = overflow < 0 || n < 0 ? INT_MIN : INT_MAX;   /* the check names it */
    *out = (int)n;
    return 0;
}

static int str_field(PyObject *v, const char *name, char *buf, size_t cap) {
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "set_options: %s must be a str, got %s", name, Py_TYPE(v)->tp_name);
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(v, &n);
    if (!s) return -1;
    if ((size_t)n >= cap || strlen(s) != (size_t)n) {
        PyErr_Format(PyExc_ValueError, "set_options: %s is longer than %zu characters or holds a NUL", name, cap - 1);
        return -1;
    }
    memcpy(buf, s, (size_t)n + 1);
    return 0;
}

static PyObject *py_set_options(PyObject *module, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args)) {
        PyErr_SetString(PyExc_TypeError, "set_options takes keyword arguments only");
        return NULL;
    }
    om_options o = om_options_defaults();
    unsigned fields = 0;
    PyObject *key, *v;
    Py_ssize_t pos = 0;
    while (kwargs && PyDict_Next(kwargs, &pos, &key, &v)) {
        const char *name = PyUnicode_AsUTF8(key);
        if (!name) return NULL;
        static const struct { const char *name; unsigned bit; size_t offset; } INTS[] = {
            {"max_cached_plans", OM_OPT_MAX_CACHED_PLANS, offsetof(om_options, max_cached_plans)},
            {"memory_opt_level", OM_OPT_MEMORY_OPT_LEVEL, offsetof(om_options, memory_opt_level)},
            {"optim_num_threads", OM_OPT_OPTIM_NUM_THREADS, offsetof(om_options, optim_num_threads)},
            {"num_threads", OM_OPT_NUM_THREADS, offsetof(om_options, num_threads)},
        };
        int rc = 0, is_int = 0;
        for (size_t i = 0; i < sizeof INTS / sizeof INTS[0] && !is_int; i++) {
            if (strcmp(name, INTS[i].name)) continue;
            is_int = 1;
            fields |= INTS[i].bit;
            rc = int_field(v, name, (int *)((char *)&o + INTS[i].offset));
        }
        if (is_int) {
        } else if (!strcmp(name, "profile")) {
            if (!PyBool_Check(v)) {
                PyErr_Format(PyExc_TypeError, "set_options: profile must be a bool, got %s", Py_TYPE(v)->tp_name);
                return NULL;
            }
            fields |= OM_OPT_PROFILE;
            o.profile = v == Py_True;
        } else if (!strcmp(name, "disable_passes")) {
            fields |= OM_OPT_DISABLE_PASSES;
            rc = str_field(v, name, o.disable_passes, sizeof o.disable_passes);
        } else if (!strcmp(name, "cuda_library")) {
            fields |= OM_OPT_CUDA_LIBRARY;
            rc = str_field(v, name, o.cuda_library, sizeof o.cuda_library);
        } else if (!strcmp(name, "cuda_attention")) {
            char text[32];
            fields |= OM_OPT_CUDA_ATTENTION;
            if (str_field(v, name, text, sizeof text) < 0) return NULL;
            if (!strcmp(text, "flash")) o.cuda_attention = OM_CUDA_ATTENTION_FLASH;
            else if (!strcmp(text, "materialized")) o.cuda_attention = OM_CUDA_ATTENTION_MATERIALIZED;
            else {
                PyErr_Format(PyExc_ValueError, "cuda_attention: '%s' is not flash or materialized", text);
                return NULL;
            }
        } else {
            PyErr_Format(PyExc_TypeError, "set_options: unknown option '%s'", name);
            return NULL;
        }
        if (rc < 0) return NULL;
    }
    om_status *st = om_options_set(&o, fields);
    if (st) return om_py_raise_status(module, st);
    Py_RETURN_NONE;
}

static PyObject *py_reload_options(PyObject *module, PyObject *unused) {
    om_status_free(om_options_reload());   /* get_options and every engine report it */
    Py_RETURN_NONE;
}

PyMethodDef om_py_options_methods[] = {
    {"get_options", py_get_options, METH_VARARGS,
     "get_options(field=None) -> dict: the engine's options (ortmod_options.h); a bad environment variable\n"
     "(of that field, when one is named) raises, naming it."},
    {"set_options", (PyCFunction)(void (*)(void))py_set_options, METH_VARARGS | METH_KEYWORDS,
     "set_options(**fields): sets the engine's options named, validated (nothing changes on an error)."},
    {"reload_options", py_reload_options, METH_NOARGS,
     "reload_options(): reads the engine's environment variables again."},
    {NULL, NULL, 0, NULL},
};
