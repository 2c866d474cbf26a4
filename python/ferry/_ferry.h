/* The _ferry extension module: shared helpers of its source files. Uses
 * the public API (include/ferry/) only. */
#ifndef FP_FERRY_H
#define FP_FERRY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/ferry.h"

/* CPython 3.9 lacks these 3.10 conveniences: the package builds for >= 3.9. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *fp_newref_(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#define Py_NewRef(o) fp_newref_((PyObject *)(o))
static inline int PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *v)
{
    if (!v) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "PyModule_AddObjectRef: NULL value");
        return -1;
    }
    Py_INCREF(v);
    if (PyModule_AddObject(m, name, v) < 0) {
        Py_DECREF(v);
        return -1;
    }
    return 0;
}
#endif

/* _ferry.Error: raised with str(e) the message and e.code the negative
 * FERRY_E* code. */
extern PyObject *fp_error;
/* Raise the class of code (fp_err_class: the same class for a code in every
 * module) with msg (NULL or empty: ferry_strerror(code)); MemoryError for
 * FERRY_ENOMEM. Returns NULL. */
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
/* An int as a uint64_t: TypeError when v is not an int, ValueError when it
 * is negative or too large (messages name it what). 0 or -1. */
int fp_u64_of(PyObject *v, const char *what, uint64_t *out);
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

/* The fields of the type object of a class instantiated from Python: its
 * tp_new is PyType_GenericNew and pfx_init, pfx_dealloc, pfx_methods and
 * pfx_getset are its other slots (more designated fields may follow). */
#define FP_CLASS(pfx, T, name, flags, doc)                                                                             \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = (name), .tp_basicsize = sizeof(T), .tp_flags = (flags), .tp_doc = (doc), \
        .tp_new = PyType_GenericNew, .tp_init = (initproc)pfx##_init, .tp_dealloc = (destructor)pfx##_dealloc,        \
        .tp_methods = pfx##_methods, .tp_getset = pfx##_getset

/* The close(), __enter__ and __exit__ entries of a method table, and the
 * `closed` entry of a getset table, for pfx_close, pfx_exit, pfx_get_closed. */
#define FP_CLOSE_METHODS(pfx, close_doc)                                                                               \
    {"close", (PyCFunction)pfx##_close, METH_NOARGS, "close($self, /)\n--\n\n" close_doc}, {"__enter__", fp_enter, METH_NOARGS, NULL},          \
        {"__exit__", (PyCFunction)pfx##_exit, METH_VARARGS, NULL}
#define FP_CLOSED_GETTER(pfx, doc) {"closed", (getter)pfx##_get_closed, NULL, doc, NULL}

/* ---- memory arguments (_ferry_mem.c) --------------------------------------- */
/* A view of the memory of o for a call: like PyObject_GetBuffer(o, v, flags)
 * (release it with PyBuffer_Release), but o may also be a torch tensor (CPU;
 * one that requires grad is exported detached), any object with __dlpack__
 * or a DLPack capsule. Refused, naming o as `what` and describing it (type,
 * dtype, shape): not contiguous when flags need it (any flags without
 * PyBUF_STRIDES, or PyBUF_C_CONTIGUOUS), read-only with PyBUF_WRITABLE
 * (ValueError); device memory (ValueError "device memory (cuda:0) is not
 * supported yet"); not memory at all (TypeError). 0 or -1. */
int fp_buf_get(PyObject *o, Py_buffer *v, int flags, const char *what);
/* The ferry dtype of a view's elements ("bf16" for a torch bfloat16 tensor,
 * from the struct format otherwise), or NULL when it has none. */
const char *fp_buf_dtype(const Py_buffer *v);
/* The ferry dtype of a struct format with that itemsize (NULL format: "u8"
 * for 1-byte items), or NULL. */
const char *fp_format_dtype(const char *fmt, Py_ssize_t itemsize);
/* A ferry._ferry.Memory over o's memory (new reference), or NULL raised. */
PyObject *fp_memory(PyObject *o, const char *what);
/* "torch.Tensor of torch.float32, shape [4, 4]": what o is, for messages. */
PyObject *fp_describe(PyObject *o);
int fp_mem_init(PyObject *m);     /* Memory and memory() */

/* ---- dicts, lists and getters from C values (_ferry_util.c) ------------- */
static inline PyObject *fp_u64(uint64_t v)
{
    return PyLong_FromUnsignedLongLong(v);
}
/* d[k] = v, stealing v (NULL: an error is already set). 0 or -1. */
int fp_dict_set(PyObject *d, const char *k, PyObject *v);
/* A list of the n values (ints; str by fp_str_of). NULL with an error set. */
PyObject *fp_list_u64(const uint64_t *v, size_t n);
PyObject *fp_list_u32(const uint32_t *v, size_t n);
PyObject *fp_list_str(char *const *v, size_t n);

/* A member of a C struct that goes into a dict under its own name: its
 * kind (from its C type, by FP_FIELD) and offset. A table of
 * FP_FIELD(T, member) turns a counters struct into a dict in table order. */
enum fp_kind { FP_KIND_U64, FP_KIND_U32, FP_KIND_F64, FP_KIND_STR /* char *, by fp_str_of */ };
typedef struct {
    const char *key;
    enum fp_kind kind;
    size_t off;
} fp_field;
#define FP_KIND_OF(x)                                                                                                  \
    _Generic((x), uint64_t: FP_KIND_U64, uint32_t: FP_KIND_U32, double: FP_KIND_F64, char *: FP_KIND_STR)
#define FP_FIELD(T, m) {#m, FP_KIND_OF(((T *)0)->m), offsetof(T, m)}
#define FP_NFIELDS(f) (sizeof(f) / sizeof((f)[0]))
/* d[f[i].key] = the field of s for each of the n fields. 0 or -1. */
int fp_dict_put_fields(PyObject *d, const void *s, const fp_field *f, size_t n);
/* A new dict of the n fields of s (NULL with an error set). */
PyObject *fp_dict_of_fields(const void *s, const fp_field *f, size_t n);
#define FP_FIELDS_DICT(s, f) fp_dict_of_fields((s), (f), FP_NFIELDS(f))
/* A getter of the uint64_t at offset (uintptr_t)closure of the object:
 * {"name", fp_get_u64, NULL, doc, FP_OFFSET(T, member)}. */
PyObject *fp_get_u64(PyObject *self, void *closure);
#define FP_OFFSET(T, m) ((void *)(uintptr_t)offsetof(T, m))

/* close(), __exit__, tp_dealloc and the `closed` getter (pfx_close,
 * pfx_exit, pfx_dealloc, pfx_get_closed) of an object type T that holds a
 * ferry.Store in self->store and its C handle in self->handle, released by
 * pfx_close_now(self) (which also drops the store's busy mark). close()
 * raises BusyError(busy_msg) while self->inflight counts a call. */
#define FP_STORE_HOLDER_CLOSE(pfx, T, handle, busy_msg)                                                                \
    static PyObject *pfx##_close(T *self, PyObject *unused)                                                            \
    {                                                                                                                  \
        (void)unused;                                                                                                  \
        if (self->inflight)                                                                                            \
            return fp_raise_class(FERRY_EBUSY, busy_msg);                                                              \
        pfx##_close_now(self);                                                                                         \
        Py_CLEAR(self->store);                                                                                         \
        Py_RETURN_NONE;                                                                                                \
    }                                                                                                                  \
    static PyObject *pfx##_exit(T *self, PyObject *args)                                                               \
    {                                                                                                                  \
        (void)args;                                                                                                    \
        return fp_exit_result(pfx##_close(self, NULL));                                                                \
    }                                                                                                                  \
    static void pfx##_dealloc(T *self)                                                                                 \
    {                                                                                                                  \
        pfx##_close_now(self);                                                                                         \
        Py_CLEAR(self->store);                                                                                         \
        Py_TYPE(self)->tp_free((PyObject *)self);                                                                      \
    }                                                                                                                  \
    static PyObject *pfx##_get_closed(T *self, void *closure)                                                          \
    {                                                                                                                  \
        (void)closure;                                                                                                 \
        return PyBool_FromLong(self->handle == NULL);                                                                  \
    }

/* For an object over a C handle: 0 when handle is set and, with busy_msg,
 * no call is in flight; else -1 with ValueError("the <what> is closed") or
 * BusyError(busy_msg). */
int fp_check_open(const void *handle, int inflight, const char *what, const char *busy_msg);
/* For __init__: 0, or -1 with ValueError("the <what> is already open")
 * when open. */
int fp_check_unopened(int open, const char *what);

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

/* ---- parameter shards: (tensor name, global offset, writable strided array) -------- */
/* The caller's shard tuples, held (the names live in them), and one held
 * buffer export per shard: a box's shape and element strides are its
 * array's (views[i].itemsize its element size). */
typedef struct {
    PyObject *items;
    ferry_param_shard *sh;
    Py_buffer *views;
    size_t n, held;
} fp_shards;
/* Parse shards (a sequence of such tuples, arrays of 1..max_dims dims);
 * 0, or -1 with an exception set and nothing held. */
int fp_shards_from(fp_shards *w, PyObject *o, int max_dims);
void fp_shards_free(fp_shards *w);

/* ---- shared by the reshard files ---------------------------------------- */
#define FP_KWFN(f) (PyCFunction)(void (*)(void))(f)
/* A sequence of at most FERRY_MAX_DIMS non-negative ints into out, *n its
 * length; None leaves out untouched and sets *n = UINT32_MAX. 0 or -1. */
int fp_dims(PyObject *o, uint64_t *out, uint32_t *n, const char *what);
PyObject *fp_tuple_u64(const uint64_t *v, uint32_t n);
PyObject *fp_hex16(const uint8_t d[16]);   /* digest as 32 hex chars */
/* The manifest of a ferry.reshard.Manifest (Python, over the cffi binding;
 * borrowed: the object holds it), or NULL with TypeError set. */
ferry_manifest *fp_manifest_of(PyObject *o);
/* The plan of a ferry.reshard.Plan (borrowed), or NULL with TypeError set. */
ferry_plan *fp_plan_of(PyObject *o);
/* Add each file's types and functions to module m; 0 or -1. */
int fp_store_init(PyObject *m);   /* Store, Watch and the store's error classes */
int fp_exec_init(PyObject *m);    /* Engine, Binding, AttestedPlan, Executor (after fp_store_init) */
int fp_weights_init(PyObject *m); /* WeightSubscriber and the weights_* functions (after fp_store_init) */
int fp_sparse_init(PyObject *m);  /* sparse_put, sparse_admit, sparse_read, sparse_apply (after fp_store_init) */

/* ---- shared by the publish calls (_ferry_weights.c) ------------------------ */
/* cfg, zeroed, from the arguments both publish calls take (rank_node left
 * NULL). 0 or -1 with ValueError (a name too long). */
int fp_publisher_config(ferry_publisher_config *cfg, const char *model, const char *out_dtype, uint32_t rank,
                        uint32_t world, uint64_t segment, uint32_t keep, uint64_t timeout_ms);
/* One (fragment id, buffer) of a shard publish, checked against the
 * placement: the fragment exists and is rank's, the buffer (held into v;
 * *held counts it) holds what the fragment says in its tensor's dtype.
 * 0 or -1 raised. (_ferry_weights.c; the delta encoder's too.) */
int fp_shard_item(ferry_manifest *pl, uint32_t rank, PyObject *it, size_t i, ferry_shard_data *d,
                  Py_buffer *v, size_t *held);
/* DeltaEncoder's functions (_ferry_sparse_delta.c), after fp_store_init. */
int fp_sparse_delta_init(PyObject *m);
/* d["generation"] and the counters of a publish (all: with the phase times
 * and local_bytes that weights_publish reports). 0 or -1. */
int fp_publish_stats_put(PyObject *d, uint64_t generation, const ferry_publish_stats *st, bool all);

/* ---- shared with the store file ------------------------------------------ */
/* The C handle of a ferry.Store (borrowed), or NULL with TypeError or
 * ValueError (not open) set. */
ferry_store *fp_store_handle(PyObject *o);
/* The sparse reader a ferry.Store owns (borrowed; opened at the first
 * call, closed with the store), or NULL with an error set. */
ferry_sparse_reader *fp_store_sparse_reader(PyObject *o);
/* Parse the positional arguments (store, str) with fmt ("Os:name") and
 * return the store's C handle (*so: the ferry.Store, *str: the string), or
 * NULL with an error set. */
ferry_store *fp_store_str_args(PyObject *args, const char *fmt, PyObject **so, const char **str);
/* Count a call or an object using the handle without the GIL (delta +1,
 * then -1): Store.close() refuses with BusyError while any is counted. */
void fp_store_busy(PyObject *o, int delta);

#endif
