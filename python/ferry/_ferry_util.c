/* _ferry: helpers shared by the extension's source files (errors raised as
 * the store's Error subclasses, str/key conversions, sequences, dicts and
 * lists from C values). */
#include <string.h>

#include "_ferry.h"

PyObject *fp_err_new(int code, const char *msg)
{
    PyObject *e = PyObject_CallFunction(fp_err_class(code), "s", msg && *msg ? msg : ferry_strerror(code));
    if (!e)
        return NULL;
    PyObject *c = PyLong_FromLong(code);
    if (!c || PyObject_SetAttrString(e, "code", c) < 0) {
        Py_XDECREF(c);
        Py_DECREF(e);
        return NULL;
    }
    Py_DECREF(c);
    return e;
}

PyObject *fp_err_throw(PyObject *e)
{
    if (e) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

PyObject *fp_raise_class(int code, const char *msg)
{
    if (code == FERRY_ENOMEM)
        return PyErr_NoMemory();
    return fp_err_throw(fp_err_new(code, msg));
}

PyObject *fp_raise_err_class(int code, const ferry_error *err)
{
    return fp_raise_class(code, err ? err->msg : NULL);
}

const char *fp_key_of(PyObject *o, const char *what)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *k = PyUnicode_AsUTF8AndSize(o, &n);
    if (k && (size_t)n != strlen(k)) {
        PyErr_Format(PyExc_ValueError, "%s contains a NUL character", what);
        return NULL;
    }
    return k;
}

int fp_u64_of(PyObject *v, const char *what, uint64_t *out)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(v)->tp_name);
        return -1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be a non-negative 64-bit int", what);
        return -1;
    }
    *out = x;
    return 0;
}

PyObject *fp_str_of(const char *s)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
}

int fp_copy_str(char *dst, size_t cap, const char *src, const char *what)
{
    size_t n = strlen(src);
    if (n >= cap) {
        PyErr_Format(PyExc_ValueError, "%s is longer than %zu bytes", what, cap - 1);
        return -1;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

PyObject *fp_seq_hold(PyObject *o, const char *what)
{
    if (PyUnicode_Check(o) || PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list, not %.100s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    PyObject *t = PySequence_Tuple(o);
    if (!t)
        PyErr_Format(PyExc_TypeError, "%s must be a sequence", what);
    return t;
}

PyObject *fp_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

PyObject *fp_exit_result(PyObject *r)
{
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

int fp_add_type(PyObject *m, const char *name, PyTypeObject *t)
{
    return PyType_Ready(t) < 0 || PyModule_AddObjectRef(m, name, (PyObject *)t) < 0 ? -1 : 0;
}

int fp_check_open(const void *handle, int inflight, const char *what, const char *busy_msg)
{
    if (!handle) {
        PyErr_Format(PyExc_ValueError, "the %s is closed", what);
        return -1;
    }
    if (busy_msg && inflight) {
        fp_raise_class(FERRY_EBUSY, busy_msg);
        return -1;
    }
    return 0;
}

int fp_check_unopened(int open, const char *what)
{
    if (open) {
        PyErr_Format(PyExc_ValueError, "the %s is already open", what);
        return -1;
    }
    return 0;
}

int fp_dict_set(PyObject *d, const char *k, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return rc;
}

/* The value of kind k at p, as a new object. */
static PyObject *value_at(const void *p, enum fp_kind k)
{
    switch (k) {
    case FP_KIND_U64: {
        uint64_t x;
        memcpy(&x, p, sizeof x);
        return PyLong_FromUnsignedLongLong(x);
    }
    case FP_KIND_U32: {
        uint32_t x;
        memcpy(&x, p, sizeof x);
        return PyLong_FromUnsignedLong(x);
    }
    case FP_KIND_F64: {
        double x;
        memcpy(&x, p, sizeof x);
        return PyFloat_FromDouble(x);
    }
    case FP_KIND_STR: {
        const char *x;
        memcpy(&x, p, sizeof x);
        return fp_str_of(x);
    }
    }
    PyErr_SetString(PyExc_SystemError, "_ferry: unknown field kind");
    return NULL;
}

/* A list of the n values of kind k, size bytes apart from v. */
static PyObject *list_of(const void *v, size_t n, size_t size, enum fp_kind k)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *x = value_at((const char *)v + i * size, k);
        if (!x) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, x);
    }
    return l;
}

PyObject *fp_list_u64(const uint64_t *v, size_t n)
{
    return list_of(v, n, sizeof *v, FP_KIND_U64);
}

PyObject *fp_list_u32(const uint32_t *v, size_t n)
{
    return list_of(v, n, sizeof *v, FP_KIND_U32);
}

PyObject *fp_list_str(char *const *v, size_t n)
{
    return list_of(v, n, sizeof *v, FP_KIND_STR);
}

int fp_dict_put_fields(PyObject *d, const void *s, const fp_field *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fp_dict_set(d, f[i].key, value_at((const char *)s + f[i].off, f[i].kind)) < 0)
            return -1;
    return 0;
}

PyObject *fp_dict_of_fields(const void *s, const fp_field *f, size_t n)
{
    PyObject *d = PyDict_New();
    if (d && fp_dict_put_fields(d, s, f, n) < 0)
        Py_CLEAR(d);
    return d;
}

PyObject *fp_get_u64(PyObject *self, void *closure)
{
    return value_at((const char *)self + (uintptr_t)closure, FP_KIND_U64);
}

/* ---- shared by the reshard calls still here (exec, weights, sparse) ---------- */

int fp_dims(PyObject *o, uint64_t *out, uint32_t *n, const char *what)
{
    if (o == NULL || o == Py_None) {
        *n = UINT32_MAX;
        return 0;
    }
    PyObject *seq = PySequence_Fast(o, "a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len > FERRY_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: at most %d dims", what, FERRY_MAX_DIMS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        out[i] = v;
    }
    Py_DECREF(seq);
    *n = (uint32_t)len;
    return 0;
}

PyObject *fp_tuple_u64(const uint64_t *v, uint32_t n)
{
    PyObject *t = PyTuple_New(n);
    for (uint32_t i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

PyObject *fp_hex16(const uint8_t d[16])
{
    char h[33];
    ferry_digest_hex(d, h);
    return PyUnicode_FromString(h);
}

/* The C pointer a Python object of ferry.reshard (Manifest, Plan) holds,
 * from its property attr (an address; the object keeps it alive). */
static void *handle_of(PyObject *o, const char *attr, const char *expected)
{
    PyObject *a = PyObject_GetAttrString(o, attr);
    void *p = a ? PyLong_AsVoidPtr(a) : NULL;
    Py_XDECREF(a);
    if (!p) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, expected);
    }
    return p;
}

ferry_manifest *fp_manifest_of(PyObject *o)
{
    return handle_of(o, "_manifest_address", "expected a Manifest");
}

ferry_plan *fp_plan_of(PyObject *o)
{
    return handle_of(o, "_plan_address", "expected a Plan");
}
