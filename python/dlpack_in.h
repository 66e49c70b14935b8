/* dlpack_in.h — taking tensors from Python through DLPack, shared by module.c (the engine)
 * and optim.c (the optimizer kernels). */
#ifndef OM_PY_DLPACK_IN_H
#define OM_PY_DLPACK_IN_H
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
#endif
