/* _ferry: sparse COO weight deltas from Python (ferry.sparse) over
 * include/ferry/sparse.h: scatter apply into a strided destination, and
 * the read's counters for the sparse update (put, owner admission and the
 * batched read are ferry/_weights.py's, over the cffi binding).
 *
 * Thin: validation, sorting, planning, the fence are the C library's.
 * Descriptors, targets and results cross as dicts and tuples; array data as
 * buffers (ferry.sparse turns numpy arrays into buffers and results back
 * into arrays). Store calls and apply run with the GIL released while the
 * buffers they read or write stay held. Errors raise the store's Error
 * subclasses (FERRY_ESTATE, the base fence: ConflictError; FERRY_EEXIST:
 * ExistsError; FERRY_ENOENT: NotFoundError; others ferry.Error). */
#include <string.h>

#include "_ferry.h"
#include "ferry/sparse.h"

/* ---- descriptors ------------------------------------------------------------------------ */

/* d[k] as a non-negative 64-bit int (absent: *out unchanged when opt). 0 or -1. */
static int d_u64(PyObject *d, const char *k, uint64_t *out, bool opt)
{
    PyObject *v = PyDict_GetItemString(d, k);
    if (!v) {
        if (opt)
            return 0;
        PyErr_Format(PyExc_KeyError, "sparse descriptor: %s is missing", k);
        return -1;
    }
    return fp_u64_of(v, k, out);
}

static int d_str(PyObject *d, const char *k, char *dst, size_t cap)
{
    PyObject *v = PyDict_GetItemString(d, k);
    if (!v) {
        PyErr_Format(PyExc_KeyError, "sparse descriptor: %s is missing", k);
        return -1;
    }
    const char *s = fp_key_of(v, k);
    return s ? fp_copy_str(dst, cap, s, k) : -1;
}

/* A sequence of 1..FERRY_SPARSE_NDIM_MAX non-negative ints; *n its length. */
static int dims_of(PyObject *o, uint64_t *out, uint32_t *n, const char *what)
{
    PyObject *t = fp_seq_hold(o, what);
    if (!t)
        return -1;
    Py_ssize_t nd = PyTuple_GET_SIZE(t);
    if (nd < 1 || nd > FERRY_SPARSE_NDIM_MAX) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ValueError, "%s must have 1..%d dimensions, not %zd", what, FERRY_SPARSE_NDIM_MAX, nd);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *x = PyTuple_GET_ITEM(t, i);
        unsigned long long v = PyLong_Check(x) ? PyLong_AsUnsignedLongLong(x) : (unsigned long long)-1;
        if (!PyLong_Check(x) || (v == (unsigned long long)-1 && PyErr_Occurred())) {
            Py_DECREF(t);
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s[%zd] must be a non-negative int", what, i);
            return -1;
        }
        out[i] = v;
    }
    *n = (uint32_t)nd;
    Py_DECREF(t);
    return 0;
}

static int apply_of(const char *s, enum ferry_sparse_apply *a)
{
    if (!strcmp(s, "scatter_add"))
        *a = FERRY_SPARSE_SCATTER_ADD;
    else if (!strcmp(s, "scatter_set"))
        *a = FERRY_SPARSE_SCATTER_SET;
    else {
        PyErr_Format(PyExc_ValueError, "apply must be \"scatter_add\" or \"scatter_set\", not \"%.40s\"", s);
        return -1;
    }
    return 0;
}

#define F(m) FP_FIELD(ferry_sparse_stats, m)
static const fp_field stats_fields[] = {
    F(source_objects), F(non_ep_source_object_count), F(index_gets), F(index_cache_hits), F(unique_range_gets),
    F(full_indices_values_get_count), F(dedup_hits), F(bytes_read), F(entries_read), F(entries_kept),
    F(boundary_filtered), F(plan_s), F(read_s), F(filter_s), F(index_checks), F(index_bytes_read), F(index_s),
    F(index_range_gets), F(index_range_bytes), F(value_range_bytes), F(index_range_s), F(value_range_s),
};
#undef F

/* ---- apply ------------------------------------------------------------------------------ */

/* sparse_apply(result dict, indices, values, dst, dst_dtype, current_generation) -> new generation.
 * indices: int64 [nnz, ndim]; values: nnz of the result's value_dtype. */
static PyObject *sp_apply(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *rd, *io, *vo, *dst;
    const char *dst_dtype;
    unsigned long long cur;
    if (!PyArg_ParseTuple(args, "OOOOsK:sparse_apply", &rd, &io, &vo, &dst, &dst_dtype, &cur))
        return NULL;
    if (!PyDict_Check(rd))
        return PyErr_Format(PyExc_TypeError, "result must be a dict, not %.100s", Py_TYPE(rd)->tp_name);
    ferry_sparse_result r;
    memset(&r, 0, sizeof r);
    char apply[16];
    PyObject *shape = PyDict_GetItemString(rd, "shape");
    if (d_str(rd, "tensor_id", r.tensor_id, sizeof r.tensor_id) < 0 ||
        d_u64(rd, "base_generation", &r.base_generation, false) < 0 ||
        d_u64(rd, "delta_generation", &r.delta_generation, false) < 0 || d_str(rd, "apply", apply, sizeof apply) < 0 ||
        apply_of(apply, &r.apply) < 0 || d_str(rd, "value_dtype", r.value_dtype, sizeof r.value_dtype) < 0 ||
        d_u64(rd, "nnz", &r.nnz, false) < 0)
        return NULL;
    if (!shape)
        return PyErr_Format(PyExc_KeyError, "result: shape is missing");
    if (dims_of(shape, r.shape, &r.ndim, "result shape") < 0)
        return NULL;
    uint32_t vsz = ferry_dtype_size(r.value_dtype), dsz = ferry_dtype_size(dst_dtype);
    if (!vsz || !dsz)
        return PyErr_Format(PyExc_ValueError, "sparse_apply %s: value dtype %s or buffer dtype %s unknown",
                            r.tensor_id, r.value_dtype, dst_dtype);
    uint64_t elems = 1;
    for (uint32_t k = 0; k < r.ndim; k++)
        elems *= r.shape[k];
    Py_buffer iv, vv, dv;
    if (fp_buf_get(io, &iv, PyBUF_C_CONTIGUOUS, "sparse_apply: indices") < 0)
        return NULL;
    if (fp_buf_get(vo, &vv, PyBUF_C_CONTIGUOUS, "sparse_apply: values") < 0) {
        PyBuffer_Release(&iv);
        return NULL;
    }
    if (fp_buf_get(dst, &dv, PyBUF_STRIDES | PyBUF_WRITABLE, "sparse_apply: dense") < 0) {
        PyBuffer_Release(&iv);
        PyBuffer_Release(&vv);
        return NULL;
    }
    PyObject *out = NULL;
    if ((uint64_t)iv.len != r.nnz * r.ndim * sizeof(int64_t) || (uint64_t)vv.len != r.nnz * vsz) {
        PyErr_Format(PyExc_ValueError, "sparse_apply %s: %llu entries need %llu index bytes (int64) and %llu value "
                     "bytes; the arrays hold %zd and %zd", r.tensor_id, (unsigned long long)r.nnz,
                     (unsigned long long)(r.nnz * r.ndim * 8), (unsigned long long)(r.nnz * vsz), iv.len, vv.len);
        goto done;
    }
    /* The destination is a view: its shape must be the target's, its
     * strides (in elements) go to the library, which refuses overlapping
     * or negative ones before any write. */
    ferry_sparse_view view = {.data = dv.buf, .ndim = (uint32_t)dv.ndim};
    snprintf(view.dtype, sizeof view.dtype, "%s", dst_dtype);
    bool shape_ok = dv.ndim == (int)r.ndim && dv.itemsize == (Py_ssize_t)dsz;
    for (int k = 0; shape_ok && k < dv.ndim; k++) {
        shape_ok = (uint64_t)dv.shape[k] == r.shape[k];
        view.shape[k] = (uint64_t)dv.shape[k];
        Py_ssize_t b = dv.strides ? dv.strides[k] : 0;
        if (dv.strides && (b % dv.itemsize)) {
            PyErr_Format(PyExc_ValueError, "sparse_apply %s: stride %zd of dimension %d is not a multiple of the "
                         "%zd-byte elements", r.tensor_id, b, k, dv.itemsize);
            goto done;
        }
        view.strides[k] = dv.strides ? (int64_t)(b / dv.itemsize) : 0;
    }
    if (!shape_ok || (dv.ndim == 0 && (uint64_t)dv.len != elems * dsz)) {
        PyErr_Format(PyExc_ValueError, "sparse_apply %s: the destination (%d dims of %zd-byte elements, %zd bytes) "
                     "is not the target's local shape of %u dims in %s", r.tensor_id, dv.ndim, dv.itemsize,
                     dv.len, r.ndim, dst_dtype);
        goto done;
    }
    if (!dv.strides || PyBuffer_IsContiguous(&dv, 'C'))
        memset(view.strides, 0, sizeof view.strides);
    r.indices = iv.buf;
    r.values = vv.buf;
    ferry_error err = {0};
    uint64_t gen = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_sparse_apply_view(&r, &view, cur, &gen, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        fp_raise_err_class(rc, &err);
    else
        out = fp_u64(gen);
done:
    PyBuffer_Release(&iv);
    PyBuffer_Release(&vv);
    PyBuffer_Release(&dv);
    return out;
}

static PyMethodDef sparse_methods[] = {
    {"sparse_apply", sp_apply, METH_VARARGS,
     "sparse_apply($module, result, indices, values, dst, dst_dtype, current_generation, /)\n--\n\n"
     "sparse_apply(result, indices, values, dst, dst_dtype, current_generation) -> new generation"},
    {NULL, NULL, 0, NULL},
};

PyObject *fp_sparse_stats_dict(const ferry_sparse_stats *st)
{
    return FP_FIELDS_DICT(st, stats_fields);
}

int fp_sparse_gen_init(PyObject *m);   /* _ferry_sparse_gen.c */

int fp_sparse_init(PyObject *m)
{
    if (PyModule_AddFunctions(m, sparse_methods) < 0)
        return -1;
    return fp_sparse_gen_init(m) < 0 ? -1 : fp_sparse_delta_init(m);
}
