/* binding.c — tensors from Python through DLPack (binding.h). */
#include "binding.h"

DLManagedTensor *om_py_take_dlpack(PyObject *obj, const char *label) {
    PyObject *cap;
    if (PyCapsule_CheckExact(obj)) {
        cap = Py_NewRef(obj);
    } else {
        cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
        if (!cap) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a tensor (a DLPack capsule or an object with __dlpack__), got %.100s",
                         label, Py_TYPE(obj)->tp_name);
            return NULL;
        }
    }
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (!mt) {
        Py_DECREF(cap);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: not a DLPack tensor capsule (or one already consumed)", label);
        return NULL;
    }
    if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
        Py_DECREF(cap);
        return NULL;
    }
    Py_DECREF(cap);   /* the managed tensor is the caller's now */
    return mt;
}

int om_py_dl_dtype(DLDataType t, om_dtype *out) {
    *out = OM_UNDEFINED;
    if (t.lanes != 1) return -1;
    switch (t.code) {
    case kDLFloat: *out = t.bits == 32 ? OM_F32 : t.bits == 64 ? OM_F64 : t.bits == 16 ? OM_F16 : OM_UNDEFINED; break;
    case kDLBfloat: *out = t.bits == 16 ? OM_BF16 : OM_UNDEFINED; break;
    case kDLInt: *out = t.bits == 64 ? OM_I64 : t.bits == 32 ? OM_I32 : t.bits == 8 ? OM_I8 : OM_UNDEFINED; break;
    case kDLUInt: *out = t.bits == 8 ? OM_U8 : OM_UNDEFINED; break;
    case kDLBool_: *out = t.bits == 8 ? OM_BOOL : OM_UNDEFINED; break;
    default: break;
    }
    return *out == OM_UNDEFINED ? -1 : 0;
}
