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

/* ---- errors as the store's Error subclasses, conversions (_ferry_util.c) -- */
/* The Error subclass of code (NotFoundError, BusyError, ...; the store file
 * owns them), else Error. Borrowed. */
PyObject *fp_err_class(int code);
/* A new instance of fp_err_class(code): str(e) msg (NULL or empty:
 * ferry_strerror(code)), e.code code. NULL with an error set on failure. */
PyObject *fp_err_new(int code, const char *msg);
/* Raise e (stealing it; NULL: the error already set). Returns NULL. */
PyObject *fp_err_throw(PyObject *e);
/* Raise fp_err_new(code, msg), or MemoryError for FERRY_ENOMEM. NULL. */
PyObject *fp_raise_class(int code, const char *msg);
/* fp_raise_class with the message of a ferry_error filled by a failed call. */
PyObject *fp_raise_err_class(int code, const ferry_error *err);
/* UTF-8 of a str without NUL bytes (what names it in errors); valid while
 * o lives. NULL with TypeError or ValueError. */
const char *fp_key_of(PyObject *o, const char *what);
/* str from UTF-8 (undecodable bytes as surrogates). */
PyObject *fp_str_of(const char *s);
/* src into dst of cap bytes, NUL included; ValueError when too long. 0 or -1. */
int fp_copy_str(char *dst, size_t cap, const char *src, const char *what);
/* A tuple copy of a sequence (holds its items for the duration of a call);
 * str and bytes refused. */
PyObject *fp_seq_hold(PyObject *o, const char *what);
/* Ready type t and add it to module m as name. 0 or -1. */
int fp_add_type(PyObject *m, const char *name, PyTypeObject *t);
/* __enter__ of a context manager: self. */
PyObject *fp_enter(PyObject *self, PyObject *unused);
/* __exit__ from the result of the object's close(): NULL when it raised,
 * else False (exceptions propagate). Steals r. */
PyObject *fp_exit_result(PyObject *r);

/* Run stmt without the GIL with the ferry.Store so marked busy
 * (fp_store_busy) meanwhile. */
#define FP_STORE_CALL(store, stmt)                                                                                     \
    do {                                                                                                               \
        PyThreadState *fp_save_;                                                                                       \
        fp_store_busy((store), 1);                                                                                     \
        fp_save_ = PyEval_SaveThread();                                                                                \
        stmt;                                                                                                          \
        PyEval_RestoreThread(fp_save_);                                                                                \
        fp_store_busy((store), -1);                                                                                    \
    } while (0)

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
int fp_samples_init(PyObject *m); /* PolicyWatch, SampleQueue, Sample, KVCacheGate, QueueFullError (after fp_store_init) */
int fp_sparse_init(PyObject *m);  /* sparse_put, sparse_admit, sparse_read, sparse_apply (after fp_store_init) */

/* ---- shared with the store file ------------------------------------------ */
/* The C handle of a ferry.Store (borrowed), or NULL with TypeError or
 * ValueError (not open) set. */
ferry_store *fp_store_handle(PyObject *o);
/* Count a call or an object using the handle without the GIL (delta +1,
 * then -1): Store.close() refuses with BusyError while any is counted. */
void fp_store_busy(PyObject *o, int delta);

#endif
