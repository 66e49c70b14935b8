/* binding.h — what the binding's files share: module.c (the engine, the module and its
 * exception types) and optim.c (the optimizer kernels). Tensors come in through DLPack
 * (binding.c); engine errors go out through one function. */
#ifndef OM_PY_BINDING_H
#define OM_PY_BINDING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlpack/dlpack.h>

#include "ortmod.h"

#ifndef kDLBool_
#define kDLBool_ 6U   /* DLPack >= 0.8 names this kDLBool; the header here may predate it */
#endif

/* Takes ownership of obj's DLPack tensor: obj is a "dltensor" capsule (renamed
 * "used_dltensor") or an object with __dlpack__. label names the argument in errors
 * ("input 3", "params[3]"). Returns the managed tensor — the caller calls its deleter —
 * or NULL with TypeError set. */
DLManagedTensor *om_py_take_dlpack(PyObject *obj, const char *label);

/* The engine dtype of a DLPack dtype: 0, or -1 when ortmod has no such dtype. */
int om_py_dl_dtype(DLDataType t, om_dtype *out);

/* Raises the exception of ortmod._C (module) for st and frees st; returns NULL:
 * UnsupportedOpError for an op or gradient the engine lacks, InvalidInputError (also a
 * ValueError) for a bad argument or model, MemoryError, else EngineError. (module.c) */
PyObject *om_py_raise_status(PyObject *module, om_status *st);
#endif
