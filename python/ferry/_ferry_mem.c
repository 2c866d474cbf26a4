/* _ferry: memory arguments. Every call that reads or writes caller memory
 * takes it through fp_buf_get: buffer-protocol objects (numpy arrays, bytes,
 * bytearray, memoryview, ...), torch tensors (CPU; nn.Parameter and tensors
 * that require grad included) and any object with __dlpack__, or a DLPack
 * capsule. A tensor is exported through DLPack into a Memory object, which
 * re-exports it with the buffer protocol, so the callers handle one kind of
 * view. Nothing is copied: a destination is written in place. */
#include <dlpack/dlpack.h>
#include <string.h>

#include "_ferry.h"

#define MEM_NDIM 32

typedef struct {
    PyObject_HEAD
    void *ptr;
    int ndim;
    Py_ssize_t itemsize, nbytes;
    Py_ssize_t shape[MEM_NDIM], strides[MEM_NDIM]; /* strides in bytes */
    char format[4];
    const char *fmt;         /* the format exported: format, or held.format */
    char dtype[12];          /* ferry dtype name; "" when ferry has none */
    int readonly, contiguous;
    PyObject *owner;         /* keeps the memory alive (a capsule, a tensor) */
    DLManagedTensor *consumed; /* from a capsule we consumed: ours to delete */
    Py_buffer held;          /* wrapping a buffer-protocol object (held.obj set) */
} MemoryObject;

static PyTypeObject MemoryType;

/* ---- dtypes ---------------------------------------------------------------------- */

const char *fp_format_dtype(const char *fmt, Py_ssize_t itemsize)
{
    if (!fmt)
        return itemsize == 1 ? "u8" : NULL;
    if (*fmt == '<' || *fmt == '=' || *fmt == '@')
        fmt++;
    if (!fmt[0] || fmt[1])
        return NULL;
    switch (fmt[0]) {
    case 'f': return itemsize == 4 ? "f32" : NULL;
    case 'e': return itemsize == 2 ? "f16" : NULL;
    case 'd': return itemsize == 8 ? "f64" : NULL;
    case '?': return itemsize == 1 ? "bool" : NULL;
    case 'b': return "i8";
    case 'B': return "u8";
    case 'h': return itemsize == 2 ? "i16" : NULL;
    case 'H': return itemsize == 2 ? "u16" : NULL;
    case 'i':
    case 'l':
    case 'q': return itemsize == 8 ? "i64" : itemsize == 4 ? "i32" : NULL;
    case 'I':
    case 'L':
    case 'Q': return itemsize == 8 ? "u64" : itemsize == 4 ? "u32" : NULL;
    default: return NULL;
    }
}

/* The ferry dtype, struct format and itemsize of a DLPack element type;
 * 0, or -1 when neither ferry nor the buffer protocol can carry it. Complex
 * elements have no ferry name but move as bytes. */
static int dl_dtype(DLDataType t, char *dtype, size_t dcap, char *fmt, size_t fcap, Py_ssize_t *itemsize)
{
    static const struct {
        uint8_t code, bits;
        const char *dtype, *fmt;
    } map[] = {
        {kDLFloat, 64, "f64", "d"}, {kDLFloat, 32, "f32", "f"}, {kDLFloat, 16, "f16", "e"},
        {kDLBfloat, 16, "bf16", "H"}, {kDLInt, 64, "i64", "q"},  {kDLInt, 32, "i32", "i"},
        {kDLInt, 16, "i16", "h"},     {kDLInt, 8, "i8", "b"},    {kDLUInt, 64, "u64", "Q"},
        {kDLUInt, 32, "u32", "I"},    {kDLUInt, 16, "u16", "H"}, {kDLUInt, 8, "u8", "B"},
        {kDLComplex, 64, "", "Zf"},   {kDLComplex, 128, "", "Zd"},
    };
    if (t.lanes != 1)
        return -1;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].code == t.code && map[i].bits == t.bits) {
            snprintf(dtype, dcap, "%s", map[i].dtype);
            snprintf(fmt, fcap, "%s", map[i].fmt);
            *itemsize = t.bits / 8;
            return 0;
        }
    return -1;
}

/* ---- descriptions for messages ------------------------------------------------------ */

PyObject *fp_describe(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    PyObject *mod = PyObject_GetAttrString((PyObject *)t, "__module__");
    if (!mod)
        PyErr_Clear();
    const char *m = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : NULL;
    if (!m)
        PyErr_Clear();
    PyObject *name = m && strcmp(m, "builtins") ? PyUnicode_FromFormat("%s.%s", m, t->tp_name)
                                                 : PyUnicode_FromString(t->tp_name);
    Py_XDECREF(mod);
    if (!name)
        return NULL;
    /* tp_name of an extension type may already carry its module */
    if (strchr(t->tp_name, '.')) {
        Py_DECREF(name);
        name = PyUnicode_FromString(t->tp_name);
        if (!name)
            return NULL;
    }
    PyObject *dt = NULL, *sh = NULL;
    if (!PyUnicode_Check(o) && !PyBytes_Check(o)) {
        dt = PyObject_GetAttrString(o, "dtype");
        if (!dt)
            PyErr_Clear();
        sh = PyObject_GetAttrString(o, "shape");
        if (!sh)
            PyErr_Clear();
    }
    PyObject *r;
    if (dt && sh) {
        PyObject *shl = PySequence_Check(sh) ? PySequence_List(sh) : NULL;
        if (!shl)
            PyErr_Clear();
        r = PyUnicode_FromFormat("%U of %S, shape %S", name, dt, shl ? shl : sh);
        Py_XDECREF(shl);
    } else {
        r = Py_NewRef(name);
    }
    Py_XDECREF(dt);
    Py_XDECREF(sh);
    Py_DECREF(name);
    return r;
}

/* Raise exc with "<what> (<description of o>) <msg>". Returns -1. */
static int mem_fail(PyObject *exc, PyObject *o, const char *what, const char *msg)
{
    PyObject *d = o ? fp_describe(o) : NULL;
    if (!d) {
        PyErr_Clear();
        PyErr_Format(exc, msg[0] == ':' ? "%s%s" : "%s %s", what, msg);
    } else {
        PyErr_Format(exc, msg[0] == ':' ? "%s (%U)%s" : "%s (%U) %s", what, d, msg);
        Py_DECREF(d);
    }
    return -1;
}

/* ---- the Memory type -------------------------------------------------------------------- */

static void mem_layout(MemoryObject *m)
{
    Py_ssize_t n = 1, expect = m->itemsize;
    m->contiguous = 1;
    for (int d = m->ndim - 1; d >= 0; d--) {
        n *= m->shape[d];
        if (m->shape[d] != 1 && m->strides[d] != expect)
            m->contiguous = 0;
        expect *= m->shape[d];
    }
    m->nbytes = n * m->itemsize;
    if (m->nbytes == 0)
        m->contiguous = 1;
}

static void mem_dealloc(MemoryObject *m)
{
    if (m->held.obj)
        PyBuffer_Release(&m->held);
    if (m->consumed && m->consumed->deleter)
        m->consumed->deleter(m->consumed);
    Py_CLEAR(m->owner);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static int mem_getbuffer(MemoryObject *m, Py_buffer *v, int flags)
{
    if ((flags & PyBUF_WRITABLE) && m->readonly) {
        PyErr_SetString(PyExc_BufferError, "the memory is read-only");
        return -1;
    }
    int want_strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES;
    int want_c = (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
                 (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS;
    if ((!want_strides || want_c) && !m->contiguous) {
        PyErr_SetString(PyExc_BufferError, "the memory is not C-contiguous");
        return -1;
    }
    if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && m->ndim > 1 && !m->contiguous) {
        PyErr_SetString(PyExc_BufferError, "the memory is not Fortran-contiguous");
        return -1;
    }
    v->obj = Py_NewRef((PyObject *)m);
    v->buf = m->ptr;
    v->len = m->nbytes;
    v->readonly = m->readonly;
    v->itemsize = m->itemsize;
    v->format = (flags & PyBUF_FORMAT) ? (char *)m->fmt : NULL;
    v->ndim = m->ndim;
    v->shape = (flags & PyBUF_ND) == PyBUF_ND ? m->shape : NULL;
    v->strides = want_strides ? m->strides : NULL;
    v->suboffsets = NULL;
    v->internal = NULL;
    if (!v->shape) {   /* a plain run of bytes */
        v->ndim = 1;
        v->itemsize = 1;
    }
    return 0;
}

static PyBufferProcs mem_as_buffer = {.bf_getbuffer = (getbufferproc)mem_getbuffer};

static PyObject *mem_get_dtype(MemoryObject *m, void *c)
{
    (void)c;
    if (!m->dtype[0])
        Py_RETURN_NONE;
    return PyUnicode_FromString(m->dtype);
}

static PyObject *mem_get_shape(MemoryObject *m, void *c)
{
    (void)c;
    PyObject *t = PyTuple_New(m->ndim);
    for (int d = 0; t && d < m->ndim; d++) {
        PyObject *x = PyLong_FromSsize_t(m->shape[d]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, d, x);
    }
    return t;
}

static PyObject *mem_get_ptr(MemoryObject *m, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(m->ptr);
}

static PyObject *mem_get_nbytes(MemoryObject *m, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(m->nbytes);
}

static PyObject *mem_get_readonly(MemoryObject *m, void *c)
{
    (void)c;
    return PyBool_FromLong(m->readonly);
}

static PyObject *mem_get_contiguous(MemoryObject *m, void *c)
{
    (void)c;
    return PyBool_FromLong(m->contiguous);
}

static PyGetSetDef mem_getset[] = {
    {"dtype", (getter)mem_get_dtype, NULL, "ferry dtype name of the elements (None: no ferry name)", NULL},
    {"shape", (getter)mem_get_shape, NULL, "shape (tuple of ints)", NULL},
    {"ptr", (getter)mem_get_ptr, NULL, "address of the first element", NULL},
    {"nbytes", (getter)mem_get_nbytes, NULL, "bytes of the elements", NULL},
    {"readonly", (getter)mem_get_readonly, NULL, "True when the memory must not be written", NULL},
    {"contiguous", (getter)mem_get_contiguous, NULL, "True when C-contiguous", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Memory",
    .tp_basicsize = sizeof(MemoryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory: a tensor's or buffer's memory as ferry sees it (ferry._ferry.memory); a buffer",
    .tp_dealloc = (destructor)mem_dealloc,
    .tp_as_buffer = &mem_as_buffer,
    .tp_getset = mem_getset,
};

static MemoryObject *mem_new(void)
{
    MemoryObject *m = PyObject_New(MemoryObject, &MemoryType);
    if (!m)
        return NULL;
    char *p = (char *)m + sizeof(PyObject);
    memset(p, 0, sizeof *m - sizeof(PyObject));
    return m;
}

/* ---- DLPack ------------------------------------------------------------------------------ */

static const char *dl_device_name(int type)
{
    switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLOpenCL: return "opencl";
    case kDLVulkan: return "vulkan";
    case kDLMetal: return "metal";
    case kDLVPI: return "vpi";
    case kDLROCM: return "rocm";
    case kDLROCMHost: return "rocm_host";
    case kDLExtDev: return "ext_dev";
    case kDLCUDAManaged: return "cuda_managed";
    case 14: return "oneapi";
    case 15: return "webgpu";
    case 16: return "hexagon";
    default: return "device";
    }
}

/* Host memory the CPU reads and writes directly: plain, and pinned. */
static int dl_host(int type)
{
    return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

static int dl_refuse_device(PyObject *o, const char *what, int type, long id)
{
    char msg[160];
    snprintf(msg, sizeof msg, ": device memory (%s:%ld) is not supported yet; copy it to the host first (e.g. "
             ".cpu())", dl_device_name(type), id);
    return mem_fail(PyExc_ValueError, o, what, msg);
}

/* __dlpack_device__() of o when it has one: 0 (host or unknown), -1 raised. */
static int dl_check_device(PyObject *o, const char *what)
{
    PyObject *dev = PyObject_CallMethod(o, "__dlpack_device__", NULL);
    if (!dev) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    long type = -1, id = 0;
    if (PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) == 2) {
        type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
        id = PyLong_AsLong(PyTuple_GET_ITEM(dev, 1));
    }
    Py_DECREF(dev);
    if (PyErr_Occurred())
        return -1;
    if (type >= 0 && !dl_host((int)type))
        return dl_refuse_device(o, what, (int)type, id);
    return 0;
}

/* Attribute name of o is true (a torch tensor's requires_grad, ...). */
static int attr_true(PyObject *o, const char *name)
{
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v) {
        PyErr_Clear();
        return 0;
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t < 0)
        PyErr_Clear();
    return t > 0;
}

/* str(o.dtype) equals s (a torch dtype such as "torch.bool"). */
static int dtype_str_is(PyObject *o, const char *s)
{
    PyObject *dt = PyObject_GetAttrString(o, "dtype");
    if (!dt) {
        PyErr_Clear();
        return 0;
    }
    PyObject *str = PyObject_Str(dt);
    Py_DECREF(dt);
    if (!str) {
        PyErr_Clear();
        return 0;
    }
    int eq = PyUnicode_CompareWithASCIIString(str, s) == 0;
    Py_DECREF(str);
    return eq;
}

/* Fill m from the DLTensor; 0 or -1 raised (o, what name it). */
static int dl_fill(MemoryObject *m, const DLTensor *t, PyObject *o, const char *what)
{
    if (!dl_host(t->device.device_type))
        return dl_refuse_device(o, what, t->device.device_type, t->device.device_id);
    if (dl_dtype(t->dtype, m->dtype, sizeof m->dtype, m->format, sizeof m->format, &m->itemsize) < 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "has elements ferry cannot carry (DLPack type code %u, %u bits, %u lanes)",
                 t->dtype.code, t->dtype.bits, t->dtype.lanes);
        return mem_fail(PyExc_TypeError, o, what, msg);
    }
    if (t->ndim < 0 || t->ndim > MEM_NDIM) {
        char msg[64];
        snprintf(msg, sizeof msg, "has %d dims (at most %d)", t->ndim, MEM_NDIM);
        return mem_fail(PyExc_ValueError, o, what, msg);
    }
    m->ndim = t->ndim;
    Py_ssize_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] < 0)
            return mem_fail(PyExc_ValueError, o, what, "has a negative dimension");
        m->shape[d] = (Py_ssize_t)t->shape[d];
        m->strides[d] = (Py_ssize_t)(t->strides ? t->strides[d] : expect) * m->itemsize;
        expect *= (Py_ssize_t)t->shape[d];
    }
    m->ptr = (char *)t->data + t->byte_offset;
    m->readonly = 0;   /* DLPack 0.6 has no read-only flag: exporters refuse read-only memory */
    mem_layout(m);
    for (int d = 0; d < m->ndim; d++)
        if (m->strides[d] < 0 && m->shape[d] > 1)
            return mem_fail(PyExc_ValueError, o, what, "has a negative stride");
    return 0;
}

/* A Memory over a DLPack exporter or capsule o. New reference or NULL. */
static PyObject *mem_from_dlpack(PyObject *o, const char *what)
{
    MemoryObject *m = mem_new();
    if (!m)
        return NULL;
    if (PyCapsule_IsValid(o, "dltensor")) {
        DLManagedTensor *mt = PyCapsule_GetPointer(o, "dltensor");
        if (!mt || PyCapsule_SetName(o, "used_dltensor") < 0)
            goto fail;
        m->consumed = mt;
        m->fmt = m->format;
        if (dl_fill(m, &mt->dl_tensor, o, what) < 0)
            goto fail;
        return (PyObject *)m;
    }
    if (PyCapsule_CheckExact(o)) {
        mem_fail(PyExc_ValueError, o, what, "is a capsule but not an unconsumed DLPack tensor (\"dltensor\")");
        goto fail;
    }
    if (dl_check_device(o, what) < 0)
        goto fail;
    /* torch refuses to export a tensor that requires grad; its detach()
     * shares the storage, and ferry never records gradients. */
    PyObject *src = attr_true(o, "requires_grad") ? PyObject_CallMethod(o, "detach", NULL) : Py_NewRef(o);
    if (!src)
        goto fail;
    /* torch 1.13 has no DLPack bool: export its bytes, keep the name */
    int is_bool = dtype_str_is(src, "torch.bool");
    if (is_bool) {
        PyObject *torch = PyImport_ImportModule("torch");
        PyObject *u8 = torch ? PyObject_GetAttrString(torch, "uint8") : NULL;
        PyObject *v = u8 ? PyObject_CallMethod(src, "view", "O", u8) : NULL;
        Py_XDECREF(torch);
        Py_XDECREF(u8);
        Py_DECREF(src);
        if (!v)
            goto fail;
        src = v;
    }
    PyObject *cap = PyObject_CallMethod(src, "__dlpack__", NULL);
    Py_DECREF(src);
    if (!cap) {
        if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_RuntimeError) ||
            PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyObject *s = ev ? PyObject_Str(ev) : NULL;
            const char *txt = s ? PyUnicode_AsUTF8(s) : NULL;
            char msg[512];
            snprintf(msg, sizeof msg, "could not be exported with DLPack: %s", txt ? txt : "(no reason given)");
            PyErr_Clear();
            Py_XDECREF(s);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            mem_fail(PyExc_ValueError, o, what, msg);
        }
        goto fail;
    }
    DLManagedTensor *mt = PyCapsule_IsValid(cap, "dltensor") ? PyCapsule_GetPointer(cap, "dltensor") : NULL;
    if (!mt) {
        Py_DECREF(cap);
        PyErr_Clear();
        mem_fail(PyExc_TypeError, o, what, "returned something other than a DLPack capsule from __dlpack__()");
        goto fail;
    }
    m->owner = cap;   /* its destructor calls the deleter: we never consume it */
    m->fmt = m->format;
    if (dl_fill(m, &mt->dl_tensor, o, what) < 0)
        goto fail;
    if (is_bool) {
        snprintf(m->dtype, sizeof m->dtype, "bool");
        snprintf(m->format, sizeof m->format, "?");
    }
    return (PyObject *)m;
fail:
    Py_DECREF(m);
    return NULL;
}

/* A Memory holding a buffer-protocol view of o (strided, read-only allowed). */
static PyObject *mem_from_buffer(PyObject *o, const char *what)
{
    MemoryObject *m = mem_new();
    if (!m)
        return NULL;
    if (PyObject_GetBuffer(o, &m->held, PyBUF_FULL_RO) < 0) {
        m->held.obj = NULL;
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *s = ev ? PyObject_Str(ev) : NULL;
        const char *txt = s ? PyUnicode_AsUTF8(s) : NULL;
        char msg[512];
        snprintf(msg, sizeof msg, "cannot be read as a buffer: %s", txt ? txt : "(no reason given)");
        PyErr_Clear();
        Py_XDECREF(s);
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        mem_fail(PyExc_BufferError, o, what, msg);
        Py_DECREF(m);
        return NULL;
    }
    Py_buffer *v = &m->held;
    if (v->ndim > MEM_NDIM || v->suboffsets) {
        mem_fail(PyExc_ValueError, o, what, "has too many dims or indirect (suboffset) memory");
        Py_DECREF(m);
        return NULL;
    }
    m->ptr = v->buf;
    m->itemsize = v->itemsize > 0 ? v->itemsize : 1;
    m->fmt = v->format ? v->format : "B";
    const char *dt = fp_format_dtype(v->format, v->itemsize);
    snprintf(m->dtype, sizeof m->dtype, "%s", dt ? dt : "");
    m->readonly = v->readonly;
    if (v->ndim == 0 || !v->shape) {
        m->ndim = v->ndim == 0 ? 0 : 1;
        if (m->ndim) {
            m->shape[0] = v->len / m->itemsize;
            m->strides[0] = m->itemsize;
        }
    } else {
        m->ndim = v->ndim;
        for (int d = 0; d < v->ndim; d++) {
            m->shape[d] = v->shape[d];
            m->strides[d] = v->strides ? v->strides[d] : 0;
        }
        if (!v->strides) {
            Py_ssize_t s = m->itemsize;
            for (int d = v->ndim - 1; d >= 0; d--) {
                m->strides[d] = s;
                s *= m->shape[d];
            }
        }
    }
    mem_layout(m);
    return (PyObject *)m;
}

PyObject *fp_memory(PyObject *o, const char *what)
{
    if (PyObject_TypeCheck(o, &MemoryType))
        return Py_NewRef(o);
    if (PyObject_CheckBuffer(o))
        return mem_from_buffer(o, what);
    if (PyCapsule_CheckExact(o) || PyObject_HasAttrString(o, "__dlpack__"))
        return mem_from_dlpack(o, what);
    if (PyLong_Check(o)) {
        mem_fail(PyExc_TypeError, o, what, "is an int: a raw address needs its size (a (ptr, size) call)");
        return NULL;
    }
    mem_fail(PyExc_TypeError, o, what,
             "is not memory: pass a numpy array, a torch tensor, bytes/bytearray/memoryview or an object with "
             "__dlpack__");
    return NULL;
}

/* ---- the helper every call uses ------------------------------------------------------- */

int fp_buf_get(PyObject *o, Py_buffer *v, int flags, const char *what)
{
    PyObject *src;
    if (PyObject_CheckBuffer(o) && !PyObject_TypeCheck(o, &MemoryType)) {
        /* Probe a read-only strided view first, to say precisely what is
         * wrong rather than pass on the exporter's terse refusal. */
        Py_buffer probe;
        if (PyObject_GetBuffer(o, &probe, PyBUF_FULL_RO) == 0) {
            int contig = PyBuffer_IsContiguous(&probe, 'C');
            int ro = probe.readonly;
            PyBuffer_Release(&probe);
            int want_strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES;
            int want_c = (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS;
            if ((flags & PyBUF_WRITABLE) && ro)
                return mem_fail(PyExc_ValueError, o, what, "is read-only: a destination must be writable");
            if ((!want_strides || want_c) && !contig)
                return mem_fail(PyExc_ValueError, o, what,
                                "is not contiguous: pass a C-contiguous one (numpy.ascontiguousarray(a), "
                                "t.contiguous()); nothing is copied behind your back");
        } else {
            PyErr_Clear();
        }
        src = Py_NewRef(o);
    } else {
        src = fp_memory(o, what);
        if (!src)
            return -1;
        MemoryObject *m = (MemoryObject *)src;
        int want_strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES;
        int want_c = (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS;
        if ((flags & PyBUF_WRITABLE) && m->readonly) {
            Py_DECREF(src);
            return mem_fail(PyExc_ValueError, o, what, "is read-only: a destination must be writable");
        }
        if ((!want_strides || want_c) && !m->contiguous) {
            Py_DECREF(src);
            return mem_fail(PyExc_ValueError, o, what,
                            "is not contiguous: pass a contiguous one (t.contiguous(), "
                            "numpy.ascontiguousarray(a)); nothing is copied behind your back");
        }
    }
    int rc = PyObject_GetBuffer(src, v, flags);
    Py_DECREF(src);
    if (rc < 0) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *s = ev ? PyObject_Str(ev) : NULL;
        const char *txt = s ? PyUnicode_AsUTF8(s) : NULL;
        char msg[512];
        snprintf(msg, sizeof msg, "was refused by its exporter: %s", txt ? txt : "(no reason given)");
        PyErr_Clear();
        Py_XDECREF(s);
        PyObject *cls = et ? et : PyExc_BufferError;
        mem_fail(cls, o, what, msg);
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        return -1;
    }
    return 0;
}

const char *fp_buf_dtype(const Py_buffer *v)
{
    if (v->obj && PyObject_TypeCheck(v->obj, &MemoryType)) {
        const MemoryObject *m = (const MemoryObject *)v->obj;
        return m->dtype[0] ? m->dtype : NULL;
    }
    return fp_format_dtype(v->format, v->itemsize);
}

/* memory(obj, what="buffer", writable=False) -> Memory */
static PyObject *fp_memory_fn(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwl[] = {"obj", "what", "writable", NULL};
    PyObject *o;
    const char *what = "buffer";
    int writable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|sp:memory", kwl, &o, &what, &writable))
        return NULL;
    PyObject *m = fp_memory(o, what);
    if (m && writable && ((MemoryObject *)m)->readonly) {
        Py_DECREF(m);
        mem_fail(PyExc_ValueError, o, what, "is read-only: a destination must be writable");
        return NULL;
    }
    return m;
}

/* _view(obj, what, writable) -> a memoryview of obj's memory under
 * fp_buf_get's rules (C-contiguous; writable for a destination), for the
 * calls written in Python over the cffi binding */
static PyObject *fp_view_fn(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o;
    const char *what;
    int writable;
    if (!PyArg_ParseTuple(args, "Osp:_view", &o, &what, &writable))
        return NULL;
    Py_buffer v;
    if (fp_buf_get(o, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0), what) < 0)
        return NULL;
    PyObject *mv = PyMemoryView_FromObject(v.obj);
    PyBuffer_Release(&v);
    return mv;
}

static PyMethodDef mem_functions[] = {
    {"_view", fp_view_fn, METH_VARARGS, "_view($module, obj, what, writable, /)\n--\n\n"
     "_view(obj, what, writable) -> memoryview of obj's memory, refused as every call refuses it"},
    {"memory", FP_KWFN(fp_memory_fn), METH_VARARGS | METH_KEYWORDS,
     "memory($module, /, obj, what='buffer', writable=False)\n--\n\n"
     "memory(obj, what='buffer', writable=False) -> Memory: the memory of an array, buffer or tensor (CPU), "
     "held until the Memory is dropped; errors name it `what`"},
    {NULL, NULL, 0, NULL},
};

int fp_mem_init(PyObject *m)
{
    if (fp_add_type(m, "Memory", &MemoryType) < 0)
        return -1;
    return PyModule_AddFunctions(m, mem_functions);
}
