/* _ferry: the Manifest type (ferry.reshard.Manifest) and the helpers the
 * reshard files share. Thin: every check is the C library's; the GIL is
 * held throughout (a manifest is built by one thread). */
#include <string.h>

#include "_ferry.h"

/* ---- helpers ---------------------------------------------------------------- */

/* A sequence of at most FERRY_MAX_DIMS non-negative ints into out; *n its
 * length. None leaves out untouched and *n = UINT32_MAX. */
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

/* ---- Manifest ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ferry_manifest *m;
} ManifestObject;


PyObject *fp_manifest_wrap(ferry_manifest *m)
{
    ManifestObject *o = PyObject_New(ManifestObject, &fp_ManifestType);
    if (!o) {
        ferry_manifest_close(m);
        return NULL;
    }
    o->m = m;
    return (PyObject *)o;
}

static int manifest_init(ManifestObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"ranks", "nodes", "gpus_per_node", NULL};
    unsigned int ranks, gpn = 8;
    PyObject *nodes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I|OI", kwl, &ranks, &nodes, &gpn))
        return -1;
    uint32_t *nv = NULL;
    if (nodes != Py_None) {
        PyObject *seq = PySequence_Fast(nodes, "nodes: a sequence of ints");
        if (!seq)
            return -1;
        if ((unsigned)PySequence_Fast_GET_SIZE(seq) != ranks) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "nodes: one node per rank");
            return -1;
        }
        nv = PyMem_Calloc(ranks ? ranks : 1, sizeof *nv);
        for (unsigned i = 0; nv && i < ranks; i++) {
            unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
            if (PyErr_Occurred() || v > UINT32_MAX) {
                Py_DECREF(seq);
                PyMem_Free(nv);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "nodes: node numbers fit 32 bits");
                return -1;
            }
            nv[i] = (uint32_t)v;
        }
        Py_DECREF(seq);
        if (!nv) {
            PyErr_NoMemory();
            return -1;
        }
    }
    ferry_manifest_close(self->m);
    self->m = NULL;
    int rc = ferry_manifest_create(ranks, nv, gpn, &self->m);
    PyMem_Free(nv);
    if (rc < 0) {
        fp_raise(rc, ranks ? NULL : "a manifest needs at least one rank");
        return -1;
    }
    return 0;
}

static void manifest_dealloc(ManifestObject *self)
{
    ferry_manifest_close(self->m);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *manifest_add_tensor(ManifestObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"name", "dtype", "shape", NULL};
    const char *name, *dtype;
    PyObject *shape;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ssO", kwl, &name, &dtype, &shape))
        return NULL;
    ferry_tensor_desc t = {.name = name, .dtype = dtype, .itemsize = ferry_dtype_size(dtype)};
    if (fp_dims(shape, t.shape, &t.ndim, "shape") < 0)
        return NULL;
    if (t.ndim == UINT32_MAX)
        t.ndim = 0;
    ferry_error err = {0};
    int rc = ferry_manifest_add_tensor(self->m, &t, &err);
    return rc < 0 ? fp_raise_err(rc, &err) : PyLong_FromLong(rc);
}

static PyObject *manifest_add_fragment(ManifestObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tensor", "rank", "offset", "shape", "replica", "strides", "storage_offset",
                          "object", "object_offset", NULL};
    unsigned int tensor, rank, replica = 0;
    PyObject *offset = Py_None, *shape = Py_None, *strides = Py_None;
    unsigned long long so = 0, oo = 0;
    const char *object = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "II|OOIOKzK", kwl, &tensor, &rank, &offset, &shape, &replica,
                                     &strides, &so, &object, &oo))
        return NULL;
    ferry_fragment f = {.tensor = tensor, .rank = rank, .replica = replica, .storage_offset = so,
                        .object = object, .object_offset = oo};
    uint32_t n1, n2, n3;
    if (fp_dims(offset, f.offset, &n1, "offset") < 0 || fp_dims(shape, f.shape, &n2, "shape") < 0 ||
        fp_dims(strides, f.strides, &n3, "strides") < 0)
        return NULL;
    f.has_strides = n3 != UINT32_MAX;
    ferry_tensor_desc t;
    if (ferry_manifest_tensor(self->m, tensor, &t) == 0) {
        if ((n1 != UINT32_MAX && n1 != t.ndim) || (n2 != UINT32_MAX && n2 != t.ndim) ||
            (f.has_strides && n3 != t.ndim))
            return fp_raise(FERRY_EINVAL, "offset, shape and strides need one value per dim of the tensor");
        if (n2 == UINT32_MAX)   /* no shape: the rest of the tensor from offset */
            for (uint32_t d = 0; d < t.ndim; d++)
                f.shape[d] = f.offset[d] < t.shape[d] ? t.shape[d] - f.offset[d] : 0;
    }
    ferry_error err = {0};
    int rc = ferry_manifest_add_fragment(self->m, &f, &err);
    if (rc < 0)
        return fp_raise_err(rc, &err);
    Py_RETURN_NONE;
}

static PyObject *manifest_add_split(ManifestObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tensor", "rank", "parts", "rank_stride", "offset", "shape", "replicas",
                          "replica_stride", "replica", NULL};
    unsigned int tensor, rank = 0, replicas = 1, rs = 0, replica = 0;
    PyObject *parts = Py_None, *rstride = Py_None, *offset = Py_None, *shape = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I|IOOOOIII", kwl, &tensor, &rank, &parts, &rstride, &offset,
                                     &shape, &replicas, &rs, &replica))
        return NULL;
    ferry_split s = {.tensor = tensor, .rank = rank, .replicas = replicas, .replica_stride = rs,
                     .replica = replica};
    uint64_t p[FERRY_MAX_DIMS] = {0}, r[FERRY_MAX_DIMS] = {0};
    uint32_t n1, n2, n3, n4;
    if (fp_dims(parts, p, &n1, "parts") < 0 || fp_dims(rstride, r, &n2, "rank_stride") < 0 ||
        fp_dims(offset, s.offset, &n3, "offset") < 0 || fp_dims(shape, s.shape, &n4, "shape") < 0)
        return NULL;
    if ((n3 == UINT32_MAX) != (n4 == UINT32_MAX))
        return fp_raise(FERRY_EINVAL, "offset and shape come together");
    s.whole = n3 == UINT32_MAX;
    for (uint32_t d = 0; d < FERRY_MAX_DIMS; d++) {
        if (p[d] > UINT32_MAX || r[d] > UINT32_MAX)
            return fp_raise(FERRY_EINVAL, "parts and rank_stride fit 32 bits");
        s.parts[d] = (uint32_t)p[d];
        s.rank_stride[d] = (uint32_t)r[d];
    }
    ferry_error err = {0};
    int rc = ferry_manifest_add_split(self->m, &s, &err);
    if (rc < 0)
        return fp_raise_err(rc, &err);
    Py_RETURN_NONE;
}

static PyObject *manifest_validate(ManifestObject *self, PyObject *unused)
{
    (void)unused;
    ferry_error err = {0};
    int rc = ferry_manifest_validate(self->m, &err);
    if (rc < 0)
        return fp_raise_err(rc, &err);
    Py_RETURN_NONE;
}

static PyObject *manifest_tensor(ManifestObject *self, PyObject *arg)
{
    unsigned long i = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return NULL;
    ferry_tensor_desc t;
    if (i > UINT32_MAX || ferry_manifest_tensor(self->m, (uint32_t)i, &t) < 0) {
        PyErr_SetString(PyExc_IndexError, "tensor index out of range");
        return NULL;
    }
    return Py_BuildValue("(ssIN)", t.name, t.dtype, t.itemsize, fp_tuple_u64(t.shape, t.ndim));
}

static PyObject *manifest_find_tensor(ManifestObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    int rc = ferry_manifest_find_tensor(self->m, name);
    if (rc < 0) {
        PyErr_Format(PyExc_KeyError, "%s", name);
        return NULL;
    }
    return PyLong_FromLong(rc);
}

static PyObject *manifest_fragment(ManifestObject *self, PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    ferry_fragment f;
    if (ferry_manifest_fragment(self->m, id, &f) < 0) {
        PyErr_SetString(PyExc_IndexError, "fragment id out of range");
        return NULL;
    }
    ferry_tensor_desc t;
    ferry_manifest_tensor(self->m, f.tensor, &t);
    PyObject *strides = f.has_strides ? fp_tuple_u64(f.strides, t.ndim) : (Py_INCREF(Py_None), Py_None);
    return Py_BuildValue("{sI,sI,sI,sI,sN,sN,sN,sK,sz,sK}", "tensor", f.tensor, "rank", f.rank, "node", f.node,
                         "replica", f.replica, "offset", fp_tuple_u64(f.offset, t.ndim), "shape",
                         fp_tuple_u64(f.shape, t.ndim), "strides", strides, "storage_offset",
                         (unsigned long long)f.storage_offset, "object", f.object, "object_offset",
                         (unsigned long long)f.object_offset);
}

static PyObject *manifest_rank_bytes(ManifestObject *self, PyObject *arg)
{
    unsigned long r = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return NULL;
    uint64_t b;
    if (r > UINT32_MAX || ferry_manifest_rank_bytes(self->m, (uint32_t)r, &b) < 0) {
        PyErr_SetString(PyExc_IndexError, "rank out of range");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(b);
}

static PyObject *manifest_node_of(ManifestObject *self, PyObject *arg)
{
    unsigned long r = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return NULL;
    if (r >= ferry_manifest_rank_count(self->m)) {
        PyErr_SetString(PyExc_IndexError, "rank out of range");
        return NULL;
    }
    return PyLong_FromUnsignedLong(ferry_manifest_node_of(self->m, (uint32_t)r));
}

static PyObject *manifest_digest(ManifestObject *self, PyObject *unused)
{
    (void)unused;
    uint8_t d[16];
    int rc = ferry_manifest_digest(self->m, d);
    return rc < 0 ? fp_raise(rc, NULL) : fp_hex16(d);
}

static PyObject *manifest_topology_digest(ManifestObject *self, PyObject *unused)
{
    (void)unused;
    uint8_t d[16];
    int rc = ferry_manifest_topology_digest(self->m, d);
    return rc < 0 ? fp_raise(rc, NULL) : fp_hex16(d);
}

static PyObject *manifest_to_json(ManifestObject *self, PyObject *unused)
{
    (void)unused;
    char *text = ferry_manifest_to_json(self->m);
    if (!text)
        return PyErr_NoMemory();
    PyObject *s = PyUnicode_FromString(text);
    free(text);
    return s;
}

static PyObject *manifest_save(ManifestObject *self, PyObject *arg)
{
    PyObject *path;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    ferry_error err = {0};
    int rc = ferry_manifest_save(self->m, PyBytes_AS_STRING(path), &err);
    Py_DECREF(path);
    if (rc < 0)
        return fp_raise_err(rc, &err);
    Py_RETURN_NONE;
}

static PyObject *manifest_from_json(PyObject *cls, PyObject *arg)
{
    (void)cls;
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(arg, &len);
    if (!text)
        return NULL;
    ferry_manifest *m;
    ferry_error err = {0};
    int rc = ferry_manifest_from_json(text, (size_t)len, &m, &err);
    return rc < 0 ? fp_raise_err(rc, &err) : fp_manifest_wrap(m);
}

static PyObject *manifest_load(PyObject *cls, PyObject *arg)
{
    (void)cls;
    PyObject *path;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    ferry_manifest *m;
    ferry_error err = {0};
    int rc = ferry_manifest_load(PyBytes_AS_STRING(path), &m, &err);
    Py_DECREF(path);
    return rc < 0 ? fp_raise_err(rc, &err) : fp_manifest_wrap(m);
}

static PyObject *manifest_get_ranks(ManifestObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(ferry_manifest_rank_count(self->m));
}

static PyObject *manifest_get_ntensors(ManifestObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(ferry_manifest_tensor_count(self->m));
}

static PyObject *manifest_get_nfrags(ManifestObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(ferry_manifest_fragment_count(self->m));
}

/* The layout with the tensors the rules pick stored as FP8 in blocks
 * (ferry_manifest_quantize); None arguments are the rules' defaults. */
static PyObject *manifest_quantize(ManifestObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"dtype", "include", "exclude", "scale_name", "block", "scale_format",
                          NULL};
    const char *sf = "f32";
    unsigned int b0 = 0, b1 = 0;
    ferry_quant_rules r;
    ferry_quant_rules_init(&r);
    r.dtype = r.include = r.exclude = r.scale_name = NULL;   /* NULL: the defaults */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzzz(II)s", kwl, &r.dtype, &r.include,
                                     &r.exclude, &r.scale_name, &b0, &b1, &sf))
        return NULL;
    r.fp8.block_rows = b0, r.fp8.block_cols = b1;
    if (!strcmp(sf, "ue8m0"))
        r.fp8.scale_format = FERRY_FP8_SCALE_UE8M0;
    else if (strcmp(sf, "f32")) {
        PyErr_Format(PyExc_ValueError, "scale_format must be 'f32' or 'ue8m0', not '%s'", sf);
        return NULL;
    }
    ferry_manifest *q;
    ferry_error err = {0};
    int rc = ferry_manifest_quantize(self->m, &r, &q, &err);
    return rc < 0 ? fp_raise_err(rc, &err) : fp_manifest_wrap(q);
}

static PyObject *manifest_tensor_quant(ManifestObject *self, PyObject *arg)
{
    unsigned long i = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return NULL;
    ferry_tensor_quant q;
    if (i > UINT32_MAX || ferry_manifest_tensor_quant(self->m, (uint32_t)i, &q) < 0) {
        PyErr_SetString(PyExc_IndexError, "tensor index out of range");
        return NULL;
    }
    if (q.role == FERRY_QUANT_NONE)
        Py_RETURN_NONE;
    return Py_BuildValue("{s:s,s:I,s:s,s:(II),s:s}", "role",
                         q.role == FERRY_QUANT_WEIGHT ? "weight" : "scale", "partner", q.partner,
                         "dtype", q.fp8_dtype, "block", q.fp8.block_rows, q.fp8.block_cols,
                         "scale_format",
                         q.fp8.scale_format == FERRY_FP8_SCALE_UE8M0 ? "ue8m0" : "f32");
}

static PyMethodDef manifest_methods[] = {
    {"add_tensor", FP_KWFN(manifest_add_tensor), METH_VARARGS | METH_KEYWORDS, "add_tensor($self, /, name, dtype, shape)\n--\n\n"
     "add_tensor(name, dtype, shape) -> index"},
    {"add_fragment", FP_KWFN(manifest_add_fragment), METH_VARARGS | METH_KEYWORDS,
     "add_fragment($self, /, tensor, rank, offset=None, shape=None, replica=0, strides=None, storage_offset=0, object=None, object_offset=0)\n--\n\n"
     "add_fragment(tensor, rank, offset=None, shape=None, replica=0, strides=None, storage_offset=0, object=None, "
     "object_offset=0)"},
    {"add_split", FP_KWFN(manifest_add_split), METH_VARARGS | METH_KEYWORDS,
     "add_split($self, /, tensor, rank=0, parts=None, rank_stride=None, offset=None, shape=None, replicas=1, replica_stride=0, replica=0)\n--\n\n"
     "add_split(tensor, rank=0, parts=None, rank_stride=None, offset=None, shape=None, replicas=1, "
     "replica_stride=0, replica=0)"},
    {"quantize", FP_KWFN(manifest_quantize), METH_VARARGS | METH_KEYWORDS,
     "quantize($self, /, dtype=None, include=None, exclude=None, scale_name=None, block=(0, 0), scale_format='f32')\n--\n\n"
     "quantize(dtype=None, include=None, exclude=None, scale_name=None, block=(0, 0), scale_format='f32') "
     "-> Manifest: the tensors the rules pick stored as FP8 in blocks, with their scale tensors "
     "(None and 0: the defaults: f8e4m3, every linear weight, '%s_scale_inv', 128 x 128)"},
    {"tensor_quant", (PyCFunction)manifest_tensor_quant, METH_O, "tensor_quant($self, i, /)\n--\n\n"
     "tensor_quant(i) -> None, or {role, partner, dtype, block, scale_format}"},
    {"validate", (PyCFunction)manifest_validate, METH_NOARGS, "validate($self, /)\n--\n\n"
     "whole-manifest checks"},
    {"tensor", (PyCFunction)manifest_tensor, METH_O, "tensor($self, i, /)\n--\n\n"
     "tensor(i) -> (name, dtype, itemsize, shape)"},
    {"find_tensor", (PyCFunction)manifest_find_tensor, METH_O, "find_tensor($self, name, /)\n--\n\n"
     "find_tensor(name) -> index (KeyError)"},
    {"fragment", (PyCFunction)manifest_fragment, METH_O, "fragment($self, id, /)\n--\n\n"
     "fragment(id) -> dict"},
    {"rank_bytes", (PyCFunction)manifest_rank_bytes, METH_O, "rank_bytes($self, rank, /)\n--\n\n"
     "rank_bytes(rank) -> bytes the rank stores"},
    {"node_of", (PyCFunction)manifest_node_of, METH_O, "node_of($self, rank, /)\n--\n\n"
     "node_of(rank) -> node"},
    {"digest", (PyCFunction)manifest_digest, METH_NOARGS, "digest($self, /)\n--\n\n"
     "XXH3-128 hex of the tensors and fragments"},
    {"topology_digest", (PyCFunction)manifest_topology_digest, METH_NOARGS, "topology_digest($self, /)\n--\n\n"
     "XXH3-128 hex of the topology"},
    {"to_json", (PyCFunction)manifest_to_json, METH_NOARGS, "to_json($self, /)\n--\n\n"
     "the JSON text (docs/manifest.md)"},
    {"save", (PyCFunction)manifest_save, METH_O, "save($self, path, /)\n--\n\n"
     "save(path): write the JSON atomically"},
    {"from_json", (PyCFunction)manifest_from_json, METH_O | METH_CLASS, "from_json($type, text, /)\n--\n\n"
     "Manifest.from_json(text)"},
    {"load", (PyCFunction)manifest_load, METH_O | METH_CLASS, "load($type, path, /)\n--\n\n"
     "Manifest.load(path)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef manifest_getset[] = {
    {"ranks", (getter)manifest_get_ranks, NULL, "ranks in the topology", NULL},
    {"tensor_count", (getter)manifest_get_ntensors, NULL, "tensors", NULL},
    {"fragment_count", (getter)manifest_get_nfrags, NULL, "fragments (empty split pieces excluded)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject fp_ManifestType = {
    FP_CLASS(manifest, ManifestObject, "ferry._ferry.Manifest", Py_TPFLAGS_DEFAULT,
             "Manifest(ranks, nodes=None, gpus_per_node=8)\n--\n\n" "Manifest(ranks, nodes=None, gpus_per_node=8): a placement manifest"),
};

ferry_manifest *fp_manifest_of(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &fp_ManifestType) || !((ManifestObject *)o)->m) {
        PyErr_SetString(PyExc_TypeError, "expected a Manifest");
        return NULL;
    }
    return ((ManifestObject *)o)->m;
}


int fp_manifest_init(PyObject *m)
{
    return fp_add_type(m, "Manifest", &fp_ManifestType);
}
