/* _ferry: the Model type, presets and layouts (ferry.reshard.Model,
 * preset, presets, parse_layout, build, dtype_size). */
#include <string.h>

#include "_ferry.h"

/* ---- Model ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ferry_model *m;
} ModelObject;


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
    if (fp_dims(shape, t.desc.shape, &t.desc.ndim, "shape") < 0)
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
        PyObject *x = Py_BuildValue("(ssNsii)", t.desc.name, t.desc.dtype, fp_tuple_u64(t.desc.shape, t.desc.ndim),
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
    {"add_tensor", FP_KWFN(model_add_tensor), METH_VARARGS | METH_KEYWORDS,
     "add_tensor($self, /, name, dtype, shape, role, layer, expert=-1)\n--\n\n"
     "add_tensor(name, dtype, shape, role, layer, expert=-1); layer -1: embedding side, -2: head side"},
    {"tensors", (PyCFunction)model_tensors, METH_NOARGS, "tensors($self, /)\n--\n\n"
     "[(name, dtype, shape, role, layer, expert)]"},
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

PyTypeObject fp_ModelType = {
    FP_CLASS(model, ModelObject, "ferry._ferry.Model", Py_TPFLAGS_DEFAULT,
             "Model(name, layers, experts=0)\n--\n\n" "Model(name, layers, experts=0): a tensor list with parallelism roles"),
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
    ModelObject *o = PyObject_New(ModelObject, &fp_ModelType);
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
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!s|I", kwl, &fp_ModelType, &mo, &text, &gpn))
        return NULL;
    ferry_layout l;
    if (layout_from(text, gpn, &l) < 0)
        return NULL;
    ferry_manifest *m;
    ferry_error err = {0};
    int rc = ferry_layout_build(((ModelObject *)mo)->m, &l, &m, &err);
    return rc < 0 ? fp_raise_err(rc, &err) : fp_manifest_wrap(m);
}

static PyObject *fn_dtype_size(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *d = PyUnicode_AsUTF8(arg);
    return d ? PyLong_FromUnsignedLong(ferry_dtype_size(d)) : NULL;
}

static PyMethodDef fns[] = {
    {"preset", fn_preset, METH_O, "preset(name, /)\n--\n\n"
     "preset(name) -> Model"},
    {"presets", fn_presets, METH_NOARGS, "presets(/)\n--\n\n"
     "names of the model presets"},
    {"parse_layout", fn_parse_layout, METH_O, "parse_layout(text, /)\n--\n\n"
     "parse_layout(text) -> dict"},
    {"build", FP_KWFN(fn_build), METH_VARARGS | METH_KEYWORDS,
     "build(model, layout, gpus_per_node=0)\n--\n\n"
     "build(model, layout, gpus_per_node=0) -> Manifest of the model under the layout"},
    {"dtype_size", fn_dtype_size, METH_O, "dtype_size(name, /)\n--\n\n"
     "dtype_size(name) -> bytes per element (0: unknown)"},
    {NULL, NULL, 0, NULL},
};


int fp_model_init(PyObject *m)
{
    if (fp_add_type(m, "Model", &fp_ModelType) < 0)
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
