/* _ferry: helpers shared by the extension's source files (errors raised as
 * the store's Error subclasses, str/key conversions, sequences). */
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
