/* _ferry: Plan, PlanIter and PlanCache (ferry.reshard.Plan, PlanCache):
 * plans, iteration over regions and runs as tuples, the plan cache. */
#include <string.h>

#include "_ferry.h"

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

/* (src, dst, **limits): two Manifests and the plan options. 0 or -1. */
static int plan_args(PyObject *args, PyObject *kw, ferry_manifest **src, ferry_manifest **dst, ferry_plan_options *o)
{
    PyObject *so, *dobj;
    if (!PyArg_ParseTuple(args, "OO", &so, &dobj))
        return -1;
    *src = fp_manifest_of(so);
    *dst = *src ? fp_manifest_of(dobj) : NULL;
    return !*dst || options_from(kw, o) < 0 ? -1 : 0;
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)type;
    ferry_manifest *src, *dst;
    ferry_plan_options o;
    if (plan_args(args, kw, &src, &dst, &o) < 0)
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
#define F(m) FP_FIELD(ferry_plan_stats, m)
    static const fp_field f[] = {
        F(tensors), F(src_fragments), F(dst_fragments), F(regions), F(runs),
        F(bytes), F(max_rank_bytes), F(mean_rank_bytes), F(dst_ranks), F(plan_s),
    };
#undef F
    PyObject *d = FP_FIELDS_DICT(&s, f);
    if (d && (fp_dict_set(d, "src_digest", fp_hex16(s.src_digest)) < 0 ||
              fp_dict_set(d, "dst_digest", fp_hex16(s.dst_digest)) < 0 ||
              fp_dict_set(d, "topology_digest", fp_hex16(s.topology_digest)) < 0))
        Py_CLEAR(d);
    return d;
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
                             (unsigned long long)r.dst_fragment, r.src_rank, r.dst_rank, fp_tuple_u64(r.offset, r.ndim),
                             fp_tuple_u64(r.shape, r.ndim), (unsigned long long)r.bytes);
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
    {"stats", (PyCFunction)plan_stats, METH_NOARGS, "stats($self, /)\n--\n\n"
     "dict of counts, bytes, time and digests"},
    {"iter", FP_KWFN(plan_iter), METH_VARARGS | METH_KEYWORDS,
     "iter($self, /, kind, tensor=-1, src_rank=-1, dst_rank=-1)\n--\n\n"
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
    .tp_doc = "Plan(src, dst, max_fragments=0, max_regions=0, max_overlaps=0)\n--\n\n" "Plan(src, dst, max_fragments=0, max_regions=0, max_overlaps=0)",
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
    ferry_manifest *src, *dst;
    ferry_plan_options o;
    if (plan_args(args, kw, &src, &dst, &o) < 0)
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
    {"get", FP_KWFN(cache_get), METH_VARARGS | METH_KEYWORDS, "get($self, /, src, dst, **limits)\n--\n\n"
     "get(src, dst, **limits) -> (Plan, hit)"},
    {"size", (PyCFunction)cache_len, METH_NOARGS, "size($self, /)\n--\n\n"
     "plans held"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.PlanCache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PlanCache(capacity=16)\n--\n\n" "PlanCache(capacity=16): plans keyed by manifest and topology digests",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)cache_init,
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_methods = cache_methods,
};


ferry_plan *fp_plan_of(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &PlanType) || !((PlanObject *)o)->p) {
        PyErr_SetString(PyExc_TypeError, "expected a Plan");
        return NULL;
    }
    return ((PlanObject *)o)->p;
}

int fp_plan_init(PyObject *m)
{
    if (fp_add_type(m, "Plan", &PlanType) < 0 || fp_add_type(m, "PlanIter", &PlanIterType) < 0 ||
        fp_add_type(m, "PlanCache", &CacheType) < 0)
        return -1;
    return 0;
}
