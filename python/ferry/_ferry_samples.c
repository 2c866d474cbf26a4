/* _ferry: rollout/update disaggregation from Python (ferry.samples) over
 * include/ferry/samples.h: the record encoders, the policy registry and
 * PolicyWatch, SampleQueue and its Sample, and KVCacheGate.
 *
 * Thin: every rule (versions, leases, claims, the gate) is the C library's.
 * Records cross as dicts with the Mooncake field names, metadata as JSON
 * text (ferry.samples turns both into dataclasses). Every call that touches
 * the store runs with the GIL released while the buffers it reads or writes
 * stay held; a SampleQueue or PolicyWatch keeps its store busy (Store.close()
 * refuses) until it is closed. A full bounded queue raises QueueFullError
 * (FERRY_EAGAIN); the other codes raise the store's Error subclasses. */
#include <stdlib.h>
#include <string.h>

#include "_ferry.h"

#define SP_POP_MAX ((int)FERRY_STORE_POP_MAX)   /* the store's cap on one pop */
#define SP_HISTORY_MAX 1024   /* the registry keeps the last 1024 versions */
#define SP_SLICE_MS 200       /* blocking waits wake this often to take signals */

static PyObject *err_queue_full;

/* Raise for rc with msg (NULL or empty: ferry_strerror(rc)). NULL. */
static PyObject *sp_raise(int rc, const char *msg)
{
    return fp_raise_class(rc, msg);   /* FERRY_EAGAIN: QueueFullError, as everywhere */
}

static PyObject *sp_raise_err(int rc, const ferry_error *err)
{
    return sp_raise(rc, err ? err->msg : NULL);
}

/* ---- records <-> dicts ----------------------------------------------------------------- */

/* d[k] (absent or None: "") into dst. 0 or -1. */
static int d_str(PyObject *d, const char *k, char *dst, size_t cap)
{
    PyObject *v = PyDict_GetItemString(d, k);
    dst[0] = '\0';
    if (!v || v == Py_None)
        return 0;
    const char *s = fp_key_of(v, k);
    return s ? fp_copy_str(dst, cap, s, k) : -1;
}

/* d[k] (absent or None: 0) as a non-negative int. 0 or -1. */
static int d_u64(PyObject *d, const char *k, uint64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, k);
    *out = 0;
    if (!v || v == Py_None)
        return 0;
    return fp_u64_of(v, k, out);
}

/* d["metadata"]: None or absent -> NULL, else JSON text copied with strdup
 * (the record's clear frees it). 0 or -1. */
static int d_meta(PyObject *d, char **out)
{
    PyObject *v = PyDict_GetItemString(d, "metadata");
    *out = NULL;
    if (!v || v == Py_None)
        return 0;
    const char *s = fp_key_of(v, "metadata (JSON text)");
    if (!s)
        return -1;
    if (!(*out = strdup(s))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* d[k]: a list of str into a malloc'd array of strdup'd strings. 0 or -1
 * (whatever was copied stays in *out / *n for the record's clear). */
static int d_list(PyObject *d, const char *k, char ***out, size_t *n)
{
    PyObject *v = PyDict_GetItemString(d, k);
    *out = NULL;
    *n = 0;
    if (!v || v == Py_None)
        return 0;
    PyObject *t = fp_seq_hold(v, k);
    if (!t)
        return -1;
    size_t m = (size_t)PyTuple_GET_SIZE(t);
    int rc = 0;
    if (m && !(*out = calloc(m, sizeof **out))) {
        PyErr_NoMemory();
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < m; i++) {
        const char *s = fp_key_of(PyTuple_GET_ITEM(t, (Py_ssize_t)i), k);
        if (!s) {
            rc = -1;
        } else if (!((*out)[i] = strdup(s))) {
            PyErr_NoMemory();
            rc = -1;
        } else {
            *n = i + 1;
        }
    }
    Py_DECREF(t);
    return rc;
}

static int need_dict(PyObject *d, const char *what)
{
    if (PyDict_Check(d))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s must be a dict, not %.100s", what, Py_TYPE(d)->tp_name);
    return -1;
}

static int rollout_of(PyObject *d, ferry_rollout_session *r)
{
    memset(r, 0, sizeof *r);
    if (need_dict(d, "session") < 0)
        return -1;
    const struct { const char *k; char *dst; size_t cap; } s[] = {
        {"session_id", r->session_id, sizeof r->session_id},
        {"episode_id", r->episode_id, sizeof r->episode_id},
        {"request_id", r->request_id, sizeof r->request_id},
        {"prompt_ref", r->prompt_ref, sizeof r->prompt_ref},
        {"output_ref", r->output_ref, sizeof r->output_ref},
        {"logprob_ref", r->logprob_ref, sizeof r->logprob_ref},
        {"reward_ref", r->reward_ref, sizeof r->reward_ref},
        {"kv_ref", r->kv_ref, sizeof r->kv_ref},
        {"status", r->status, sizeof r->status},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if (d_str(d, s[i].k, s[i].dst, s[i].cap) < 0)
            return -1;
    if (d_u64(d, "policy_version", &r->policy_version) < 0 || d_meta(d, &r->metadata) < 0)
        return -1;
    return 0;
}

static PyObject *meta_obj(const char *m)
{
    return m ? fp_str_of(m) : Py_NewRef(Py_None);
}

static PyObject *rollout_dict(const ferry_rollout_session *r)
{
    PyObject *d = PyDict_New();
    if (!d || fp_dict_set(d, "session_id", fp_str_of(r->session_id)) < 0 ||
        fp_dict_set(d, "episode_id", fp_str_of(r->episode_id)) < 0 ||
        fp_dict_set(d, "request_id", fp_str_of(r->request_id)) < 0 ||
        fp_dict_set(d, "policy_version", fp_u64(r->policy_version)) < 0 ||
        fp_dict_set(d, "prompt_ref", fp_str_of(r->prompt_ref)) < 0 ||
        fp_dict_set(d, "output_ref", fp_str_of(r->output_ref)) < 0 ||
        fp_dict_set(d, "logprob_ref", fp_str_of(r->logprob_ref)) < 0 ||
        fp_dict_set(d, "reward_ref", fp_str_of(r->reward_ref)) < 0 ||
        fp_dict_set(d, "kv_ref", fp_str_of(r->kv_ref)) < 0 ||
        fp_dict_set(d, "status", fp_str_of(r->status)) < 0 || fp_dict_set(d, "metadata", meta_obj(r->metadata)) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

static int update_of(PyObject *d, ferry_update_session *r)
{
    memset(r, 0, sizeof *r);
    if (need_dict(d, "update session") < 0)
        return -1;
    if (d_str(d, "update_id", r->update_id, sizeof r->update_id) < 0 ||
        d_str(d, "status", r->status, sizeof r->status) < 0 ||
        d_u64(d, "input_policy_version", &r->input_version) < 0 ||
        d_u64(d, "output_policy_version", &r->output_version) < 0 ||
        d_list(d, "trajectory_refs", &r->trajectory_refs, &r->ntrajectory) < 0 ||
        d_list(d, "reward_refs", &r->reward_refs, &r->nreward) < 0 ||
        d_list(d, "logprob_refs", &r->logprob_refs, &r->nlogprob) < 0 || d_meta(d, &r->metadata) < 0)
        return -1;
    return 0;
}

static PyObject *update_dict(const ferry_update_session *r)
{
    PyObject *d = PyDict_New();
    if (!d || fp_dict_set(d, "update_id", fp_str_of(r->update_id)) < 0 ||
        fp_dict_set(d, "input_policy_version", fp_u64(r->input_version)) < 0 ||
        fp_dict_set(d, "output_policy_version", fp_u64(r->output_version)) < 0 ||
        fp_dict_set(d, "trajectory_refs", fp_list_str(r->trajectory_refs, r->ntrajectory)) < 0 ||
        fp_dict_set(d, "reward_refs", fp_list_str(r->reward_refs, r->nreward)) < 0 ||
        fp_dict_set(d, "logprob_refs", fp_list_str(r->logprob_refs, r->nlogprob)) < 0 ||
        fp_dict_set(d, "status", fp_str_of(r->status)) < 0 || fp_dict_set(d, "metadata", meta_obj(r->metadata)) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

static int policy_of(PyObject *d, ferry_policy_version *r)
{
    memset(r, 0, sizeof *r);
    if (need_dict(d, "policy version") < 0)
        return -1;
    if (d_u64(d, "version_id", &r->version) < 0 || d_u64(d, "parent_version_id", &r->parent) < 0 ||
        d_u64(d, "created_at_step", &r->created_at_step) < 0 ||
        d_u64(d, "weight_generation", &r->weight_generation) < 0 || d_str(d, "model", r->model, sizeof r->model) < 0 ||
        d_meta(d, &r->metadata) < 0)
        return -1;
    return 0;
}

static PyObject *policy_dict(const ferry_policy_version *r)
{
    PyObject *d = PyDict_New();
    if (!d || fp_dict_set(d, "version_id", fp_u64(r->version)) < 0 ||
        fp_dict_set(d, "parent_version_id", fp_u64(r->parent)) < 0 ||
        fp_dict_set(d, "created_at_step", fp_u64(r->created_at_step)) < 0 ||
        fp_dict_set(d, "weight_generation", fp_u64(r->weight_generation)) < 0 ||
        fp_dict_set(d, "model", fp_str_of(r->model)) < 0 || fp_dict_set(d, "metadata", meta_obj(r->metadata)) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

/* JSON text from the C encoder; takes json (free()d here). */
static PyObject *json_result(int rc, char *json, const char *what)
{
    if (rc < 0) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "%s: cannot be encoded (metadata must be a JSON object; ids, references and status "
                 "hold no control character; versions fit in int64)",
                 what);
        return sp_raise(rc, msg);
    }
    PyObject *s = PyUnicode_DecodeUTF8(json, (Py_ssize_t)strlen(json), "strict");
    free(json);   /* also when decoding failed */
    return s;
}

/* The UTF-8 bytes of a str or bytes-like argument. */
static int text_of(PyObject *o, Py_buffer *v)
{
    if (PyUnicode_Check(o)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(o, &n);
        return s ? PyBuffer_FillInfo(v, o, (void *)s, n, 1, PyBUF_SIMPLE) : -1;
    }
    return PyObject_GetBuffer(o, v, PyBUF_SIMPLE);
}

/* r_<rec>_to_json(dict) -> JSON text and r_<rec>_from_json(text) -> dict for
 * the record type ferry_<type>: <rec>_of and <rec>_dict convert it, the
 * library's ferry_<type>_to_json/_from_json/_clear encode, decode and free. */
#define SP_RECORD_JSON(rec, type, what)                                                                                \
    static PyObject *r_##rec##_to_json(PyObject *self, PyObject *d)                                                    \
    {                                                                                                                  \
        (void)self;                                                                                                    \
        ferry_##type r;                                                                                                \
        char *json = NULL;                                                                                             \
        int rc = 0;                                                                                                    \
        if (rec##_of(d, &r) == 0)                                                                                      \
            rc = ferry_##type##_to_json(&r, &json);                                                                    \
        ferry_##type##_clear(&r);                                                                                      \
        return PyErr_Occurred() ? NULL : json_result(rc, json, what);                                                  \
    }                                                                                                                  \
    static PyObject *r_##rec##_from_json(PyObject *self, PyObject *o)                                                  \
    {                                                                                                                  \
        (void)self;                                                                                                    \
        Py_buffer v;                                                                                                   \
        if (text_of(o, &v) < 0)                                                                                        \
            return NULL;                                                                                               \
        ferry_##type r;                                                                                                \
        ferry_error err = {0};                                                                                         \
        int rc = ferry_##type##_from_json(v.buf, (size_t)v.len, &r, &err);                                             \
        PyBuffer_Release(&v);                                                                                          \
        if (rc < 0)                                                                                                    \
            return sp_raise_err(rc, &err);                                                                             \
        PyObject *out = rec##_dict(&r);                                                                                \
        ferry_##type##_clear(&r);                                                                                      \
        return out;                                                                                                    \
    }

SP_RECORD_JSON(rollout, rollout_session, "rollout session")
SP_RECORD_JSON(update, update_session, "update session")
SP_RECORD_JSON(policy, policy_version, "policy version")

static PyObject *r_admit(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long sv, iv;
    unsigned int lag;
    if (!PyArg_ParseTuple(args, "KKI:policy_admit", &sv, &iv, &lag))
        return NULL;
    switch (ferry_policy_admit(sv, iv, lag)) {
    case FERRY_VERSION_ADMIT: return PyUnicode_FromString("admit");
    case FERRY_VERSION_STALE: return PyUnicode_FromString("stale");
    default: return PyUnicode_FromString("ahead");
    }
}

/* ---- the policy registry ---------------------------------------------------------------- */

/* policy_publish(store, model, rank, world, rank_node, out_dtype, segment,
 * keep, timeout_ms, record, tensors) -> stats dict. record: a policy
 * version dict; tensors: (name, C-contiguous buffer, ferry dtype). */
static PyObject *p_publish(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *ro, *rec, *to;
    const char *model, *out_dtype;
    unsigned int rank, world, keep;
    unsigned long long segment, timeout;
    if (!PyArg_ParseTuple(args, "OsIIOsKIKOO:policy_publish", &so, &model, &rank, &world, &ro, &out_dtype, &segment,
                          &keep, &timeout, &rec, &to))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    ferry_publisher_config cfg;
    if (fp_publisher_config(&cfg, model, out_dtype, rank, world, segment, keep, timeout) < 0)
        return NULL;
    PyObject *nodes_t = fp_seq_hold(ro, "rank_node"), *items = NULL, *out = NULL;
    uint32_t *nodes = NULL;
    ferry_weight_tensor *t = NULL;
    Py_buffer *v = NULL;
    size_t n = 0, held = 0;
    ferry_policy_version pv;
    memset(&pv, 0, sizeof pv);
    if (!nodes_t || policy_of(rec, &pv) < 0)
        goto done;
    if ((size_t)PyTuple_GET_SIZE(nodes_t) != world) {
        PyErr_Format(PyExc_ValueError, "rank_node has %zd entries for a world of %u", PyTuple_GET_SIZE(nodes_t),
                     world);
        goto done;
    }
    if (!(nodes = PyMem_Calloc(world ? world : 1, sizeof *nodes))) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < world; i++) {
        unsigned long x = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(nodes_t, (Py_ssize_t)i));
        if ((x == (unsigned long)-1 && PyErr_Occurred()) || x > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "rank_node[%zu] must be an int in [0, %u]", i, UINT32_MAX);
            goto done;
        }
        nodes[i] = (uint32_t)x;
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
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 3) {
            PyErr_Format(PyExc_TypeError, "tensors[%zu] must be (name, array, dtype)", i);
            goto done;
        }
        if (!(t[i].name = fp_key_of(PyTuple_GET_ITEM(it, 0), "tensor name")) ||
            !(t[i].dtype = fp_key_of(PyTuple_GET_ITEM(it, 2), "dtype")))
            goto done;
        char what[96];
        snprintf(what, sizeof what, "tensors[%zu] (%.40s)", i, t[i].name);
        if (fp_buf_get(PyTuple_GET_ITEM(it, 1), &v[i], PyBUF_C_CONTIGUOUS, what) < 0)
            goto done;
        held++;
        if (ferry_dtype_size(t[i].dtype) != (uint32_t)v[i].itemsize || v[i].ndim > FERRY_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "tensor %s: dtype %s does not match the array's %zd-byte elements, or "
                         "it has more than %d dims", t[i].name, t[i].dtype, v[i].itemsize, FERRY_MAX_DIMS);
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
    FP_STORE_CALL(so, rc = ferry_policy_publish(s, &cfg, &pv, t, n, &st, &err));
    if (rc < 0) {
        sp_raise_err(rc, &err);
        goto done;
    }
    out = PyDict_New();
    if (!out || fp_dict_set(out, "version", fp_u64(pv.version)) < 0 ||
        fp_publish_stats_put(out, pv.version, &st, false) < 0)
        Py_CLEAR(out);
done:
    for (size_t i = 0; i < held; i++)
        PyBuffer_Release(&v[i]);
    PyMem_Free(v);
    PyMem_Free(t);
    PyMem_Free(nodes);
    Py_XDECREF(items);
    Py_XDECREF(nodes_t);
    ferry_policy_version_clear(&pv);
    return out;
}

/* policy_current(store, model) -> version dict, or None when none was announced. */
static PyObject *p_current(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so;
    const char *model;
    ferry_store *s = fp_store_str_args(args, "Os:policy_current", &so, &model);
    if (!s)
        return NULL;
    ferry_policy_version pv;
    ferry_error err = {0};
    int rc;
    FP_STORE_CALL(so, rc = ferry_policy_current(s, model, &pv, &err));
    if (rc == FERRY_ENOENT)
        Py_RETURN_NONE;
    if (rc < 0)
        return sp_raise_err(rc, &err);
    PyObject *d = policy_dict(&pv);
    ferry_policy_version_clear(&pv);
    return d;
}

/* policy_history(store, model) -> [version dict], oldest first. */
static PyObject *p_history(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so;
    const char *model;
    ferry_store *s = fp_store_str_args(args, "Os:policy_history", &so, &model);
    if (!s)
        return NULL;
    ferry_policy_version *h = PyMem_Calloc(SP_HISTORY_MAX, sizeof *h);
    if (!h)
        return PyErr_NoMemory();
    size_t n = 0;
    ferry_error err = {0};
    int rc;
    FP_STORE_CALL(so, rc = ferry_policy_history(s, model, h, SP_HISTORY_MAX, &n, &err));
    PyObject *l = rc < 0 ? sp_raise_err(rc, &err) : PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *d = policy_dict(&h[i]);
        if (!d)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, d);
    }
    for (size_t i = 0; i < n; i++)
        ferry_policy_version_clear(&h[i]);
    PyMem_Free(h);
    return l;
}

/* ---- PolicyWatch ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *store;          /* strong reference, marked busy while open */
    ferry_policy_watch *w;
    int inflight;
} WatchObject;

static void pw_close_now(WatchObject *self)
{
    ferry_policy_watch *w = self->w;
    self->w = NULL;
    if (w) {
        Py_BEGIN_ALLOW_THREADS ferry_policy_watch_close(w);
        Py_END_ALLOW_THREADS fp_store_busy(self->store, -1);
    }
}

static int pw_init(WatchObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"store", "model", NULL};
    PyObject *so;
    const char *model;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os:PolicyWatch", kwl, &so, &model))
        return -1;
    if (fp_check_unopened(self->w || self->store, "watch") < 0)
        return -1;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return -1;
    ferry_policy_watch *w = NULL;
    int rc;
    FP_STORE_CALL(so, rc = ferry_policy_watch_open(s, model, &w, NULL));
    if (rc < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "policy watch of %s: %s", model,
                 rc == FERRY_EINVAL ? "the model name is empty, too long or holds '/'" : ferry_strerror(rc));
        sp_raise(rc, msg);
        return -1;
    }
    self->w = w;
    self->store = Py_NewRef(so);
    fp_store_busy(so, 1);   /* until close */
    return 0;
}

/* next(timeout_ms=-1) -> version dict, or None once timeout_ms passed. */
static PyObject *pw_next(WatchObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"timeout_ms", NULL};
    long timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|l:next", kwl, &timeout))
        return NULL;
    if (fp_check_open(self->w, self->inflight, "watch", "another thread is waiting on this policy watch") < 0)
        return NULL;
    ferry_policy_version pv;
    ferry_error err = {0};
    int rc;
    for (;;) {
        int slice = timeout < 0 || timeout > SP_SLICE_MS ? SP_SLICE_MS : (int)timeout;
        self->inflight++;
        FP_STORE_CALL(self->store, rc = ferry_policy_watch_next(self->w, slice, &pv, &err));
        self->inflight--;
        if (rc != FERRY_ETIMEDOUT)
            break;
        if (timeout >= 0 && (timeout -= slice) <= 0)
            Py_RETURN_NONE;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    if (rc < 0)
        return sp_raise_err(rc, &err);
    PyObject *d = policy_dict(&pv);
    ferry_policy_version_clear(&pv);
    return d;
}

FP_STORE_HOLDER_CLOSE(pw, WatchObject, w, "close: another thread is waiting on this policy watch")

static PyMethodDef pw_methods[] = {
    {"next", FP_KWFN(pw_next), METH_VARARGS | METH_KEYWORDS,
     "next($self, /, timeout_ms=-1)\n--\n\n"
     "next(timeout_ms=-1) -> the next version newer than any returned (a dict), or None after timeout_ms"},
    FP_CLOSE_METHODS(pw, "close()"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pw_getset[] = {
    FP_CLOSED_GETTER(pw, "whether close() ran"),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WatchType = {
    FP_CLASS(pw, WatchObject, "ferry._ferry.PolicyWatch", Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
             "PolicyWatch(store, model)\n--\n\n" "PolicyWatch(store, model): new policy versions of a model, by a watch on its announcing key"),
};

/* ---- Sample -------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ferry_sample s;   /* owns its session's metadata */
} SampleObject;

static PyTypeObject SampleType;

static void sm_dealloc(SampleObject *self)
{
    ferry_sample_clear(&self->s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A Sample taking over smp (cleared here either way). */
static PyObject *sm_wrap(ferry_sample *smp)
{
    SampleObject *o = PyObject_New(SampleObject, &SampleType);
    if (!o) {
        ferry_sample_clear(smp);
        return NULL;
    }
    o->s = *smp;
    memset(smp, 0, sizeof *smp);
    return (PyObject *)o;
}

#define SM_U64(field)                                                                                                  \
    static PyObject *sm_get_##field(SampleObject *self, void *closure)                                                 \
    {                                                                                                                  \
        (void)closure;                                                                                                 \
        return fp_u64(self->s.field);                                                                                  \
    }
SM_U64(id)
SM_U64(token)
SM_U64(uid)
SM_U64(pushed_at_ms)
SM_U64(popped_at_ms)
SM_U64(prompt_len)
SM_U64(ntokens)
SM_U64(nrewards)

static PyObject *sm_get_payload(SampleObject *self, void *closure)
{
    (void)closure;
    return fp_str_of(self->s.payload);
}

static PyObject *sm_get_session(SampleObject *self, void *closure)
{
    (void)closure;
    return rollout_dict(&self->s.session);
}

static PyObject *sm_repr(SampleObject *self)
{
    return PyUnicode_FromFormat("<ferry Sample %s v%llu id=%llu token=%u ntokens=%llu>", self->s.session.session_id,
                                (unsigned long long)self->s.session.policy_version, (unsigned long long)self->s.id,
                                (unsigned)self->s.token, (unsigned long long)self->s.ntokens);
}

static PyGetSetDef sm_getset[] = {
    {"id", (getter)sm_get_id, NULL, "the queue record", NULL},
    {"token", (getter)sm_get_token, NULL, "the record's delivery (1: first)", NULL},
    {"uid", (getter)sm_get_uid, NULL, "the sample's identity across retried pushes", NULL},
    {"pushed_at_ms", (getter)sm_get_pushed_at_ms, NULL, "the producer's wall clock at push", NULL},
    {"popped_at_ms", (getter)sm_get_popped_at_ms, NULL, "the consumer's wall clock at pop", NULL},
    {"prompt_len", (getter)sm_get_prompt_len, NULL, "prompt token count", NULL},
    {"ntokens", (getter)sm_get_ntokens, NULL, "output token count (and logprobs)", NULL},
    {"nrewards", (getter)sm_get_nrewards, NULL, "reward count", NULL},
    {"payload", (getter)sm_get_payload, NULL, "the payload object's key (\"\" for recompute)", NULL},
    {"session", (getter)sm_get_session, NULL, "the rollout session record (a dict)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SampleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Sample",
    .tp_basicsize = sizeof(SampleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sample: one popped sample (SampleQueue.pop); ack or release it",
    .tp_dealloc = (destructor)sm_dealloc,
    .tp_repr = (reprfunc)sm_repr,
    .tp_getset = sm_getset,
};

/* ---- SampleQueue ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *store;          /* strong reference, marked busy while open */
    ferry_sample_queue *q;
    int inflight;
    uint64_t input_version;
} QueueObject;

static void sq_close_now(QueueObject *self)
{
    ferry_sample_queue *q = self->q;
    self->q = NULL;
    if (q) {
        Py_BEGIN_ALLOW_THREADS ferry_sample_queue_close(q);
        Py_END_ALLOW_THREADS fp_store_busy(self->store, -1);
    }
}

static int sq_init(QueueObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"store",          "queue",    "bound",    "fail_when_full", "push_timeout_ms",
                          "input_version",  "max_policy_lag", "stale_policy", "lease_ms", "consumer", NULL};
    PyObject *so;
    const char *queue, *policy = "drop", *consumer = "";
    unsigned long long bound = 0, push_timeout = 0, input = 0, lease = 0;
    unsigned int lag = 0;
    int fail = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|KpKKIsKs:SampleQueue", kwl, &so, &queue, &bound, &fail,
                                     &push_timeout, &input, &lag, &policy, &lease, &consumer))
        return -1;
    if (fp_check_unopened(self->q || self->store, "queue") < 0)
        return -1;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return -1;
    ferry_sample_queue_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (fp_copy_str(cfg.queue, sizeof cfg.queue, queue, "queue") < 0 ||
        fp_copy_str(cfg.consumer, sizeof cfg.consumer, consumer, "consumer") < 0)
        return -1;
    if (!strcmp(policy, "drop")) {
        cfg.stale_policy = FERRY_STALE_DROP;
    } else if (!strcmp(policy, "recompute")) {
        cfg.stale_policy = FERRY_STALE_RECOMPUTE;
    } else {
        PyErr_Format(PyExc_ValueError, "stale_policy must be \"drop\" or \"recompute\", not %.100s", policy);
        return -1;
    }
    cfg.bound = bound;
    cfg.fail_when_full = fail != 0;
    cfg.push_timeout_ms = push_timeout;
    cfg.input_version = input;
    cfg.max_policy_lag = lag;
    cfg.lease_ms = lease;
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    int rc;
    FP_STORE_CALL(so, rc = ferry_sample_queue_open(s, &cfg, &q, &err));
    if (rc < 0) {
        sp_raise_err(rc, &err);
        return -1;
    }
    self->q = q;
    self->input_version = input;
    self->store = Py_NewRef(so);
    fp_store_busy(so, 1);   /* until close */
    return 0;
}

/* The queue, open and idle; NULL with an error set. */
static ferry_sample_queue *sq_ready(QueueObject *self)
{
    const char *busy = "another thread is using this sample queue (open one per thread)";
    return fp_check_open(self->q, self->inflight, "sample queue", busy) < 0 ? NULL : self->q;
}

#define SQ_CALL(self, stmt)                                                                                            \
    do {                                                                                                               \
        (self)->inflight++;                                                                                            \
        FP_STORE_CALL((self)->store, stmt);                                                                            \
        (self)->inflight--;                                                                                            \
    } while (0)

/* A C-contiguous buffer of 4-byte elements of struct kind c ('i' or 'f'). */
static int buf4(PyObject *o, Py_buffer *v, char c, int writable, const char *what)
{
    if (fp_buf_get(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0), what) < 0)
        return -1;
    const char *dt = fp_buf_dtype(v);
    const char *want = c == 'i' ? "i32" : "f32";
    if (!dt || strcmp(dt, want)) {
        PyObject *d = fp_describe(o);
        PyErr_Format(PyExc_TypeError, "%s (%S) must hold %s elements (%s), not %s", what, d ? d : Py_None,
                     c == 'i' ? "int32" : "float32", want, dt ? dt : "untyped bytes");
        Py_XDECREF(d);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* push(session, tokens, logprobs, rewards, prompt=None) -> (id, session dict
 * with the refs and status filled in). */
static PyObject *sq_push(QueueObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"session", "tokens", "logprobs", "rewards", "prompt", NULL};
    PyObject *so, *to, *lo, *ro, *po = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|O:push", kwl, &so, &to, &lo, &ro, &po))
        return NULL;
    ferry_sample_queue *q = sq_ready(self);
    if (!q)
        return NULL;
    ferry_rollout_session rs;
    Py_buffer v[4];
    int held = 0;
    PyObject *out = NULL;
    if (rollout_of(so, &rs) < 0)
        goto done;
    if (buf4(to, &v[0], 'i', 0, "tokens") < 0)
        goto done;
    held = 1;
    if (buf4(lo, &v[1], 'f', 0, "logprobs") < 0)
        goto done;
    held = 2;
    if (buf4(ro, &v[2], 'f', 0, "rewards") < 0)
        goto done;
    held = 3;
    if (po != Py_None) {
        if (buf4(po, &v[3], 'i', 0, "prompt") < 0)
            goto done;
        held = 4;
    }
    if (v[1].len != v[0].len) {
        PyErr_Format(PyExc_ValueError, "push: %zd tokens but %zd logprobs", v[0].len / 4, v[1].len / 4);
        goto done;
    }
    ferry_sample_data d = {
        .prompt = held == 4 ? v[3].buf : NULL, .prompt_len = held == 4 ? (uint64_t)v[3].len / 4 : 0,
        .tokens = v[0].buf, .ntokens = (uint64_t)v[0].len / 4, .logprobs = v[1].buf,
        .rewards = v[2].buf, .nrewards = (uint64_t)v[2].len / 4,
    };
    uint64_t id = 0;
    ferry_error err = {0};
    int rc;
    SQ_CALL(self, rc = ferry_sample_push(q, &rs, &d, &id, &err));
    if (rc < 0)
        sp_raise_err(rc, &err);
    else
        out = Py_BuildValue("(KN)", (unsigned long long)id, rollout_dict(&rs));
done:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&v[i]);
    ferry_rollout_session_clear(&rs);
    return out;
}

static PyObject *sq_pop_any(QueueObject *self, PyObject *args, PyObject *kw, int recompute)
{
    static char *kwl[] = {"max", NULL};
    unsigned int max = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, recompute ? "|I:pop_recompute" : "|I:pop", kwl, &max))
        return NULL;
    if (max == 0 || max > SP_POP_MAX)
        return PyErr_Format(PyExc_ValueError, "max must be 1 to %d", SP_POP_MAX);
    ferry_sample_queue *q = sq_ready(self);
    if (!q)
        return NULL;
    ferry_sample *out = PyMem_Calloc(max, sizeof *out);
    if (!out)
        return PyErr_NoMemory();
    size_t n = 0;
    ferry_error err = {0};
    int rc;
    if (recompute)
        SQ_CALL(self, rc = ferry_sample_pop_recompute(q, max, out, &n, &err));
    else
        SQ_CALL(self, rc = ferry_sample_pop(q, max, out, &n, &err));
    PyObject *l = rc < 0 ? sp_raise_err(rc, &err) : PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *o = l ? sm_wrap(&out[i]) : NULL;
        if (!o) {
            ferry_sample_clear(&out[i]);   /* sm_wrap cleared it already when it ran */
            Py_CLEAR(l);
        } else {
            PyList_SET_ITEM(l, (Py_ssize_t)i, o);
        }
    }
    PyMem_Free(out);
    return l;
}

static PyObject *sq_pop(QueueObject *self, PyObject *args, PyObject *kw)
{
    return sq_pop_any(self, args, kw, 0);
}

static PyObject *sq_pop_recompute(QueueObject *self, PyObject *args, PyObject *kw)
{
    return sq_pop_any(self, args, kw, 1);
}

/* Shallow copies of the samples of a sequence (the Sample objects stay held
 * in *hold, owning their metadata). NULL with an error set. */
static ferry_sample *samples_of(PyObject *o, PyObject **hold, size_t *n)
{
    if (!(*hold = fp_seq_hold(o, "samples")))
        return NULL;
    *n = (size_t)PyTuple_GET_SIZE(*hold);
    ferry_sample *v = PyMem_Calloc(*n ? *n : 1, sizeof *v);
    if (!v) {
        Py_CLEAR(*hold);
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < *n; i++) {
        PyObject *it = PyTuple_GET_ITEM(*hold, (Py_ssize_t)i);
        if (!PyObject_TypeCheck(it, &SampleType)) {
            PyErr_Format(PyExc_TypeError, "samples[%zu] is a %.100s, not a popped Sample", i, Py_TYPE(it)->tp_name);
            PyMem_Free(v);
            Py_CLEAR(*hold);
            return NULL;
        }
        v[i] = ((SampleObject *)it)->s;
    }
    return v;
}

/* ack(samples) -> [bool]: False for a sample delivered again after its lease
 * lapsed (not acked; counted ack_stale). Other failures raise. */
static PyObject *sq_ack(QueueObject *self, PyObject *arg)
{
    ferry_sample_queue *q = sq_ready(self);
    if (!q)
        return NULL;
    PyObject *hold;
    size_t n;
    ferry_sample *v = samples_of(arg, &hold, &n);
    if (!v)
        return NULL;
    bool *ok = PyMem_Calloc(n ? n : 1, sizeof *ok);
    PyObject *l = NULL;
    if (!ok) {
        PyErr_NoMemory();
    } else {
        ferry_error err = {0};
        int rc;
        SQ_CALL(self, rc = ferry_sample_ack(q, v, n, ok, &err));
        if (rc < 0 && rc != FERRY_ESTALE) {
            sp_raise_err(rc, &err);
        } else if ((l = PyList_New((Py_ssize_t)n))) {
            for (size_t i = 0; i < n; i++)
                PyList_SET_ITEM(l, (Py_ssize_t)i, PyBool_FromLong(ok[i]));
        }
    }
    PyMem_Free(ok);
    PyMem_Free(v);
    Py_DECREF(hold);
    return l;
}

/* release(samples): give them back for someone else now (nack). */
static PyObject *sq_release(QueueObject *self, PyObject *arg)
{
    ferry_sample_queue *q = sq_ready(self);
    if (!q)
        return NULL;
    PyObject *hold;
    size_t n;
    ferry_sample *v = samples_of(arg, &hold, &n);
    if (!v)
        return NULL;
    int rc;
    ferry_error fe = {0};
    SQ_CALL(self, rc = ferry_sample_release(q, v, n, &fe));
    PyMem_Free(v);
    Py_DECREF(hold);
    if (rc < 0)
        return sp_raise(rc, fe.msg);
    Py_RETURN_NONE;
}

/* read(sample, prompt, tokens, logprobs, rewards): each a writable int32 /
 * float32 buffer of the sample's count, or None. */
static PyObject *sq_read(QueueObject *self, PyObject *args)
{
    PyObject *smo, *o[4];
    if (!PyArg_ParseTuple(args, "O!OOOO:read", &SampleType, &smo, &o[0], &o[1], &o[2], &o[3]))
        return NULL;
    ferry_sample_queue *q = sq_ready(self);
    if (!q)
        return NULL;
    const ferry_sample *smp = &((SampleObject *)smo)->s;
    const char *names[4] = {"prompt", "tokens", "logprobs", "rewards"};
    const char kinds[4] = {'i', 'i', 'f', 'f'};
    const uint64_t counts[4] = {smp->prompt_len, smp->ntokens, smp->ntokens, smp->nrewards};
    Py_buffer v[4];
    void *dst[4] = {NULL, NULL, NULL, NULL};
    int held[4] = {0, 0, 0, 0}, fail = 0;
    for (int i = 0; i < 4 && !fail; i++) {
        if (o[i] == Py_None)
            continue;
        if (buf4(o[i], &v[i], kinds[i], 1, names[i]) < 0) {
            fail = 1;
            break;
        }
        held[i] = 1;
        dst[i] = v[i].buf;
        if ((uint64_t)v[i].len != counts[i] * 4) {
            PyErr_Format(PyExc_ValueError, "read: %s holds %zd elements, the sample %llu", names[i], v[i].len / 4,
                         (unsigned long long)counts[i]);
            fail = 1;
        }
    }
    PyObject *out = NULL;
    if (!fail) {
        ferry_error err = {0};
        int rc;
        SQ_CALL(self, rc = ferry_sample_read(q, smp, dst[0], dst[1], dst[2], dst[3], &err));
        out = rc < 0 ? sp_raise_err(rc, &err) : Py_NewRef(Py_None);
    }
    for (int i = 0; i < 4; i++)
        if (held[i])
            PyBuffer_Release(&v[i]);
    return out;
}

static PyObject *sq_set_version(QueueObject *self, PyObject *arg)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    ferry_sample_queue *q = sq_ready(self);
    if (!q)
        return NULL;
    SQ_CALL(self, ferry_sample_queue_set_version(q, v));   /* removes lapsed claims */
    self->input_version = v;
    Py_RETURN_NONE;
}

/* stats() -> dict of every ferry_sample_stats counter. Allowed while another
 * thread is in a call on this queue (e.g. to see a push waiting for room). */
static PyObject *sq_stats(QueueObject *self, PyObject *unused)
{
    (void)unused;
    if (fp_check_open(self->q, 0, "sample queue", NULL) < 0)
        return NULL;
    ferry_sample_stats st;
    ferry_sample_queue_stats(self->q, &st);
#define F(m) FP_FIELD(ferry_sample_stats, m)
    static const fp_field f[] = {
        F(pushed), F(push_waits), F(push_full), F(push_retries), F(popped), F(admitted),
        F(stale), F(dropped), F(recompute), F(ahead), F(redelivered), F(duplicates),
        F(acked), F(ack_stale), F(recompute_popped),
    };
#undef F
    return FP_FIELDS_DICT(&st, f);
}

FP_STORE_HOLDER_CLOSE(sq, QueueObject, q, "close: another thread is using this sample queue")

static PyMethodDef sq_methods[] = {
    {"push", FP_KWFN(sq_push), METH_VARARGS | METH_KEYWORDS,
     "push($self, /, session, tokens, logprobs, rewards, prompt=None)\n--\n\n"
     "push(session, tokens, logprobs, rewards, prompt=None) -> (record id, session dict with refs)"},
    {"pop", FP_KWFN(sq_pop), METH_VARARGS | METH_KEYWORDS, "pop($self, /, max=1)\n--\n\n"
     "pop(max=1) -> [Sample] admitted by the version rule"},
    {"pop_recompute", FP_KWFN(sq_pop_recompute), METH_VARARGS | METH_KEYWORDS,
     "pop_recompute($self, /, max=1)\n--\n\n"
     "pop_recompute(max=1) -> [Sample] sent back for recompute (sessions only)"},
    {"read", (PyCFunction)sq_read, METH_VARARGS, "read($self, sample, prompt, tokens, logprobs, rewards, /)\n--\n\n"
     "read(sample, prompt, tokens, logprobs, rewards): into buffers"},
    {"ack", (PyCFunction)sq_ack, METH_O, "ack($self, samples, /)\n--\n\n"
     "ack(samples) -> [bool]: trained; False: delivered again, not acked"},
    {"release", (PyCFunction)sq_release, METH_O, "release($self, samples, /)\n--\n\n"
     "release(samples): give them back now"},
    {"set_version", (PyCFunction)sq_set_version, METH_O, "set_version($self, v, /)\n--\n\n"
     "set_version(v): the consumer's input version"},
    {"stats", (PyCFunction)sq_stats, METH_NOARGS, "stats($self, /)\n--\n\n"
     "stats() -> dict of counters"},
    FP_CLOSE_METHODS(sq, "close()"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sq_getset[] = {
    {"input_version", fp_get_u64, NULL, "the consumer's input version", FP_OFFSET(QueueObject, input_version)},
    FP_CLOSED_GETTER(sq, "whether close() ran"),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject QueueType = {
    FP_CLASS(sq, QueueObject, "ferry._ferry.SampleQueue", Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
             "SampleQueue(store, queue, bound=0, fail_when_full=False, push_timeout_ms=0, input_version=0, max_policy_lag=0, stale_policy=\"drop\", lease_ms=0, consumer=\"\")\n--\n\n" "SampleQueue(store, queue, bound=0, fail_when_full=False, push_timeout_ms=0, input_version=0, "
             "max_policy_lag=0, stale_policy=\"drop\", lease_ms=0, consumer=\"\"): a leased sample queue"),
};

/* ---- KVCacheGate ----------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *store;   /* strong reference; each call checks it is open */
    char ns[128];
    ferry_kvcache_stats st;   /* each call counts into its own, added here with the GIL */
} GateObject;

static void kv_add(GateObject *self, const ferry_kvcache_stats *d)
{
    self->st.stored += d->stored;
    self->st.hits += d->hits;
    self->st.refused += d->refused;
    self->st.retired += d->retired;
}

static int kv_init(GateObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"store", "ns", NULL};
    PyObject *so;
    const char *ns;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os:KVCacheGate", kwl, &so, &ns))
        return -1;
    if (!fp_store_handle(so))
        return -1;
    if (!ns[0] || strchr(ns, '/')) {
        PyErr_SetString(PyExc_ValueError, "ns must be non-empty and hold no '/'");
        return -1;
    }
    if (fp_copy_str(self->ns, sizeof self->ns, ns, "ns") < 0)
        return -1;
    Py_XSETREF(self->store, Py_NewRef(so));
    memset(&self->st, 0, sizeof self->st);
    return 0;
}

static ferry_store *kv_store(GateObject *self)
{
    if (!self->store) {
        PyErr_SetString(PyExc_ValueError, "the gate is not initialised");
        return NULL;
    }
    return fp_store_handle(self->store);
}

/* put(version, name, data) -> "store://ferry/kv/<ns>/<version>/<name>". */
static PyObject *kv_put(GateObject *self, PyObject *args)
{
    ferry_error fe = {0};
    unsigned long long version;
    const char *name;
    Py_buffer v;
    PyObject *data;
    if (!PyArg_ParseTuple(args, "KsO:put", &version, &name, &data) ||
        fp_buf_get(data, &v, PyBUF_C_CONTIGUOUS, "KVCacheGate.put: data") < 0)
        return NULL;
    ferry_store *s = kv_store(self);
    PyObject *out = NULL;
    if (s) {
        char ref[FERRY_RECORD_REF_MAX + 1];
        ferry_kvcache_stats d = {0};
        int rc;
        FP_STORE_CALL(self->store,
                      rc = ferry_kvcache_put(s, self->ns, version, name, v.buf, (size_t)v.len, ref, sizeof ref, &d, &fe));
        kv_add(self, &d);
        if (rc < 0)
            sp_raise(rc, rc == FERRY_EMSGSIZE ? "kvcache put: the key is longer than a reference allows"
                                              : fe.msg);
        else
            out = fp_str_of(ref);
    }
    PyBuffer_Release(&v);
    return out;
}

static PyObject *kv_refused(const char *ref, uint64_t active)
{
    uint64_t rv = 0;
    char msg[FERRY_RECORD_REF_MAX + 160];
    if (ferry_kvcache_ref_version(ref, &rv) == 0)
        snprintf(msg, sizeof msg, "KV cache %s was made under policy version %llu, the active one is %llu: recompute",
                 ref, (unsigned long long)rv, (unsigned long long)active);
    else
        snprintf(msg, sizeof msg, "%s is not a KV cache reference", ref);
    return sp_raise(FERRY_ESTALE, msg);
}

/* get(ref, active_version) -> bytes; StaleError when the reference was made
 * under another version (nothing read). */
static PyObject *kv_get(GateObject *self, PyObject *args)
{
    ferry_error fe = {0};
    const char *ref;
    unsigned long long active;
    if (!PyArg_ParseTuple(args, "sK:get", &ref, &active))
        return NULL;
    ferry_store *s = kv_store(self);
    if (!s)
        return NULL;
    for (int attempt = 0; attempt < 4; attempt++) {
        ferry_kvcache_stats d = {0};
        size_t len = 0;
        int rc;
        /* the size first (cap 0 reads nothing), then the bytes */
        FP_STORE_CALL(self->store, rc = ferry_kvcache_get(s, ref, active, NULL, 0, &len, &d, &fe));
        kv_add(self, &d);
        if (rc == FERRY_ESTALE)
            return kv_refused(ref, active);
        if (rc < 0 && rc != FERRY_EMSGSIZE)
            return sp_raise(rc, rc == FERRY_EINVAL ? "kvcache get: not a KV cache reference" : fe.msg);
        if (rc == 0)
            return PyBytes_FromStringAndSize("", 0);
        PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
        if (!b)
            return NULL;
        size_t got = 0;
        memset(&d, 0, sizeof d);
        FP_STORE_CALL(self->store, rc = ferry_kvcache_get(s, ref, active, PyBytes_AS_STRING(b), len, &got, &d, &fe));
        kv_add(self, &d);
        if (rc == 0 && got == len)
            return b;
        Py_DECREF(b);
        if (rc < 0 && rc != FERRY_EMSGSIZE)
            return sp_raise(rc, fe.msg);
        /* replaced by a larger object in between: again */
    }
    return sp_raise(FERRY_EBUSY, "kvcache get: the object kept changing size while it was read; retry");
}

/* get_into(ref, active_version, buffer) -> bytes read. */
static PyObject *kv_get_into(GateObject *self, PyObject *args)
{
    ferry_error fe = {0};
    const char *ref;
    unsigned long long active;
    Py_buffer v;
    PyObject *dst;
    if (!PyArg_ParseTuple(args, "sKO:get_into", &ref, &active, &dst) ||
        fp_buf_get(dst, &v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, "KVCacheGate.get_into: buffer") < 0)
        return NULL;
    ferry_store *s = kv_store(self);
    PyObject *out = NULL;
    if (s) {
        ferry_kvcache_stats d = {0};
        size_t len = 0;
        int rc;
        FP_STORE_CALL(self->store, rc = ferry_kvcache_get(s, ref, active, v.buf, (size_t)v.len, &len, &d, &fe));
        kv_add(self, &d);
        if (rc == FERRY_ESTALE)
            kv_refused(ref, active);
        else if (rc < 0)
            sp_raise(rc, fe.msg);
        else
            out = PyLong_FromSize_t(len);
    }
    PyBuffer_Release(&v);
    return out;
}

/* retire(version) -> objects removed (every KV object of that version). */
static PyObject *kv_retire(GateObject *self, PyObject *arg)
{
    ferry_error fe = {0};
    unsigned long long version = PyLong_AsUnsignedLongLong(arg);
    if (version == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    ferry_store *s = kv_store(self);
    if (!s)
        return NULL;
    ferry_kvcache_stats d = {0};
    uint64_t removed = 0;
    int rc;
    FP_STORE_CALL(self->store, rc = ferry_kvcache_retire(s, self->ns, version, &removed, &d, &fe));
    kv_add(self, &d);
    if (rc < 0)
        return sp_raise(rc, fe.msg);
    return fp_u64(removed);
}

static PyObject *kv_stats(GateObject *self, PyObject *unused)
{
    (void)unused;
#define F(m) FP_FIELD(ferry_kvcache_stats, m)
    static const fp_field f[] = {F(stored), F(hits), F(refused), F(retired)};
#undef F
    return FP_FIELDS_DICT(&self->st, f);
}

static PyObject *kv_get_ns(GateObject *self, void *closure)
{
    (void)closure;
    return fp_str_of(self->ns);
}

static void kv_dealloc(GateObject *self)
{
    Py_CLEAR(self->store);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef kv_methods[] = {
    {"put", (PyCFunction)kv_put, METH_VARARGS, "put($self, version, name, data, /)\n--\n\n"
     "put(version, name, data) -> reference"},
    {"get", (PyCFunction)kv_get, METH_VARARGS, "get($self, ref, active_version, /)\n--\n\n"
     "get(ref, active_version) -> bytes; StaleError for another version"},
    {"get_into", (PyCFunction)kv_get_into, METH_VARARGS, "get_into($self, ref, active_version, buffer, /)\n--\n\n"
     "get_into(ref, active_version, buffer) -> bytes read"},
    {"retire", (PyCFunction)kv_retire, METH_O, "retire($self, version, /)\n--\n\n"
     "retire(version) -> objects removed"},
    {"stats", (PyCFunction)kv_stats, METH_NOARGS, "stats($self, /)\n--\n\n"
     "stats() -> {stored, hits, refused, retired}"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kv_getset[] = {
    {"ns", (getter)kv_get_ns, NULL, "the gate's namespace", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GateType = {
    FP_CLASS(kv, GateObject, "ferry._ferry.KVCacheGate", Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
             "KVCacheGate(store, ns)\n--\n\n" "KVCacheGate(store, ns): KV cache objects kept under the policy version that made them"),
};

static PyObject *kv_ref_version(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *ref = fp_key_of(arg, "ref");
    if (!ref)
        return NULL;
    uint64_t v = 0;
    if (ferry_kvcache_ref_version(ref, &v) < 0)
        return PyErr_Format(PyExc_ValueError, "%.400s is not a KV cache reference", ref);
    return fp_u64(v);
}

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef sp_methods[] = {
    {"rollout_session_to_json", r_rollout_to_json, METH_O, "rollout_session_to_json($module, dict, /)\n--\n\n"
     "rollout_session_to_json(dict) -> canonical JSON text"},
    {"rollout_session_from_json", r_rollout_from_json, METH_O, "rollout_session_from_json($module, text, /)\n--\n\n"
     "rollout_session_from_json(text) -> dict"},
    {"update_session_to_json", r_update_to_json, METH_O, "update_session_to_json($module, dict, /)\n--\n\n"
     "update_session_to_json(dict) -> canonical JSON text"},
    {"update_session_from_json", r_update_from_json, METH_O, "update_session_from_json($module, text, /)\n--\n\n"
     "update_session_from_json(text) -> dict"},
    {"policy_version_to_json", r_policy_to_json, METH_O, "policy_version_to_json($module, dict, /)\n--\n\n"
     "policy_version_to_json(dict) -> canonical JSON text"},
    {"policy_version_from_json", r_policy_from_json, METH_O, "policy_version_from_json($module, text, /)\n--\n\n"
     "policy_version_from_json(text) -> dict"},
    {"policy_admit", r_admit, METH_VARARGS,
     "policy_admit($module, sample_version, input_version, max_policy_lag, /)\n--\n\n"
     "policy_admit(sample_version, input_version, max_policy_lag) -> \"admit\", \"stale\" or \"ahead\""},
    {"policy_publish", p_publish, METH_VARARGS,
     "policy_publish($module, store, model, rank, world, rank_node, out_dtype, segment, keep, timeout_ms, record, tensors, /)\n--\n\n"
     "policy_publish(store, model, rank, world, rank_node, out_dtype, segment, keep, timeout_ms, record, tensors) "
     "-> stats"},
    {"policy_current", p_current, METH_VARARGS, "policy_current($module, store, model, /)\n--\n\n"
     "policy_current(store, model) -> version dict or None"},
    {"policy_history", p_history, METH_VARARGS, "policy_history($module, store, model, /)\n--\n\n"
     "policy_history(store, model) -> [version dict], oldest first"},
    {"kvcache_ref_version", kv_ref_version, METH_O, "kvcache_ref_version($module, ref, /)\n--\n\n"
     "kvcache_ref_version(ref) -> the version it was made under"},
    {NULL, NULL, 0, NULL},
};

int fp_samples_init(PyObject *m)
{
    err_queue_full = fp_err_class(FERRY_EAGAIN);   /* made by fp_store_init, as every error class */
    if (!err_queue_full || PyModule_AddFunctions(m, sp_methods) < 0 || fp_add_type(m, "PolicyWatch", &WatchType) < 0 ||
        fp_add_type(m, "SampleQueue", &QueueType) < 0 || fp_add_type(m, "Sample", &SampleType) < 0 ||
        fp_add_type(m, "KVCacheGate", &GateType) < 0)
        return -1;
    return 0;
}
