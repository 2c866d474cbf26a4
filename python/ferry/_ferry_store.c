/* _ferry: Store and Watch (ferry.Store, ferry.Watch) over include/ferry/store.h,
 * and the store's error classes. Every blocking call runs with the GIL
 * released while the Python buffers it reads or writes stay held. */
#include <string.h>

#include "_ferry.h"

/* ---- errors ------------------------------------------------------------------------ */

static PyObject *err_notfound, *err_exists, *err_nospace, *err_lost, *err_busy, *err_conflict, *err_timeout,
    *err_auth, *err_conn, *err_stale, *err_unreach, *err_full;

PyObject *fp_err_class(int code)
{
    switch (code) {
    case FERRY_ENOENT: return err_notfound;
    case FERRY_EEXIST: return err_exists;
    case FERRY_ENOSPC: return err_nospace;
    case FERRY_ELOST: return err_lost;
    case FERRY_EBUSY: return err_busy;
    case FERRY_ESTATE: return err_conflict;
    case FERRY_ETIMEDOUT: return err_timeout;
    case FERRY_EAUTH: return err_auth;
    case FERRY_ECONNRESET:
    case FERRY_ECONNREFUSED: return err_conn;
    case FERRY_ESTALE: return err_stale;
    case FERRY_EUNREACH: return err_unreach;
    case FERRY_EAGAIN: return err_full;
    default: return fp_error;
    }
}

/* Raise for code with the sentence the store call left in *e. */
static PyObject *st_raise(int code, const ferry_error *e)
{
    return fp_err_throw(fp_err_new(code, e->msg));
}

/* ---- objects ------------------------------------------------------------------------ */

typedef struct WatchObject WatchObject;

typedef struct {
    PyObject_HEAD
    ferry_store *s;
    PyObject *regs;         /* address -> memoryview holding a registered buffer */
    int inflight;           /* calls running with the GIL released */
    WatchObject *watches;   /* open watches: closed before the store */
    ferry_sparse_reader *sparse;   /* sparse_read's, opened at its first call: its index
                                    * cache serves the store's later reads */
} StoreObject;

struct WatchObject {
    PyObject_HEAD
    StoreObject *store;     /* strong reference */
    ferry_watch *w;
    int inflight;
    WatchObject *next, **pprev;
};

static PyTypeObject StoreType, WatchType;

/* Run stmt without the GIL, counted in self->inflight so close() can refuse. */
#define ST_CALL(self, stmt) FP_STORE_CALL((PyObject *)(self), stmt)

static ferry_store *st_of(StoreObject *self)
{
    if (!self->s)
        PyErr_SetString(PyExc_ValueError, "the store is not open (call setup() first)");
    return self->s;
}

static int buf_src(PyObject *o, Py_buffer *v, const char *what)
{
    return fp_buf_get(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, what);
}

static int buf_dst(PyObject *o, Py_buffer *v, const char *what)
{
    return fp_buf_get(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE, what);
}

/* The integer o (anything with __index__) in lo..hi into *out; ValueError
 * naming what and the range otherwise. The store's revisions, ids, counts
 * and leases are unsigned: a negative one is refused here rather than
 * wrapping around to a huge value (kv_cas(expected_rev=-1) would become
 * 2**64-1). 0 or -1. */
static int st_uint(PyObject *o, const char *what, unsigned long long lo, unsigned long long hi,
                   unsigned long long *out)
{
    PyObject *i = PyNumber_Index(o);
    if (!i)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(i);
    int bad = 0;
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            Py_DECREF(i);
            return -1;
        }
        PyErr_Clear();
        bad = 1;
    }
    if (bad || v < lo || v > hi) {
        if (hi == UINT64_MAX)
            PyErr_Format(PyExc_ValueError, "%s must be an integer from %llu to 2**64-1, not %R", what, lo, i);
        else
            PyErr_Format(PyExc_ValueError, "%s must be an integer from %llu to %llu, not %R", what, lo, hi, i);
        Py_DECREF(i);
        return -1;
    }
    Py_DECREF(i);
    *out = v;
    return 0;
}

/* st_uint for an optional argument: None or absent (NULL) keeps *out. */
static int st_uint_opt(PyObject *o, const char *what, unsigned long long lo, unsigned long long hi,
                       unsigned long long *out)
{
    return !o || o == Py_None ? 0 : st_uint(o, what, lo, hi, out);
}

/* ---- replicate config --------------------------------------------------------------- */

typedef struct {
    ferry_replicate_config rc;
    uint64_t *pref;
    int set;
} st_rc;

/* Attribute or dict item name of o: new reference, NULL when missing (no
 * error) or on error (error set). */
static PyObject *field_of(PyObject *o, const char *name)
{
    if (PyDict_Check(o)) {
        PyObject *v = PyDict_GetItemString(o, name);
        Py_XINCREF(v);
        return v;
    }
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();
    return v;
}

static void rc_free(st_rc *r)
{
    PyMem_Free(r->pref);
    r->pref = NULL;
}

/* ReplicateConfig (or a dict with the same names, or None) into r. 0 or -1. */
static int rc_from(PyObject *o, st_rc *r)
{
    memset(r, 0, sizeof *r);
    if (!o || o == Py_None)
        return 0;
    r->set = 1;
    PyObject *v = field_of(o, "replica_num");
    if (PyErr_Occurred())
        return -1;
    if (v && v != Py_None) {
        unsigned long long n = 0;
        int bad = st_uint(v, "replica_num", 0, FERRY_STORE_REPLICAS_MAX, &n);
        Py_DECREF(v);
        if (bad < 0)
            return -1;
        r->rc.replica_num = (uint32_t)n;
    } else {
        Py_XDECREF(v);
    }
    v = field_of(o, "with_hard_pin");   /* Mooncake's name */
    if (!v && !PyErr_Occurred())
        v = field_of(o, "hard_pin");
    if (PyErr_Occurred())
        return -1;
    if (v) {
        int t = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (t < 0)
            return -1;
        r->rc.hard_pin = t;
    }
    /* Mooncake's preferred_segment (one) goes first, then preferred_segments */
    PyObject *one = field_of(o, "preferred_segment");
    if (PyErr_Occurred())
        return -1;
    if (one == Py_None || (one && PyUnicode_Check(one) && PyUnicode_GetLength(one) == 0))
        Py_CLEAR(one);
    v = field_of(o, "preferred_segments");
    if (PyErr_Occurred()) {
        Py_XDECREF(one);
        return -1;
    }
    if (v == Py_None)
        Py_CLEAR(v);
    PyObject *t = v ? fp_seq_hold(v, "preferred_segments") : PyTuple_New(0);
    Py_XDECREF(v);
    if (!t) {
        Py_XDECREF(one);
        return -1;
    }
    Py_ssize_t nt = PyTuple_GET_SIZE(t), n = nt + (one ? 1 : 0);
    r->pref = PyMem_Malloc(((size_t)n + 1) * sizeof *r->pref);
    if (!r->pref) {
        Py_DECREF(t);
        Py_XDECREF(one);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = one && i == 0 ? one : PyTuple_GET_ITEM(t, i - (one ? 1 : 0));
        unsigned long long id = 0;
        int bad;
        if (PyUnicode_Check(x)) {
            PyErr_Format(PyExc_TypeError, "preferred segment %R: ferry names segments by their id (an int, as in "
                         "Store.status()['segments'] and get_replica_desc()), not by a host name", x);
            bad = -1;
        } else {
            bad = st_uint(x, "a preferred segment id", 0, UINT64_MAX, &id);
        }
        r->pref[i] = id;
        if (bad < 0) {
            Py_DECREF(t);
            Py_XDECREF(one);
            rc_free(r);
            return -1;
        }
    }
    Py_DECREF(t);
    Py_XDECREF(one);
    r->rc.preferred_segments = n ? r->pref : NULL;
    r->rc.npreferred = (uint32_t)n;
    return 0;
}

/* ---- set-up and lifetime ---------------------------------------------------------- */

static PyObject *st_setup(StoreObject *self, PyObject *args, PyObject *kw)
{
    ferry_error fe = {0};
    static char *kwl[] = {"master", "token", "token_file", "transport", "timeout_ms", "lease_ms", NULL};
    const char *master = NULL, *token_file = NULL, *transport = NULL;
    PyObject *token = Py_None, *timeout = Py_None, *lease = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zOzzOO:setup", kwl, &master, &token, &token_file, &transport,
                                     &timeout, &lease))
        return NULL;
    if (self->s) {
        PyErr_SetString(PyExc_ValueError, "the store is already set up (close() it first)");
        return NULL;
    }
    if (token != Py_None && token_file) {
        PyErr_SetString(PyExc_ValueError, "pass token or token_file, not both");
        return NULL;
    }
    ferry_store_config cfg;
    int rc = ferry_store_config_init(&cfg);
    if (rc < 0)
        return st_raise(rc, &fe);
    if (master && fp_copy_str(cfg.master, sizeof cfg.master, master, "master") < 0)
        return NULL;
    if (transport && fp_copy_str(cfg.engine.transport, sizeof cfg.engine.transport, transport, "transport") < 0)
        return NULL;
    if (token_file) {
        rc = ferry_engine_config_token_file(&cfg.engine, token_file, NULL);
        if (rc < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "token file %s: %s", token_file, ferry_strerror(rc));
            return fp_err_throw(fp_err_new(rc, msg));
        }
    }
    if (token != Py_None) {
        Py_buffer v;
        if (PyUnicode_Check(token)) {
            Py_ssize_t n;
            const char *t = PyUnicode_AsUTF8AndSize(token, &n);
            if (!t || PyBuffer_FillInfo(&v, NULL, (void *)t, n, 1, PyBUF_SIMPLE) < 0)
                return NULL;
        } else if (PyObject_GetBuffer(token, &v, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        if (v.len == 0 || v.len > FERRY_TOKEN_MAX) {
            PyBuffer_Release(&v);
            PyErr_Format(PyExc_ValueError, "token must be 1 to %d bytes", FERRY_TOKEN_MAX);
            return NULL;
        }
        memcpy(cfg.engine.token, v.buf, (size_t)v.len);
        cfg.engine.token_len = (size_t)v.len;
        PyBuffer_Release(&v);
    }
    if (timeout != Py_None) {
        long t = PyLong_AsLong(timeout);
        if (t == -1 && PyErr_Occurred())
            return NULL;
        if (t <= 0 || t > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "timeout_ms must be positive");
            return NULL;
        }
        cfg.timeout_ms = (int)t;
    }
    if (lease != Py_None) {
        unsigned long long l = 0;
        if (st_uint(lease, "lease_ms", 0, FERRY_STORE_LEASE_MAX_MS, &l) < 0)
            return NULL;
        cfg.lease_ms = l;
    }
    ferry_store *s = NULL;
    ST_CALL(self, rc = ferry_store_open(&cfg, &s, &fe));
    memset(&cfg.engine.token, 0, sizeof cfg.engine.token);
    if (rc < 0)
        return st_raise(rc, &fe);
    if (self->s) {   /* another thread set it up meanwhile */
        ST_CALL(self, ferry_store_close(s));
        PyErr_SetString(PyExc_ValueError, "the store is already set up (close() it first)");
        return NULL;
    }
    self->s = s;
    Py_RETURN_NONE;
}

static void watch_unlink(WatchObject *w)
{
    if (w->pprev) {
        *w->pprev = w->next;
        if (w->next)
            w->next->pprev = w->pprev;
        w->next = NULL;
        w->pprev = NULL;
    }
}

static void watch_close_now(WatchObject *w)
{
    ferry_watch *fw = w->w;
    w->w = NULL;
    watch_unlink(w);
    if (fw) {
        Py_BEGIN_ALLOW_THREADS ferry_watch_close(fw);
        Py_END_ALLOW_THREADS
    }
}

static void regs_release(StoreObject *self)
{
    if (!self->regs)
        return;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(self->regs, &pos, &k, &v)) {
        PyObject *r = PyObject_CallMethod(v, "release", NULL);
        if (!r)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    PyDict_Clear(self->regs);
}

static void st_close_now(StoreObject *self)
{
    while (self->watches)
        watch_close_now(self->watches);
    ferry_sparse_reader_close(self->sparse);   /* reads from s: closed before it */
    self->sparse = NULL;
    ferry_store *s = self->s;
    self->s = NULL;
    if (s) {
        Py_BEGIN_ALLOW_THREADS ferry_store_close(s);
        Py_END_ALLOW_THREADS
    }
    regs_release(self);   /* the engine unregistered them when it closed */
}

static PyObject *st_close(StoreObject *self, PyObject *unused)
{
    (void)unused;
    int busy = self->inflight;
    for (WatchObject *w = self->watches; w; w = w->next)
        busy += w->inflight;
    if (busy)
        return fp_err_throw(fp_err_new(FERRY_EBUSY, "close: calls are still running on this store or its watches"));
    st_close_now(self);
    return PyLong_FromLong(0);
}

static PyObject *st_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    StoreObject *self = (StoreObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->regs = PyDict_New();
    if (!self->regs) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void st_dealloc(StoreObject *self)
{
    st_close_now(self);
    Py_CLEAR(self->regs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *st_exit(StoreObject *self, PyObject *args)
{
    (void)args;
    return fp_exit_result(st_close(self, NULL));
}

static PyObject *st_is_open(StoreObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->s != NULL);
}

/* The C handle crosses to the calls written in Python over the cffi
 * binding (ferry/store.py) as its address: _enter() returns it (ValueError
 * when not open) and counts a call in flight until _leave(), so that
 * close() refuses meanwhile as it does for the calls made here. */
static PyObject *st_enter(StoreObject *self, PyObject *unused)
{
    (void)unused;
    ferry_store *s = st_of(self);
    if (!s)
        return NULL;
    self->inflight++;
    return PyLong_FromVoidPtr(s);
}

static PyObject *st_leave(StoreObject *self, PyObject *unused)
{
    (void)unused;
    self->inflight--;
    Py_RETURN_NONE;
}

/* The store's sparse reader for ferry/_weights.py's sparse_read (its
 * address; opened at the first call, closed with the store). */
static PyObject *st_sparse_reader(StoreObject *self, PyObject *unused)
{
    (void)unused;
    ferry_sparse_reader *r = fp_store_sparse_reader((PyObject *)self);
    return r ? PyLong_FromVoidPtr(r) : NULL;
}

/* ---- memory arguments ------------------------------------------------------------------ */

/* The registration holding [p, p+len) (borrowed: the registered memoryview,
 * or the size of a raw (ptr, size) registration), or NULL (no error). */
static PyObject *reg_covering(StoreObject *self, uintptr_t p, size_t len)
{
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(self->regs, &pos, &k, &v)) {
        uintptr_t a = (uintptr_t)PyLong_AsVoidPtr(k);
        size_t n = PyLong_Check(v) ? PyLong_AsSize_t(v) : (size_t)PyMemoryView_GET_BUFFER(v)->len;
        if (PyErr_Occurred()) {
            PyErr_Clear();
            continue;
        }
        if (p >= a && len <= n && p - a <= n - len)
            return v;
    }
    return NULL;
}

/* One memory argument of a call: an object (array, buffer, tensor, DLPack),
 * or Mooncake's raw address, whose size comes with it. */
typedef struct {
    Py_buffer v;      /* v.obj set: a held view (of the object, or of the
                         registration covering a raw address) */
    void *ptr;
    size_t len;
} st_mem;

static void mem_release(st_mem *m)
{
    if (m->v.obj)
        PyBuffer_Release(&m->v);
    m->v.obj = NULL;
}

/* size (None or absent: the whole buffer) of a memory argument. */
static int size_of(PyObject *size, const char *what, int *given, size_t *out)
{
    *given = size && size != Py_None;
    if (!*given)
        return 0;
    unsigned long long n = 0;
    char w[160];
    snprintf(w, sizeof w, "%s: size", what);
    if (st_uint(size, w, 0, PY_SSIZE_T_MAX, &n) < 0)
        return -1;
    *out = (size_t)n;
    return 0;
}

/* o as memory for a call (writable: a destination); size optional for an
 * object (then at most its bytes: the first size bytes), required for an int
 * address, which must lie inside a buffer registered with register_buffer
 * (the registration is held for the call). 0 or -1 raised. */
static int mem_get(StoreObject *self, PyObject *o, PyObject *size, int writable, const char *what, st_mem *m)
{
    memset(m, 0, sizeof *m);
    int given = 0;
    size_t n = 0;
    if (size_of(size, what, &given, &n) < 0)
        return -1;
    if (PyLong_Check(o) && !PyBool_Check(o)) {
        if (!given) {
            PyErr_Format(PyExc_TypeError, "%s: an address (int) needs its size: (ptr, size)", what);
            return -1;
        }
        void *p = PyLong_AsVoidPtr(o);
        if (!p && PyErr_Occurred())
            return -1;
        PyObject *reg = reg_covering(self, (uintptr_t)p, n);
        if (!reg) {
            PyErr_Format(PyExc_ValueError, "%s: address %p (%zu bytes) is not inside a buffer registered with "
                         "register_buffer(); register it first, or pass the array or tensor itself", what, p, n);
            return -1;
        }
        /* a registered object stays alive while this call holds a view of it */
        if (!PyLong_Check(reg) && PyObject_GetBuffer(reg, &m->v, PyBUF_SIMPLE) < 0)
            return -1;
        if (m->v.obj && writable && m->v.readonly) {
            mem_release(m);
            PyErr_Format(PyExc_ValueError, "%s: address %p is inside a read-only registered buffer", what, p);
            return -1;
        }
        m->ptr = p;
        m->len = n;
        return 0;
    }
    if ((writable ? buf_dst(o, &m->v, what) : buf_src(o, &m->v, what)) < 0) {
        m->v.obj = NULL;
        return -1;
    }
    m->ptr = m->v.buf;
    m->len = (size_t)m->v.len;
    if (given) {
        if (n > m->len) {
            PyErr_Format(PyExc_ValueError, "%s: size %zu is larger than the buffer (%zu bytes)", what, n, m->len);
            mem_release(m);
            return -1;
        }
        m->len = n;
    }
    return 0;
}

/* For the calls written in Python over the cffi binding, the two argument
 * readers the batch and structured calls here share with them:
 * _memory(obj, size, writable, what) -> (address, bytes, holder): a memory
 * argument by mem_get, held by holder (a memoryview export, or None for a
 * raw registration) until the caller drops it; */
static PyObject *st_memory(StoreObject *self, PyObject *args)
{
    PyObject *o, *size;
    int writable;
    const char *what;
    if (!PyArg_ParseTuple(args, "OOps:_memory", &o, &size, &writable, &what) || !st_of(self))
        return NULL;
    st_mem m;
    if (mem_get(self, o, size, writable, what, &m) < 0)
        return NULL;
    PyObject *hold = m.v.obj ? PyMemoryView_FromObject(m.v.obj) : Py_NewRef(Py_None);
    mem_release(&m);
    return hold ? Py_BuildValue("(NnN)", PyLong_FromVoidPtr(m.ptr), (Py_ssize_t)m.len, hold) : NULL;
}

/* _replicate(config) -> None, or (replica_num, hard_pin, preferred segment
 * ids) of a ReplicateConfig or dict, checked by rc_from. */
static PyObject *st_replicate(PyObject *self, PyObject *cfg)
{
    (void)self;
    st_rc r;
    if (rc_from(cfg, &r) < 0)
        return NULL;
    if (!r.set)
        Py_RETURN_NONE;
    PyObject *pref = PyTuple_New(r.rc.npreferred);
    for (uint32_t i = 0; pref && i < r.rc.npreferred; i++)
        PyTuple_SET_ITEM(pref, i, PyLong_FromUnsignedLongLong(r.pref[i]));
    rc_free(&r);
    return pref ? Py_BuildValue("(IOO)", r.rc.replica_num, r.rc.hard_pin ? Py_True : Py_False, pref) : NULL;
}

/* ---- registered buffers -------------------------------------------------------------- */

/* register_buffer(buffer) or register_buffer(ptr, size) -> 0 */
static PyObject *st_register(StoreObject *self, PyObject *args, PyObject *kw)
{
    ferry_error fe = {0};
    static char *kwl[] = {"buffer", "size", NULL};
    PyObject *buffer, *size = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:register_buffer", kwl, &buffer, &size))
        return NULL;
    ferry_store *s = st_of(self);
    if (!s)
        return NULL;
    int given = 0;
    size_t n = 0;
    if (size_of(size, "register_buffer", &given, &n) < 0)
        return NULL;
    PyObject *hold = NULL;   /* what the registry keeps: a memoryview, or the raw size */
    void *p;
    if (PyLong_Check(buffer) && !PyBool_Check(buffer)) {
        if (!given || n == 0) {
            PyErr_SetString(PyExc_ValueError, "register_buffer(ptr, size): a raw address needs a positive size");
            return NULL;
        }
        p = PyLong_AsVoidPtr(buffer);
        if (!p) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "register_buffer: address 0");
            return NULL;
        }
        hold = PyLong_FromSize_t(n);
    } else {
        PyObject *mem = fp_memory(buffer, "register_buffer: buffer");
        if (!mem)
            return NULL;
        hold = PyMemoryView_FromObject(mem);
        Py_DECREF(mem);
        if (!hold)
            return NULL;
        Py_buffer *v = PyMemoryView_GET_BUFFER(hold);
        p = v->buf;
        int bad = !PyBuffer_IsContiguous(v, 'C') || v->len == 0 || (given && (n == 0 || n > (size_t)v->len));
        if (bad) {
            PyObject *r = PyObject_CallMethod(hold, "release", NULL);
            Py_XDECREF(r);
            Py_DECREF(hold);
            PyErr_SetString(PyExc_ValueError, "register_buffer: a non-empty contiguous buffer is needed (and a size "
                            "within it)");
            return NULL;
        }
        if (given && n < (size_t)v->len) {   /* the first n bytes only */
            Py_DECREF(hold);
            PyErr_SetString(PyExc_ValueError, "register_buffer(buffer, size): size must be the buffer's size; "
                            "register a slice to register part of it");
            return NULL;
        }
        n = (size_t)v->len;
    }
    PyObject *addr = hold ? PyLong_FromVoidPtr(p) : NULL;
    int rc = 0;
    if (addr)
        ST_CALL(self, rc = ferry_store_register_buffer(s, p, n, &fe));
    if (!addr || rc < 0 || PyDict_SetItem(self->regs, addr, hold) < 0) {
        if (addr && rc == 0)   /* registered but not recorded: undo */
            ferry_store_unregister_buffer(s, p, &fe);
        Py_XDECREF(addr);
        if (hold && PyMemoryView_Check(hold)) {
            PyObject *r = PyObject_CallMethod(hold, "release", NULL);
            Py_XDECREF(r);
        }
        Py_XDECREF(hold);
        return rc < 0 ? st_raise(rc, &fe) : NULL;
    }
    Py_DECREF(addr);
    Py_DECREF(hold);
    return PyLong_FromLong(0);
}

/* unregister_buffer(buffer or ptr) -> 0 */
static PyObject *st_unregister(StoreObject *self, PyObject *buffer)
{
    ferry_error fe = {0};
    ferry_store *s = st_of(self);
    if (!s)
        return NULL;
    void *p;
    if (PyLong_Check(buffer) && !PyBool_Check(buffer)) {
        p = PyLong_AsVoidPtr(buffer);
        if (!p && PyErr_Occurred())
            return NULL;
    } else {
        PyObject *mem = fp_memory(buffer, "unregister_buffer: buffer");
        if (!mem)
            return NULL;
        PyObject *a = PyObject_GetAttrString(mem, "ptr");
        Py_DECREF(mem);
        if (!a)
            return NULL;
        p = PyLong_AsVoidPtr(a);
        Py_DECREF(a);
        if (!p && PyErr_Occurred())
            return NULL;
    }
    int rc;
    ST_CALL(self, rc = ferry_store_unregister_buffer(s, p, &fe));
    if (rc < 0)
        return st_raise(rc, &fe);
    PyObject *addr = PyLong_FromVoidPtr(p);
    if (!addr)
        return NULL;
    PyObject *mv = PyDict_GetItemWithError(self->regs, addr);
    if (mv) {
        Py_INCREF(mv);
        PyDict_DelItem(self->regs, addr);
        if (PyMemoryView_Check(mv)) {
            PyObject *r = PyObject_CallMethod(mv, "release", NULL);
            if (!r)   /* a call on another thread holds it: freed when that call ends */
                PyErr_Clear();
            Py_XDECREF(r);
        }
        Py_DECREF(mv);
    }
    Py_DECREF(addr);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(0);
}

/* ---- objects --------------------------------------------------------------------------- */

/* keys, buffers (objects or addresses) and sizes (None, or one per buffer;
 * required for addresses) of a batch call named fn. 0 or -1. */
/* batch_put_from(keys, buffers, sizes=None, config=None) */
/* batch_get_into(keys, buffers, sizes=None) */
/* ---- structured objects ------------------------------------------------------------ */

/* put_struct_raw(key, [(name, dtype, shape, buffer), ...], config=None) */
/* read_member_into(key, member, row_begin, row_end, buffer, size=None) -> bytes
 * read; buffer may be an address inside a registered buffer (with size). */
/* ---- KV ----------------------------------------------------------------------------------- */

static PyObject *st_watch(StoreObject *self, PyObject *args, PyObject *kw)
{
    ferry_error fe = {0};
    static char *kwl[] = {"prefix", "from_rev", NULL};
    const char *prefix;
    unsigned long long from = 0;
    PyObject *ofrom = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:watch", kwl, &prefix, &ofrom) ||
        st_uint_opt(ofrom, "from_rev", 0, UINT64_MAX, &from) < 0)
        return NULL;
    ferry_store *s = st_of(self);
    if (!s)
        return NULL;
    WatchObject *w = PyObject_New(WatchObject, &WatchType);
    if (!w)
        return NULL;
    w->store = NULL;
    w->w = NULL;
    w->inflight = 0;
    w->next = NULL;
    w->pprev = NULL;
    int rc;
    ferry_watch *fw = NULL;
    ST_CALL(self, rc = ferry_kv_watch(s, prefix, from, &fw, &fe));
    if (rc < 0) {
        Py_DECREF(w);
        return st_raise(rc, &fe);
    }
    if (!self->s) {   /* closed meanwhile: cannot happen (close refuses), kept safe */
        ferry_watch_close(fw);
        Py_DECREF(w);
        st_of(self);
        return NULL;
    }
    w->w = fw;
    Py_INCREF(self);
    w->store = self;
    w->next = self->watches;
    if (w->next)
        w->next->pprev = &w->next;
    w->pprev = &self->watches;
    self->watches = w;
    return (PyObject *)w;
}

/* ---- queues ------------------------------------------------------------------------------ */

/* warm(write=False) -> bytes warmed (ferry_store_warm). */
static PyMethodDef st_methods[] = {
    {"_enter", (PyCFunction)st_enter, METH_NOARGS, "_enter($self, /)\n--\n\n"
     "_enter() -> the address of the C handle, the call counted in flight until _leave()"},
    {"_leave", (PyCFunction)st_leave, METH_NOARGS, "_leave($self, /)\n--\n\n"
     "_leave(): the call of the last _enter() is done"},
    {"_sparse_reader", (PyCFunction)st_sparse_reader, METH_NOARGS, "_sparse_reader($self, /)\n--\n\n"
     "_sparse_reader() -> the address of the store's sparse reader (opened at the first call)"},
    {"_memory", (PyCFunction)st_memory, METH_VARARGS, "_memory($self, obj, size, writable, what, /)\n--\n\n"
     "_memory(obj, size, writable, what) -> (address, bytes, holder) of a memory argument"},
    {"setup", FP_KWFN(st_setup), METH_VARARGS | METH_KEYWORDS,
     "setup($self, /, master=None, token=None, token_file=None, transport=None, timeout_ms=None, lease_ms=None)\n--\n\n"
     "setup(master=None, token=None, token_file=None, transport=None, timeout_ms=None, lease_ms=None)\n"
     "Connect to the master; unset arguments come from FERRY_MASTER, FERRY_TOKEN, FERRY_TOKEN_FILE, ..."},
    FP_CLOSE_METHODS(st, "close(): close the connection and the client's engine"),
    {"register_buffer", FP_KWFN(st_register), METH_VARARGS | METH_KEYWORDS,
     "register_buffer($self, /, buffer, size=None)\n--\n\n"
     "register_buffer(buffer, size=None) -> 0: register an array, tensor or buffer (held until unregistered), or "
     "Mooncake's (ptr, size) (the caller keeps that memory alive)"},
    {"unregister_buffer", (PyCFunction)st_unregister, METH_O,
     "unregister_buffer($self, buffer, /)\n--\n\nunregister_buffer(buffer or ptr) -> 0"},
    {"watch", FP_KWFN(st_watch), METH_VARARGS | METH_KEYWORDS, "watch($self, /, prefix, from_rev=0)\n--\n\n"
     "watch(prefix, from_rev=0) -> Watch"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef st_getset[] = {
    {"is_open", (getter)st_is_open, NULL, "True between setup() and close()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Store()\n--\n\n" "Store(): a client of the ferry store; call setup() to connect",
    .tp_new = st_new,
    .tp_dealloc = (destructor)st_dealloc,
    .tp_methods = st_methods,
    .tp_getset = st_getset,
};

/* ---- Watch ---------------------------------------------------------------------------------- */

#define WATCH_SLICE_MS 200   /* blocking waits wake this often to take signals */

static void watch_dealloc(WatchObject *self)
{
    watch_close_now(self);
    Py_CLEAR(self->store);
    PyObject_Free(self);
}

/* The next event as (rev, key, value or None), Py_None on timeout, NULL on error. */
static PyObject *watch_wait(WatchObject *self, long timeout_ms)
{
    ferry_error fe = {0};
    if (fp_check_open(self->w, 0, "watch", NULL) < 0)
        return NULL;
    ferry_kv_event ev;
    int rc;
    for (;;) {
        int slice = timeout_ms < 0 || timeout_ms > WATCH_SLICE_MS ? WATCH_SLICE_MS : (int)timeout_ms;
        memset(&ev, 0, sizeof ev);
        ST_CALL(self, rc = ferry_watch_next(self->w, slice, &ev, &fe));
        if (rc != FERRY_ETIMEDOUT)
            break;
        if (timeout_ms >= 0) {
            timeout_ms -= slice;
            if (timeout_ms <= 0)
                Py_RETURN_NONE;
        }
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    if (rc < 0)
        return st_raise(rc, &fe);
    PyObject *val;
    if (ev.deleted)
        val = Py_NewRef(Py_None);
    else
        val = PyBytes_FromStringAndSize(ev.val, (Py_ssize_t)ev.len);
    if (!val)
        return NULL;
    PyObject *key = fp_str_of(ev.key ? ev.key : "");
    if (!key) {
        Py_DECREF(val);
        return NULL;
    }
    return Py_BuildValue("(KNN)", (unsigned long long)ev.rev, key, val);
}

static PyObject *watch_next_m(WatchObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"timeout_ms", NULL};
    long timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|l:next", kwl, &timeout))
        return NULL;
    return watch_wait(self, timeout);
}

static PyObject *watch_iternext(WatchObject *self)
{
    if (!self->w)
        return NULL;   /* closed: the iteration ends */
    return watch_wait(self, -1);
}

static PyObject *watch_close_m(WatchObject *self, PyObject *unused)
{
    (void)unused;
    if (self->inflight)
        return fp_err_throw(fp_err_new(FERRY_EBUSY, "close: another thread is waiting on this watch"));
    watch_close_now(self);
    Py_RETURN_NONE;
}

static PyObject *watch_exit(WatchObject *self, PyObject *args)
{
    (void)args;
    return fp_exit_result(watch_close_m(self, NULL));
}

static PyMethodDef watch_methods[] = {
    {"next", FP_KWFN(watch_next_m), METH_VARARGS | METH_KEYWORDS,
     "next($self, /, timeout_ms=-1)\n--\n\n"
     "next(timeout_ms=-1) -> (rev, key, value or None if deleted), or None when timeout_ms passed"},
    {"close", (PyCFunction)watch_close_m, METH_NOARGS, "close($self, /)\n--\n\n"
     "close()"},
    {"__enter__", fp_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)watch_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Watch",
    .tp_basicsize = sizeof(WatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Watch: changes to the keys under a prefix (Store.watch); iterate or call next()",
    .tp_dealloc = (destructor)watch_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)watch_iternext,
    .tp_methods = watch_methods,
};

/* ---- for the other files ------------------------------------------------------------------ */

ferry_store *fp_store_handle(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &StoreType)) {
        PyErr_Format(PyExc_TypeError, "expected a ferry.Store, not %.100s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    return st_of((StoreObject *)o);
}

ferry_sparse_reader *fp_store_sparse_reader(PyObject *o)
{
    ferry_store *s = fp_store_handle(o);
    if (!s)
        return NULL;
    StoreObject *self = (StoreObject *)o;
    if (!self->sparse) {   /* with the GIL: one opens it */
        ferry_sparse_reader_config cfg;
        ferry_error err = {0};
        int rc = ferry_sparse_reader_config_init(&cfg);
        if (rc == 0)
            rc = ferry_sparse_reader_open(s, &cfg, &self->sparse, &err);
        if (rc < 0) {
            fp_raise_err_class(rc, &err);
            return NULL;
        }
    }
    return self->sparse;
}

ferry_store *fp_store_str_args(PyObject *args, const char *fmt, PyObject **so, const char **str)
{
    if (!PyArg_ParseTuple(args, fmt, so, str))
        return NULL;
    return fp_store_handle(*so);
}

void fp_store_busy(PyObject *o, int delta)
{
    ((StoreObject *)o)->inflight += delta;
}

/* ---- module ------------------------------------------------------------------------------- */

int fp_store_init(PyObject *m)
{
    struct {
        PyObject **slot;
        const char *name, *doc;
        PyObject *builtin;
    } errs[] = {
        {&err_notfound, "NotFoundError", "No such object, key, member or buffer (FERRY_ENOENT).", NULL},
        {&err_exists, "ExistsError", "The key already exists (FERRY_EEXIST).", NULL},
        {&err_nospace, "NoSpaceError", "No segment has room (FERRY_ENOSPC).", NULL},
        {&err_lost, "LostError", "Every replica of the object is gone (FERRY_ELOST).", NULL},
        {&err_busy, "BusyError", "Leased or in use (FERRY_EBUSY).", NULL},
        {&err_conflict, "ConflictError",
         "A compare-and-swap or conditional call lost (FERRY_ESTATE); .current_revision when known.", NULL},
        {&err_timeout, "TimeoutError", "The deadline passed (FERRY_ETIMEDOUT).", PyExc_TimeoutError},
        {&err_auth, "AuthError", "The cluster token was refused (FERRY_EAUTH).", NULL},
        {&err_conn, "ConnectionError", "The master is unreachable or the connection was lost "
                                       "(FERRY_ECONNREFUSED, FERRY_ECONNRESET).",
         PyExc_ConnectionError},
        {&err_stale, "StaleError", "The record was delivered again since this lease (FERRY_ESTALE).", NULL},
        {&err_unreach, "UnreachableError",
         "The object's node is not heard from or reconnecting (FERRY_EUNREACH); its data is kept: "
         "retry later.", NULL},
        {&err_full, "QueueFullError",
         "A bounded queue is full (FERRY_EAGAIN): a sample queue with fail_when_full, a store queue with a "
         "bound; retry after consumers made room.", NULL},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        char qual[64];
        snprintf(qual, sizeof qual, "ferry.%s", errs[i].name);
        PyObject *base = errs[i].builtin ? PyTuple_Pack(2, fp_error, errs[i].builtin) : Py_NewRef(fp_error);
        PyObject *dict = PyDict_New();
        if (!base || !dict ||
            (errs[i].slot == &err_conflict && PyDict_SetItemString(dict, "current_revision", Py_None) < 0)) {
            Py_XDECREF(base);
            Py_XDECREF(dict);
            return -1;
        }
        *errs[i].slot = PyErr_NewExceptionWithDoc(qual, errs[i].doc, base, dict);
        Py_DECREF(base);
        Py_DECREF(dict);
        if (!*errs[i].slot || PyModule_AddObjectRef(m, errs[i].name, *errs[i].slot) < 0)
            return -1;
    }
    static PyMethodDef functions[] = {
        {"_replicate", st_replicate, METH_O, "_replicate($module, config, /)\n--\n\n"
         "_replicate(config) -> None or (replica_num, hard_pin, preferred segment ids), checked"},
        {NULL, NULL, 0, NULL},
    };
    if (fp_add_type(m, "Store", &StoreType) < 0 || fp_add_type(m, "Watch", &WatchType) < 0 ||
        PyModule_AddFunctions(m, functions) < 0)
        return -1;
    return 0;
}
