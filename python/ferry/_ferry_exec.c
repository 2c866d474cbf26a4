/* _ferry: reshard execution from Python (ferry.Engine, ferry.reshard.Binding,
 * AttestedPlan, Executor). Thin over include/ferry/exec.h and engine.h:
 * every check is the C library's. A binding keeps a buffer export of each
 * array it binds (the memory stays alive and cannot be resized while the
 * binding lives); an engine keeps one of each array it registers. Runs,
 * engine opens/closes, peer imports and notification waits release the GIL;
 * objects read during a run are marked busy so that another thread cannot
 * change or free them meanwhile. */
#include <string.h>

#include "_ferry.h"

/* ---- errors ------------------------------------------------------------------------ */

/* Raise the Error subclass of code with msg (NULL/empty: strerror), e.code,
 * and when given e.result (stolen) and e.__cause__ (stolen). Returns NULL. */
static PyObject *ex_raise(int code, const char *msg, PyObject *result, PyObject *cause)
{
    if (code == FERRY_ENOMEM && !result) {
        Py_XDECREF(cause);
        return PyErr_NoMemory();
    }
    PyObject *e = fp_err_new(code, msg);
    if (!e || (result && PyObject_SetAttrString(e, "result", result) < 0)) {
        Py_XDECREF(e);
        Py_XDECREF(result);
        Py_XDECREF(cause);
        return NULL;
    }
    Py_XDECREF(result);
    if (cause)
        PyException_SetCause(e, cause);   /* steals cause */
    return fp_err_throw(e);
}

/* Raise for an engine call's failure: the code's text, as these calls
 * always said, then the engine's sentence (which op, which peer, why). */
static PyObject *ex_raise_why(int code, const ferry_error *err)
{
    char msg[sizeof err->msg + 160];
    if (err->msg[0])
        snprintf(msg, sizeof msg, "%s: %s", ferry_strerror(code), err->msg);
    else
        snprintf(msg, sizeof msg, "%s", ferry_strerror(code));
    return ex_raise(code, msg, NULL, NULL);
}

static PyObject *busy_error(const char *what)
{
    return ex_raise(FERRY_EBUSY, what, NULL, NULL);
}

/* A buffer's element layout: strides in elements (refusing negative strides
 * and strides that are not multiples of the itemsize) and the bytes from
 * the first element to one past the last. 0 or -1 with ValueError. */
static int buffer_layout(const Py_buffer *v, uint64_t *shape, uint64_t *strides, uint64_t *nbytes)
{
    if (v->ndim < 0 || v->ndim > FERRY_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "array: at most %d dims", FERRY_MAX_DIMS);
        return -1;
    }
    if (v->itemsize <= 0) {
        PyErr_SetString(PyExc_ValueError, "array: itemsize must be positive");
        return -1;
    }
    uint64_t isz = (uint64_t)v->itemsize, span = 0, expect = isz;
    bool empty = false;
    for (int d = v->ndim - 1; d >= 0; d--) {
        Py_ssize_t ext = v->shape ? v->shape[d] : (Py_ssize_t)(v->len / v->itemsize);
        Py_ssize_t st = v->strides ? v->strides[d] : (Py_ssize_t)expect;
        if (st < 0) {
            PyErr_Format(PyExc_ValueError, "array: negative stride %zd on dim %d", st, d);
            return -1;
        }
        if ((uint64_t)st % isz) {
            PyErr_Format(PyExc_ValueError, "array: stride %zd bytes on dim %d is not a multiple of the itemsize %zd",
                         st, d, v->itemsize);
            return -1;
        }
        shape[d] = (uint64_t)ext;
        strides[d] = (uint64_t)st / isz;
        if (ext == 0)
            empty = true;
        else
            span += (uint64_t)(ext - 1) * (uint64_t)st;
        expect *= (uint64_t)ext;
    }
    *nbytes = empty ? 0 : span + isz;
    return 0;
}

/* bytes-like descriptor into out (at most FERRY_DESC_MAX). 0 or -1. */
static int desc_from(PyObject *o, uint8_t *out, uint32_t *len)
{
    *len = 0;
    if (!o || o == Py_None)
        return 0;
    Py_buffer v;
    if (PyObject_GetBuffer(o, &v, PyBUF_SIMPLE) < 0)
        return -1;
    if (v.len > FERRY_DESC_MAX) {
        PyBuffer_Release(&v);
        ex_raise(FERRY_EMSGSIZE, "desc: at most 256 bytes", NULL, NULL);
        return -1;
    }
    memcpy(out, v.buf, (size_t)v.len);
    *len = (uint32_t)v.len;
    PyBuffer_Release(&v);
    return 0;
}

static int mode_from(const char *s, enum ferry_exec_mode *m)
{
    if (!strcmp(s, "sink"))
        *m = FERRY_EXEC_SINK;
    else if (!strcmp(s, "reader"))
        *m = FERRY_EXEC_READER;
    else {
        PyErr_Format(PyExc_ValueError, "mode: 'sink' or 'reader', not '%s'", s);
        return -1;
    }
    return 0;
}

/* A sequence of worker ids into a new array (*out NULL when empty). */
static int workers_from(PyObject *o, uint32_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    PyObject *seq = PySequence_Fast(o, "workers: a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    uint32_t *w = len ? PyMem_Calloc((size_t)len, sizeof *w) : NULL;
    if (len && !w) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "workers: ids fit 32 bits");
            PyMem_Free(w);
            Py_DECREF(seq);
            return -1;
        }
        w[i] = (uint32_t)v;
    }
    Py_DECREF(seq);
    *out = w;
    *n = (size_t)len;
    return 0;
}

/* ---- Binding ----------------------------------------------------------------------- */

typedef struct {
    Py_buffer view;
    uint64_t fragment;
} BoundView;

typedef struct {
    PyObject_HEAD
    ferry_binding *b;
    BoundView **views;   /* buffer exports of the bound arrays */
    size_t nviews, cap;
    int busy;            /* runs reading the binding with the GIL released */
} BindingObject;

static PyTypeObject BindingType;

static BindingObject *binding_of(PyObject *o, const char *what)
{
    if (!PyObject_TypeCheck(o, &BindingType) || !((BindingObject *)o)->b) {
        PyErr_Format(PyExc_TypeError, "%s: expected a Binding", what);
        return NULL;
    }
    return (BindingObject *)o;
}

static int binding_init(BindingObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"manifest", "instance", "generation", "lease", NULL};
    PyObject *mo;
    unsigned long long inst = 0, gen = 0, lease = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|KKK", kwl, &mo, &inst, &gen, &lease))
        return -1;
    ferry_manifest *m = fp_manifest_of(mo);
    if (!m)
        return -1;
    if (self->b || self->nviews) {
        PyErr_SetString(PyExc_RuntimeError, "Binding already initialised");
        return -1;
    }
    ferry_error err = {0};
    int rc = ferry_binding_create(m, inst, gen, lease, &self->b, &err);
    if (rc < 0) {
        fp_raise_err_class(rc, &err);
        return -1;
    }
    return 0;
}

static void binding_dealloc(BindingObject *self)
{
    ferry_binding_free(self->b);
    for (size_t i = 0; i < self->nviews; i++) {
        PyBuffer_Release(&self->views[i]->view);
        PyMem_Free(self->views[i]);
    }
    PyMem_Free(self->views);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int binding_add_entry(BindingObject *self, const ferry_binding_entry *e)
{
    if (self->busy) {
        busy_error("the binding is being executed");
        return -1;
    }
    ferry_error err = {0};
    int rc = ferry_binding_add(self->b, e, &err);
    if (rc < 0) {
        fp_raise_err_class(rc, &err);
        return -1;
    }
    return 0;
}

static PyObject *binding_add(BindingObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"fragment", "array", "worker", "desc", NULL};
    unsigned long long frag;
    unsigned int worker = 0;
    PyObject *arr, *desc = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KO|IO", kwl, &frag, &arr, &worker, &desc))
        return NULL;
    ferry_binding_entry e;
    memset(&e, 0, sizeof e);
    e.fragment = frag;
    e.worker = worker;
    e.kind = FERRY_MEM_HOST;
    if (desc_from(desc, e.desc, &e.desc_len) < 0)
        return NULL;
    if (self->nviews == self->cap) {
        size_t cap = self->cap ? 2 * self->cap : 8;
        BoundView **v = PyMem_Realloc(self->views, cap * sizeof *v);
        if (!v)
            return PyErr_NoMemory();
        self->views = v;
        self->cap = cap;
    }
    BoundView *bv = PyMem_Calloc(1, sizeof *bv);
    if (!bv)
        return PyErr_NoMemory();
    if (fp_buf_get(arr, &bv->view, PyBUF_STRIDES, "bind: array") < 0) {
        PyMem_Free(bv);
        return NULL;
    }
    e.addr = (uint64_t)(uintptr_t)bv->view.buf;
    e.itemsize = (uint32_t)bv->view.itemsize;
    e.ndim = (uint32_t)bv->view.ndim;
    if (buffer_layout(&bv->view, e.shape, e.strides, &e.nbytes) < 0 || binding_add_entry(self, &e) < 0) {
        PyBuffer_Release(&bv->view);
        PyMem_Free(bv);
        return NULL;
    }
    bv->fragment = frag;
    self->views[self->nviews++] = bv;
    Py_RETURN_NONE;
}

static PyObject *binding_add_raw(BindingObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"fragment", "addr", "nbytes", "shape", "strides", "itemsize", "worker", "desc", "kind",
                          "storage_offset", NULL};
    unsigned long long frag, addr, nbytes, so = 0;
    unsigned int itemsize, worker = 0;
    PyObject *shape, *strides, *desc = Py_None;
    const char *kind = "host";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKKOOI|IOsK", kwl, &frag, &addr, &nbytes, &shape, &strides,
                                     &itemsize, &worker, &desc, &kind, &so))
        return NULL;
    ferry_binding_entry e;
    memset(&e, 0, sizeof e);
    e.fragment = frag;
    e.addr = addr;
    e.nbytes = nbytes;
    e.itemsize = itemsize;
    e.worker = worker;
    e.storage_offset = so;
    if (!strcmp(kind, "host"))
        e.kind = FERRY_MEM_HOST;
    else if (!strcmp(kind, "device"))
        e.kind = FERRY_MEM_DEVICE;
    else {
        PyErr_SetString(PyExc_ValueError, "kind: 'host' or 'device'");
        return NULL;
    }
    uint32_t n1, n2;
    if (fp_dims(shape, e.shape, &n1, "shape") < 0 || fp_dims(strides, e.strides, &n2, "strides") < 0 ||
        desc_from(desc, e.desc, &e.desc_len) < 0)
        return NULL;
    if (n1 == UINT32_MAX || n1 != n2) {
        PyErr_SetString(PyExc_ValueError, "shape and strides: one value per dim each");
        return NULL;
    }
    e.ndim = n1;
    if (binding_add_entry(self, &e) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *binding_digest(BindingObject *self, PyObject *unused)
{
    (void)unused;
    uint8_t d[16];
    ferry_binding_digest(self->b, d);
    return fp_hex16(d);
}

static PyObject *binding_placement_digest(BindingObject *self, PyObject *unused)
{
    (void)unused;
    uint8_t d[16];
    ferry_binding_placement_digest(self->b, d);
    return fp_hex16(d);
}

static PyObject *binding_to_json(BindingObject *self, PyObject *unused)
{
    (void)unused;
    char *t = ferry_binding_to_json(self->b);
    if (!t)
        return PyErr_NoMemory();
    PyObject *s = PyUnicode_FromString(t);
    free(t);
    return s;
}

static PyObject *binding_from_json(PyObject *cls, PyObject *args)
{
    const char *text;
    Py_ssize_t len;
    PyObject *mo;
    if (!PyArg_ParseTuple(args, "s#O", &text, &len, &mo))
        return NULL;
    ferry_manifest *m = fp_manifest_of(mo);
    if (!m)
        return NULL;
    ferry_binding *b;
    ferry_error err = {0};
    int rc = ferry_binding_from_json(text, (size_t)len, m, &b, &err);
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    BindingObject *o = (BindingObject *)((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    if (!o) {
        ferry_binding_free(b);
        return NULL;
    }
    o->b = b;
    return (PyObject *)o;
}

static PyObject *entry_dict(const ferry_binding_entry *e)
{
    return Py_BuildValue("{sK,sK,sK,sI,ss,sI,sN,sN,sK,sy#}", "fragment", (unsigned long long)e->fragment, "addr",
                         (unsigned long long)e->addr, "nbytes", (unsigned long long)e->nbytes, "worker", e->worker,
                         "kind", e->kind == FERRY_MEM_DEVICE ? "device" : "host", "itemsize", e->itemsize, "shape",
                         fp_tuple_u64(e->shape, e->ndim), "strides", fp_tuple_u64(e->strides, e->ndim),
                         "storage_offset", (unsigned long long)e->storage_offset, "desc", (const char *)e->desc,
                         (Py_ssize_t)e->desc_len);
}

static PyObject *binding_entries(BindingObject *self, PyObject *unused)
{
    (void)unused;
    size_t n = ferry_binding_count(self->b);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *d = entry_dict(ferry_binding_entry_at(self->b, i));
        if (!d) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, d);
    }
    return l;
}

static PyObject *binding_entry(BindingObject *self, PyObject *arg)
{
    unsigned long long f = PyLong_AsUnsignedLongLong(arg);
    if (f == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    const ferry_binding_entry *e = ferry_binding_find(self->b, f);
    if (!e) {
        PyErr_Format(PyExc_KeyError, "fragment %llu is not bound", f);
        return NULL;
    }
    return entry_dict(e);
}

static Py_ssize_t binding_len(BindingObject *self)
{
    return self->b ? (Py_ssize_t)ferry_binding_count(self->b) : 0;
}

static PyObject *binding_get_instance(BindingObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(ferry_binding_instance(self->b));
}

static PyObject *binding_get_generation(BindingObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(ferry_binding_generation(self->b));
}

static PyObject *binding_get_lease(BindingObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(ferry_binding_lease(self->b));
}

static PyMethodDef binding_methods[] = {
    {"add", FP_KWFN(binding_add), METH_VARARGS | METH_KEYWORDS,
     "add($self, /, fragment, array, worker=0, desc=b'')\n--\n\n"
     "add(fragment, array, worker=0, desc=b''): bind a fragment to an array (buffer protocol; strides in "
     "whole elements, none negative); the array stays referenced while the binding lives"},
    {"add_raw", FP_KWFN(binding_add_raw), METH_VARARGS | METH_KEYWORDS,
     "add_raw($self, /, fragment, addr, nbytes, shape, strides, itemsize, worker=0, desc=b'', kind='host', storage_offset=0)\n--\n\n"
     "add_raw(fragment, addr, nbytes, shape, strides, itemsize, worker=0, desc=b'', kind='host', "
     "storage_offset=0): bind raw memory (strides in elements); nothing is kept alive"},
    {"digest", (PyCFunction)binding_digest, METH_NOARGS, "digest($self, /)\n--\n\n"
     "XXH3-128 hex of the canonical encoding"},
    {"placement_digest", (PyCFunction)binding_placement_digest, METH_NOARGS,
     "placement_digest($self, /)\n--\n\n"
     "digest of the placement manifest the binding was validated against"},
    {"to_json", (PyCFunction)binding_to_json, METH_NOARGS, "to_json($self, /)\n--\n\n"
     "the JSON text (docs/exec.md)"},
    {"from_json", (PyCFunction)binding_from_json, METH_VARARGS | METH_CLASS,
     "from_json($type, text, manifest, /)\n--\n\n"
     "Binding.from_json(text, manifest): read and validate against the placement"},
    {"entries", (PyCFunction)binding_entries, METH_NOARGS, "entries($self, /)\n--\n\n"
     "entries in insertion order, as dicts"},
    {"entry", (PyCFunction)binding_entry, METH_O, "entry($self, fragment, /)\n--\n\n"
     "entry(fragment) -> dict (KeyError when not bound)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef binding_getset[] = {
    {"instance", (getter)binding_get_instance, NULL, "instance id", NULL},
    {"generation", (getter)binding_get_generation, NULL, "generation", NULL},
    {"lease", (getter)binding_get_lease, NULL, "lease id", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods binding_seq = {.sq_length = (lenfunc)binding_len};

static PyTypeObject BindingType = {
    FP_CLASS(binding, BindingObject, "ferry._ferry.Binding", Py_TPFLAGS_DEFAULT,
             "Binding(manifest, instance=0, generation=0, lease=0)\n--\n\n" "Binding(manifest, instance=0, generation=0, lease=0): where a placement's fragments live now"),
    .tp_as_sequence = &binding_seq,
};

/* ---- Engine ------------------------------------------------------------------------ */

typedef struct ExecutorObject ExecutorObject;

typedef struct {
    ferry_region *r;
    Py_buffer *view;
} EngineRegion;

typedef struct {
    PyObject_HEAD
    ferry_engine *e;
    EngineRegion *regs;      /* regions from register(), with their buffer exports */
    size_t nregs, cap;
    ExecutorObject *execs;   /* live executors (freed before the engine closes) */
    int busy;                /* calls running with the GIL released */
} EngineObject;

static PyTypeObject EngineType;

static int engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"transport", "token", "listen", NULL};
    const char *transport = NULL, *listen = NULL;
    PyObject *token = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zOz", kwl, &transport, &token, &listen))
        return -1;
    if (self->e) {
        PyErr_SetString(PyExc_RuntimeError, "Engine already open");
        return -1;
    }
    ferry_engine_config cfg;
    int rc = ferry_engine_config_init(&cfg);
    if (rc < 0) {
        ex_raise(rc, "engine configuration: a FERRY_* environment value is malformed", NULL, NULL);
        return -1;
    }
    if (transport) {
        if (strlen(transport) >= sizeof cfg.transport) {
            PyErr_SetString(PyExc_ValueError, "transport: 'shm', 'tcp' or ''");
            return -1;
        }
        strcpy(cfg.transport, transport);
    }
    if (listen) {
        if (strlen(listen) >= sizeof cfg.listen_addr) {
            PyErr_SetString(PyExc_ValueError, "listen: HOST:PORT");
            return -1;
        }
        strcpy(cfg.listen_addr, listen);
    }
    if (token != Py_None) {
        Py_buffer v;
        PyObject *tb = PyUnicode_Check(token) ? PyUnicode_AsUTF8String(token) : Py_NewRef(token);
        if (!tb || PyObject_GetBuffer(tb, &v, PyBUF_SIMPLE) < 0) {
            Py_XDECREF(tb);
            return -1;
        }
        if (v.len == 0 || v.len > FERRY_TOKEN_MAX) {
            PyBuffer_Release(&v);
            Py_DECREF(tb);
            PyErr_SetString(PyExc_ValueError, "token: 1 to 256 bytes");
            return -1;
        }
        memcpy(cfg.token, v.buf, (size_t)v.len);
        cfg.token_len = (size_t)v.len;
        PyBuffer_Release(&v);
        Py_DECREF(tb);
    }
    ferry_engine *e = NULL;
    ferry_error err = {0};
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_engine_open(&cfg, &e, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (rc == FERRY_EAUTH)
            ex_raise(rc, "engine open: no cluster token (set FERRY_TOKEN or FERRY_TOKEN_FILE, "
                         "or pass token=)", NULL, NULL);
        else
            ex_raise_why(rc, &err);
        return -1;
    }
    self->e = e;
    return 0;
}

static EngineObject *engine_open_of(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &EngineType)) {
        PyErr_SetString(PyExc_TypeError, "expected an Engine");
        return NULL;
    }
    EngineObject *e = (EngineObject *)o;
    if (!e->e) {
        ex_raise(FERRY_ESTATE, "the engine is closed", NULL, NULL);
        return NULL;
    }
    return e;
}

static void executor_detach(ExecutorObject *x);

static void engine_do_close(EngineObject *self)
{
    while (self->execs)
        executor_detach(self->execs);
    ferry_engine *e = self->e;
    self->e = NULL;
    if (e) {
        Py_BEGIN_ALLOW_THREADS
        ferry_engine_close(e);   /* unregisters every region */
        Py_END_ALLOW_THREADS
    }
    for (size_t i = 0; i < self->nregs; i++) {
        PyBuffer_Release(self->regs[i].view);
        PyMem_Free(self->regs[i].view);
    }
    PyMem_Free(self->regs);
    self->regs = NULL;
    self->nregs = self->cap = 0;
}

static PyObject *engine_close(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (self->busy)
        return busy_error("the engine is in use by a run or a wait");
    engine_do_close(self);
    Py_RETURN_NONE;
}

static void engine_dealloc(EngineObject *self)
{
    engine_do_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *engine_register(EngineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"array", "remote", NULL};
    PyObject *arr, *remote = Py_True;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwl, &arr, &remote))
        return NULL;
    if (!engine_open_of((PyObject *)self))
        return NULL;
    unsigned flags;
    if (remote == Py_True)
        flags = FERRY_REMOTE_RW;
    else if (remote == Py_False || remote == Py_None)
        flags = 0;
    else if (PyUnicode_Check(remote) && !PyUnicode_CompareWithASCIIString(remote, "read"))
        flags = FERRY_REMOTE_READ;
    else if (PyUnicode_Check(remote) && !PyUnicode_CompareWithASCIIString(remote, "write"))
        flags = FERRY_REMOTE_WRITE;
    else if (PyUnicode_Check(remote) && !PyUnicode_CompareWithASCIIString(remote, "rw"))
        flags = FERRY_REMOTE_RW;
    else {
        PyErr_SetString(PyExc_ValueError, "remote: True, False, 'read', 'write' or 'rw'");
        return NULL;
    }
    if (self->nregs == self->cap) {
        size_t cap = self->cap ? 2 * self->cap : 8;
        EngineRegion *r = PyMem_Realloc(self->regs, cap * sizeof *r);
        if (!r)
            return PyErr_NoMemory();
        self->regs = r;
        self->cap = cap;
    }
    Py_buffer *v = PyMem_Calloc(1, sizeof *v);
    if (!v)
        return PyErr_NoMemory();
    /* Peers may write into it: then it must be writable. Any layout: the
     * whole span from the first to one past the last element is registered. */
    if (fp_buf_get(arr, v, PyBUF_STRIDES | ((flags & FERRY_REMOTE_WRITE) ? PyBUF_WRITABLE : 0), "register: array") < 0) {
        PyMem_Free(v);
        return NULL;
    }
    uint64_t shape[FERRY_MAX_DIMS], strides[FERRY_MAX_DIMS], nbytes;
    ferry_region *r = NULL;
    int rc = 0;
    uint8_t desc[FERRY_DESC_MAX];
    if (buffer_layout(v, shape, strides, &nbytes) < 0)
        goto fail;
    if (nbytes == 0) {
        PyErr_SetString(PyExc_ValueError, "register: the array is empty");
        goto fail;
    }
    ferry_error err = {0};
    rc = ferry_region_register(self->e, v->buf, (size_t)nbytes, flags, FERRY_MEM_HOST, &r, &err);
    if (rc < 0) {
        ex_raise_why(rc, &err);
        goto fail;
    }
    rc = ferry_region_export(r, desc, sizeof desc);
    if (rc < 0) {
        ferry_region_unregister(r, NULL);
        ex_raise(rc, NULL, NULL, NULL);
        goto fail;
    }
    self->regs[self->nregs].r = r;
    self->regs[self->nregs].view = v;
    self->nregs++;
    return PyBytes_FromStringAndSize((const char *)desc, rc);
fail:
    PyBuffer_Release(v);
    PyMem_Free(v);
    return NULL;
}

static PyObject *engine_export(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (!engine_open_of((PyObject *)self))
        return NULL;
    uint8_t buf[FERRY_DESC_MAX];
    int rc = ferry_engine_export(self->e, buf, sizeof buf);
    if (rc < 0)
        return ex_raise(rc, NULL, NULL, NULL);
    return PyBytes_FromStringAndSize((const char *)buf, rc);
}

static PyObject *engine_wait_notify(EngineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tag", "count", "timeout_ms", NULL};
    unsigned long long tag;
    unsigned int count;
    int timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KI|i", kwl, &tag, &count, &timeout))
        return NULL;
    if (!engine_open_of((PyObject *)self))
        return NULL;
    uint64_t *vals = PyMem_Calloc(count ? count : 1, sizeof *vals);
    if (!vals)
        return PyErr_NoMemory();
    int rc;
    ferry_error err = {0};
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_wait_notify(self->e, tag, count, timeout, vals, &err);
    Py_END_ALLOW_THREADS
    self->busy--;
    PyObject *l = rc < 0 ? ex_raise_why(rc, &err) : fp_list_u64(vals, count);
    PyMem_Free(vals);
    return l;
}

static PyObject *engine_peer_transport(EngineObject *self, PyObject *arg)
{
    if (!engine_open_of((PyObject *)self))
        return NULL;
    uint8_t desc[FERRY_DESC_MAX];
    uint32_t len;
    if (desc_from(arg, desc, &len) < 0)
        return NULL;
    ferry_remote_region rr = {0};
    ferry_peer_id peer;
    int rc;
    ferry_error err = {0};
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_region_import(self->e, desc, len, &rr, NULL);
    peer = rr.peer;
    if (rc < 0)   /* not a region's descriptor: an engine's */
        rc = ferry_peer_add(self->e, desc, len, &peer, &err);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc < 0)
        return ex_raise_why(rc, &err);
    const char *t = ferry_peer_transport(self->e, peer);
    if (!t)
        Py_RETURN_NONE;
    return PyUnicode_FromString(t);
}

static PyObject *engine_pending(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (!engine_open_of((PyObject *)self))
        return NULL;
    ferry_pending_info info[64];
    int n = ferry_engine_pending(self->e, info, 64);
    if (n < 0)
        return ex_raise(n, NULL, NULL, NULL);
    PyObject *l = PyList_New(0);
    for (int i = 0; l && i < n && i < 64; i++) {
        PyObject *d = Py_BuildValue("{sK,sI,sK,sK}", "id", (unsigned long long)info[i].id, "peer", info[i].peer,
                                    "bytes_total", (unsigned long long)info[i].bytes_total, "age_ms",
                                    (unsigned long long)info[i].age_ms);
        if (!d || PyList_Append(l, d) < 0)
            Py_CLEAR(l);
        Py_XDECREF(d);
    }
    return l;
}

static PyObject *engine_region_count(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (!engine_open_of((PyObject *)self))
        return NULL;
    return PyLong_FromSize_t(ferry_engine_region_count(self->e));
}

static PyObject *engine_stats(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (!engine_open_of((PyObject *)self))
        return NULL;
    ferry_engine_stats s;
    ferry_engine_get_stats(self->e, &s);
#define F(m) FP_FIELD(ferry_engine_stats, m)
    static const fp_field f[] = {
        F(bytes_written), F(bytes_read), F(ops_completed), F(ops_failed), F(tickets_completed),
        F(tickets_aborted), F(tickets_failed), F(tickets_unknown), F(remote_refused),
    };
#undef F
    return FP_FIELDS_DICT(&s, f);
}

static PyObject *engine_get_address(EngineObject *self, void *c)
{
    (void)c;
    if (!engine_open_of((PyObject *)self))
        return NULL;
    return PyUnicode_FromString(ferry_engine_address(self->e));
}

static PyObject *engine_get_closed(EngineObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->e == NULL);
}

static PyObject *engine_exit(EngineObject *self, PyObject *args)
{
    (void)args;
    return engine_close(self, NULL);
}

static PyMethodDef engine_methods[] = {
    {"register", FP_KWFN(engine_register), METH_VARARGS | METH_KEYWORDS,
     "register($self, /, array, remote=True)\n--\n\n"
     "register(array, remote=True) -> region descriptor bytes. remote: True/'rw', 'read', 'write', or "
     "False (local only). The array stays referenced until close()"},
    {"export", (PyCFunction)engine_export, METH_NOARGS, "export($self, /)\n--\n\n"
     "the engine's endpoint descriptor (bytes)"},
    {"wait_notify", FP_KWFN(engine_wait_notify), METH_VARARGS | METH_KEYWORDS,
     "wait_notify($self, /, tag, count, timeout_ms=-1)\n--\n\n"
     "wait_notify(tag, count, timeout_ms=-1) -> values of count notifications of tag (GIL released)"},
    {"peer_transport", (PyCFunction)engine_peer_transport, METH_O,
     "peer_transport($self, desc, /)\n--\n\n"
     "peer_transport(desc) -> 'shm', 'tcp' or None: the transport to the peer of an endpoint or region "
     "descriptor (adds the peer)"},
    {"pending", (PyCFunction)engine_pending, METH_NOARGS, "pending($self, /)\n--\n\n"
     "transfers whose outcome is UNKNOWN, as dicts"},
    {"region_count", (PyCFunction)engine_region_count, METH_NOARGS, "region_count($self, /)\n--\n\n"
     "regions registered with the engine"},
    {"stats", (PyCFunction)engine_stats, METH_NOARGS, "stats($self, /)\n--\n\n"
     "counters since open"},
    FP_CLOSE_METHODS(engine, "close: frees the engine's executors, drains, unregisters everything, drops the array "
                             "references"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"address", (getter)engine_get_address, NULL, "tcp://HOST:PORT of the listener", NULL},
    FP_CLOSED_GETTER(engine, "True after close()"),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EngineType = {
    FP_CLASS(engine, EngineObject, "ferry.Engine", Py_TPFLAGS_DEFAULT,
             "Engine(transport=None, token=None, listen=None)\n--\n\n" "Engine(transport=None, token=None, listen=None): a ferry transfer engine (token from "
             "FERRY_TOKEN / FERRY_TOKEN_FILE unless given)"),
};

/* ---- AttestedPlan ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ferry_attested_plan *a;
} AttestedObject;

static PyTypeObject AttestedType;

static PyObject *attested_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)type;
    static char *kwl[] = {"plan", "src", "dst", "generation", NULL};
    PyObject *po, *so, *dobj;
    unsigned long long gen;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOK", kwl, &po, &so, &dobj, &gen))
        return NULL;
    ferry_plan *p = fp_plan_of(po);
    BindingObject *s = p ? binding_of(so, "src") : NULL, *d = s ? binding_of(dobj, "dst") : NULL;
    if (!d)
        return NULL;
    ferry_attested_plan *a;
    ferry_error err = {0};
    int rc = ferry_attest(p, s->b, d->b, gen, &a, &err);
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    AttestedObject *o = PyObject_New(AttestedObject, &AttestedType);
    if (!o) {
        ferry_attested_free(a);
        return NULL;
    }
    o->a = a;
    return (PyObject *)o;
}

static void attested_dealloc(AttestedObject *self)
{
    ferry_attested_free(self->a);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* An optional binding argument: None -> NULL (ok), else a Binding. */
static int opt_binding(PyObject *o, const char *what, const ferry_binding **out)
{
    *out = NULL;
    if (o == Py_None)
        return 0;
    BindingObject *b = binding_of(o, what);
    if (!b)
        return -1;
    *out = b->b;
    return 0;
}

static PyObject *attested_check(AttestedObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"src", "dst", NULL};
    PyObject *so = Py_None, *dobj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO", kwl, &so, &dobj))
        return NULL;
    const ferry_binding *s, *d;
    if (opt_binding(so, "src", &s) < 0 || opt_binding(dobj, "dst", &d) < 0)
        return NULL;
    ferry_error err = {0};
    int rc = ferry_attested_check(self->a, s, d, &err);
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    Py_RETURN_NONE;
}

static PyObject *attested_counterparts(AttestedObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"src", "dst", "workers", "of_target", NULL};
    PyObject *so, *dobj, *wo;
    int of_target = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|p", kwl, &so, &dobj, &wo, &of_target))
        return NULL;
    const ferry_binding *s, *d;
    uint32_t *w;
    size_t nw;
    if (opt_binding(so, "src", &s) < 0 || opt_binding(dobj, "dst", &d) < 0 || workers_from(wo, &w, &nw) < 0)
        return NULL;
    ferry_error err = {0};
    size_t n = 0;
    int rc = ferry_exec_counterparts(self->a, s, d, of_target, w, nw, NULL, 0, &n, &err);
    uint32_t *out = NULL;
    if (rc >= 0 && n) {
        out = PyMem_Calloc(n, sizeof *out);
        if (!out) {
            PyMem_Free(w);
            return PyErr_NoMemory();
        }
        size_t n2 = 0;
        rc = ferry_exec_counterparts(self->a, s, d, of_target, w, nw, out, n, &n2, &err);
        if (n2 < n)
            n = n2;
    }
    PyMem_Free(w);
    PyObject *l = rc < 0 ? fp_raise_err_class(rc, &err) : fp_list_u32(out, n);
    PyMem_Free(out);
    return l;
}

static PyObject *attested_get_generation(AttestedObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(ferry_attested_generation(self->a));
}

static PyMethodDef attested_methods[] = {
    {"check", FP_KWFN(attested_check), METH_VARARGS | METH_KEYWORDS,
     "check($self, /, src=None, dst=None)\n--\n\n"
     "check(src=None, dst=None): StaleError when a binding changed since attestation"},
    {"counterparts", FP_KWFN(attested_counterparts), METH_VARARGS | METH_KEYWORDS,
     "counterparts($self, /, src, dst, workers, of_target=False)\n--\n\n"
     "counterparts(src, dst, workers, of_target=False) -> the other side's workers these exchange bytes with"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef attested_getset[] = {
    {"generation", (getter)attested_get_generation, NULL, "the attested generation", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AttestedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.AttestedPlan",
    .tp_basicsize = sizeof(AttestedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "AttestedPlan(plan, src, dst, generation)\n--\n\n" "AttestedPlan(plan, src, dst, generation): a plan bound to its placements, bindings and generation",
    .tp_new = attested_new,
    .tp_dealloc = (destructor)attested_dealloc,
    .tp_methods = attested_methods,
    .tp_getset = attested_getset,
};

/* ---- Executor ------------------------------------------------------------------------ */

typedef struct {
    PyObject *obj;            /* the Python guard (held by the executor's guards tuple) */
    ExecutorObject *owner;
} GuardCtx;

struct ExecutorObject {
    PyObject_HEAD
    ferry_executor *x;
    EngineObject *engine;     /* strong reference */
    ExecutorObject *next, **pprev;   /* in engine->execs */
    PyObject *guards;         /* tuple of guard objects */
    GuardCtx *gctx;
    PyObject *exc;            /* first exception a guard raised during the current run */
    int busy;
};

static PyTypeObject ExecutorType;

/* Free the C executor (best-effort cleanup) and unlink it from its engine:
 * done at the executor's dealloc, or at the engine's close, first. */
static void executor_detach(ExecutorObject *x)
{
    if (x->x) {
        ferry_executor *fx = x->x;
        x->x = NULL;
        Py_BEGIN_ALLOW_THREADS
        ferry_executor_free(fx);
        Py_END_ALLOW_THREADS
    }
    if (x->pprev) {
        *x->pprev = x->next;
        if (x->next)
            x->next->pprev = x->pprev;
        x->next = NULL;
        x->pprev = NULL;
    }
}

/* Guard callbacks: may run on any thread, with the GIL released by the run. */
static int guard_call(void *ctx, const char *meth)
{
    GuardCtx *g = ctx;
    PyGILState_STATE st = PyGILState_Ensure();
    int rc = 0;
    PyObject *r = PyObject_CallMethod(g->obj, meth, NULL);
    if (!r) {
        rc = FERRY_EIO;
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
        if (v && tb)
            PyException_SetTraceback(v, tb);
        Py_XDECREF(t);
        Py_XDECREF(tb);
        if (!g->owner->exc)
            g->owner->exc = v;
        else
            Py_XDECREF(v);
    } else {
        if (r == Py_False)
            rc = FERRY_EBUSY;
        Py_DECREF(r);
    }
    PyGILState_Release(st);
    return rc;
}

static int guard_acquire(void *ctx, uint64_t id)
{
    (void)id;
    return guard_call(ctx, "acquire");
}

static int guard_release(void *ctx, uint64_t id)
{
    (void)id;
    return guard_call(ctx, "release");
}

static void executor_dealloc(ExecutorObject *self)
{
    executor_detach(self);
    Py_XDECREF(self->engine);
    Py_XDECREF(self->guards);
    Py_XDECREF(self->exc);
    PyMem_Free(self->gctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* peers: {worker: region descriptor bytes} imported into the engine. */
static int peers_from(EngineObject *eng, PyObject *o, ferry_peer_map **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (o == Py_None)
        return 0;
    if (!PyDict_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "peers: a dict {worker: region descriptor bytes}");
        return -1;
    }
    Py_ssize_t len = PyDict_Size(o), pos = 0, i = 0;
    ferry_peer_map *pm = len ? PyMem_Calloc((size_t)len, sizeof *pm) : NULL;
    if (len && !pm) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *k, *v;
    while (PyDict_Next(o, &pos, &k, &v)) {
        unsigned long w = PyLong_AsUnsignedLong(k);
        if ((w == (unsigned long)-1 && PyErr_Occurred()) || w > UINT32_MAX) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "peers: worker ids fit 32 bits");
            goto fail;
        }
        uint8_t desc[FERRY_DESC_MAX];
        uint32_t dlen;
        if (desc_from(v, desc, &dlen) < 0)
            goto fail;
        ferry_remote_region rr;
        int rc;
        eng->busy++;
        Py_BEGIN_ALLOW_THREADS
        rc = ferry_region_import(eng->e, desc, dlen, &rr, NULL);
        Py_END_ALLOW_THREADS
        eng->busy--;
        if (rc < 0) {
            char msg[96];
            snprintf(msg, sizeof msg, "peers: worker %lu: region descriptor import failed: %s", w,
                     ferry_strerror(rc));
            ex_raise(rc, msg, NULL, NULL);
            goto fail;
        }
        pm[i].worker = (uint32_t)w;
        pm[i].peer = rr.peer;
        pm[i].key = rr.key;
        i++;
    }
    *out = pm;
    *n = (size_t)i;
    return 0;
fail:
    PyMem_Free(pm);
    return -1;
}

static PyObject *executor_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"engine", "mode", "workers", "peers", "window", "timeout_ms", "notify_tag", "guards",
                          "max_ops", "max_bytes", NULL};
    PyObject *eo, *wo, *po = Py_None, *go = Py_None;
    const char *mode_s;
    unsigned int window = 8;
    int timeout = 60000;
    unsigned long long tag = 0, max_ops = 0, max_bytes = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsO|OIiKOKK", kwl, &eo, &mode_s, &wo, &po, &window, &timeout, &tag,
                                     &go, &max_ops, &max_bytes))
        return NULL;
    EngineObject *eng = engine_open_of(eo);
    enum ferry_exec_mode mode;
    if (!eng || mode_from(mode_s, &mode) < 0)
        return NULL;
    ExecutorObject *self = (ExecutorObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->engine = (EngineObject *)Py_NewRef(eo);
    uint32_t *w = NULL;
    size_t nw = 0, np = 0, ng = 0;
    ferry_peer_map *pm = NULL;
    ferry_guard *g = NULL;
    self->guards = go == Py_None ? PyTuple_New(0) : PySequence_Tuple(go);
    if (!self->guards || workers_from(wo, &w, &nw) < 0 || peers_from(eng, po, &pm, &np) < 0)
        goto fail;
    ng = (size_t)PyTuple_GET_SIZE(self->guards);
    if (ng) {
        g = PyMem_Calloc(ng, sizeof *g);
        self->gctx = PyMem_Calloc(ng, sizeof *self->gctx);
        if (!g || !self->gctx) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    for (size_t i = 0; i < ng; i++) {
        PyObject *gobj = PyTuple_GET_ITEM(self->guards, (Py_ssize_t)i);
        PyObject *id = PyObject_GetAttrString(gobj, "id");
        unsigned long long v = id ? PyLong_AsUnsignedLongLong(id) : 0;
        Py_XDECREF(id);
        if (PyErr_Occurred())
            goto fail;
        if (!PyObject_HasAttrString(gobj, "acquire") || !PyObject_HasAttrString(gobj, "release")) {
            PyErr_Format(PyExc_TypeError, "guards[%zu]: needs .id, .acquire() and .release()", i);
            goto fail;
        }
        self->gctx[i].obj = gobj;
        self->gctx[i].owner = self;
        g[i] = (ferry_guard){.id = v, .ctx = &self->gctx[i], .acquire = guard_acquire, .release = guard_release};
    }
    ferry_exec_config cfg = {
        .mode = mode,
        .engine = eng->e,
        .workers = w,
        .nworkers = nw,
        .peers = pm,
        .npeers = np,
        .limits = {.max_ops = max_ops, .max_bytes = max_bytes},
        .window = window,
        .timeout_ms = timeout,
        .notify_tag = tag,
        .guards = g,
        .nguards = ng,
    };
    ferry_error err = {0};
    int rc = ferry_executor_create(&cfg, &self->x, &err);
    if (rc < 0) {
        fp_raise_err_class(rc, &err);
        goto fail;
    }
    PyMem_Free(w);
    PyMem_Free(pm);
    PyMem_Free(g);
    self->next = eng->execs;
    if (eng->execs)
        eng->execs->pprev = &self->next;
    eng->execs = self;
    self->pprev = &eng->execs;
    return (PyObject *)self;
fail:
    PyMem_Free(w);
    PyMem_Free(pm);
    PyMem_Free(g);
    Py_DECREF(self);
    return NULL;
}

static const char *state_name(enum ferry_ticket_state s)
{
    switch (s) {
    case FERRY_TICKET_COMPLETED: return "COMPLETED";
    case FERRY_TICKET_ABORTED: return "ABORTED";
    case FERRY_TICKET_FAILED_DRAINED: return "FAILED_DRAINED";
    case FERRY_TICKET_UNKNOWN: return "UNKNOWN";
    case FERRY_TICKET_PENDING: return "PENDING";
    }
    return "UNKNOWN";
}

static PyObject *result_dict(const ferry_exec_result *r)
{
    return Py_BuildValue("{ss,si,sK,sK,sK,sK,sN,sN}", "state", state_name(r->state), "error", r->error, "bytes",
                         (unsigned long long)r->bytes, "ops", (unsigned long long)r->ops, "batches",
                         (unsigned long long)r->batches, "bytes_done", (unsigned long long)r->bytes_done,
                         "pending", fp_list_u64(r->pending, r->npending), "quarantined",
                         fp_list_u64(r->quarantined, r->nquarantined));
}

/* A target array bound read-only would be written behind numpy's back. */
static int check_writable(BindingObject *dst)
{
    for (size_t i = 0; i < dst->nviews; i++)
        if (dst->views[i]->view.readonly) {
            PyErr_Format(PyExc_ValueError, "dst: fragment %llu is bound to read-only memory",
                         (unsigned long long)dst->views[i]->fragment);
            return -1;
        }
    return 0;
}

static PyObject *executor_run(ExecutorObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"attested", "src", "dst", NULL};
    PyObject *ao, *so, *dobj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO", kwl, &ao, &so, &dobj))
        return NULL;
    if (!PyObject_TypeCheck(ao, &AttestedType)) {
        PyErr_SetString(PyExc_TypeError, "attested: expected an AttestedPlan");
        return NULL;
    }
    BindingObject *s = binding_of(so, "src"), *d = s ? binding_of(dobj, "dst") : NULL;
    if (!d || check_writable(d) < 0)
        return NULL;
    if (!self->x)
        return ex_raise(FERRY_ESTATE, "the executor's engine is closed", NULL, NULL);
    if (self->busy)
        return busy_error("the executor is already running");
    ferry_attested_plan *a = ((AttestedObject *)ao)->a;
    ferry_exec_result res;
    memset(&res, 0, sizeof res);
    ferry_error err = {0};
    int rc;
    Py_CLEAR(self->exc);
    Py_INCREF(ao);
    self->busy++;
    self->engine->busy++;
    s->busy++;
    d->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_executor_run(self->x, a, s->b, d->b, &res, &err);
    Py_END_ALLOW_THREADS
    d->busy--;
    s->busy--;
    self->engine->busy--;
    self->busy--;
    Py_DECREF(ao);
    PyObject *r = result_dict(&res);
    ferry_exec_result_free(&res);
    PyObject *cause = self->exc;
    self->exc = NULL;
    if (!r) {
        Py_XDECREF(cause);
        return NULL;
    }
    if (rc < 0)
        return ex_raise(rc, err.msg, r, cause);
    Py_XDECREF(cause);
    return r;
}

static PyObject *executor_cleanup(ExecutorObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->x)
        Py_RETURN_TRUE;
    if (self->busy)
        return busy_error("the executor is running");
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_executor_cleanup(self->x);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc < 0 && rc != FERRY_EBUSY)
        return ex_raise(rc, NULL, NULL, NULL);
    return PyBool_FromLong(rc == 0);
}

static PyObject *executor_get_registered(ExecutorObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(self->x ? ferry_executor_registered(self->x) : 0);
}

static PyObject *executor_get_restart(ExecutorObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->x && ferry_executor_restart_required(self->x));
}

static PyObject *executor_close(ExecutorObject *self, PyObject *unused)
{
    (void)unused;
    if (self->busy)
        return busy_error("the executor is running");
    executor_detach(self);
    Py_RETURN_NONE;
}

static PyMethodDef executor_methods[] = {
    {"run", FP_KWFN(executor_run), METH_VARARGS | METH_KEYWORDS,
     "run($self, /, attested, src, dst)\n--\n\n"
     "run(attested, src, dst) -> result dict (state, error, bytes, ops, batches, bytes_done, pending, "
     "quarantined); raises an Error subclass with .result unless COMPLETED (GIL released)"},
    {"cleanup", (PyCFunction)executor_cleanup, METH_NOARGS,
     "cleanup($self, /)\n--\n\n"
     "retry unregistering local memory left pinned: True when nothing is left"},
    {"close", (PyCFunction)executor_close, METH_NOARGS, "close($self, /)\n--\n\n"
     "free the executor (best-effort cleanup)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef executor_getset[] = {
    {"registered", (getter)executor_get_registered, NULL, "local regions still registered", NULL},
    {"restart_required", (getter)executor_get_restart, NULL, "an interrupted cleanup needs a restart", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ExecutorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Executor",
    .tp_basicsize = sizeof(ExecutorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Executor(engine, mode, workers, peers=None, window=8, timeout_ms=60000, notify_tag=0, guards=None, max_ops=0, max_bytes=0)\n--\n\n" "Executor(engine, mode, workers, peers=None, window=8, timeout_ms=60000, notify_tag=0, guards=None, "
              "max_ops=0, max_bytes=0): runs attested plans for one process's workers",
    .tp_new = executor_new,
    .tp_dealloc = (destructor)executor_dealloc,
    .tp_methods = executor_methods,
    .tp_getset = executor_getset,
};

int fp_exec_init(PyObject *m)
{
    if (fp_add_type(m, "Binding", &BindingType) < 0 || fp_add_type(m, "Engine", &EngineType) < 0 ||
        fp_add_type(m, "AttestedPlan", &AttestedType) < 0 || fp_add_type(m, "Executor", &ExecutorType) < 0)
        return -1;
    return 0;
}
