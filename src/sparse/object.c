/* Sparse COO objects (sparse.h, docs/sparse.md): put (validate, sort by
 * (tile, element), merge duplicates, build the tile index, store one
 * structured object), owner admission, and the compact-index read that
 * touches only meta, tile_coords and tile_ptr. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "sparse/sparse_int.h"

#define SCHEMA "ferry.sparse_object"
#define TILE_TARGET 16384u        /* elements per default tile */
#define META_MAX (1u << 20)       /* bytes of a meta member we accept */

/* ---- key and meta ------------------------------------------------------------------- */

int fr_sparse_key(const ferry_sparse_desc *d, char *buf, size_t cap)
{
    char pl[64];
    const ferry_sparse_placement *p = &d->placement;
    int an = (int)strnlen(p->axis, sizeof p->axis);
    if (p->kind == FERRY_SPARSE_OWNER)
        snprintf(pl, sizeof pl, "own-%.*s-%" PRIu32, an, p->axis, p->owner);
    else if (an)
        snprintf(pl, sizeof pl, "rep-%.*s", an, p->axis);
    else
        snprintf(pl, sizeof pl, "rep");
    int n = snprintf(buf, cap, "ferry/sp/%.*s/%020" PRIu64 "-%020" PRIu64 "/%s",
                     FERRY_SPARSE_ID_MAX, d->tensor_id, d->base_generation, d->delta_generation,
                     pl);
    if (n < 0 || (size_t)n >= cap)
        return FERRY_EMSGSIZE;
    return n;
}

/* "<object key>/owner": the admission key of a sparse object (KV). */
static int owner_key(const char *key, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s/owner", key);
    return n < 0 || (size_t)n >= cap ? FERRY_EMSGSIZE : n;
}

int ferry_sparse_remove(ferry_store *s, const char *key, ferry_error *err)
{
    char ok[FERRY_STORE_KEY_MAX + 16];
    if (!s || !key || !key[0] || owner_key(key, ok, sizeof ok) < 0)
        return fr_fail(err, FERRY_EINVAL, "sparse_remove: no store, or '%s' is no sparse object's "
                       "key", key ? key : "");
    int rc = ferry_store_remove(s, key, err);
    (void)ferry_kv_delete(s, ok, 0, NULL, NULL);
    return rc;
}

int ferry_sparse_remove_many(ferry_store *s, const char *const *keys, size_t n, int *results,
                             ferry_error *err)
{
    if (!s || (n && (!keys || !results)))
        return fr_fail(err, FERRY_EINVAL, "sparse_remove_many: store, keys and results are "
                       "required");
    if (n == 0)
        return 0;
    char (*ok)[FERRY_STORE_KEY_MAX + 16] = fr_calloc(n, sizeof *ok);
    const char **k = fr_calloc(n, sizeof *k), **okp = fr_calloc(n, sizeof *okp);
    size_t *slot = fr_calloc(n, sizeof *slot);
    int *res = fr_calloc(n, sizeof *res);
    int rc = ok && k && okp && slot && res ? 0
             : fr_fail(err, FERRY_ENOMEM, "sparse_remove_many: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = rc;
        if (rc < 0)
            continue;
        if (!keys[i] || !keys[i][0] || owner_key(keys[i], ok[m], sizeof ok[m]) < 0) {
            results[i] = fr_fail(err, FERRY_EINVAL, "sparse_remove: '%s' is no sparse object's "
                                 "key", keys[i] ? keys[i] : "");
            continue;
        }
        k[m] = keys[i], okp[m] = ok[m], slot[m++] = i;
    }
    if (rc == 0 && m) {
        (void)ferry_store_batch_remove(s, k, m, res, err);   /* per key below */
        for (size_t q = 0; q < m; q++)
            results[slot[q]] = res[q];
        (void)ferry_kv_batch_delete(s, okp, m, res, NULL);   /* the admission keys */
    }
    int first = rc;
    for (size_t i = 0; i < n && first == 0; i++)
        first = results[i];
    fr_free(ok);
    fr_free(k);
    fr_free(okp);
    fr_free(slot);
    fr_free(res);
    return first;
}

int ferry_sparse_remove_tensors(ferry_store *s, const char *tensor_prefix, uint64_t *removed,
                                ferry_error *err)
{
    char p[FERRY_SPARSE_ID_MAX + 16];
    if (!s || !tensor_prefix || !tensor_prefix[0] || strlen(tensor_prefix) > FERRY_SPARSE_ID_MAX)
        return fr_fail(err, FERRY_EINVAL, "sparse_remove_tensors: no store, or an empty tensor "
                       "prefix or one longer than %d bytes", FERRY_SPARSE_ID_MAX);
    snprintf(p, sizeof p, "ferry/sp/%s", tensor_prefix);
    return ferry_store_remove_prefix(s, p, removed, err);
}

int ferry_sparse_remove_base(ferry_store *s, const char *tensor_id, uint64_t base,
                             uint64_t *removed, ferry_error *err)
{
    char p[FERRY_SPARSE_ID_MAX + 48];
    if (!s || !tensor_id || !tensor_id[0] || strlen(tensor_id) > FERRY_SPARSE_ID_MAX ||
        strchr(tensor_id, '/'))
        return fr_fail(err, FERRY_EINVAL, "sparse_remove_base: no store, or a tensor id that is "
                       "empty, holds '/' or is longer than %d bytes", FERRY_SPARSE_ID_MAX);
    /* the key's tensor and base, up to the '-' before the delta: nothing
     * of another tensor or base shares it */
    snprintf(p, sizeof p, "ferry/sp/%s/%020" PRIu64 "-", tensor_id, base);
    return ferry_store_remove_prefix(s, p, removed, err);
}

static bool id_ok(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == 0 || n == cap)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || s[i] == '/' || s[i] == 0x7f)
            return false;
    return true;
}

static bool axis_ok(const char *s)
{
    size_t n = strnlen(s, 16);
    if (n == 16)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.'))
            return false;
    }
    return true;
}

/* Elements of the padded tile grid (prod ceil(shape/tile) * tile) fit in a
 * u64, so a (tile, element) sort key does too. */
static int grid_fits(const ferry_sparse_desc *d)
{
    uint64_t g = 1, v = 1;
    for (uint32_t k = 0; k < d->ndim; k++) {
        uint64_t n = d->shape[k] / d->tile[k] + (d->shape[k] % d->tile[k] != 0);
        if (fr_mul_u64(g, n, &g) < 0 || fr_mul_u64(v, d->tile[k], &v) < 0)
            return FERRY_ERANGE;
    }
    return fr_mul_u64(g, v, &g);
}

/* The checks shared by put and the decoder (everything but nnz/ntiles). */
static int desc_check(const ferry_sparse_desc *d, bool need_tile, char *why, size_t cap)
{
    if (!id_ok(d->tensor_id, sizeof d->tensor_id))
        return snprintf(why, cap, "tensor_id must be 1..%d printable bytes without '/' or spaces",
                        FERRY_SPARSE_ID_MAX), -1;
    if (d->ndim < 1 || d->ndim > FERRY_SPARSE_NDIM_MAX)
        return snprintf(why, cap, "ndim %" PRIu32 " is outside 1..%d", d->ndim,
                        FERRY_SPARSE_NDIM_MAX), -1;
    for (uint32_t k = 0; k < d->ndim; k++) {
        if (d->shape[k] == 0 || d->shape[k] > INT64_MAX)
            return snprintf(why, cap, "shape[%" PRIu32 "] = %" PRIu64 " is not in 1..2^63-1", k,
                            d->shape[k]), -1;
        if ((need_tile || d->tile[k]) && (d->tile[k] == 0 || d->tile[k] > d->shape[k]))
            return snprintf(why, cap, "tile[%" PRIu32 "] = %" PRIu64 " is not in 1..shape[%" PRIu32
                            "] = %" PRIu64, k, d->tile[k], k, d->shape[k]), -1;
    }
    if (d->base_generation >= d->delta_generation || d->delta_generation > INT64_MAX)
        return snprintf(why, cap, "generations must satisfy base < delta <= 2^63-1 (base %" PRIu64
                        ", delta %" PRIu64 ")", d->base_generation, d->delta_generation), -1;
    if (d->placement.kind != FERRY_SPARSE_OWNER && d->placement.kind != FERRY_SPARSE_REPLICATE)
        return snprintf(why, cap, "placement kind %d is neither OWNER nor REPLICATE",
                        (int)d->placement.kind), -1;
    if (!axis_ok(d->placement.axis) ||
        (d->placement.kind == FERRY_SPARSE_OWNER && !d->placement.axis[0]))
        return snprintf(why, cap, "placement axis must be 0..15 of [A-Za-z0-9_.] (non-empty for "
                        "OWNER)"), -1;
    if (d->placement.kind == FERRY_SPARSE_REPLICATE && d->placement.owner != 0)
        return snprintf(why, cap, "a REPLICATE placement has owner 0"), -1;
    if (d->apply != FERRY_SPARSE_SCATTER_ADD && d->apply != FERRY_SPARSE_SCATTER_SET)
        return snprintf(why, cap, "apply %d is neither SCATTER_ADD nor SCATTER_SET",
                        (int)d->apply), -1;
    if (!fr_sp_index_size(d->index_dtype) || strnlen(d->index_dtype, 8) == 8)
        return snprintf(why, cap, "index dtype '%.7s' is not i32 or i64", d->index_dtype), -1;
    if (!fr_sp_value_size(d->value_dtype) || strnlen(d->value_dtype, 8) == 8)
        return snprintf(why, cap, "value dtype '%.7s' is not f32, bf16 or f16", d->value_dtype),
               -1;
    return 0;
}

int fr_sparse_meta_encode(const ferry_sparse_desc *d, char **out, size_t *len)
{
    json_t *shape = json_array(), *tile = json_array();
    for (uint32_t k = 0; k < d->ndim && k < FERRY_SPARSE_NDIM_MAX; k++) {
        json_array_append_new(shape, json_integer((json_int_t)d->shape[k]));
        json_array_append_new(tile, json_integer((json_int_t)d->tile[k]));
    }
    json_t *pl = json_pack("{s:s, s:s%, s:I}",
                           "kind", d->placement.kind == FERRY_SPARSE_OWNER ? "owner" : "replicate",
                           "axis", d->placement.axis, strnlen(d->placement.axis, 16),
                           "owner", (json_int_t)d->placement.owner);
    json_t *j = json_pack("{s:s, s:i, s:s, s:s, s:o, s:o, s:I, s:I, s:o, s:s, s:s, s:s, s:I, s:I}",
                          "schema", SCHEMA, "version", 1, "tensor_id", d->tensor_id,
                          "coordinate_space", "global", "shape", shape, "tile", tile,
                          "base_generation", (json_int_t)d->base_generation,
                          "delta_generation", (json_int_t)d->delta_generation, "placement", pl,
                          "apply", d->apply == FERRY_SPARSE_SCATTER_SET ? "scatter_set"
                                                                        : "scatter_add",
                          "index_dtype", d->index_dtype, "value_dtype", d->value_dtype,
                          "nnz", (json_int_t)d->nnz, "ntiles", (json_int_t)d->ntiles);
    if (!j)
        return FERRY_ENOMEM;
    char *s = fr_json_dump_canonical(j);
    json_decref(j);
    if (!s)
        return FERRY_ENOMEM;
    *out = s;
    *len = strlen(s);
    return 0;
}

static int meta_fail(ferry_error *err, const char *why)
{
    return fr_fail(err, FERRY_EPROTO, "sparse meta: %s", why);
}

static int get_u64_array(const json_t *j, const char *name, uint64_t *out, size_t max, size_t *n)
{
    json_t *a = json_object_get(j, name);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > max)
        return -1;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return -1;
        out[i] = (uint64_t)json_integer_value(v);
    }
    *n = json_array_size(a);
    return 0;
}

static int copy_str(const json_t *j, const char *name, char *dst, size_t cap)
{
    json_t *v = json_object_get(j, name);
    if (!json_is_string(v) || json_string_length(v) >= cap ||
        strlen(json_string_value(v)) != json_string_length(v))
        return -1;
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

int fr_sparse_meta_decode(const char *text, size_t len, ferry_sparse_desc *out, ferry_error *err)
{
    json_t *j = NULL;
    char why[256];
    if (!text || fr_json_parse(text, len, &j, why, sizeof why) < 0)
        return meta_fail(err, "not JSON");
    ferry_sparse_desc d;
    memset(&d, 0, sizeof d);
    int rc = FERRY_EPROTO;
    const char *msg = "missing or malformed field";
    json_t *pl = json_object_get(j, "placement"), *v;
    size_t ns = 0, nt = 0;
    const char *kind, *apply;
    uint64_t owner, u;
    if (!json_is_object(j) || !json_is_string(json_object_get(j, "schema")) ||
        strcmp(json_string_value(json_object_get(j, "schema")), SCHEMA) != 0) {
        msg = "schema is not " SCHEMA;
        goto out;
    }
    if (fr_json_get_u64(j, "version", &u, why, sizeof why) < 0 || u != 1) {
        msg = "version is not 1";
        goto out;
    }
    if (copy_str(j, "tensor_id", d.tensor_id, sizeof d.tensor_id) < 0 ||
        get_u64_array(j, "shape", d.shape, FERRY_SPARSE_NDIM_MAX, &ns) < 0 ||
        get_u64_array(j, "tile", d.tile, FERRY_SPARSE_NDIM_MAX, &nt) < 0 || ns != nt ||
        fr_json_get_u64(j, "base_generation", &d.base_generation, why, sizeof why) < 0 ||
        fr_json_get_u64(j, "delta_generation", &d.delta_generation, why, sizeof why) < 0 ||
        fr_json_get_u64(j, "nnz", &d.nnz, why, sizeof why) < 0 ||
        fr_json_get_u64(j, "ntiles", &d.ntiles, why, sizeof why) < 0 ||
        copy_str(j, "index_dtype", d.index_dtype, sizeof d.index_dtype) < 0 ||
        copy_str(j, "value_dtype", d.value_dtype, sizeof d.value_dtype) < 0 ||
        !json_is_object(pl) || copy_str(pl, "axis", d.placement.axis, sizeof d.placement.axis) < 0 ||
        fr_json_get_u64(pl, "owner", &owner, why, sizeof why) < 0 || owner > UINT32_MAX ||
        !json_is_string(json_object_get(pl, "kind")) ||
        !json_is_string(v = json_object_get(j, "apply")))
        goto out;
    d.ndim = (uint32_t)ns;
    d.placement.owner = (uint32_t)owner;
    kind = json_string_value(json_object_get(pl, "kind"));
    apply = json_string_value(v);
    if (strcmp(kind, "owner") == 0)
        d.placement.kind = FERRY_SPARSE_OWNER;
    else if (strcmp(kind, "replicate") == 0)
        d.placement.kind = FERRY_SPARSE_REPLICATE;
    else {
        msg = "placement kind is neither owner nor replicate";
        goto out;
    }
    if (strcmp(apply, "scatter_add") == 0)
        d.apply = FERRY_SPARSE_SCATTER_ADD;
    else if (strcmp(apply, "scatter_set") == 0)
        d.apply = FERRY_SPARSE_SCATTER_SET;
    else {
        msg = "apply is neither scatter_add nor scatter_set";
        goto out;
    }
    if (desc_check(&d, true, why, sizeof why) < 0) {
        msg = why;
        goto out;
    }
    if (grid_fits(&d) < 0) {
        msg = "the tile grid has more than 2^64 elements";
        goto out;
    }
    if (d.nnz == 0 || d.ntiles == 0 || d.ntiles > d.nnz) {
        msg = "nnz and ntiles must satisfy 0 < ntiles <= nnz";
        goto out;
    }
    *out = d;
    rc = 0;
out:
    json_decref(j);
    return rc == 0 ? 0 : meta_fail(err, msg);
}

/* ---- put ------------------------------------------------------------------------------ */

/* The default tile: about TILE_TARGET elements, as square as the shape
 * allows. Dimensions are visited smallest first; each takes the r-th root
 * of the remaining budget (r = dimensions left) rounded down to a power of
 * two (so tile edges fall on the power-of-two splits TP layouts make),
 * capped by its extent, so a short dimension hands its unused share to the
 * longer ones. */
static void default_tile(const uint64_t *shape, uint32_t ndim, uint64_t *tile)
{
    uint32_t ord[FERRY_SPARSE_NDIM_MAX];
    for (uint32_t k = 0; k < ndim; k++)
        ord[k] = k;
    for (uint32_t a = 1; a < ndim; a++)     /* insertion sort by extent */
        for (uint32_t b = a; b > 0 && shape[ord[b]] < shape[ord[b - 1]]; b--) {
            uint32_t t = ord[b];
            ord[b] = ord[b - 1];
            ord[b - 1] = t;
        }
    uint64_t budget = TILE_TARGET;
    for (uint32_t i = 0; i < ndim; i++) {
        uint32_t r = ndim - i;
        uint64_t x = 1;
        for (;;) {          /* largest x with (x+1)^r > budget */
            uint64_t p = 1, y = x + 1;
            bool over = false;
            for (uint32_t e = 0; e < r && !over; e++)
                over = fr_mul_u64(p, y, &p) < 0 || p > budget;
            if (over)
                break;
            x = y;
        }
        while (x & (x - 1))
            x &= x - 1;   /* the highest power of two <= x */
        uint64_t t = x < shape[ord[i]] ? x : shape[ord[i]];
        tile[ord[i]] = t;
        budget /= t;
        if (budget == 0)
            budget = 1;
    }
}

typedef struct { uint64_t key, idx; } sortent;

/* LSD radix sort by key, stable (equal keys keep input order), skipping
 * bytes every key shares. */
static int radix_sort(sortent *a, size_t n)
{
    sortent *b = fr_warm_alloc(n * sizeof *b);
    if (!b)
        return FERRY_ENOMEM;
    uint64_t all_or = 0, all_and = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        all_or |= a[i].key;
        all_and &= a[i].key;
    }
    sortent *src = a, *dst = b;
    for (int shift = 0; shift < 64; shift += 8) {
        if ((((all_or ^ all_and) >> shift) & 0xff) == 0)
            continue;       /* this byte is the same in every key */
        size_t cnt[257] = {0};
        for (size_t i = 0; i < n; i++)
            cnt[((src[i].key >> shift) & 0xff) + 1]++;
        for (int k = 0; k < 256; k++)
            cnt[k + 1] += cnt[k];
        for (size_t i = 0; i < n; i++)
            dst[cnt[(src[i].key >> shift) & 0xff]++] = src[i];
        sortent *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof *a);
    fr_warm_free(b);
    return 0;
}

static void fmt_coord(char *buf, size_t cap, const int64_t *c, uint32_t ndim)
{
    size_t o = 0;
    for (uint32_t k = 0; k < ndim && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, k ? ", " : "", c[k]);
}

static void fmt_shape(char *buf, size_t cap, const uint64_t *c, uint32_t ndim)
{
    size_t o = 0;
    for (uint32_t k = 0; k < ndim && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRIu64, k ? ", " : "", c[k]);
}

/* The sorted, merged object under construction. */
typedef struct built {
    sortent *ent;             /* nnz_in, sorted */
    void *indices, *values;   /* nnz entries */
    int64_t *tile_coords, *tile_ptr;
    uint64_t nnz, ntiles;
} built;

static void built_free(built *b)
{
    fr_warm_free(b->ent);   /* the entry-sized buffers are warm (base.h) */
    fr_warm_free(b->indices);
    fr_warm_free(b->values);
    fr_free(b->tile_coords);
    fr_free(b->tile_ptr);
}

/* Sort keys for every entry after checking it is inside the shape. */
static int make_keys(const ferry_sparse_desc *d, const void *indices, size_t isz, built *b,
                     ferry_error *err)
{
    uint64_t grid[FERRY_SPARSE_NDIM_MAX], vol = 1;
    for (uint32_t k = 0; k < d->ndim; k++) {
        grid[k] = d->shape[k] / d->tile[k] + (d->shape[k] % d->tile[k] != 0);
        vol *= d->tile[k];
    }
    for (uint64_t i = 0; i < d->nnz; i++) {
        uint64_t t = 0, e = 0;
        for (uint32_t k = 0; k < d->ndim; k++) {
            int64_t c = fr_sp_coord(indices, isz, i, d->ndim, k);
            if (c < 0 || (uint64_t)c >= d->shape[k]) {
                int64_t cc[FERRY_SPARSE_NDIM_MAX];
                char a[200], s[200];
                for (uint32_t q = 0; q < d->ndim; q++)
                    cc[q] = fr_sp_coord(indices, isz, i, d->ndim, q);
                fmt_coord(a, sizeof a, cc, d->ndim);
                fmt_shape(s, sizeof s, d->shape, d->ndim);
                return fr_fail(err, FERRY_EINVAL,
                               "put_sparse_object %s: indices[%" PRIu64 "] = (%s) is outside "
                               "the shape (%s); nothing stored", d->tensor_id, i, a, s);
            }
            t = t * grid[k] + (uint64_t)c / d->tile[k];
            e = e * d->tile[k] + (uint64_t)c % d->tile[k];
        }
        b->ent[i].key = t * vol + e;
        b->ent[i].idx = i;
    }
    return 0;
}

static float value_f32(const void *values, const char *dt, size_t vsz, uint64_t i)
{
    return fr_elem_load_f32((const uint8_t *)values + i * vsz, fr_ftype_of(dt));
}

/* Merge duplicates (policy in sparse.h), gather indices and values in
 * sorted order and build tile_coords/tile_ptr. */
static int build_sorted(const ferry_sparse_desc *d, const void *indices, const void *values,
                        size_t isz, size_t vsz, built *b, ferry_error *err)
{
    uint64_t vol = 1, n = d->nnz;
    for (uint32_t k = 0; k < d->ndim; k++)
        vol *= d->tile[k];
    uint64_t uniq = 0, tiles = 0;
    for (uint64_t i = 0; i < n; i++) {
        bool dup = i && b->ent[i].key == b->ent[i - 1].key;
        if (dup && d->apply == FERRY_SPARSE_SCATTER_SET) {
            int64_t cc[FERRY_SPARSE_NDIM_MAX];
            char a[200];
            for (uint32_t q = 0; q < d->ndim; q++)
                cc[q] = fr_sp_coord(indices, isz, b->ent[i].idx, d->ndim, q);
            fmt_coord(a, sizeof a, cc, d->ndim);
            return fr_fail(err, FERRY_EINVAL,
                           "put_sparse_object %s: coordinate (%s) appears twice (entries %"
                           PRIu64 " and %" PRIu64 "); scatter_set refuses duplicates; nothing "
                           "stored", d->tensor_id, a, b->ent[i - 1].idx, b->ent[i].idx);
        }
        uniq += !dup;
        tiles += !i || b->ent[i].key / vol != b->ent[i - 1].key / vol;
    }
    size_t row = (size_t)d->ndim * isz;
    b->indices = fr_warm_alloc(uniq * row);
    b->values = fr_warm_alloc(uniq * vsz);
    b->tile_coords = fr_malloc(tiles * d->ndim * sizeof(int64_t));
    b->tile_ptr = fr_malloc((tiles + 1) * sizeof(int64_t));
    if (!b->indices || !b->values || !b->tile_coords || !b->tile_ptr)
        return FERRY_ENOMEM;
    uint64_t o = 0, t = 0;
    for (uint64_t i = 0; i < n;) {
        uint64_t j = i + 1, src = b->ent[i].idx;
        while (j < n && b->ent[j].key == b->ent[i].key)
            j++;
        memcpy((uint8_t *)b->indices + o * row, (const uint8_t *)indices + src * row, row);
        if (j - i == 1) {
            memcpy((uint8_t *)b->values + o * vsz, (const uint8_t *)values + src * vsz, vsz);
        } else {            /* duplicates under scatter_add: sum in f32, in input order */
            float sum = 0.0f;
            for (uint64_t q = i; q < j; q++)
                sum += value_f32(values, d->value_dtype, vsz, b->ent[q].idx);
            fr_elem_store_f32((uint8_t *)b->values + o * vsz, fr_ftype_of(d->value_dtype), sum);
        }
        if (!i || b->ent[i].key / vol != b->ent[i - 1].key / vol) {
            for (uint32_t k = 0; k < d->ndim; k++)
                b->tile_coords[t * d->ndim + k] =
                    fr_sp_coord(indices, isz, src, d->ndim, k) / (int64_t)d->tile[k];
            b->tile_ptr[t++] = (int64_t)o;
        }
        o++;
        i = j;
    }
    b->tile_ptr[t] = (int64_t)o;
    b->nnz = uniq;
    b->ntiles = tiles;
    return 0;
}

/* One object of a put: its descriptor as stored, key, sorted entries,
 * meta and the struct's members. */
typedef struct sp_put {
    ferry_sparse_desc sd;
    char key[512];
    built b;
    char *meta;
    ferry_member m[5];
    const void *data[5];
} sp_put;

static void put_free(sp_put *p)
{
    built_free(&p->b);
    free(p->meta);
    memset(p, 0, sizeof *p);
}

/* Everything checked, the tile chosen and the key made: no store call. */
static int put_check(const ferry_sparse_desc *d, const void *indices, const void *values,
                     sp_put *p, ferry_error *err)
{
    memset(p, 0, sizeof *p);
    if (!d || !indices || !values)
        return fr_fail(err, FERRY_EINVAL, "put_sparse_object: store, descriptor, indices and "
                       "values are required");
    char why[256];
    if (desc_check(d, false, why, sizeof why) < 0)
        return fr_fail(err, FERRY_EINVAL, "put_sparse_object %.*s: %s; nothing stored",
                       FERRY_SPARSE_ID_MAX, d->tensor_id, why);
    ferry_sparse_desc sd = *d;
    bool chosen = true;
    for (uint32_t k = 0; k < sd.ndim; k++)
        chosen = chosen && sd.tile[k] == 0;
    for (uint32_t k = 0; k < sd.ndim && !chosen; k++)
        if (sd.tile[k] == 0)
            return fr_fail(err, FERRY_EINVAL, "put_sparse_object %s: tile shape must be all 0 "
                           "(chosen) or all set; tile[%" PRIu32 "] is 0; nothing stored",
                           d->tensor_id, k);
    for (uint32_t k = sd.ndim; k < FERRY_SPARSE_NDIM_MAX; k++)
        sd.shape[k] = sd.tile[k] = 0;
    if (chosen)
        default_tile(sd.shape, sd.ndim, sd.tile);
    if (grid_fits(&sd) < 0)
        return fr_fail(err, FERRY_EINVAL, "put_sparse_object %s: the tile grid of this shape "
                       "has more than 2^64 elements; nothing stored", d->tensor_id);
    uint64_t bytes;
    if (sd.nnz == 0 || fr_mul_u64(sd.nnz, (uint64_t)sd.ndim * 8 + 16, &bytes) < 0 ||
        bytes > SIZE_MAX / 2)
        return fr_fail(err, FERRY_EINVAL, "put_sparse_object %s: nnz %" PRIu64 " must be in "
                       "1..%zu (an update with no entries is not stored); nothing stored",
                       d->tensor_id, sd.nnz, (size_t)(SIZE_MAX / 2 / (sd.ndim * 8 + 16)));
    if (fr_sparse_key(&sd, p->key, sizeof p->key) < 0)
        return fr_fail(err, FERRY_EINVAL, "put_sparse_object %s: key too long", d->tensor_id);
    p->sd = sd;
    return 0;
}

static int put_exists(const sp_put *p, ferry_error *err)
{
    return fr_fail(err, FERRY_EEXIST, "put_sparse_object: %s already exists (same tensor, "
                   "base, delta and placement); nothing stored", p->key);
}

/* The entries sorted, duplicates merged, the tile index and meta built and
 * the struct's members set. On failure p keeps nothing to free but what
 * put_free frees. */
static int put_build(const void *indices, const void *values, sp_put *p, ferry_error *err)
{
    ferry_sparse_desc *sd = &p->sd;
    size_t isz = fr_sp_index_size(sd->index_dtype), vsz = fr_sp_value_size(sd->value_dtype);
    built *b = &p->b;
    b->ent = fr_warm_alloc(sd->nnz * sizeof *b->ent);
    if (!b->ent)
        return fr_fail(err, FERRY_ENOMEM, "put_sparse_object %s: out of memory for %" PRIu64
                       " entries", sd->tensor_id, sd->nnz);
    int rc = make_keys(sd, indices, isz, b, err);
    if (rc == 0 && (rc = radix_sort(b->ent, sd->nnz)) < 0)
        fr_fail(err, rc, "put_sparse_object %s: out of memory sorting", sd->tensor_id);
    if (rc == 0 && (rc = build_sorted(sd, indices, values, isz, vsz, b, err)) == FERRY_ENOMEM)
        fr_fail(err, rc, "put_sparse_object %s: out of memory", sd->tensor_id);
    if (rc < 0)
        return rc;
    fr_warm_free(b->ent);   /* the sort's keys are not needed past here */
    b->ent = NULL;
    sd->nnz = b->nnz;
    sd->ntiles = b->ntiles;
    size_t mlen = 0;
    if ((rc = fr_sparse_meta_encode(sd, &p->meta, &mlen)) < 0)
        return fr_fail(err, rc, "put_sparse_object %s: cannot encode meta", sd->tensor_id);
    ferry_member *m = p->m;
    snprintf(m[0].name, sizeof m[0].name, "meta");
    snprintf(m[0].dtype, sizeof m[0].dtype, "u8");
    m[0].ndim = 1;
    m[0].shape[0] = mlen;
    snprintf(m[1].name, sizeof m[1].name, "tile_coords");
    snprintf(m[1].dtype, sizeof m[1].dtype, "i64");
    m[1].ndim = 2;
    m[1].shape[0] = b->ntiles;
    m[1].shape[1] = sd->ndim;
    snprintf(m[2].name, sizeof m[2].name, "tile_ptr");
    snprintf(m[2].dtype, sizeof m[2].dtype, "i64");
    m[2].ndim = 1;
    m[2].shape[0] = b->ntiles + 1;
    snprintf(m[3].name, sizeof m[3].name, "indices");
    snprintf(m[3].dtype, sizeof m[3].dtype, "%s", sd->index_dtype);
    m[3].ndim = 2;
    m[3].shape[0] = b->nnz;
    m[3].shape[1] = sd->ndim;
    snprintf(m[4].name, sizeof m[4].name, "values");
    snprintf(m[4].dtype, sizeof m[4].dtype, "%s", sd->value_dtype);
    m[4].ndim = 1;
    m[4].shape[0] = b->nnz;
    p->data[0] = p->meta, p->data[1] = b->tile_coords, p->data[2] = b->tile_ptr;
    p->data[3] = b->indices, p->data[4] = b->values;
    return 0;
}

/* The store's answer to p's put, in the put's words. */
static int put_stored(const sp_put *p, int rc, ferry_error *err)
{
    if (rc == FERRY_EEXIST)
        return put_exists(p, err);
    if (rc < 0)
        return fr_fail(err, rc, "put_sparse_object %s: %s", p->key, fr_why(err, rc));
    return 0;
}

static void put_out(const sp_put *p, ferry_sparse_desc *out, char *key, size_t keycap)
{
    if (out)
        *out = p->sd;
    if (key && keycap)
        snprintf(key, keycap, "%s", p->key);
}

static const ferry_replicate_config sp_repl = {.replica_num = 1, .hard_pin = true};

int ferry_put_sparse_object(ferry_store *s, const ferry_sparse_desc *d, const void *indices,
                            const void *values, ferry_sparse_desc *out, char *key, size_t keycap,
                            ferry_error *err)
{
    if (!s)
        return fr_fail(err, FERRY_EINVAL, "put_sparse_object: store, descriptor, indices and "
                       "values are required");
    sp_put p;
    int rc = put_check(d, indices, values, &p, err);
    if (rc == 0 && ferry_store_exist(s, p.key, NULL) == 1)
        rc = put_exists(&p, err);
    if (rc == 0)
        rc = put_build(indices, values, &p, err);
    if (rc == 0)
        rc = put_stored(&p, ferry_store_put_struct(s, p.key, p.m, p.data, 5, &sp_repl, err), err);
    if (rc == 0)
        put_out(&p, out, key, keycap);
    put_free(&p);
    return rc;
}

int ferry_put_sparse_objects(ferry_store *s, const ferry_sparse_desc *d,
                             const void *const *indices, const void *const *values, size_t n,
                             ferry_sparse_desc *out, char *keys, size_t keycap, int *results,
                             ferry_error *err)
{
    if (!s || (n && (!d || !indices || !values || !results)))
        return fr_fail(err, FERRY_EINVAL, "put_sparse_objects: store, descriptors, indices, "
                       "values and results are required");
    if (n == 0)
        return 0;
    sp_put *p = fr_calloc(n, sizeof *p);
    ferry_error *e = fr_calloc(n, sizeof *e);
    const char **k = fr_calloc(n, sizeof *k);
    ferry_object_desc *od = fr_calloc(n, sizeof *od);
    int *ex = fr_calloc(n, sizeof *ex), *res = fr_calloc(n, sizeof *res);
    size_t *slot = fr_calloc(n, sizeof *slot);
    const ferry_member **m = fr_calloc(n, sizeof *m);
    const void *const **data = fr_calloc(n, sizeof *data);
    size_t *nm = fr_calloc(n, sizeof *nm);
    int rc = p && e && k && od && ex && res && slot && m && data && nm ? 0
             : fr_fail(err, FERRY_ENOMEM, "put_sparse_objects: out of memory");
    size_t nk = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = rc;
        if (rc == 0 && (results[i] = put_check(&d[i], indices[i], values[i], &p[i], &e[i])) == 0)
            k[nk] = p[i].key, slot[nk++] = i;
    }
    /* the keys looked up first (one round trip for all): an existing one is
     * refused before anything of it is sorted */
    if (rc == 0 && nk)
        (void)ferry_store_batch_get_replica_desc(s, k, nk, od, ex, NULL);
    size_t np = 0;
    for (size_t q = 0; rc == 0 && q < nk; q++) {
        size_t i = slot[q];
        if (ex[q] == 0)
            results[i] = put_exists(&p[i], &e[i]);
        else if ((results[i] = put_build(indices[i], values[i], &p[i], &e[i])) == 0) {
            k[np] = p[i].key, m[np] = p[i].m, data[np] = p[i].data, nm[np] = 5;
            slot[np++] = i;
        }
    }
    if (rc == 0 && np)
        (void)ferry_store_batch_put_struct(s, k, m, data, nm, np, &sp_repl, res, err);
    for (size_t q = 0; rc == 0 && q < np; q++) {
        size_t i = slot[q];
        if (res[q] < 0)   /* its own words: the batch's err holds the last failure's */
            fr_fail(&e[i], res[q], "%s", ferry_strerror(res[q]));
        results[i] = put_stored(&p[i], res[q], &e[i]);
    }
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        if (rc == 0 && results[i] == 0)
            put_out(&p[i], out ? &out[i] : NULL, keys ? keys + i * keycap : NULL, keycap);
        else if (rc == 0 && keys && keycap)   /* its key whenever it has one (EEXIST) */
            snprintf(keys + i * keycap, keycap, "%s", p[i].key);
        if (rc == 0 && first == 0 && results[i] < 0) {
            first = results[i];
            if (err)
                *err = e[i];
        }
        if (p)
            put_free(&p[i]);
    }
    fr_free(p);
    fr_free(e);
    fr_free(k);
    fr_free(od);
    fr_free(ex);
    fr_free(res);
    fr_free(slot);
    fr_free(m);
    fr_free(data);
    fr_free(nm);
    return rc < 0 ? rc : first;
}

/* ---- admission ---------------------------------------------------------------------- */

int ferry_sparse_admit(ferry_store *s, const ferry_sparse_desc *d, uint32_t rank, bool *admitted,
                       ferry_error *err)
{
    if (!s || !d || !admitted)
        return fr_fail(err, FERRY_EINVAL, "sparse_admit: store, descriptor and result are "
                       "required");
    char why[256];
    ferry_sparse_desc sd = *d;
    for (uint32_t k = 0; k < FERRY_SPARSE_NDIM_MAX; k++)
        sd.tile[k] = 0;
    if (desc_check(&sd, false, why, sizeof why) < 0)
        return fr_fail(err, FERRY_EINVAL, "sparse_admit %.*s: %s", FERRY_SPARSE_ID_MAX,
                       d->tensor_id, why);
    char ok[600], k[600], val[16];
    if (fr_sparse_key(&sd, ok, sizeof ok) < 0 || owner_key(ok, k, sizeof k) < 0)
        return fr_fail(err, FERRY_EINVAL, "sparse_admit %s: key too long", d->tensor_id);
    int vl = snprintf(val, sizeof val, "%" PRIu32, rank);
    *admitted = false;
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t rev = 0;
        int rc = ferry_kv_cas(s, k, 0, val, (size_t)vl, &rev, err);
        if (rc == 0) {
            *admitted = true;
            return 0;
        }
        if (rc != FERRY_ESTATE && rc != FERRY_ECONNRESET)
            return fr_fail(err, rc, "sparse_admit %s: %s", k, fr_why(err, rc));
        /* Taken, or our own CAS whose reply was lost: the value names the
         * owner. Not there after a lost reply: the CAS never landed, try again. */
        ferry_kv_value cur;
        memset(&cur, 0, sizeof cur);
        rc = ferry_kv_get(s, k, &cur, err);
        if (rc == FERRY_ENOENT)
            continue;
        if (rc < 0)
            return fr_fail(err, rc, "sparse_admit %s: %s", k, fr_why(err, rc));
        *admitted = cur.len == (size_t)vl && memcmp(cur.val, val, (size_t)vl) == 0;
        ferry_store_free(cur.val);
        return 0;
    }
    return fr_fail(err, FERRY_ECONNRESET, "sparse_admit %s: the master connection kept "
                   "resetting", k);
}

/* ---- the compact index ---------------------------------------------------------------- */

static const ferry_member *find_member(const ferry_member *m, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].name, name) == 0)
            return &m[i];
    return NULL;
}

static bool member_is(const ferry_member *m, const char *dtype, uint32_t ndim, uint64_t s0,
                      uint64_t s1)
{
    return m && strcmp(m->dtype, dtype) == 0 && m->ndim == ndim && m->shape[0] == s0 &&
           (ndim < 2 || m->shape[1] == s1);
}

/* tile_ptr from 0 to nnz, strictly ascending (tiles are non-empty);
 * tile_coords inside the grid and strictly ascending in row-major order. */
static const char *check_tiles(const ferry_sparse_index *ix)
{
    const ferry_sparse_desc *d = &ix->desc;
    if (ix->tile_ptr[0] != 0 || (uint64_t)ix->tile_ptr[d->ntiles] != d->nnz)
        return "tile_ptr does not run from 0 to nnz";
    for (uint64_t t = 0; t < d->ntiles; t++) {
        if (ix->tile_ptr[t + 1] <= ix->tile_ptr[t])
            return "tile_ptr is not strictly ascending";
        const int64_t *c = ix->tile_coords + t * d->ndim;
        int cmp = t == 0 ? 1 : 0;
        for (uint32_t k = 0; k < d->ndim; k++) {
            uint64_t g = d->shape[k] / d->tile[k] + (d->shape[k] % d->tile[k] != 0);
            if (c[k] < 0 || (uint64_t)c[k] >= g)
                return "a tile coordinate is outside the tile grid";
            if (cmp == 0 && c[k] != c[k - (int64_t)d->ndim])
                cmp = c[k] > c[k - (int64_t)d->ndim] ? 1 : -1;
        }
        if (cmp <= 0)
            return "tile_coords are not strictly ascending";
    }
    return NULL;
}

/* One object's compact-index read: its member table, then the three
 * ranges of meta, tile_coords and tile_ptr. */
typedef struct ix_job {
    const char *key;
    ferry_member m[16];
    size_t n;
    const ferry_member *fm, *fc, *fp, *fi, *fv;
    char *meta;
    ferry_range r[3];
    size_t nr;
    int64_t got[3];
} ix_job;

/* The members checked, out's arrays allocated, j->r set to the ranges to
 * read. On failure nothing is left allocated. */
static int ix_prepare(ix_job *j, ferry_sparse_index *out, ferry_error *err)
{
    const char *key = j->key;
    size_t n = j->n > 16 ? 16 : j->n;
    j->fm = find_member(j->m, n, "meta"), j->fc = find_member(j->m, n, "tile_coords");
    j->fp = find_member(j->m, n, "tile_ptr"), j->fi = find_member(j->m, n, "indices");
    j->fv = find_member(j->m, n, "values");
    const ferry_member *fm = j->fm, *fc = j->fc, *fp = j->fp;
    if (!fm || !fc || !fp || !j->fi || !j->fv || strcmp(fm->dtype, "u8") != 0 || fm->ndim != 1 ||
        fm->nbytes == 0 || fm->nbytes > META_MAX || fc->ndim != 2 || fp->ndim != 1)
        return fr_fail(err, FERRY_EPROTO, "sparse_index_read %s: not a sparse object (members "
                       "meta, tile_coords, tile_ptr, indices, values expected)", key);
    j->meta = fr_malloc(fm->nbytes);
    out->tile_coords = fr_malloc(fc->nbytes ? fc->nbytes : 1);
    out->tile_ptr = fr_malloc(fp->nbytes ? fp->nbytes : 1);
    if (!j->meta || !out->tile_coords || !out->tile_ptr) {
        fr_free(j->meta);
        fr_free(out->tile_coords);
        fr_free(out->tile_ptr);
        j->meta = NULL;
        memset(out, 0, sizeof *out);
        return fr_fail(err, FERRY_ENOMEM, "sparse_index_read %s: out of memory", key);
    }
    j->r[0] = (ferry_range){.key = key, .src_offset = fm->offset, .dst = j->meta, .len = fm->nbytes};
    j->r[1] = (ferry_range){.key = key, .src_offset = fc->offset, .dst = out->tile_coords,
                            .len = fc->nbytes};
    j->r[2] = (ferry_range){.key = key, .src_offset = fp->offset, .dst = out->tile_ptr,
                            .len = fp->nbytes};
    j->nr = fc->nbytes ? 3 : 1;   /* an empty tile_coords is refused in ix_finish */
    return 0;
}

/* The ranges read (rc: the read's result): meta decoded, everything
 * checked. Frees j->meta; on failure out's arrays too. */
static int ix_finish(ix_job *j, int rc, ferry_sparse_index *out, ferry_member *mi,
                     ferry_member *mv, ferry_error *err)
{
    const char *key = j->key;
    if (rc < 0) {
        fr_fail(err, rc, "sparse_index_read %s: %s", key, fr_why(err, rc));
        goto fail;
    }
    for (size_t i = 0; i < j->nr; i++)
        if ((uint64_t)j->got[i] != j->r[i].len) {
            rc = fr_fail(err, FERRY_EPROTO, "sparse_index_read %s: short read", key);
            goto fail;
        }
    if ((rc = fr_sparse_meta_decode(j->meta, j->fm->nbytes, &out->desc, err)) < 0) {
        char m2[sizeof err->msg];
        snprintf(m2, sizeof m2, "%s", err ? err->msg : "");
        fr_fail(err, rc, "sparse_index_read %s: %s", key, m2);
        goto fail;
    }
    const ferry_sparse_desc *d = &out->desc;
    const char *why = NULL;
    if (!member_is(j->fc, "i64", 2, d->ntiles, d->ndim) ||
        !member_is(j->fp, "i64", 1, d->ntiles + 1, 0) ||
        !member_is(j->fi, d->index_dtype, 2, d->nnz, d->ndim) ||
        !member_is(j->fv, d->value_dtype, 1, d->nnz, 0))
        why = "member shapes or dtypes disagree with meta";
    else
        why = check_tiles(out);
    if (why) {
        rc = fr_fail(err, FERRY_EPROTO, "sparse_index_read %s: %s", key, why);
        goto fail;
    }
    snprintf(out->key, sizeof out->key, "%s", key);
    if (mi)
        *mi = *j->fi;
    if (mv)
        *mv = *j->fv;
    fr_free(j->meta);
    j->meta = NULL;
    return 0;
fail:
    fr_free(j->meta);
    j->meta = NULL;
    fr_free(out->tile_coords);
    fr_free(out->tile_ptr);
    memset(out, 0, sizeof *out);
    return rc;
}

static int ix_key_ok(const char *key, ferry_sparse_index *out, ferry_error *err)
{
    memset(out, 0, sizeof *out);
    if (strlen(key) >= sizeof out->key)
        return fr_fail(err, FERRY_EINVAL, "sparse_index_read: key longer than %zu bytes",
                       sizeof out->key - 1);
    return 0;
}

int fr_sparse_index_load(ferry_store *s, const char *key, ferry_sparse_index *out,
                         ferry_member *mi, ferry_member *mv, ferry_error *err)
{
    if (!s || !key || !out)
        return fr_fail(err, FERRY_EINVAL, "sparse_index_read: store, key and out are required");
    int rc = ix_key_ok(key, out, err);
    if (rc < 0)
        return rc;
    ix_job j = {.key = key};
    rc = ferry_store_get_members(s, key, j.m, 16, &j.n, err);
    if (rc < 0)
        return fr_fail(err, rc, "sparse_index_read %s: %s", key, fr_why(err, rc));
    if ((rc = ix_prepare(&j, out, err)) < 0)
        return rc;
    rc = ferry_store_get_into_ranges(s, j.r, j.nr, j.got, err);
    return ix_finish(&j, rc, out, mi, mv, err);
}

int fr_sparse_index_load_many(ferry_store *s, const char *const *keys, size_t n,
                              ferry_sparse_index *out, ferry_member *mi, ferry_member *mv,
                              int *rcs)
{
    if (n == 0)
        return 0;
    ix_job *j = fr_calloc(n, sizeof *j);
    const char **k = fr_calloc(n, sizeof *k);
    size_t *slot = fr_calloc(n, sizeof *slot), *cnt = fr_calloc(n, sizeof *cnt);
    int *res = fr_calloc(n, sizeof *res);
    ferry_member *m = fr_calloc(n * 16, sizeof *m);
    ferry_range *r = fr_calloc(3 * n, sizeof *r);
    int64_t *got = fr_calloc(3 * n, sizeof *got);
    size_t *rslot = fr_calloc(3 * n, sizeof *rslot);
    int ret = j && k && slot && cnt && res && m && r && got && rslot ? 0 : FERRY_ENOMEM;
    size_t nk = 0, nr = 0;
    ferry_error e;
    for (size_t i = 0; i < n; i++) {
        rcs[i] = ret;
        if (ret == 0 && (rcs[i] = ix_key_ok(keys[i], &out[i], &e)) == 0) {
            k[nk] = keys[i];
            slot[nk++] = i;
        }
    }
    if (ret == 0 && nk)
        ferry_store_batch_get_members(s, k, nk, m, 16, cnt, res, &e);   /* per key below */
    for (size_t q = 0; q < nk && ret == 0; q++) {
        size_t i = slot[q];
        j[i].key = keys[i];
        if ((rcs[i] = res[q]) < 0)
            continue;
        memcpy(j[i].m, m + q * 16, 16 * sizeof *m);
        j[i].n = cnt[q];
        if ((rcs[i] = ix_prepare(&j[i], &out[i], &e)) < 0)
            continue;
        for (size_t t = 0; t < j[i].nr; t++) {
            r[nr] = j[i].r[t];
            rslot[nr++] = i;
        }
    }
    if (ret == 0 && nr)
        ferry_store_get_into_ranges(s, r, nr, got, &e);   /* each range's result below */
    for (size_t t = 0, c = 0; t < nr; t++) {
        size_t i = rslot[t];
        c = t > 0 && rslot[t - 1] == i ? c + 1 : 0;
        j[i].got[c] = got[t];
        if (got[t] < 0 && rcs[i] == 0)
            rcs[i] = (int)got[t];
    }
    for (size_t i = 0; i < n && ret == 0; i++)
        if (j[i].meta) {   /* prepared: finish it, whatever its reads gave */
            int rc = rcs[i];
            rcs[i] = ix_finish(&j[i], rc, &out[i], mi ? &mi[i] : NULL, mv ? &mv[i] : NULL, &e);
        }
    fr_free(j);
    fr_free(k);
    fr_free(slot);
    fr_free(cnt);
    fr_free(res);
    fr_free(m);
    fr_free(r);
    fr_free(got);
    fr_free(rslot);
    return ret;
}

int ferry_sparse_index_read(ferry_store *s, const char *key, ferry_sparse_index *out,
                            ferry_error *err)
{
    return fr_sparse_index_load(s, key, out, NULL, NULL, err);
}

void ferry_sparse_index_free(ferry_sparse_index *ix)
{
    if (!ix)
        return;
    fr_sparse_aux_free(ix->aux);
    fr_free(ix->tile_coords);
    fr_free(ix->tile_ptr);
    ix->aux = NULL;
    ix->tile_coords = ix->tile_ptr = NULL;
}
