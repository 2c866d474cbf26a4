/* _ferry: the update of a sparse generation from Python (ferry.sparse.update)
 * over include/ferry/weights.h (announce, chain and the active mark are
 * ferry/_weights.py's, over the cffi binding): the update that follows the
 * chain into the worker's arrays (any writable strided numpy array or CPU torch
 * tensor; their strides are passed on). Store calls run with the GIL
 * released while the arrays stay held. */
#include <string.h>

#include "_ferry.h"
#include "ferry/weights.h"

PyObject *fp_sparse_stats_dict(const ferry_sparse_stats *st);   /* _ferry_sparse.c */

/* Without the GIL: each shard's element size against the published dtype
 * of its tensor in the dense generation the chain starts at (the library
 * knows the box, not the element size). 0 or a code with msg. */
static int sg_itemsizes(ferry_store *s, const char *model, uint64_t held, const fp_shards *w, char *msg,
                        size_t cap)
{
    ferry_sparse_chain ch;
    ferry_error err = {0};
    int rc = ferry_sparse_chain_resolve(s, model, held, &ch, &err);
    if (rc < 0 || ch.active == held) {
        ferry_sparse_chain_free(&ch);
        return 0;   /* the update reports it, or has nothing to do */
    }
    ferry_weight_manifest m;
    memset(&m, 0, sizeof m);
    rc = ferry_weights_manifest(s, model, ch.dense, &m, &err);
    ferry_sparse_chain_free(&ch);
    if (rc < 0)
        return 0;   /* the update names it */
    for (size_t i = 0; i < w->n && rc == 0; i++)
        for (size_t e = 0; e < m.n; e++)
            if (!strcmp(m.entries[e].name, w->sh[i].tensor) &&
                ferry_dtype_size(m.entries[e].dtype) != (uint32_t)w->views[i].itemsize) {
                snprintf(msg, cap, "shard %zu (%s): the array's %zd-byte elements do not match the published "
                         "dtype %s; nothing applied", i, w->sh[i].tensor, w->views[i].itemsize,
                         m.entries[e].dtype);
                rc = FERRY_EINVAL;
                break;
            }
    ferry_weight_manifest_free(&m);
    return rc;
}

/* sparse_update(store, model, axis_index, no_dense, shards, generation) -> stats dict */
static PyObject *sg_update(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *sho;
    const char *model;
    unsigned axis;
    int no_dense;
    unsigned long long gen;
    if (!PyArg_ParseTuple(args, "OsIpOK:sparse_update", &so, &model, &axis, &no_dense, &sho, &gen))
        return NULL;
    ferry_store *s = fp_store_handle(so);
    if (!s)
        return NULL;
    ferry_sparse_update_config cfg = {.axis_index = axis, .no_dense = no_dense != 0};
    if (fp_copy_str(cfg.model, sizeof cfg.model, model, "model") < 0)
        return NULL;
    fp_shards w;
    if (fp_shards_from(&w, sho, FERRY_SPARSE_NDIM_MAX) < 0)
        return NULL;
    ferry_sparse_update_stats st;
    memset(&st, 0, sizeof st);
    ferry_error err = {0};
    uint64_t g = gen;
    int rc;
    FP_STORE_CALL(so, rc = sg_itemsizes(s, model, g, &w, err.msg, sizeof err.msg);
                  if (rc == 0) rc = ferry_sparse_update(s, &cfg, w.sh, w.n, &g, &st, &err));
    fp_shards_free(&w);
    if (rc < 0)
        return fp_raise_err_class(rc, &err);
    PyObject *read = fp_sparse_stats_dict(&st.read);
    if (!read)
        return NULL;
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:N,s:d,s:d,s:d,s:d}", "generation", (unsigned long long)g,
                         "dense_generation", (unsigned long long)st.dense_generation, "dense_bytes",
                         (unsigned long long)st.dense_bytes, "dense_ranges", (unsigned long long)st.dense_ranges,
                         "deltas", (unsigned long long)st.deltas, "entries_applied",
                         (unsigned long long)st.entries_applied, "read", read, "resolve_s", st.resolve_s,
                         "read_s", st.read_s, "dense_s", st.dense_s, "apply_s", st.apply_s);
}

static PyMethodDef sparse_gen_methods[] = {
    {"sparse_update", sg_update, METH_VARARGS,
     "sparse_update($module, store, model, axis_index, no_dense, shards, generation, /)\n--\n\n"
     "sparse_update(store, model, axis_index, no_dense, [(tensor, offset, array)], generation) -> stats dict"},
    {NULL, NULL, 0, NULL},
};

int fp_sparse_gen_init(PyObject *m)
{
    return PyModule_AddFunctions(m, sparse_gen_methods);
}
