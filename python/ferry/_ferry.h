/* The _ferry extension module: shared helpers of its source files. Uses
 * the public API (include/ferry/) only. */
#ifndef FP_FERRY_H
#define FP_FERRY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ferry/ferry.h"

/* _ferry.Error: raised with str(e) the message and e.code the negative
 * FERRY_E* code. */
extern PyObject *fp_error;
/* Raise Error for code with msg (NULL or empty: ferry_strerror(code));
 * returns NULL. */
PyObject *fp_raise(int code, const char *msg);
/* Raise from a ferry_error filled by a failed call. */
PyObject *fp_raise_err(int code, const ferry_error *err);

/* Add the reshard types and functions to module m; 0 or -1. */
int fp_reshard_init(PyObject *m);

#endif
