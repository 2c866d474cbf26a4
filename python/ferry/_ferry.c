/* _ferry: the C extension under the ferry Python package. Module set-up
 * and the error type; each layer adds its types from its own file. */
#include "_ferry.h"

PyObject *fp_error;

/* One class per code everywhere (fp_err_class): a FERRY_ENOENT from a
 * manifest call is the same NotFoundError as from the store. */
PyObject *fp_raise(int code, const char *msg)
{
    return fp_raise_class(code, msg);
}

PyObject *fp_raise_err(int code, const ferry_error *err)
{
    return fp_raise_class(code, err ? err->msg : NULL);
}

/* The module cffi generates from the public headers is compiled into this
 * one (one libferry in the process) and made on first use, so that this
 * extension loads without cffi's backend (an interpreter without it can
 * still load the parts written here). */
PyMODINIT_FUNC PyInit__ferry_cffi(void);

static PyObject *fp_cffi(PyObject *self, PyObject *unused)
{
    static PyObject *mod;
    (void)self;
    (void)unused;
    if (!mod)
        mod = PyInit__ferry_cffi();
    return mod ? Py_NewRef(mod) : NULL;
}

/* _error(code, msg) -> the exception a call over the cffi binding raises */
static PyObject *fp_error_fn(PyObject *self, PyObject *args)
{
    (void)self;
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "is:_error", &code, &msg))
        return NULL;
    return fp_err_new(code, msg);
}

static PyMethodDef fp_methods[] = {
    {"_error", fp_error_fn, METH_VARARGS, "_error($module, code, msg, /)\n--\n\n"
     "_error(code, msg) -> the Error subclass of code, .code set (msg empty: strerror(code))"},
    {"_cffi", fp_cffi, METH_NOARGS, "_cffi($module, /)\n--\n\n"
     "_cffi() -> the cffi module over include/ferry/*.h (its ffi and lib)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fp_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ferry._ferry",
    .m_doc = "C extension of the ferry package (use the ferry modules, not this one)",
    .m_size = -1,
    .m_methods = fp_methods,
};

PyMODINIT_FUNC PyInit__ferry(void)
{
    PyObject *m = PyModule_Create(&fp_module);
    if (!m)
        return NULL;
    fp_error = PyErr_NewExceptionWithDoc("ferry.Error", "A ferry call failed; .code is the FERRY_E* code.",
                                         PyExc_Exception, NULL);
    if (!fp_error || PyModule_AddObjectRef(m, "Error", fp_error) < 0 || fp_mem_init(m) < 0 || fp_store_init(m) < 0 || fp_exec_init(m) < 0 ||
        fp_weights_init(m) < 0 || fp_sparse_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
