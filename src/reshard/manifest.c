/* Placement manifests: tensors, fragments and splits, each checked as it is
 * added so a bad description fails at its first wrong entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard/reshard_int.h"

static const char *tensor_key(const void *ctx, uint32_t idx)
{
    return ((const ferry_manifest *)ctx)->tensors[idx].name;
}

static const char *object_key(const void *ctx, uint32_t idx)
{
    return ((const ferry_manifest *)ctx)->objects[idx];
}

/* ---- lifetime ----------------------------------------------------------- */

int ferry_manifest_create(uint32_t nranks, const uint32_t *nodes, uint32_t gpus_per_node,
                          ferry_manifest **out)
{
    if (!out || nranks == 0)
        return FERRY_EINVAL;
    ferry_manifest *m = fr_calloc(1, sizeof *m);
    if (!m)
        return FERRY_ENOMEM;
    m->nodes = fr_calloc(nranks, sizeof *m->nodes);
    if (!m->nodes) {
        fr_free(m);
        return FERRY_ENOMEM;
    }
    uint32_t gpn = gpus_per_node ? gpus_per_node : 8;
    for (uint32_t r = 0; r < nranks; r++)
        m->nodes[r] = nodes ? nodes[r] : r / gpn;
    m->gpus_per_node = nodes ? 0 : gpn;
    m->nranks = nranks;
    atomic_init(&m->refs, 1);
    *out = m;
    return 0;
}

void fr_manifest_ref(ferry_manifest *m)
{
    atomic_fetch_add(&m->refs, 1);
}

void ferry_manifest_close(ferry_manifest *m)
{
    if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    for (size_t i = 0; i < m->ntensors; i++)
        fr_free(m->tensors[i].name);
    for (size_t i = 0; i < m->nobjects; i++)
        fr_free(m->objects[i]);
    fr_free(m->tensors);
    fr_free(m->groups);
    fr_free(m->pool);
    fr_free(m->objects);
    fr_free(m->nodes);
    fr_free(m->tg_start);
    fr_free(m->tg_list);
    fr_strmap_free(&m->tnames);
    fr_strmap_free(&m->onames);
    fr_free(m);
}

uint32_t ferry_manifest_rank_count(const ferry_manifest *m)
{
    return m ? m->nranks : 0;
}

uint32_t ferry_manifest_node_of(const ferry_manifest *m, uint32_t rank)
{
    return m && rank < m->nranks ? m->nodes[rank] : UINT32_MAX;
}

uint32_t ferry_manifest_tensor_count(const ferry_manifest *m)
{
    return m ? (uint32_t)m->ntensors : 0;
}

uint64_t ferry_manifest_fragment_count(const ferry_manifest *m)
{
    return m ? m->nfrags : 0;
}

/* ---- tensors ------------------------------------------------------------ */

static int check_mutable(ferry_manifest *m, ferry_error *err)
{
    if (m->frozen)
        return fr_fail(err, FERRY_ESTATE, "manifest is frozen: a plan uses it");
    return 0;
}

int ferry_manifest_add_tensor(ferry_manifest *m, const ferry_tensor_desc *t, ferry_error *err)
{
    if (!m || !t)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    int rc = check_mutable(m, err);
    if (rc < 0)
        return rc;
    size_t idx = m->ntensors;
    if (!t->name || !t->name[0] || strlen(t->name) >= FR_NAME_MAX)
        return fr_fail(err, FERRY_EINVAL, "tensor %zu: name is empty or longer than %d bytes", idx,
                       FR_NAME_MAX - 1);
    if (idx >= UINT32_MAX - 1)
        return fr_fail(err, FERRY_EMSGSIZE, "tensor '%s': too many tensors", t->name);
    if (fr_strmap_find(&m->tnames, t->name, tensor_key, m) >= 0)
        return fr_fail(err, FERRY_EEXIST, "tensor '%s': declared twice", t->name);
    uint32_t known = ferry_dtype_size(t->dtype);
    if (!known)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': unknown dtype '%s'", t->name,
                       t->dtype ? t->dtype : "(null)");
    if (t->itemsize != known)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': itemsize %u does not match dtype %s (%u bytes)",
                       t->name, t->itemsize, t->dtype, known);
    if (t->ndim > FR_MAXD)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': %u dims, at most %d", t->name, t->ndim, FR_MAXD);
    uint64_t elems = 1, bytes;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0)
            return fr_fail(err, FERRY_EINVAL, "tensor '%s': dim %u is 0", t->name, d);
        if (fr_mul_u64(elems, t->shape[d], &elems) < 0)
            return fr_fail(err, FERRY_ERANGE, "tensor '%s': element count overflows", t->name);
    }
    if (fr_mul_u64(elems, t->itemsize, &bytes) < 0)
        return fr_fail(err, FERRY_ERANGE, "tensor '%s': byte size overflows", t->name);
    if (fr_grow((void **)&m->tensors, &m->tcap, idx + 1, sizeof *m->tensors) < 0)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    fr_tensor *x = &m->tensors[idx];
    memset(x, 0, sizeof *x);
    x->name = fr_strdup(t->name);
    if (!x->name)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    snprintf(x->dtype, sizeof x->dtype, "%s", t->dtype);
    x->itemsize = t->itemsize;
    x->ndim = t->ndim;
    memcpy(x->shape, t->shape, t->ndim * sizeof(uint64_t));
    x->elems = elems;
    m->ntensors++;
    if (fr_strmap_insert(&m->tnames, x->name, (uint32_t)idx, tensor_key, m) < 0) {
        m->ntensors--;
        fr_free(x->name);
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    }
    m->digest_valid = false;
    return (int)idx;
}

int ferry_manifest_tensor(const ferry_manifest *m, uint32_t index, ferry_tensor_desc *out)
{
    if (!m || !out || index >= m->ntensors)
        return FERRY_EINVAL;
    const fr_tensor *t = &m->tensors[index];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->itemsize = t->itemsize;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    return 0;
}

int ferry_manifest_find_tensor(const ferry_manifest *m, const char *name)
{
    if (!m || !name)
        return FERRY_EINVAL;
    int64_t i = fr_strmap_find(&m->tnames, name, tensor_key, m);
    return i < 0 ? FERRY_ENOENT : (int)i;
}

/* ---- groups ------------------------------------------------------------- */

static int intern_object(ferry_manifest *m, const char *key, int32_t *out)
{
    int64_t i = fr_strmap_find(&m->onames, key, object_key, m);
    if (i >= 0) {
        *out = (int32_t)i;
        return 0;
    }
    if (m->nobjects >= INT32_MAX)
        return FERRY_EMSGSIZE;
    if (fr_grow((void **)&m->objects, &m->ocap, m->nobjects + 1, sizeof *m->objects) < 0)
        return FERRY_ENOMEM;
    char *k = fr_strdup(key);
    if (!k)
        return FERRY_ENOMEM;
    m->objects[m->nobjects] = k;
    if (fr_strmap_insert(&m->onames, k, (uint32_t)m->nobjects, object_key, m) < 0) {
        fr_free(k);
        return FERRY_ENOMEM;
    }
    *out = (int32_t)m->nobjects++;
    return 0;
}

/* Strides of a fragment must never map two elements to one place: sorted
 * by stride, each dim must step over everything the smaller ones span. */
static bool strides_injective(const uint64_t *shape, const uint64_t *strides, uint32_t n)
{
    uint32_t order[FR_MAXD], k = 0;
    for (uint32_t d = 0; d < n; d++)
        if (shape[d] > 1)
            order[k++] = d;
    for (uint32_t i = 1; i < k; i++)   /* insertion sort by stride */
        for (uint32_t j = i; j > 0 && strides[order[j]] < strides[order[j - 1]]; j--) {
            uint32_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    uint64_t span = 1;   /* elements covered by the dims seen so far */
    for (uint32_t i = 0; i < k; i++) {
        uint64_t s = strides[order[i]], ext;
        if (s < span)
            return false;
        if (fr_mul_u64(s, shape[order[i]] - 1, &ext) < 0 || fr_add_u64(ext, 1, &span) < 0)
            return false;
    }
    return true;
}

/* Allocate a group with its pool entries (5 or 6 per dim). */
static int new_group(ferry_manifest *m, uint32_t ndim, bool strides, fr_group **out)
{
    if (m->ngroups >= FR_MAX_GROUPS)
        return FERRY_EMSGSIZE;
    size_t need = (size_t)ndim * (strides ? 6 : 5);
    /* +1: the pool exists even when every tensor is a scalar (no pointer
     * arithmetic on NULL). */
    if (fr_grow((void **)&m->groups, &m->gcap, m->ngroups + 1, sizeof *m->groups) < 0 ||
        fr_grow((void **)&m->pool, &m->pcap, m->npool + need + 1, sizeof *m->pool) < 0)
        return FERRY_ENOMEM;
    fr_group *g = &m->groups[m->ngroups];
    memset(g, 0, sizeof *g);
    g->pool = m->npool;
    g->ndim = (uint8_t)ndim;
    g->has_strides = strides;
    g->object = -1;
    memset(m->pool + m->npool, 0, need * sizeof *m->pool);
    *out = g;
    return 0;
}

static void commit_group(ferry_manifest *m, fr_group *g)
{
    g->first_id = m->nfrags;
    m->nfrags += g->ncells * g->replicas;
    m->npool += (size_t)g->ndim * (g->has_strides ? 6 : 5);
    m->ngroups++;
    m->digest_valid = false;
}

/* A quantized tensor's fragments and its scale tensor's are made together
 * by ferry_manifest_quantize, blocks checked: nothing is added to them. */
static int quantized_fixed(const fr_tensor *t, ferry_error *err)
{
    return fr_fail(err, FERRY_ESTATE, "tensor '%s': %s: its fragments are fixed by "
                   "ferry_manifest_quantize", t->name,
                   t->qrole == FERRY_QUANT_WEIGHT ? "stored in FP8 blocks" : "a scale tensor");
}

int ferry_manifest_add_fragment(ferry_manifest *m, const ferry_fragment *f, ferry_error *err)
{
    if (!m || !f)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    int rc = check_mutable(m, err);
    if (rc < 0)
        return rc;
    uint64_t id = m->nfrags;
    if (f->tensor >= m->ntensors)
        return fr_fail(err, FERRY_EINVAL, "fragment %llu: tensor index %u out of range (%zu tensors)",
                       (unsigned long long)id, f->tensor, m->ntensors);
    const fr_tensor *t = &m->tensors[f->tensor];
    char b1[200], b2[200];
    if (t->qrole)
        return quantized_fixed(t, err);
    if (f->rank >= m->nranks)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': fragment %llu: rank %u outside the topology (%u ranks)",
                       t->name, (unsigned long long)id, f->rank, m->nranks);
    if (m->nexplicit >= FR_MAX_EXPLICIT || id >= UINT64_MAX / 2)
        return fr_fail(err, FERRY_EMSGSIZE, "tensor '%s': fragment %llu: more than %llu fragments added one by one",
                       t->name, (unsigned long long)id, (unsigned long long)FR_MAX_EXPLICIT);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        uint64_t end;
        if (f->shape[d] == 0 || fr_add_u64(f->offset[d], f->shape[d], &end) < 0 || end > t->shape[d])
            return fr_fail(err, FERRY_EINVAL,
                           "tensor '%s': fragment %llu (rank %u): box offset %s shape %s is empty or outside the tensor shape %s",
                           t->name, (unsigned long long)id, f->rank, fr_fmt_dims(b1, sizeof b1, f->offset, t->ndim),
                           fr_fmt_dims(b2, sizeof b2, f->shape, t->ndim),
                           fr_fmt_dims((char[200]){0}, 200, t->shape, t->ndim));
        elems *= f->shape[d];   /* bounded by the tensor's element count */
    }
    /* Span of the local buffer in bytes: storage offset + the last element. */
    uint64_t span = elems, bytes, end;
    if (f->has_strides) {
        if (!strides_injective(f->shape, f->strides, t->ndim))
            return fr_fail(err, FERRY_EINVAL, "tensor '%s': fragment %llu (rank %u): strides %s alias elements of shape %s",
                           t->name, (unsigned long long)id, f->rank, fr_fmt_dims(b1, sizeof b1, f->strides, t->ndim),
                           fr_fmt_dims(b2, sizeof b2, f->shape, t->ndim));
        span = 1;
        for (uint32_t d = 0; d < t->ndim; d++) {
            uint64_t x;
            if (fr_mul_u64(f->shape[d] - 1, f->strides[d], &x) < 0 || fr_add_u64(span, x, &span) < 0)
                return fr_fail(err, FERRY_ERANGE, "tensor '%s': fragment %llu: strided span overflows",
                               t->name, (unsigned long long)id);
        }
    }
    if (fr_add_u64(span, f->storage_offset, &span) < 0 || fr_mul_u64(span, t->itemsize, &bytes) < 0 ||
        fr_add_u64(bytes, f->object_offset, &end) < 0)
        return fr_fail(err, FERRY_ERANGE, "tensor '%s': fragment %llu (rank %u): byte span overflows 64 bits",
                       t->name, (unsigned long long)id, f->rank);
    if (f->object && (!f->object[0] || strlen(f->object) >= FR_NAME_MAX))
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': fragment %llu: object key is empty or too long",
                       t->name, (unsigned long long)id);
    if (!f->object && f->object_offset)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': fragment %llu: object_offset without an object",
                       t->name, (unsigned long long)id);
    fr_group *g;
    rc = new_group(m, t->ndim, f->has_strides, &g);
    if (rc < 0)
        return fr_fail(err, rc, "tensor '%s': fragment %llu: %s", t->name, (unsigned long long)id,
                       ferry_strerror(rc));
    if (f->object) {
        int32_t oid;
        rc = intern_object(m, f->object, &oid);
        if (rc < 0)
            return fr_fail(err, rc, "out of memory");
        g->object = oid;
        g->object_offset = f->object_offset;
    }
    g->tensor = f->tensor;
    g->rank = f->rank;
    g->replicas = 1;
    g->replica = f->replica;
    g->ncells = 1;
    g->storage_offset = f->storage_offset;
    for (uint32_t d = 0; d < t->ndim; d++) {
        G_OFF(m, g)[d] = f->offset[d];
        G_EXT(m, g)[d] = f->shape[d];
        G_CHUNK(m, g)[d] = f->shape[d];
        G_PARTS(m, g)[d] = 1;
        if (f->has_strides)
            G_STRIDES(m, g)[d] = f->strides[d];
    }
    commit_group(m, g);
    m->nexplicit++;
    return 0;
}

int ferry_manifest_add_split(ferry_manifest *m, const ferry_split *s, ferry_error *err)
{
    if (!m || !s)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    int rc = check_mutable(m, err);
    if (rc < 0)
        return rc;
    uint64_t id = m->nfrags;
    if (s->tensor >= m->ntensors)
        return fr_fail(err, FERRY_EINVAL, "split at fragment %llu: tensor index %u out of range (%zu tensors)",
                       (unsigned long long)id, s->tensor, m->ntensors);
    const fr_tensor *t = &m->tensors[s->tensor];
    char b1[200], b2[200];
    if (t->qrole)
        return quantized_fixed(t, err);
    uint64_t off[FR_MAXD], ext[FR_MAXD], chunk[FR_MAXD], parts[FR_MAXD], rstride[FR_MAXD];
    uint64_t cells = 1, maxrank = s->rank, x;
    for (uint32_t d = 0; d < t->ndim; d++) {
        off[d] = s->whole ? 0 : s->offset[d];
        ext[d] = s->whole ? t->shape[d] : s->shape[d];
        uint64_t end;
        if (ext[d] == 0 || fr_add_u64(off[d], ext[d], &end) < 0 || end > t->shape[d])
            return fr_fail(err, FERRY_EINVAL,
                           "tensor '%s': split at fragment %llu: box offset %s shape %s is empty or outside the tensor shape %s",
                           t->name, (unsigned long long)id, fr_fmt_dims(b1, sizeof b1, off, d + 1),
                           fr_fmt_dims(b2, sizeof b2, ext, d + 1), fr_fmt_dims((char[200]){0}, 200, t->shape, t->ndim));
        uint64_t want = s->parts[d] ? s->parts[d] : 1;
        chunk[d] = (ext[d] + want - 1) / want;
        parts[d] = (ext[d] + chunk[d] - 1) / chunk[d];
        rstride[d] = parts[d] > 1 ? s->rank_stride[d] : 0;
        if (parts[d] == 1)
            chunk[d] = ext[d];
        cells *= parts[d];   /* <= elements of the tensor */
        bool ovf = fr_mul_u64(want - 1, s->rank_stride[d], &x) < 0 || fr_add_u64(maxrank, x, &maxrank) < 0;
        if (ovf)
            maxrank = UINT64_MAX;
    }
    uint64_t reps = s->replicas ? s->replicas : 1;
    if (fr_mul_u64(reps - 1, s->replica_stride, &x) < 0 || fr_add_u64(maxrank, x, &maxrank) < 0)
        maxrank = UINT64_MAX;
    if (maxrank >= m->nranks)
        return fr_fail(err, FERRY_EINVAL,
                       "tensor '%s': split at fragment %llu: its pieces reach rank %llu, outside the topology (%u ranks)",
                       t->name, (unsigned long long)id, (unsigned long long)maxrank, m->nranks);
    if ((uint64_t)s->replica + reps - 1 > UINT32_MAX)
        return fr_fail(err, FERRY_ERANGE, "tensor '%s': split at fragment %llu: replica numbers overflow",
                       t->name, (unsigned long long)id);
    uint64_t nf;
    if (fr_mul_u64(cells, reps, &nf) < 0 || fr_add_u64(m->nfrags, nf, &x) < 0 || x >= UINT64_MAX / 2)
        return fr_fail(err, FERRY_EMSGSIZE, "tensor '%s': split at fragment %llu: fragment count overflows",
                       t->name, (unsigned long long)id);
    fr_group *g;
    rc = new_group(m, t->ndim, false, &g);
    if (rc < 0)
        return fr_fail(err, rc, "tensor '%s': split at fragment %llu: %s", t->name, (unsigned long long)id,
                       ferry_strerror(rc));
    g->tensor = s->tensor;
    g->rank = s->rank;
    g->replicas = (uint32_t)reps;
    g->replica_stride = reps > 1 ? s->replica_stride : 0;
    g->replica = s->replica;
    g->ncells = cells;
    g->is_split = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        G_OFF(m, g)[d] = off[d];
        G_EXT(m, g)[d] = ext[d];
        G_CHUNK(m, g)[d] = chunk[d];
        G_PARTS(m, g)[d] = parts[d];
        G_RSTRIDE(m, g)[d] = rstride[d];
    }
    commit_group(m, g);
    return 0;
}

