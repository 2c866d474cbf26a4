/* _ferry: weight updates from Python (ferry.weights, ferry.WeightPublisher,
 * ferry.WeightSubscriber, ferry.CompatGroup) over include/ferry/weights.h
 * and include/ferry/weights_compat.h. Thin: every check
 * of the generation, the manifest and the boxes is the C library's; this
 * file turns buffers into tensors and shards and adds one check the library
 * cannot make (a destination's itemsize against the published dtype).
 * Publishing and updates run with the GIL released while every buffer they
 * read or write stays held and the store is marked busy (Store.close()
 * refuses meanwhile); a subscriber keeps its store busy until it is closed. */
#include <stdlib.h>
#include <string.h>

#include "_ferry.h"

/* A sequence of non-negative ints into a new array of n entries (PyMem). */
static uint64_t *u64_seq(PyObject *o, size_t *n, uint64_t max, const char *what)
{
    PyObject *seq = fp_seq_hold(o, what);
    if (!seq)
        return NULL;
    size_t len = (size_t)PyTuple_GET_SIZE(seq);
    uint64_t *v = PyMem_Calloc(len ? len : 1, sizeof *v);
    if (!v) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned long long x = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(seq, (Py_ssize_t)i));
        if (x == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "%s[%zu] must be an int in [0, %llu]", what, i, (unsigned long long)max);
            goto fail;
        }
        if (x > max) {
            PyErr_Format(PyExc_ValueError, "%s[%zu] = %llu is above %llu", what, i, x, (unsigned long long)max);
            goto fail;
        }
        v[i] = x;
    }
    Py_DECREF(seq);
    *n = len;
    return v;
fail:
    Py_DECREF(seq);
    PyMem_Free(v);
    return NULL;
}

static uint32_t *u32_of(const uint64_t *v, size_t n)
{
    uint32_t *o = PyMem_Calloc(n ? n : 1, sizeof *o);
    if (!o) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        o[i] = (uint32_t)v[i];
    return o;
}

static PyObject *entry_dict(const ferry_weight_entry *e)
{
    PyObject *d = PyDict_New();
    if (!d || fp_dict_set(d, "name", fp_str_of(e->name)) < 0 || fp_dict_set(d, "dtype", fp_str_of(e->dtype)) < 0 ||
        fp_dict_set(d, "shape", fp_tuple_u64(e->shape, e->ndim)) < 0 || fp_dict_set(d, "bytes", fp_u64(e->bytes)) < 0 ||
        fp_dict_set(d, "checksum", fp_u64(e->checksum)) < 0 ||
        fp_dict_set(d, "publisher", PyLong_FromUnsignedLong(e->publisher)) < 0 ||
        fp_dict_set(d, "segment", fp_u64(e->segment)) < 0 || fp_dict_set(d, "key", fp_str_of(e->key)) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

#define F(m) FP_FIELD(ferry_update_stats, m)
static const fp_field update_fields[] = {
    F(generation), F(bytes_read), F(ranges), F(tensors), F(bytes_pushed), F(bytes_received),
    F(group_bytes_read), F(prepare_s), F(read_s), F(push_s), F(exchange_s), F(plan_s), F(forward_s),
    F(barrier_s), F(apply_s), F(batches), F(group_pushed_cross), F(group_pushed_intra), F(nic_max_in),
    F(nic_max_out), F(nic_mean_in), F(nic_mean_out), F(epoch), F(members), F(position), F(faults), F(total_s),
};
#undef F

#define F(m) FP_FIELD(ferry_update_node, m)
static const fp_field node_fields[] = {
    F(node), F(workers), F(store_read), F(pushed_in), F(pushed_out), F(pushed_intra), F(nic_in), F(nic_out),
};
#undef F

/* The group's per-node figures of a subscriber's last update as a list of
 * dicts (ascending node id). */
static PyObject *nodes_list(const ferry_subscriber *sub)
{
    int n = ferry_subscriber_nodes(sub, NULL, 0);
    ferry_update_node *v = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof *v);
    if (!v)
        return PyErr_NoMemory();
    n = n > 0 ? ferry_subscriber_nodes(sub, v, (size_t)n) : 0;
    PyObject *l = PyList_New(0);
    for (int i = 0; l && i < n; i++) {
        PyObject *d = FP_FIELDS_DICT(&v[i], node_fields);
        if (!d || PyList_Append(l, d) < 0)
            Py_CLEAR(l);
        Py_XDECREF(d);
    }
    PyMem_Free(v);
    return l;
}

/* ---- publishing ---------------------------------------------------------------------- */

int fp_publisher_config(ferry_publisher_config *cfg, const char *model, const char *out_dtype, uint32_t rank,
                        uint32_t world, uint64_t segment, uint32_t keep, uint64_t timeout_ms)
{
    memset(cfg, 0, sizeof *cfg);
    if (fp_copy_str(cfg->model, sizeof cfg->model, model, "model") < 0 ||
        fp_copy_str(cfg->out_dtype, sizeof cfg->out_dtype, out_dtype, "out_dtype") < 0)
        return -1;
    cfg->rank = rank;
    cfg->world = world;
    cfg->segment = segment;
    cfg->keep = keep;
    cfg->timeout_ms = timeout_ms;
    return 0;
}

/* weights_publish's counters after "generation" (policy_publish, in
 * ferry/_samples.py, reports the first PUBLISH_BASE_FIELDS: those that
 * predate the phase times). */
#define F(m) FP_FIELD(ferry_publish_stats, m)
static const fp_field publish_fields[] = {
    F(tensors), F(bytes), F(total_tensors), F(total_bytes), F(cross_node_bytes), F(put_s),
    F(commit_s), F(removed_generations), F(convert_s), F(store_s), F(barrier_s), F(local_bytes),
    F(swept_generations), F(faults), F(total_s),
};
#undef F
#define PUBLISH_BASE_FIELDS 8

int fp_publish_stats_put(PyObject *d, uint64_t generation, const ferry_publish_stats *st, bool all)
{
    if (fp_dict_set(d, "generation", fp_u64(generation)) < 0)
        return -1;
    return fp_dict_put_fields(d, st, publish_fields, all ? FP_NFIELDS(publish_fields) : PUBLISH_BASE_FIELDS);
}

/* What a publish returns to Python: its stats as a dict, or the error raised
 * (NULL). */
static PyObject *publish_outcome(int rc, const ferry_error *err, uint64_t gen,
                                 const ferry_publish_stats *st)
{
    if (rc < 0) {
        fp_raise_err_class(rc, err);
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out && fp_publish_stats_put(out, gen, st, true) < 0)
        Py_CLEAR(out);
    return out;
}


/* A Python exception is set: this rank cannot publish generation gen (its
 * own check failed before it reached ferry_publish). Tell the other ranks
 * through ferry_publish_abort, so that they fail now rather than after the
 * timeout, and raise the error every rank of the attempt gets, with this
 * rank's own exception as its __cause__. Returns NULL. */
static PyObject *publish_abort_raise(PyObject *so, ferry_store *s, ferry_publisher_config *cfg, uint64_t gen)
{
    PyObject *type, *val, *tb;
    PyErr_Fetch(&type, &val, &tb);
    PyErr_NormalizeException(&type, &val, &tb);
    if (tb && val)
        PyException_SetTraceback(val, tb);
    PyObject *str = val ? PyObject_Str(val) : NULL;
    const char *u = str ? PyUnicode_AsUTF8(str) : NULL;
    char why[512];
    snprintf(why, sizeof why, "%s", u && *u ? u : (type ? ((PyTypeObject *)type)->tp_name : "a check failed"));
    if (!u)
        PyErr_Clear();
    Py_XDECREF(str);
    ferry_error err = {0};
    int rc;
    cfg->rank_node = NULL;
    FP_STORE_CALL(so, rc = ferry_publish_abort(s, cfg, gen, why, &err));
    fp_raise_err_class(rc, &err);
    PyObject *t2, *v2, *tb2;
    PyErr_Fetch(&t2, &v2, &tb2);
    PyErr_NormalizeException(&t2, &v2, &tb2);
    if (v2 && val) {
        PyException_SetCause(v2, Py_NewRef(val));
        PyException_SetContext(v2, Py_NewRef(val));
    }
    Py_XDECREF(type);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    PyErr_Restore(t2, v2, tb2);
    return NULL;
}

/* weights_publish_abort(store, model, rank, world, timeout_ms, generation,
 * why): this rank cannot publish; raises what every rank gets. */
static PyObject *w_publish_abort(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so;
    const char *model, *why;
    unsigned int rank, world;
    unsigned long long timeout, gen;
    if (!PyArg_ParseTuple(args, "OsIIKKs:weights_publish_abort", &so, &model, &rank, &world, &timeout, &gen, &why))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    ferry_publisher_config cfg;
    if (fp_publisher_config(&cfg, model, "", rank, world, 0, 0, timeout) < 0)
        return NULL;
    ferry_error err = {0};
    int rc;
    FP_STORE_CALL(so, rc = ferry_publish_abort(s, &cfg, gen, why, &err));
    return fp_raise_err_class(rc, &err);
}

/* The quantization rules of a publish (publisher config's quant): None,
 * or (dtype, include, exclude, scale_name, (block_rows, block_cols),
 * scale_format) with None strings and 0 blocks the defaults. 1: rules in
 * *r, 0: none, -1: an exception set. The strings stay owned by q. */
static int quant_of(PyObject *q, ferry_quant_rules *r)
{
    if (!q || q == Py_None)
        return 0;
    const char *sf = "f32";
    unsigned int b0 = 0, b1 = 0;
    ferry_quant_rules_init(r);
    r->dtype = r->include = r->exclude = r->scale_name = NULL;   /* NULL: the defaults */
    if (!PyArg_ParseTuple(q, "zzzz(II)s:quant", &r->dtype, &r->include, &r->exclude,
                          &r->scale_name, &b0, &b1, &sf))
        return -1;
    r->fp8.block_rows = b0, r->fp8.block_cols = b1;
    if (!strcmp(sf, "ue8m0"))
        r->fp8.scale_format = FERRY_FP8_SCALE_UE8M0;
    else if (strcmp(sf, "f32")) {
        PyErr_Format(PyExc_ValueError, "scale_format must be 'f32' or 'ue8m0', not '%s'", sf);
        return -1;
    }
    return 1;
}

/* weights_publish(store, model, rank, world, rank_node, out_dtype, segment,
 * keep, timeout_ms, generation, tensors) -> stats dict. tensors: (name,
 * buffer) or (name, buffer, dtype), C-contiguous. A tensor or rank_node this
 * rank cannot use fails the attempt on every rank (publish_abort_raise). */
static PyObject *w_publish(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *ro, *to, *qo = NULL;
    const char *model, *out_dtype;
    unsigned int rank, world, keep;
    unsigned long long segment, timeout, gen;
    if (!PyArg_ParseTuple(args, "OsIIOsKIKKO|O:weights_publish", &so, &model, &rank, &world, &ro, &out_dtype, &segment,
                          &keep, &timeout, &gen, &to, &qo))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    ferry_publisher_config cfg;
    ferry_quant_rules qr;
    if (fp_publisher_config(&cfg, model, out_dtype, rank, world, segment, keep, timeout) < 0)
        return NULL;
    int qk = quant_of(qo, &qr);
    if (qk < 0)
        return NULL;
    cfg.quant = qk ? &qr : NULL;
    size_t nr = 0, n = 0, held = 0;
    bool called = false;
    uint32_t *nodes = NULL;
    PyObject *items = NULL, *out = NULL;
    ferry_weight_tensor *t = NULL;
    Py_buffer *v = NULL;
    uint64_t *nodes64 = u64_seq(ro, &nr, UINT32_MAX, "rank_node");
    if (!nodes64)
        goto done;
    nodes = u32_of(nodes64, nr);
    PyMem_Free(nodes64);
    if (!nodes)
        goto done;
    if (nr != world) {
        PyErr_Format(PyExc_ValueError, "rank_node has %zu entries for a world of %u", nr, world);
        goto done;
    }
    cfg.rank_node = nodes;
    if (!(items = fp_seq_hold(to, "tensors")))
        goto done;
    n = (size_t)PyTuple_GET_SIZE(items);
    t = PyMem_Calloc(n ? n : 1, sizeof *t);
    v = PyMem_Calloc(n ? n : 1, sizeof *v);
    if (!t || !v) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(items, (Py_ssize_t)i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) < 2 || PyTuple_GET_SIZE(it) > 3) {
            PyErr_Format(PyExc_TypeError, "tensors[%zu] must be (name, array) or (name, array, dtype)", i);
            goto done;
        }
        if (!(t[i].name = fp_key_of(PyTuple_GET_ITEM(it, 0), "tensor name")))
            goto done;
        char what[96];
        snprintf(what, sizeof what, "tensors[%zu] (%.40s)", i, t[i].name);
        if (fp_buf_get(PyTuple_GET_ITEM(it, 1), &v[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, what) < 0)
            goto done;
        held++;
        if (PyTuple_GET_SIZE(it) == 3) {
            if (!(t[i].dtype = fp_key_of(PyTuple_GET_ITEM(it, 2), "dtype")))
                goto done;
            if (ferry_dtype_size(t[i].dtype) != (uint32_t)v[i].itemsize) {
                PyErr_Format(PyExc_ValueError, "tensor %s: dtype %s does not match the array's %zd-byte elements",
                             t[i].name, t[i].dtype, v[i].itemsize);
                goto done;
            }
        } else if (!(t[i].dtype = fp_buf_dtype(&v[i]))) {
            PyErr_Format(PyExc_ValueError,
                         "tensor %s: no ferry dtype for buffer format '%s' (pass (name, array, dtype))", t[i].name,
                         v[i].format ? v[i].format : "B");
            goto done;
        }
        if (v[i].ndim > FERRY_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "tensor %s: at most %d dims", t[i].name, FERRY_MAX_DIMS);
            goto done;
        }
        t[i].ndim = (uint32_t)v[i].ndim;
        for (int d = 0; d < v[i].ndim; d++)
            t[i].shape[d] = (uint64_t)v[i].shape[d];
        t[i].data = v[i].buf;
    }
    ferry_publish_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    int rc;
    called = true;
    FP_STORE_CALL(so, rc = ferry_publish(s, &cfg, gen, t, n, &st, &err));
    out = publish_outcome(rc, &err, gen, &st);
done:
    if (!called && PyErr_Occurred())
        publish_abort_raise(so, s, &cfg, gen);   /* failed here, before ferry_publish */
    for (size_t i = 0; i < held; i++)
        PyBuffer_Release(&v[i]);
    PyMem_Free(v);
    PyMem_Free(t);
    Py_XDECREF(items);
    PyMem_Free(nodes);
    return out;
}

/* The bytes a fragment's data must hold: its dense size, or, with strides,
 * up to its last element past the storage offset. 0 for an empty box. */
static uint64_t fragment_extent(const ferry_fragment *f, uint32_t ndim, uint32_t itemsize)
{
    uint64_t last = 0, dense = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (f->shape[d] == 0)
            return 0;
        dense *= f->shape[d];
        last += (f->shape[d] - 1) * (f->has_strides ? f->strides[d] : 0);
    }
    return f->has_strides ? (f->storage_offset + last + 1) * itemsize : dense * itemsize;
}

/* One (fragment id, buffer) of weights_publish_shards, checked against the
 * placement: the fragment exists and is this rank's, and the buffer holds
 * what the fragment says, in its tensor's dtype. 0 or -1 raised. */
int fp_shard_item(ferry_manifest *pl, uint32_t rank, PyObject *it, size_t i, ferry_shard_data *d,
                  Py_buffer *v, size_t *held)
{
    if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
        PyErr_Format(PyExc_TypeError, "mine[%zu] must be (fragment id, buffer)", i);
        return -1;
    }
    unsigned long long id = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(it, 0));
    if (id == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "mine[%zu]: the fragment id must be a non-negative int", i);
        return -1;
    }
    ferry_fragment f;
    ferry_tensor_desc t;
    if (ferry_manifest_fragment(pl, id, &f) < 0 || ferry_manifest_tensor(pl, f.tensor, &t) < 0) {
        PyErr_Format(PyExc_ValueError, "mine[%zu]: fragment %llu is not in the placement", i, id);
        return -1;
    }
    if (f.rank != rank) {
        PyErr_Format(PyExc_ValueError, "mine[%zu]: fragment %llu (tensor %s) is rank %u's, not this rank's (%u)", i,
                     id, t.name, f.rank, rank);
        return -1;
    }
    char what[96];
    snprintf(what, sizeof what, "fragment %llu (%.40s)", id, t.name);
    if (fp_buf_get(PyTuple_GET_ITEM(it, 1), v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, what) < 0)
        return -1;
    (*held)++;
    const char *bd = fp_buf_dtype(v);
    if (bd && strcmp(bd, "u8") != 0 && strcmp(bd, t.dtype) != 0) {
        PyErr_Format(PyExc_ValueError, "%s: the buffer holds %s elements; the tensor is %s", what, bd, t.dtype);
        return -1;
    }
    uint64_t need = fragment_extent(&f, t.ndim, t.itemsize);
    if (f.has_strides ? (uint64_t)v->len < need : (uint64_t)v->len != need) {
        PyErr_Format(PyExc_ValueError, "%s: the buffer holds %zd bytes; the fragment needs %s%llu", what, v->len,
                     f.has_strides ? "at least " : "", (unsigned long long)need);
        return -1;
    }
    d->fragment = id;
    d->data = v->buf;
    return 0;
}

/* weights_publish_shards(store, model, rank, world, out_dtype, segment, keep,
 * timeout_ms, generation, placement, mine) -> stats dict. placement: a
 * Manifest of the whole trainer world (frozen by the call); mine: (fragment
 * id, buffer) for the fragments this rank holds. A buffer this rank cannot
 * use fails the attempt on every rank (publish_abort_raise). */
static PyObject *w_publish_shards(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *po, *mo, *qo = NULL;
    const char *model, *out_dtype;
    unsigned int rank, world, keep;
    unsigned long long segment, timeout, gen;
    if (!PyArg_ParseTuple(args, "OsIIsKIKKOO|O:weights_publish_shards", &so, &model, &rank, &world, &out_dtype,
                          &segment, &keep, &timeout, &gen, &po, &mo, &qo))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    ferry_publisher_config cfg;
    ferry_quant_rules qr;
    if (fp_publisher_config(&cfg, model, out_dtype, rank, world, segment, keep, timeout) < 0)
        return NULL;
    int qk = quant_of(qo, &qr);
    if (qk < 0)
        return NULL;
    cfg.quant = qk ? &qr : NULL;
    size_t n = 0, held = 0;
    bool called = false;
    PyObject *items = NULL, *out = NULL;
    ferry_shard_data *d = NULL;
    Py_buffer *v = NULL;
    ferry_manifest *pl = fp_manifest_of(po);
    if (!pl || !(items = fp_seq_hold(mo, "mine")))
        goto done;
    n = (size_t)PyTuple_GET_SIZE(items);
    d = PyMem_Calloc(n ? n : 1, sizeof *d);
    v = PyMem_Calloc(n ? n : 1, sizeof *v);
    if (!d || !v) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (fp_shard_item(pl, rank, PyTuple_GET_ITEM(items, (Py_ssize_t)i), i, &d[i], &v[i], &held) < 0)
            goto done;
    ferry_publish_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    int rc;
    called = true;
    FP_STORE_CALL(so, rc = ferry_publish_shards(s, &cfg, gen, pl, d, n, &st, &err));
    out = publish_outcome(rc, &err, gen, &st);
done:
    if (!called && PyErr_Occurred())
        publish_abort_raise(so, s, &cfg, gen);   /* failed here, before ferry_publish_shards */
    for (size_t i = 0; i < held; i++)
        PyBuffer_Release(&v[i]);
    PyMem_Free(v);
    PyMem_Free(d);
    Py_XDECREF(items);
    return out;
}

/* weights_publish_warm(store, model, rank, world, out_dtype, placement) ->
 * bytes touched (ferry_publish_warm). */
static PyObject *w_publish_warm(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *po;
    const char *model, *out_dtype;
    unsigned int rank, world;
    if (!PyArg_ParseTuple(args, "OsIIsO:weights_publish_warm", &so, &model, &rank, &world, &out_dtype,
                          &po))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    ferry_publisher_config cfg;
    if (fp_publisher_config(&cfg, model, out_dtype, rank, world, 0, 0, 0) < 0)
        return NULL;
    ferry_manifest *pl = fp_manifest_of(po);
    if (!pl)
        return NULL;
    uint64_t bytes = 0;
    ferry_error err = {0};
    int rc;
    FP_STORE_CALL(so, rc = ferry_publish_warm(s, &cfg, pl, &bytes, &err));
    if (rc < 0) {
        fp_raise_err_class(rc, &err);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(bytes);
}

/* ---- shards (fp_shards in _ferry.h) ---------------------------------------------------- */

void fp_shards_free(fp_shards *w)
{
    for (size_t i = 0; i < w->held; i++)
        PyBuffer_Release(&w->views[i]);
    PyMem_Free(w->views);
    PyMem_Free(w->sh);
    Py_CLEAR(w->items);
    memset(w, 0, sizeof *w);
}

int fp_shards_from(fp_shards *w, PyObject *o, int max_dims)
{
    memset(w, 0, sizeof *w);
    if (!(w->items = fp_seq_hold(o, "shards")))
        return -1;
    size_t n = (size_t)PyTuple_GET_SIZE(w->items);
    w->sh = PyMem_Calloc(n ? n : 1, sizeof *w->sh);
    w->views = PyMem_Calloc(n ? n : 1, sizeof *w->views);
    if (!w->sh || !w->views) {
        PyErr_NoMemory();
        goto fail;
    }
    w->n = n;
    for (size_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(w->items, (Py_ssize_t)i);
        ferry_param_shard *sh = &w->sh[i];
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) < 3 || PyTuple_GET_SIZE(it) > 4) {
            PyErr_Format(PyExc_TypeError, "shards[%zu] must be (tensor name, offset, array[, "
                         "dequantize dtype])", i);
            goto fail;
        }
        if (PyTuple_GET_SIZE(it) == 4 && PyTuple_GET_ITEM(it, 3) != Py_None) {
            /* explicit dequantization of an FP8 tensor (weights.h); the tuple holds the str */
            if (!(sh->dequantize = PyUnicode_AsUTF8(PyTuple_GET_ITEM(it, 3))))
                goto fail;
        }
        if (!(sh->tensor = fp_key_of(PyTuple_GET_ITEM(it, 0), "tensor name")))
            goto fail;
        Py_buffer *v = &w->views[i];
        char what[96];
        snprintf(what, sizeof what, "shards[%zu] (%.40s)", i, sh->tensor);
        if (fp_buf_get(PyTuple_GET_ITEM(it, 2), v, PyBUF_STRIDES | PyBUF_WRITABLE, what) < 0)
            goto fail;
        w->held++;
        uint32_t nd = 0;
        if (fp_dims(PyTuple_GET_ITEM(it, 1), sh->offset, &nd, "offset") < 0)
            goto fail;
        if (nd == UINT32_MAX)
            nd = (uint32_t)v->ndim;   /* None: the origin */
        if (v->ndim < 1 || v->ndim > max_dims || nd != (uint32_t)v->ndim) {
            PyErr_Format(PyExc_ValueError, "shard %zu (%s): the array has %d dims and the offset %u", i, sh->tensor,
                         v->ndim, nd);
            goto fail;
        }
        sh->ndim = nd;
        sh->dst = v->buf;
        sh->elem_bytes = v->itemsize > 0 ? (uint64_t)v->itemsize : 0;   /* checked at prepare */
        int contiguous = PyBuffer_IsContiguous(v, 'C');
        if (contiguous)   /* its size known at open: huge-page advice there (weights.h) */
            sh->dst_bytes = (uint64_t)v->len;
        for (int d = 0; d < v->ndim; d++) {
            sh->shape[d] = (uint64_t)v->shape[d];
            Py_ssize_t b = v->strides ? v->strides[d] : 0;
            if (contiguous)
                continue;
            if (b < 0 || v->itemsize <= 0 || b % v->itemsize) {
                PyErr_Format(PyExc_ValueError,
                             "shard %zu (%s): stride %zd of dim %d is not a non-negative multiple of the "
                             "%zd-byte elements",
                             i, sh->tensor, b, d, v->itemsize);
                goto fail;
            }
            sh->strides[d] = (int64_t)(b / v->itemsize);
        }
    }
    return 0;
fail:
    fp_shards_free(w);
    return -1;
}

/* ---- updates --------------------------------------------------------------------------- */

/* weights_update_direct(store, model, shards, generation) -> stats dict. */
static PyObject *w_update_direct(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *sho;
    const char *model;
    unsigned long long gen;
    if (!PyArg_ParseTuple(args, "OsOK:weights_update_direct", &so, &model, &sho, &gen))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    fp_shards w;
    if (fp_shards_from(&w, sho, FERRY_MAX_DIMS) < 0)
        return NULL;
    ferry_update_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    uint64_t g = gen;
    int rc;
    FP_STORE_CALL(so, rc = ferry_weights_update_direct(s, model, &g, w.sh, w.n, &st, &err));
    fp_shards_free(&w);
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    st.generation = g;
    return FP_FIELDS_DICT(&st, update_fields);
}

typedef struct {
    PyObject *fn;
    PyThreadState *ts;
    PyObject *exc[3];   /* raised by fn (type, value, traceback): re-raised after the update */
} compat_ctx;

static int compat_cb(void *ctx, const ferry_weight_entry *e, const void *data)
{
    compat_ctx *c = ctx;
    PyEval_RestoreThread(c->ts);
    int rc = 0;
    PyObject *d = entry_dict(e);
    PyObject *b = d ? PyByteArray_FromStringAndSize(data, (Py_ssize_t)e->bytes) : NULL;
    PyObject *r = b ? PyObject_CallFunctionObjArgs(c->fn, d, b, NULL) : NULL;
    if (!r) {
        PyErr_Fetch(&c->exc[0], &c->exc[1], &c->exc[2]);
        rc = FERRY_ECANCELED;
    }
    Py_XDECREF(r);
    Py_XDECREF(b);
    Py_XDECREF(d);
    c->ts = PyEval_SaveThread();
    return rc;
}

/* weights_update_compat(store, model, generation, fn) -> stats dict; fn(entry
 * dict, bytearray of the tensor) for every tensor in manifest order. */
static PyObject *w_update_compat(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *fn;
    const char *model;
    unsigned long long gen;
    if (!PyArg_ParseTuple(args, "OsKO:weights_update_compat", &so, &model, &gen, &fn))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    if (!PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "fn must be callable");
    compat_ctx c = {.fn = fn};
    ferry_update_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    uint64_t g = gen;
    int rc;
    fp_store_busy(so, 1);
    c.ts = PyEval_SaveThread();
    rc = ferry_weights_update_compat(s, model, &g, compat_cb, &c, &st, &err);
    PyEval_RestoreThread(c.ts);
    fp_store_busy(so, -1);
    if (c.exc[0]) {
        PyErr_Restore(c.exc[0], c.exc[1], c.exc[2]);
        return NULL;
    }
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    st.generation = g;
    return FP_FIELDS_DICT(&st, update_fields);
}

/* ---- WeightSubscriber ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *store;          /* strong reference, marked busy while open */
    ferry_subscriber *sub;
    fp_shards shards;          /* the parameter buffers stay held until close */
    char model[128];
    uint64_t generation;
    int inflight;
    /* standby copies (docs/weights.md, "Standby copies"); nstandby 0: none */
    PyObject *standby;        /* the caller's standby arrays, held */
    Py_buffer *sviews;        /* one held export per standby array */
    void **sbufs;
    size_t nstandby;
    PyObject *on_flip;        /* on_flip(copy, generation), or NULL */
} SubObject;

static void standby_free(SubObject *self)
{
    for (size_t i = 0; i < self->nstandby; i++)
        PyBuffer_Release(&self->sviews[i]);
    PyMem_Free(self->sviews);
    PyMem_Free(self->sbufs);
    self->sviews = NULL;
    self->sbufs = NULL;
    self->nstandby = 0;
    Py_CLEAR(self->standby);
    Py_CLEAR(self->on_flip);
}

static Py_ssize_t stride_of(const Py_buffer *v, int d)
{
    if (v->strides)
        return v->strides[d];
    Py_ssize_t st = v->itemsize;   /* no strides: C-contiguous */
    for (int k = v->ndim - 1; k > d; k--)
        st *= v->shape[k];
    return st;
}

/* standby: one writable array per shard, laid out as the shard's (same
 * shape, element size and strides): the second copy of its parameters. */
static int standby_from(SubObject *self, PyObject *o)
{
    if (!(self->standby = fp_seq_hold(o, "standby")))
        return -1;
    size_t n = (size_t)PyTuple_GET_SIZE(self->standby);
    if (n != self->shards.n) {
        PyErr_Format(PyExc_ValueError, "standby: %zu arrays for %zu shards", n, self->shards.n);
        return -1;
    }
    self->sviews = PyMem_Calloc(n ? n : 1, sizeof *self->sviews);
    self->sbufs = PyMem_Calloc(n ? n : 1, sizeof *self->sbufs);
    if (!self->sviews || !self->sbufs) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        Py_buffer *v = &self->sviews[i], *a = &self->shards.views[i];
        char what[96];
        snprintf(what, sizeof what, "standby[%zu] (%.40s)", i, self->shards.sh[i].tensor);
        if (fp_buf_get(PyTuple_GET_ITEM(self->standby, (Py_ssize_t)i), v, PyBUF_STRIDES | PyBUF_WRITABLE, what) < 0)
            return -1;
        self->nstandby++;
        int same = v->ndim == a->ndim && v->itemsize == a->itemsize;
        for (int d = 0; same && d < v->ndim; d++)
            same = v->shape[d] == a->shape[d] && (v->shape[d] <= 1 || stride_of(v, d) == stride_of(a, d));
        if (!same) {
            PyErr_Format(PyExc_ValueError, "%s: the standby array must have the shard's shape, element size and "
                         "strides", what);
            return -1;
        }
        if (v->buf == a->buf) {
            PyErr_Format(PyExc_ValueError, "%s: the standby array is the shard's own memory", what);
            return -1;
        }
        self->sbufs[i] = v->buf;
    }
    return 0;
}

static void sub_close_now(SubObject *self)
{
    ferry_subscriber *sub = self->sub;
    self->sub = NULL;
    if (sub) {
        Py_BEGIN_ALLOW_THREADS ferry_subscriber_close(sub);
        Py_END_ALLOW_THREADS
        fp_store_busy(self->store, -1);
    }
    fp_shards_free(&self->shards);
    standby_free(self);
}

static int sub_init(SubObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"store", "model", "group", "rank", "world", "shards", "timeout_ms", "node",
                          "batch_bytes", "local_segment", "member", "standby", "on_flip", NULL};
    PyObject *so, *sho, *sbo = Py_None, *flo = Py_None;
    const char *model, *group, *member = "";
    unsigned int rank, world, node = 0;
    unsigned long long timeout = 60000, batch = 0, segment = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OssIIO|KIKKsOO:WeightSubscriber", kwl, &so, &model, &group, &rank,
                                     &world, &sho, &timeout, &node, &batch, &segment, &member, &sbo, &flo))
        return -1;
    if (flo != Py_None && (sbo == Py_None || !PyCallable_Check(flo))) {
        PyErr_SetString(PyExc_TypeError, "on_flip must be a callable, and needs standby arrays");
        return -1;
    }
    if (fp_check_unopened(self->sub || self->store, "subscriber") < 0)
        return -1;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return -1;
    ferry_subscriber_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (fp_copy_str(cfg.model, sizeof cfg.model, model, "model") < 0 ||
        fp_copy_str(cfg.group, sizeof cfg.group, group, "group") < 0 ||
        fp_copy_str(cfg.member, sizeof cfg.member, member, "member") < 0)
        return -1;
    memcpy(self->model, cfg.model, sizeof self->model);
    cfg.rank = rank;
    cfg.world = world;
    cfg.timeout_ms = timeout;
    cfg.node = node;
    cfg.batch_bytes = batch;
    cfg.local_segment = segment;
    if (fp_shards_from(&self->shards, sho, FERRY_MAX_DIMS) < 0)
        return -1;
    if (sbo != Py_None && standby_from(self, sbo) < 0) {
        fp_shards_free(&self->shards);
        standby_free(self);
        return -1;
    }
    self->on_flip = flo != Py_None ? Py_NewRef(flo) : NULL;
    ferry_error err = {0};
    ferry_subscriber *sub = NULL;
    int rc;
    if (self->standby)
        FP_STORE_CALL(so, rc = ferry_subscriber_open_standby(s, &cfg, self->shards.sh, self->sbufs, self->shards.n,
                                                             NULL, NULL, &sub, &err));
    else
        FP_STORE_CALL(so, rc = ferry_subscriber_open(s, &cfg, self->shards.sh, self->shards.n, &sub, &err));
    if (rc < 0) {
        fp_shards_free(&self->shards);
        standby_free(self);
        fp_raise_err_class(rc, &err);
        return -1;
    }
    self->sub = sub;
    self->store = Py_NewRef(so);
    fp_store_busy(so, 1);   /* until close */
    return 0;
}

static SubObject *sub_open(SubObject *self)
{
    const char *busy = "an update is already running on this subscriber";
    return fp_check_open(self->sub, self->inflight, "subscriber", busy) < 0 ? NULL : self;
}

static PyObject *sub_update(SubObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"next", NULL};
    unsigned long long next = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|K:update", kwlist, &next))
        return NULL;
    if (!sub_open(self))
        return NULL;
    ferry_store *s = fp_store_handle(self->store);
    if (!s)
        return NULL;
    ferry_update_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    uint64_t g = self->generation;
    int rc;
    bool overlapped = false;
    self->inflight++;
    if (next) {   /* overlapped (weights.h, ferry_subscriber_update_next): next is not announced yet */
        Py_BEGIN_ALLOW_THREADS rc = ferry_subscriber_update_next(self->sub, next, &g, &overlapped, &st, &err);
        Py_END_ALLOW_THREADS
    } else {
        /* each shard's element size is checked by the update itself (elem_bytes) */
        Py_BEGIN_ALLOW_THREADS rc = ferry_subscriber_update(self->sub, &g, &st, &err);
        Py_END_ALLOW_THREADS
    }
    self->inflight--;
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    bool flipped = self->standby && g != self->generation;
    self->generation = g;
    st.generation = g;
    PyObject *d = FP_FIELDS_DICT(&st, update_fields);
    if (d && fp_dict_set(d, "nodes", nodes_list(self->sub)) < 0)
        Py_CLEAR(d);
    if (d && next && fp_dict_set(d, "overlapped", PyBool_FromLong(overlapped)) < 0)
        Py_CLEAR(d);
    if (d && flipped && self->on_flip) {   /* the flip, told before update() returns */
        ferry_standby_view v;
        (void)ferry_subscriber_active_view(self->sub, &v);
        PyObject *r = PyObject_CallFunction(self->on_flip, "IK", v.copy, (unsigned long long)v.generation);
        if (!r)
            Py_CLEAR(d);
        Py_XDECREF(r);
    }
    return d;
}

/* The caller's arrays of copy c (0: the shards', 1: the standby ones). */
static PyObject *copy_arrays(SubObject *self, uint32_t c)
{
    PyObject *t = PyTuple_New((Py_ssize_t)self->shards.n);
    for (size_t i = 0; t && i < self->shards.n; i++) {
        PyObject *a = c ? PyTuple_GET_ITEM(self->standby, (Py_ssize_t)i)
                        : PyTuple_GET_ITEM(PyTuple_GET_ITEM(self->shards.items, (Py_ssize_t)i), 2);
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, Py_NewRef(a));
    }
    return t;
}

static int sub_has_standby(SubObject *self)
{
    if (!self->sub) {
        fp_raise_class(FERRY_EINVAL, "subscriber: closed");
        return 0;
    }
    if (!self->standby) {
        fp_raise_class(FERRY_EINVAL, "subscriber: opened without standby arrays");
        return 0;
    }
    return 1;
}

/* read_begin() -> (copy, generation, arrays): pin the active copy. Runs
 * while an update is in flight on another thread (that is its purpose). */
static PyObject *sub_read_begin(SubObject *self, PyObject *unused)
{
    (void)unused;
    if (!sub_has_standby(self))
        return NULL;
    ferry_standby_view v;
    (void)ferry_subscriber_read_begin(self->sub, &v);
    PyObject *arr = copy_arrays(self, v.copy);
    if (!arr) {
        ferry_subscriber_read_end(self->sub, &v);
        return NULL;
    }
    return Py_BuildValue("(IKN)", v.copy, (unsigned long long)v.generation, arr);
}

static PyObject *sub_read_end(SubObject *self, PyObject *arg)
{
    unsigned long c = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred() || c > 1) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "read_end(copy): copy is the 0 or 1 read_begin returned");
        return NULL;
    }
    if (self->sub && self->standby) {   /* after close: nothing is pinned any more */
        ferry_standby_view v = { .copy = (uint32_t)c };
        ferry_subscriber_read_end(self->sub, &v);
    }
    Py_RETURN_NONE;
}

/* active -> (copy, generation, arrays), not pinned. */
static PyObject *sub_get_active(SubObject *self, void *closure)
{
    (void)closure;
    if (!sub_has_standby(self))
        return NULL;
    ferry_standby_view v;
    (void)ferry_subscriber_active_view(self->sub, &v);
    PyObject *arr = copy_arrays(self, v.copy);
    return arr ? Py_BuildValue("(IKN)", v.copy, (unsigned long long)v.generation, arr) : NULL;
}

FP_STORE_HOLDER_CLOSE(sub, SubObject, sub, "close: an update is still running on this subscriber")

static PyMethodDef sub_methods[] = {
    {"update", (PyCFunction)(void (*)(void))sub_update, METH_VARARGS | METH_KEYWORDS,
     "update($self, /, next=0)\n--\n\n"
     "update(next=0) -> stats: take the active generation with the whole group (every member calls it); "
     "next: an overlapped update of generation next, which the trainers may still be publishing (standby "
     "arrays; stats['overlapped'] says whether it overlapped or fell back to a plain update)"},
    {"read_begin", (PyCFunction)sub_read_begin, METH_NOARGS,
     "read_begin($self, /)\n--\n\n"
     "read_begin() -> (copy, generation, arrays): pin the active copy (standby arrays only); no update writes it "
     "until read_end(copy)"},
    {"read_end", (PyCFunction)sub_read_end, METH_O,
     "read_end($self, copy, /)\n--\n\n"
     "read_end(copy): unpin the copy read_begin returned"},
    FP_CLOSE_METHODS(sub, "close(): deregister the parameters and release the arrays"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sub_getset[] = {
    {"generation", fp_get_u64, NULL, "the generation the parameters hold (0: none yet)",
     FP_OFFSET(SubObject, generation)},
    FP_CLOSED_GETTER(sub, "whether close() ran"),
    {"active", (getter)sub_get_active, NULL,
     "(copy, generation, arrays) of the active copy (standby arrays only), not pinned", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SubType = {
    FP_CLASS(sub, SubObject, "ferry.WeightSubscriber", Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
             "WeightSubscriber(store, model, group, rank, world, shards, timeout_ms=60000, node=0, batch_bytes=0, local_segment=0, member='', standby=None, on_flip=None)\n--\n\n" "WeightSubscriber(store, model, group, rank, world, shards, timeout_ms=60000, node=0, batch_bytes=0, "
             "local_segment=0, member='', standby=None, on_flip=None): single-pull updates of a rollout group's parameters (see ferry.weights); "
             "world=0: an elastic group whose membership lives in the store (rank ignored; member names this one)"),
};

/* ---- CompatGroup ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *store;          /* strong reference, marked busy while open */
    ferry_compat_group *g;
    uint64_t generation;
    unsigned int rank;
    int inflight;
} CompatObject;

static void cg_close_now(CompatObject *self)
{
    ferry_compat_group *g = self->g;
    self->g = NULL;
    if (g) {
        Py_BEGIN_ALLOW_THREADS ferry_compat_group_close(g);
        Py_END_ALLOW_THREADS
        fp_store_busy(self->store, -1);
    }
}

static int cg_init(CompatObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"store", "model", "group", "rank", "world", "node", "staging_bytes", "timeout_ms",
                          "local_segment", NULL};
    PyObject *so;
    const char *model, *group;
    unsigned int rank, world, node = 0;
    unsigned long long staging = 0, timeout = 0, segment = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OssII|IKKK:CompatGroup", kwl, &so, &model, &group, &rank, &world,
                                     &node, &staging, &timeout, &segment))
        return -1;
    if (fp_check_unopened(self->g || self->store, "compat group") < 0)
        return -1;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return -1;
    ferry_compat_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (fp_copy_str(cfg.model, sizeof cfg.model, model, "model") < 0 ||
        fp_copy_str(cfg.group, sizeof cfg.group, group, "group") < 0)
        return -1;
    cfg.rank = rank;
    cfg.world = world;
    cfg.node = node;
    cfg.staging_bytes = staging;
    cfg.timeout_ms = timeout;
    cfg.local_segment = segment;
    ferry_error err = {0};
    ferry_compat_group *g = NULL;
    int rc;
    FP_STORE_CALL(so, rc = ferry_compat_group_open(s, &cfg, &g, &err));
    if (rc < 0) {
        fp_raise_err_class(rc, &err);
        return -1;
    }
    self->g = g;
    self->rank = rank;
    self->store = Py_NewRef(so);
    fp_store_busy(so, 1);   /* until close: the staging is registered with its engine */
    return 0;
}

#define F(m) FP_FIELD(ferry_compat_stats, m)
static const fp_field compat_fields[] = {
    F(generation), F(tensors), F(bytes), F(tensors_led), F(bytes_read), F(bytes_sent_cross), F(bytes_sent_intra),
    F(bytes_received), F(batches), F(imported), F(group_bytes_read), F(group_cross_bytes), F(group_intra_bytes),
    F(nodes), F(staging_slots), F(pipelined_batches), F(prepare_s), F(exchange_s), F(plan_s), F(read_s),
    F(wait_s), F(verify_s), F(load_s), F(barrier_s), F(apply_s), F(total_s), F(bytes_viewed), F(faults),
};
#undef F

/* update(fn) -> stats dict; fn(entry dict, bytearray of the tensor) for every
 * tensor in manifest order. An exception from fn stops the update on every
 * worker, and every worker raises the same: FERRY_EREBUILD with the text the
 * others are told ("worker R: ..."); here the exception from fn is its
 * __cause__. */
static PyObject *cg_update(CompatObject *self, PyObject *args)
{
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "O:update", &fn))
        return NULL;
    if (!PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "fn must be callable");
    const char *busy = "an update is already running on this compat group";
    if (fp_check_open(self->g, self->inflight, "compat group", busy) < 0)
        return NULL;
    compat_ctx c = {.fn = fn};
    ferry_compat_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    uint64_t g = self->generation;
    int rc;
    self->inflight++;
    c.ts = PyEval_SaveThread();
    rc = ferry_compat_group_update(self->g, &g, compat_cb, &c, &st, &err);
    PyEval_RestoreThread(c.ts);
    self->inflight--;
    if (c.exc[0]) {
        PyErr_NormalizeException(&c.exc[0], &c.exc[1], &c.exc[2]);
        if (c.exc[2] && c.exc[1])
            PyException_SetTraceback(c.exc[1], c.exc[2]);
        char msg[sizeof err.msg + 32];
        snprintf(msg, sizeof msg, "worker %u: %s", self->rank, err.msg[0] ? err.msg : "the loader stopped");
        PyObject *e = fp_err_new(FERRY_EREBUILD, msg);
        if (e && c.exc[1])
            PyException_SetCause(e, Py_NewRef(c.exc[1]));
        Py_XDECREF(c.exc[0]);
        Py_XDECREF(c.exc[1]);
        Py_XDECREF(c.exc[2]);
        return fp_err_throw(e);
    }
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    self->generation = g;
    st.generation = g;
    return FP_FIELDS_DICT(&st, compat_fields);
}

/* warm() -> bytes touched: the group's part of the warm-up (every member;
 * ferry_compat_group_warm). */
static PyObject *cg_warm(CompatObject *self, PyObject *Py_UNUSED(args))
{
    if (fp_check_open(self->g, self->inflight, "compat group",
                      "an update is already running on this compat group") < 0)
        return NULL;
    uint64_t bytes = 0;
    ferry_error err = {0};
    int rc;
    self->inflight++;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_compat_group_warm(self->g, &bytes, &err);
    Py_END_ALLOW_THREADS
    self->inflight--;
    return rc < 0 ? fp_raise_err_class(rc, &err) : PyLong_FromUnsignedLongLong(bytes);
}

FP_STORE_HOLDER_CLOSE(cg, CompatObject, g, "close: an update is still running on this compat group")

static PyMethodDef cg_methods[] = {
    {"warm", (PyCFunction)cg_warm, METH_NOARGS,
     "warm($self, /)\n--\n\nwarm() -> bytes touched: the group's part of the warm-up (every member)"},
    {"update", (PyCFunction)cg_update, METH_VARARGS,
     "update($self, fn, /)\n--\n\n"
     "update(fn) -> stats: take the active generation with the whole group (every member calls it); "
     "fn(entry, bytearray) per tensor"},
    FP_CLOSE_METHODS(cg, "close(): deregister and free the staging buffer"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cg_getset[] = {
    {"generation", fp_get_u64, NULL, "the generation last loaded (0: none yet)",
     FP_OFFSET(CompatObject, generation)},
    FP_CLOSED_GETTER(cg, "whether close() ran"),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CompatType = {
    FP_CLASS(cg, CompatObject, "ferry._CompatGroup", Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
             "_CompatGroup(store, model, group, rank, world, node=0, staging_bytes=0, timeout_ms=0, local_segment=0)\n--\n\n" "_CompatGroup(store, model, group, rank, world, node=0, staging_bytes=0, timeout_ms=0, "
             "local_segment=0): the compatibility-mode group update (see ferry.CompatGroup)"),
};

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef w_methods[] = {
    {"weights_publish_abort", w_publish_abort, METH_VARARGS,
     "weights_publish_abort($module, store, model, rank, world, timeout_ms, generation, why, /)\n--\n\n"
     "weights_publish_abort(store, model, rank, world, timeout_ms, generation, why): this rank cannot publish; "
     "raises the error every rank gets"},
    {"weights_publish", w_publish, METH_VARARGS,
     "weights_publish($module, store, model, rank, world, rank_node, out_dtype, segment, keep, timeout_ms, generation, tensors, quant=None, /)\n--\n\n"
     "weights_publish(store, model, rank, world, rank_node, out_dtype, segment, keep, timeout_ms, generation, "
     "tensors, quant=None) -> stats; quant: None or (dtype, include, exclude, scale_name, block, scale_format)"},
    {"weights_publish_warm", w_publish_warm, METH_VARARGS,
     "weights_publish_warm($module, store, model, rank, world, out_dtype, placement, /)\n--\n\n"
     "weights_publish_warm(store, model, rank, world, out_dtype, placement) -> bytes touched "
     "(ferry_publish_warm: the staging buffer and the segments, for writing)"},
    {"weights_publish_shards", w_publish_shards, METH_VARARGS,
     "weights_publish_shards($module, store, model, rank, world, out_dtype, segment, keep, timeout_ms, generation, placement, mine, quant=None, /)\n--\n\n"
     "weights_publish_shards(store, model, rank, world, out_dtype, segment, keep, timeout_ms, generation, "
     "placement, mine, quant=None) -> stats; mine: [(fragment id, buffer)]; quant as weights_publish's"},
    {"weights_update_direct", w_update_direct, METH_VARARGS,
     "weights_update_direct($module, store, model, shards, generation, /)\n--\n\n"
     "weights_update_direct(store, model, shards, generation) -> stats"},
    {"weights_update_compat", w_update_compat, METH_VARARGS,
     "weights_update_compat($module, store, model, generation, fn, /)\n--\n\n"
     "weights_update_compat(store, model, generation, fn) -> stats; fn(entry, bytearray) per tensor"},
    {NULL, NULL, 0, NULL},
};

int fp_weights_init(PyObject *m)
{
    if (PyModule_AddFunctions(m, w_methods) < 0 || fp_add_type(m, "WeightSubscriber", &SubType) < 0 ||
        fp_add_type(m, "_CompatGroup", &CompatType) < 0)
        return -1;
    return 0;
}
