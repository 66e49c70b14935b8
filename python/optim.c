/* optim.c — module functions behind ortmod.optim (multi-tensor optimizer steps). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ortmod_optim.h"

PyMethodDef om_py_optim_methods[] = {
    {NULL, NULL, 0, NULL},
};
