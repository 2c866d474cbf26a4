/* _ferry reshard types: Manifest, Model, Plan, PlanIter, PlanCache and the
 * preset / layout functions. Thin: every check is the C library's. The GIL
 * is held throughout (manifests are built by one thread). */
#include <string.h>

#include "_ferry.h"

/* ---- helpers ---------------------------------------------------------------- */

/* A sequence of at most FERRY_MAX_DIMS non-negative ints into out; *n its
 * length. None leaves out untouched and *n = UINT32_MAX. */
static int dims_from(PyObject *o, uint64_t *out, uint32_t *n, const char *what)
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

static PyObject *tuple_u64(const uint64_t *v, uint32_t n)
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

static PyObject *hex16(const uint8_t d[16])
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

static PyTypeObject ManifestType;

/* Wrap m (the reference is stolen). */
static PyObject *manifest_wrap(ferry_manifest *m)
{
    ManifestObject *o = PyObject_New(ManifestObject, &ManifestType);
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
    if (dims_from(shape, t.shape, &t.ndim, "shape") < 0)
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
    if (dims_from(offset, f.offset, &n1, "offset") < 0 || dims_from(shape, f.shape, &n2, "shape") < 0 ||
        dims_from(strides, f.strides, &n3, "strides") < 0)
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
    if (dims_from(parts, p, &n1, "parts") < 0 || dims_from(rstride, r, &n2, "rank_stride") < 0 ||
        dims_from(offset, s.offset, &n3, "offset") < 0 || dims_from(shape, s.shape, &n4, "shape") < 0)
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
    return Py_BuildValue("(ssIN)", t.name, t.dtype, t.itemsize, tuple_u64(t.shape, t.ndim));
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
    PyObject *strides = f.has_strides ? tuple_u64(f.strides, t.ndim) : (Py_INCREF(Py_None), Py_None);
    return Py_BuildValue("{sI,sI,sI,sI,sN,sN,sN,sK,sz,sK}", "tensor", f.tensor, "rank", f.rank, "node", f.node,
                         "replica", f.replica, "offset", tuple_u64(f.offset, t.ndim), "shape",
                         tuple_u64(f.shape, t.ndim), "strides", strides, "storage_offset",
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
    return rc < 0 ? fp_raise(rc, NULL) : hex16(d);
}

static PyObject *manifest_topology_digest(ManifestObject *self, PyObject *unused)
{
    (void)unused;
    uint8_t d[16];
    int rc = ferry_manifest_topology_digest(self->m, d);
    return rc < 0 ? fp_raise(rc, NULL) : hex16(d);
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
    return rc < 0 ? fp_raise_err(rc, &err) : manifest_wrap(m);
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
    return rc < 0 ? fp_raise_err(rc, &err) : manifest_wrap(m);
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

#define KWFN(f) (PyCFunction)(void (*)(void))(f)

static PyMethodDef manifest_methods[] = {
    {"add_tensor", KWFN(manifest_add_tensor), METH_VARARGS | METH_KEYWORDS, "add_tensor(name, dtype, shape) -> index"},
    {"add_fragment", KWFN(manifest_add_fragment), METH_VARARGS | METH_KEYWORDS,
     "add_fragment(tensor, rank, offset=None, shape=None, replica=0, strides=None, storage_offset=0, object=None, "
     "object_offset=0)"},
    {"add_split", KWFN(manifest_add_split), METH_VARARGS | METH_KEYWORDS,
     "add_split(tensor, rank=0, parts=None, rank_stride=None, offset=None, shape=None, replicas=1, "
     "replica_stride=0, replica=0)"},
    {"validate", (PyCFunction)manifest_validate, METH_NOARGS, "whole-manifest checks"},
    {"tensor", (PyCFunction)manifest_tensor, METH_O, "tensor(i) -> (name, dtype, itemsize, shape)"},
    {"find_tensor", (PyCFunction)manifest_find_tensor, METH_O, "find_tensor(name) -> index (KeyError)"},
    {"fragment", (PyCFunction)manifest_fragment, METH_O, "fragment(id) -> dict"},
    {"rank_bytes", (PyCFunction)manifest_rank_bytes, METH_O, "rank_bytes(rank) -> bytes the rank stores"},
    {"node_of", (PyCFunction)manifest_node_of, METH_O, "node_of(rank) -> node"},
    {"digest", (PyCFunction)manifest_digest, METH_NOARGS, "XXH3-128 hex of the tensors and fragments"},
    {"topology_digest", (PyCFunction)manifest_topology_digest, METH_NOARGS, "XXH3-128 hex of the topology"},
    {"to_json", (PyCFunction)manifest_to_json, METH_NOARGS, "the JSON text (docs/manifest.md)"},
    {"save", (PyCFunction)manifest_save, METH_O, "save(path): write the JSON atomically"},
    {"from_json", (PyCFunction)manifest_from_json, METH_O | METH_CLASS, "Manifest.from_json(text)"},
    {"load", (PyCFunction)manifest_load, METH_O | METH_CLASS, "Manifest.load(path)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef manifest_getset[] = {
    {"ranks", (getter)manifest_get_ranks, NULL, "ranks in the topology", NULL},
    {"tensor_count", (getter)manifest_get_ntensors, NULL, "tensors", NULL},
    {"fragment_count", (getter)manifest_get_nfrags, NULL, "fragments (empty split pieces excluded)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ManifestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Manifest",
    .tp_basicsize = sizeof(ManifestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Manifest(ranks, nodes=None, gpus_per_node=8): a placement manifest",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)manifest_init,
    .tp_dealloc = (destructor)manifest_dealloc,
    .tp_methods = manifest_methods,
    .tp_getset = manifest_getset,
};

static ferry_manifest *manifest_of(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &ManifestType) || !((ManifestObject *)o)->m) {
        PyErr_SetString(PyExc_TypeError, "expected a Manifest");
        return NULL;
    }
    return ((ManifestObject *)o)->m;
}

/* ---- Model ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ferry_model *m;
} ModelObject;

static PyTypeObject ModelType;

static const char *const role_names[] = {"replicated", "column", "row", "vocab"};

static int model_init(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"name", "layers", "experts", NULL};
    const char *name;
    unsigned int layers, experts = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sI|I", kwl, &name, &layers, &experts))
        return -1;
    ferry_model_free(self->m);
    self->m = NULL;
    int rc = ferry_model_create(name, layers, experts, &self->m);
    if (rc < 0) {
        fp_raise(rc, NULL);
        return -1;
    }
    return 0;
}

static void model_dealloc(ModelObject *self)
{
    ferry_model_free(self->m);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *model_add_tensor(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"name", "dtype", "shape", "role", "layer", "expert", NULL};
    const char *name, *dtype, *role = "replicated";
    PyObject *shape;
    int layer, expert = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ssOsi|i", kwl, &name, &dtype, &shape, &role, &layer, &expert))
        return NULL;
    ferry_model_tensor t = {.desc = {.name = name, .dtype = dtype, .itemsize = ferry_dtype_size(dtype)},
                            .layer = layer, .expert = expert};
    int r = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(role, role_names[i]))
            r = i;
    if (r < 0)
        return fp_raise(FERRY_EINVAL, "role: replicated, column, row or vocab");
    t.role = (enum ferry_tp_role)r;
    if (dims_from(shape, t.desc.shape, &t.desc.ndim, "shape") < 0)
        return NULL;
    if (t.desc.ndim == UINT32_MAX)
        t.desc.ndim = 0;
    ferry_error err = {0};
    int rc = ferry_model_add_tensor(self->m, &t, &err);
    if (rc < 0)
        return fp_raise_err(rc, &err);
    Py_RETURN_NONE;
}

static PyObject *model_tensors(ModelObject *self, PyObject *unused)
{
    (void)unused;
    size_t n = ferry_model_tensor_count(self->m);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        ferry_model_tensor t;
        ferry_model_tensor_at(self->m, i, &t);
        PyObject *x = Py_BuildValue("(ssNsii)", t.desc.name, t.desc.dtype, tuple_u64(t.desc.shape, t.desc.ndim),
                                    role_names[t.role], t.layer, t.expert);
        if (!x) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

static PyObject *model_get(ModelObject *self, void *what)
{
    switch ((int)(intptr_t)what) {
    case 0: return PyUnicode_FromString(ferry_model_name(self->m));
    case 1: return PyLong_FromUnsignedLong(ferry_model_layers(self->m));
    case 2: return PyLong_FromUnsignedLong(ferry_model_experts(self->m));
    case 3: return PyLong_FromUnsignedLongLong(ferry_model_param_count(self->m));
    case 4: return PyLong_FromUnsignedLongLong(ferry_model_bytes(self->m));
    default: return PyLong_FromSize_t(ferry_model_tensor_count(self->m));
    }
}

static PyMethodDef model_methods[] = {
    {"add_tensor", KWFN(model_add_tensor), METH_VARARGS | METH_KEYWORDS,
     "add_tensor(name, dtype, shape, role, layer, expert=-1); layer -1: embedding side, -2: head side"},
    {"tensors", (PyCFunction)model_tensors, METH_NOARGS, "[(name, dtype, shape, role, layer, expert)]"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"name", (getter)model_get, NULL, "name", (void *)0},
    {"layers", (getter)model_get, NULL, "layers", (void *)1},
    {"experts", (getter)model_get, NULL, "routed experts", (void *)2},
    {"param_count", (getter)model_get, NULL, "parameters", (void *)3},
    {"bytes", (getter)model_get, NULL, "bytes of all tensors", (void *)4},
    {"tensor_count", (getter)model_get, NULL, "tensors", (void *)5},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Model(name, layers, experts=0): a tensor list with parallelism roles",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)model_init,
    .tp_dealloc = (destructor)model_dealloc,
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};

/* ---- Plan and PlanIter --------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ferry_plan *p;
} PlanObject;

typedef struct {
    PyObject_HEAD
    PyObject *plan;            /* keeps the plan alive */
    ferry_plan_iter *it;
    int runs;
} PlanIterObject;

static PyTypeObject PlanType, PlanIterType;

static PyObject *plan_wrap(ferry_plan *p)
{
    PlanObject *o = PyObject_New(PlanObject, &PlanType);
    if (!o) {
        ferry_plan_free(p);
        return NULL;
    }
    o->p = p;
    return (PyObject *)o;
}

static int options_from(PyObject *kw, ferry_plan_options *o)
{
    memset(o, 0, sizeof *o);
    if (!kw)
        return 0;
    static const char *names[] = {"max_fragments", "max_regions", "max_overlaps"};
    uint64_t *slots[] = {&o->max_fragments, &o->max_regions, &o->max_overlaps};
    Py_ssize_t used = 0;
    for (int i = 0; i < 3; i++) {
        PyObject *v = PyDict_GetItemString(kw, names[i]);
        if (!v)
            continue;
        used++;
        *slots[i] = PyLong_AsUnsignedLongLong(v);
        if (PyErr_Occurred())
            return -1;
    }
    if (used != PyDict_Size(kw)) {
        PyErr_SetString(PyExc_TypeError, "options: max_fragments, max_regions, max_overlaps");
        return -1;
    }
    return 0;
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)type;
    PyObject *so, *dobj;
    if (!PyArg_ParseTuple(args, "OO", &so, &dobj))
        return NULL;
    ferry_manifest *src = manifest_of(so), *dst = src ? manifest_of(dobj) : NULL;
    ferry_plan_options o;
    if (!dst || options_from(kw, &o) < 0)
        return NULL;
    ferry_plan *p;
    ferry_error err = {0};
    int rc = ferry_plan_create(src, dst, &o, &p, &err);
    return rc < 0 ? fp_raise_err(rc, &err) : plan_wrap(p);
}

static void plan_dealloc(PlanObject *self)
{
    ferry_plan_free(self->p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *plan_stats(PlanObject *self, PyObject *unused)
{
    (void)unused;
    ferry_plan_stats s;
    ferry_plan_stats_get(self->p, &s);
    return Py_BuildValue("{sK,sK,sK,sK,sK,sK,sK,sd,sI,sd,sN,sN,sN}", "tensors", (unsigned long long)s.tensors,
                         "src_fragments", (unsigned long long)s.src_fragments, "dst_fragments",
                         (unsigned long long)s.dst_fragments, "regions", (unsigned long long)s.regions, "runs",
                         (unsigned long long)s.runs, "bytes", (unsigned long long)s.bytes, "max_rank_bytes",
                         (unsigned long long)s.max_rank_bytes, "mean_rank_bytes", s.mean_rank_bytes, "dst_ranks",
                         s.dst_ranks, "plan_s", s.plan_s, "src_digest", hex16(s.src_digest), "dst_digest",
                         hex16(s.dst_digest), "topology_digest", hex16(s.topology_digest));
}

static PyObject *plan_iter(PlanObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"kind", "tensor", "src_rank", "dst_rank", NULL};
    const char *kind;
    long long tensor = -1, sr = -1, dr = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|LLL", kwl, &kind, &tensor, &sr, &dr))
        return NULL;
    int runs = !strcmp(kind, "runs");
    if (!runs && strcmp(kind, "regions"))
        return fp_raise(FERRY_EINVAL, "kind: 'regions' or 'runs'");
    PlanIterObject *o = PyObject_New(PlanIterObject, &PlanIterType);
    if (!o)
        return NULL;
    ferry_plan_filter f = {tensor, sr, dr};
    o->it = NULL;
    o->runs = runs;
    Py_INCREF(self);
    o->plan = (PyObject *)self;
    int rc = ferry_plan_iter_open(self->p, &f, &o->it);
    if (rc < 0) {
        Py_DECREF(o);
        return fp_raise(rc, NULL);
    }
    return (PyObject *)o;
}

static void iter_dealloc(PlanIterObject *self)
{
    ferry_plan_iter_close(self->it);
    Py_XDECREF(self->plan);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *iter_next(PlanIterObject *self)
{
    if (!self->it)
        return NULL;
    if (!self->runs) {
        ferry_region r;
        int rc = ferry_plan_iter_next_region(self->it, &r);
        if (rc <= 0)
            return rc < 0 ? fp_raise(rc, NULL) : NULL;
        return Py_BuildValue("(IIKKIINNK)", r.tensor, r.src_tensor, (unsigned long long)r.src_fragment,
                             (unsigned long long)r.dst_fragment, r.src_rank, r.dst_rank, tuple_u64(r.offset, r.ndim),
                             tuple_u64(r.shape, r.ndim), (unsigned long long)r.bytes);
    }
    ferry_run r;
    int rc = ferry_plan_iter_next_run(self->it, &r);
    if (rc <= 0)
        return rc < 0 ? fp_raise(rc, NULL) : NULL;
    PyObject *loops = PyTuple_New(r.nouter);
    for (uint32_t i = 0; loops && i < r.nouter; i++) {
        PyObject *l = Py_BuildValue("(KKK)", (unsigned long long)r.count[i], (unsigned long long)r.src_stride[i],
                                    (unsigned long long)r.dst_stride[i]);
        if (!l) {
            Py_CLEAR(loops);
            break;
        }
        PyTuple_SET_ITEM(loops, i, l);
    }
    if (!loops)
        return NULL;
    return Py_BuildValue("(IKKIIzKKKNK)", r.tensor, (unsigned long long)r.src_fragment,
                         (unsigned long long)r.dst_fragment, r.src_rank, r.dst_rank, r.src_object,
                         (unsigned long long)r.src_offset, (unsigned long long)r.dst_offset,
                         (unsigned long long)r.len, loops, (unsigned long long)r.bytes);
}

static PyMethodDef plan_methods[] = {
    {"stats", (PyCFunction)plan_stats, METH_NOARGS, "dict of counts, bytes, time and digests"},
    {"iter", KWFN(plan_iter), METH_VARARGS | METH_KEYWORDS,
     "iter(kind, tensor=-1, src_rank=-1, dst_rank=-1): 'regions' -> (tensor, src_tensor, src_fragment, "
     "dst_fragment, src_rank, dst_rank, offset, shape, bytes); 'runs' -> (tensor, src_fragment, dst_fragment, "
     "src_rank, dst_rank, src_object, src_offset, dst_offset, len, loops, bytes)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(src, dst, max_fragments=0, max_regions=0, max_overlaps=0)",
    .tp_new = plan_new,
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_methods = plan_methods,
};

static PyTypeObject PlanIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.PlanIter",
    .tp_basicsize = sizeof(PlanIterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "iterator over a plan's regions or runs",
    .tp_dealloc = (destructor)iter_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iter_next,
};

/* ---- PlanCache ----------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ferry_plan_cache *c;
} CacheObject;

static int cache_init(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"capacity", NULL};
    Py_ssize_t cap = 16;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|n", kwl, &cap))
        return -1;
    ferry_plan_cache_free(self->c);
    self->c = NULL;
    int rc = cap > 0 ? ferry_plan_cache_create((size_t)cap, &self->c) : FERRY_EINVAL;
    if (rc < 0) {
        fp_raise(rc, "capacity must be positive");
        return -1;
    }
    return 0;
}

static void cache_dealloc(CacheObject *self)
{
    ferry_plan_cache_free(self->c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *cache_get(CacheObject *self, PyObject *args, PyObject *kw)
{
    PyObject *so, *dobj;
    if (!PyArg_ParseTuple(args, "OO", &so, &dobj))
        return NULL;
    ferry_manifest *src = manifest_of(so), *dst = src ? manifest_of(dobj) : NULL;
    ferry_plan_options o;
    if (!dst || options_from(kw, &o) < 0)
        return NULL;
    ferry_plan *p;
    bool hit;
    ferry_error err = {0};
    int rc = ferry_plan_cache_get(self->c, src, dst, &o, &p, &hit, &err);
    if (rc < 0)
        return fp_raise_err(rc, &err);
    return Py_BuildValue("(NO)", plan_wrap(p), hit ? Py_True : Py_False);
}

static PyObject *cache_len(CacheObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(ferry_plan_cache_size(self->c));
}

static PyMethodDef cache_methods[] = {
    {"get", KWFN(cache_get), METH_VARARGS | METH_KEYWORDS, "get(src, dst, **limits) -> (Plan, hit)"},
    {"size", (PyCFunction)cache_len, METH_NOARGS, "plans held"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.PlanCache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PlanCache(capacity=16): plans keyed by manifest and topology digests",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)cache_init,
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_methods = cache_methods,
};

/* ---- functions ------------------------------------------------------------------------ */

static PyObject *fn_preset(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    ferry_model *m;
    ferry_error err = {0};
    int rc = ferry_model_preset(name, &m, &err);
    if (rc < 0)
        return fp_raise_err(rc, &err);
    ModelObject *o = PyObject_New(ModelObject, &ModelType);
    if (!o) {
        ferry_model_free(m);
        return NULL;
    }
    o->m = m;
    return (PyObject *)o;
}

static PyObject *fn_presets(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *l = PyList_New(0);
    for (size_t i = 0; l && ferry_model_preset_name(i); i++) {
        PyObject *s = PyUnicode_FromString(ferry_model_preset_name(i));
        if (!s || PyList_Append(l, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(l);
            return NULL;
        }
        Py_DECREF(s);
    }
    return l;
}

static int layout_from(const char *text, unsigned gpn, ferry_layout *l)
{
    ferry_error err = {0};
    int rc = ferry_layout_parse(text, l, &err);
    if (rc < 0) {
        fp_raise_err(rc, &err);
        return -1;
    }
    if (gpn)
        l->gpus_per_node = gpn;
    return 0;
}

static PyObject *fn_parse_layout(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *text = PyUnicode_AsUTF8(arg);
    ferry_layout l;
    if (!text || layout_from(text, 0, &l) < 0)
        return NULL;
    char canon[128];
    ferry_layout_format(&l, canon, sizeof canon);
    return Py_BuildValue("{sI,sI,sI,sI,sI,sI,sI,sI,ss}", "fsdp", l.fsdp, "tp", l.tp, "dp", l.dp, "ep", l.ep, "pp",
                         l.pp, "gpus_per_node", l.gpus_per_node, "first_node", l.first_node, "ranks",
                         ferry_layout_ranks(&l), "text", canon);
}

static PyObject *fn_build(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwl[] = {"model", "layout", "gpus_per_node", NULL};
    PyObject *mo;
    const char *text;
    unsigned int gpn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!s|I", kwl, &ModelType, &mo, &text, &gpn))
        return NULL;
    ferry_layout l;
    if (layout_from(text, gpn, &l) < 0)
        return NULL;
    ferry_manifest *m;
    ferry_error err = {0};
    int rc = ferry_layout_build(((ModelObject *)mo)->m, &l, &m, &err);
    return rc < 0 ? fp_raise_err(rc, &err) : manifest_wrap(m);
}

static PyObject *fn_dtype_size(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *d = PyUnicode_AsUTF8(arg);
    return d ? PyLong_FromUnsignedLong(ferry_dtype_size(d)) : NULL;
}

static PyMethodDef fns[] = {
    {"preset", fn_preset, METH_O, "preset(name) -> Model"},
    {"presets", fn_presets, METH_NOARGS, "names of the model presets"},
    {"parse_layout", fn_parse_layout, METH_O, "parse_layout(text) -> dict"},
    {"build", KWFN(fn_build), METH_VARARGS | METH_KEYWORDS,
     "build(model, layout, gpus_per_node=0) -> Manifest of the model under the layout"},
    {"dtype_size", fn_dtype_size, METH_O, "dtype_size(name) -> bytes per element (0: unknown)"},
    {NULL, NULL, 0, NULL},
};

int fp_reshard_init(PyObject *m)
{
    PyTypeObject *types[] = {&ManifestType, &ModelType, &PlanType, &PlanIterType, &CacheType};
    const char *names[] = {"Manifest", "Model", "Plan", "PlanIter", "PlanCache"};
    for (int i = 0; i < 5; i++)
        if (PyType_Ready(types[i]) < 0 || PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0)
            return -1;
    for (PyMethodDef *f = fns; f->ml_name; f++) {
        PyObject *fo = PyCFunction_New(f, NULL);
        if (!fo || PyModule_AddObject(m, f->ml_name, fo) < 0) {
            Py_XDECREF(fo);
            return -1;
        }
    }
    return 0;
}
