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

/* ---- shared by the reshard files ---------------------------------------- */
#define FP_KWFN(f) (PyCFunction)(void (*)(void))(f)
/* A sequence of at most FERRY_MAX_DIMS non-negative ints into out, *n its
 * length; None leaves out untouched and sets *n = UINT32_MAX. 0 or -1. */
int fp_dims(PyObject *o, uint64_t *out, uint32_t *n, const char *what);
PyObject *fp_tuple_u64(const uint64_t *v, uint32_t n);
PyObject *fp_hex16(const uint8_t d[16]);   /* digest as 32 hex chars */
extern PyTypeObject fp_ManifestType, fp_ModelType;
/* Wrap a manifest in a Manifest object, stealing the reference. */
PyObject *fp_manifest_wrap(ferry_manifest *m);
/* The manifest of a Manifest object, or NULL with TypeError set. */
ferry_manifest *fp_manifest_of(PyObject *o);
/* The plan of a _ferry.Plan object (borrowed), or NULL with TypeError set. */
ferry_plan *fp_plan_of(PyObject *o);
/* Add each file's types and functions to module m; 0 or -1. */
int fp_manifest_init(PyObject *m);
int fp_model_init(PyObject *m);
int fp_plan_init(PyObject *m);
int fp_store_init(PyObject *m);   /* Store, Watch and the store's error classes */
int fp_exec_init(PyObject *m);    /* Engine, Binding, AttestedPlan, Executor (after fp_store_init) */
int fp_weights_init(PyObject *m); /* WeightSubscriber and the weights_* functions (after fp_store_init) */

/* ---- shared with the store file ------------------------------------------ */
/* The C handle of a ferry.Store (borrowed), or NULL with TypeError or
 * ValueError (not open) set. */
ferry_store *fp_store_handle(PyObject *o);
/* Count a call or an object using the handle without the GIL (delta +1,
 * then -1): Store.close() refuses with BusyError while any is counted. */
void fp_store_busy(PyObject *o, int delta);

#endif
