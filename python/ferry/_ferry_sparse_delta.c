/* _ferry: the delta encoder from Python (ferry.sparse.DeltaEncoder,
 * ferry.torch.DeltaPublisher) over include/ferry/weights.h: a capsule
 * holding a ferry_delta_encoder, and its publish from this rank's shards
 * (the buffers of ferry.WeightPublisher.publish_shards: numpy arrays or
 * CPU torch tensors), run with the GIL released while the buffers stay
 * held. */
#include <string.h>

#include "_ferry.h"
#include "ferry/weights.h"

#define CAPSULE "ferry.delta_encoder"

typedef struct fp_delta {
    ferry_delta_encoder *e;
    uint32_t rank;
    int busy;                    /* a publish is running on it (the GIL is released) */
} fp_delta;

static void delta_capsule_free(PyObject *cap)
{
    fp_delta *x = PyCapsule_GetPointer(cap, CAPSULE);
    if (!x)
        return;
    ferry_delta_encoder_close(x->e);
    PyMem_Free(x);
}

static fp_delta *delta_of(PyObject *cap)
{
    fp_delta *x = PyCapsule_GetPointer(cap, CAPSULE);
    if (x && !x->e) {
        PyErr_SetString(PyExc_ValueError, "the delta encoder is closed");
        return NULL;
    }
    if (x && x->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the delta encoder is publishing in another thread");
        return NULL;
    }
    return x;
}

/* delta_open(model, rank, world, rank_node or None, out_dtype, segment,
 * keep, timeout_ms, crossover, max_chain) -> capsule */
static PyObject *d_open(PyObject *self, PyObject *args)
{
    (void)self;
    const char *model, *out_dtype;
    unsigned rank, world, keep, max_chain;
    unsigned long long segment, timeout;
    double crossover;
    PyObject *ro;
    if (!PyArg_ParseTuple(args, "sIIOsKIKdI:delta_open", &model, &rank, &world, &ro, &out_dtype, &segment,
                          &keep, &timeout, &crossover, &max_chain))
        return NULL;
    ferry_publisher_config pc;
    if (fp_publisher_config(&pc, model, out_dtype, rank, world, segment, keep, timeout) < 0)
        return NULL;
    uint32_t *nodes = NULL;
    if (ro != Py_None) {
        PyObject *seq = PySequence_Fast(ro, "rank_node must be a sequence of ints or None");
        if (!seq)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n != (Py_ssize_t)world) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "rank_node holds %zd entries; the world is %u", n, world);
        }
        nodes = PyMem_Calloc((size_t)n + 1, sizeof *nodes);
        for (Py_ssize_t i = 0; nodes && i < n; i++) {
            unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
            if (PyErr_Occurred() || v > UINT32_MAX) {
                Py_DECREF(seq);
                PyMem_Free(nodes);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "rank_node: a node id past 2^32");
                return NULL;
            }
            nodes[i] = (uint32_t)v;
        }
        Py_DECREF(seq);
        if (!nodes)
            return PyErr_NoMemory();
        pc.rank_node = nodes;
    }
    ferry_delta_config dc;
    (void)ferry_delta_config_init(&dc);
    dc.crossover = crossover;
    dc.max_chain = max_chain;
    fp_delta *x = PyMem_Calloc(1, sizeof *x);
    ferry_error err = {0};
    int rc = x ? ferry_delta_encoder_open(&pc, &dc, &x->e, &err) : FERRY_ENOMEM;
    PyMem_Free(nodes);
    if (rc < 0) {
        PyMem_Free(x);
        return rc == FERRY_ENOMEM && !err.msg[0] ? PyErr_NoMemory() : fp_raise_err_class(rc, &err);
    }
    x->rank = rank;
    PyObject *cap = PyCapsule_New(x, CAPSULE, delta_capsule_free);
    if (!cap) {
        ferry_delta_encoder_close(x->e);
        PyMem_Free(x);
    }
    return cap;
}

#define F(m) FP_FIELD(ferry_delta_stats, m)
static const fp_field delta_fields[] = {
    F(chain), F(elements), F(changed), F(total_elements), F(total_changed), F(compared_bytes), F(objects),
    F(nnz), F(stored_bytes), F(part_bytes), F(encode_s), F(encode_gbps), F(exchange_s), F(store_s),
    F(commit_s), F(snapshot_s), F(total_s),
};
#undef F

static const char *const kinds[] = { "sparse", "dense_first", "dense_fraction", "dense_chain" };

/* delta_publish(capsule, store, generation, placement, mine) -> stats dict */
static PyObject *d_publish(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *so, *po, *mo;
    unsigned long long gen;
    if (!PyArg_ParseTuple(args, "OOKOO:delta_publish", &cap, &so, &gen, &po, &mo))
        return NULL;
    fp_delta *x = delta_of(cap);
    ferry_store *s = x ? fp_store_handle(so) : NULL;
    ferry_manifest *pl = s ? fp_manifest_of(po) : NULL;
    PyObject *items = pl ? fp_seq_hold(mo, "mine") : NULL, *out = NULL;
    if (!items)
        return NULL;
    size_t n = (size_t)PyTuple_GET_SIZE(items), held = 0;
    ferry_shard_data *d = PyMem_Calloc(n ? n : 1, sizeof *d);
    Py_buffer *v = PyMem_Calloc(n ? n : 1, sizeof *v);
    if (!d || !v) {
        PyErr_NoMemory();
        goto done;
    }
    ferry_delta_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    int rc;
    for (size_t i = 0; i < n; i++)
        if (fp_shard_item(pl, x->rank, PyTuple_GET_ITEM(items, (Py_ssize_t)i), i, &d[i], &v[i], &held) < 0) {
            /* This rank cannot take part: publish with none of its pieces,
             * so that every rank fails now (this one's layout misses them)
             * rather than at the timeout; raise this rank's own error. */
            PyObject *t, *e, *tb;
            PyErr_Fetch(&t, &e, &tb);
            x->busy = 1;
            FP_STORE_CALL(so, rc = ferry_delta_publish(s, x->e, gen, pl, NULL, 0, &st, &err));
            x->busy = 0;
            (void)rc;
            PyErr_Restore(t, e, tb);
            goto done;
        }
    x->busy = 1;
    FP_STORE_CALL(so, rc = ferry_delta_publish(s, x->e, gen, pl, d, n, &st, &err));
    x->busy = 0;
    if (rc < 0) {
        fp_raise_err_class(rc, &err);
        goto done;
    }
    out = FP_FIELDS_DICT(&st, delta_fields);
    PyObject *dense = out ? PyDict_New() : NULL;
    if (!dense || fp_publish_stats_put(dense, gen, &st.dense, true) < 0 ||
        fp_dict_set(out, "generation", PyLong_FromUnsignedLongLong(gen)) < 0 ||
        fp_dict_set(out, "kind", PyUnicode_FromString(kinds[(unsigned)st.kind < 4 ? st.kind : 0])) < 0) {
        Py_XDECREF(dense);
        Py_CLEAR(out);
    } else if (fp_dict_set(out, "dense", dense) < 0) {   /* takes dense either way */
        Py_CLEAR(out);
    }
done:
    for (size_t i = 0; i < held; i++)
        PyBuffer_Release(&v[i]);
    PyMem_Free(v);
    PyMem_Free(d);
    Py_DECREF(items);
    return out;
}

/* delta_reset(capsule): forget the snapshot. */
static PyObject *d_reset(PyObject *self, PyObject *cap)
{
    (void)self;
    fp_delta *x = delta_of(cap);
    if (!x)
        return NULL;
    ferry_delta_encoder_reset(x->e);
    Py_RETURN_NONE;
}

/* delta_bytes(capsule) -> the snapshot's bytes */
static PyObject *d_bytes(PyObject *self, PyObject *cap)
{
    (void)self;
    fp_delta *x = delta_of(cap);
    return x ? PyLong_FromUnsignedLongLong(ferry_delta_encoder_bytes(x->e)) : NULL;
}

/* delta_close(capsule): free the encoder now (later calls raise). */
static PyObject *d_close(PyObject *self, PyObject *cap)
{
    (void)self;
    fp_delta *x = PyCapsule_GetPointer(cap, CAPSULE);
    if (!x)
        return NULL;
    if (x->busy)
        return PyErr_Format(PyExc_RuntimeError, "the delta encoder is publishing in another thread");
    ferry_delta_encoder_close(x->e);
    x->e = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef delta_methods[] = {
    {"delta_open", d_open, METH_VARARGS,
     "delta_open($module, model, rank, world, rank_node, out_dtype, segment, keep, timeout_ms, crossover, "
     "max_chain, /)\n--\n\n"
     "delta_open(...) -> a delta encoder (ferry_delta_encoder_open)"},
    {"delta_publish", d_publish, METH_VARARGS,
     "delta_publish($module, encoder, store, generation, placement, mine, /)\n--\n\n"
     "delta_publish(encoder, store, generation, placement, [(fragment id, buffer)]) -> stats dict"},
    {"delta_reset", d_reset, METH_O, "delta_reset($module, encoder, /)\n--\n\nForget the snapshot."},
    {"delta_bytes", d_bytes, METH_O, "delta_bytes($module, encoder, /)\n--\n\nThe snapshot's bytes."},
    {"delta_close", d_close, METH_O, "delta_close($module, encoder, /)\n--\n\nFree the encoder."},
    {NULL, NULL, 0, NULL},
};

int fp_sparse_delta_init(PyObject *m)
{
    return PyModule_AddFunctions(m, delta_methods);
}
