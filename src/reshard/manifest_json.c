/* Manifests as JSON (docs/manifest.md). Reading goes through the add
 * functions so a file is checked exactly like a manifest built in code;
 * unknown keys are refused. Writing is a direct text builder: a split
 * manifest of a 1T model is 140k entries and should not become millions
 * of jansson nodes. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reshard/reshard_int.h"

/* ---- reading ------------------------------------------------------------ */

typedef struct rd {
    ferry_error *err;
    const char *where;   /* "fragments[12]" etc. */
} rd;

static int bad(rd *r, const char *fmt, const char *what)
{
    char tmp[256];
    snprintf(tmp, sizeof tmp, fmt, what);
    return fr_fail(r->err, FERRY_EINVAL, "manifest %s: %s", r->where, tmp);
}

/* Refuse keys not in `allowed` (NULL-terminated). */
static int only_keys(rd *r, const json_t *o, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        bool ok = false;
        for (size_t i = 0; allowed[i] && !ok; i++)
            ok = !strcmp(allowed[i], k);
        if (!ok)
            return bad(r, "unknown key '%s'", k);
    }
    return 0;
}

static int get_u64(rd *r, const json_t *o, const char *key, bool required, uint64_t dflt, uint64_t max,
                   uint64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v) {
        if (required)
            return bad(r, "missing '%s'", key);
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return bad(r, "'%s' must be a non-negative integer in range", key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int get_u32(rd *r, const json_t *o, const char *key, bool required, uint32_t dflt, uint32_t *out)
{
    uint64_t v;
    int rc = get_u64(r, o, key, required, dflt, UINT32_MAX, &v);
    *out = (uint32_t)v;
    return rc;
}

/* An array of exactly n non-negative integers (n == UINT32_MAX: any length
 * up to FERRY_MAX_DIMS, returned in *n_out). */
static int get_dims(rd *r, const json_t *o, const char *key, bool required, uint32_t n, uint64_t *out,
                    uint32_t *n_out, bool *present)
{
    const json_t *a = json_object_get(o, key);
    if (present)
        *present = a != NULL;
    if (!a)
        return required ? bad(r, "missing '%s'", key) : 0;
    if (!json_is_array(a) || json_array_size(a) > FR_MAXD || (n != UINT32_MAX && json_array_size(a) != n))
        return bad(r, "'%s' must be an array with one integer per dim", key);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return bad(r, "'%s' must hold non-negative integers", key);
        out[i] = (uint64_t)json_integer_value(v);
    }
    if (n_out)
        *n_out = (uint32_t)json_array_size(a);
    return 0;
}

static int read_topology(rd *r, const json_t *j, ferry_manifest **out)
{
    static const char *const keys[] = {"ranks", "gpus_per_node", "nodes", NULL};
    r->where = "topology";
    if (!json_is_object(j))
        return bad(r, "%s", "must be an object");
    int rc = only_keys(r, j, keys);
    if (rc < 0)
        return rc;
    const json_t *nodes = json_object_get(j, "nodes");
    if (nodes) {
        size_t n = json_array_size(nodes);
        if (!json_is_array(nodes) || n == 0 || n > UINT32_MAX || json_object_get(j, "ranks") ||
            json_object_get(j, "gpus_per_node"))
            return bad(r, "%s", "'nodes' must be a non-empty array, given alone");
        uint32_t *v = fr_calloc(n, sizeof *v);
        if (!v)
            return fr_fail(r->err, FERRY_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(nodes, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > UINT32_MAX) {
                fr_free(v);
                return bad(r, "%s", "'nodes' must hold node numbers");
            }
            v[i] = (uint32_t)json_integer_value(x);
        }
        rc = ferry_manifest_create((uint32_t)n, v, 0, out);
        fr_free(v);
        return rc < 0 ? fr_fail(r->err, rc, "out of memory") : 0;
    }
    uint32_t ranks, gpn;
    if ((rc = get_u32(r, j, "ranks", true, 0, &ranks)) < 0 || (rc = get_u32(r, j, "gpus_per_node", false, 8, &gpn)) < 0)
        return rc;
    if (ranks == 0 || ranks > (1u << 24) || gpn == 0)
        return bad(r, "%s", "'ranks' must be in [1, 2^24] and 'gpus_per_node' positive");
    rc = ferry_manifest_create(ranks, NULL, gpn, out);
    return rc < 0 ? fr_fail(r->err, rc, "out of memory") : 0;
}

static int read_tensor(rd *r, ferry_manifest *m, const json_t *j)
{
    static const char *const keys[] = {"name", "dtype", "itemsize", "shape", NULL};
    if (!json_is_object(j))
        return bad(r, "%s", "must be an object");
    int rc = only_keys(r, j, keys);
    if (rc < 0)
        return rc;
    ferry_tensor_desc t = {0};
    t.name = json_string_value(json_object_get(j, "name"));
    t.dtype = json_string_value(json_object_get(j, "dtype"));
    if (!t.name || !t.dtype)
        return bad(r, "%s", "'name' and 'dtype' must be strings");
    uint64_t isz;
    if ((rc = get_u64(r, j, "itemsize", false, ferry_dtype_size(t.dtype), 64, &isz)) < 0 ||
        (rc = get_dims(r, j, "shape", true, UINT32_MAX, t.shape, &t.ndim, NULL)) < 0)
        return rc;
    t.itemsize = (uint32_t)isz;
    return ferry_manifest_add_tensor(m, &t, r->err);
}

static int tensor_ref(rd *r, ferry_manifest *m, const json_t *j, uint32_t *out)
{
    const json_t *t = json_object_get(j, "tensor");
    if (json_is_string(t)) {
        int i = ferry_manifest_find_tensor(m, json_string_value(t));
        if (i < 0)
            return bad(r, "no tensor named '%s'", json_string_value(t));
        *out = (uint32_t)i;
        return 0;
    }
    uint64_t v;
    int rc = get_u64(r, j, "tensor", true, 0, UINT32_MAX, &v);
    if (rc == 0 && v >= m->ntensors)
        return bad(r, "%s", "'tensor' index out of range");
    *out = (uint32_t)v;
    return rc;
}

static int read_split(rd *r, ferry_manifest *m, uint32_t ti, const json_t *j)
{
    static const char *const keys[] = {"offset", "shape", "parts", "rank", "rank_stride", "replicas",
                                       "replica_stride", "replica", NULL};
    if (!json_is_object(j))
        return bad(r, "%s", "'split' must be an object");
    int rc = only_keys(r, j, keys);
    if (rc < 0)
        return rc;
    uint32_t nd = m->tensors[ti].ndim;
    ferry_split s = {.tensor = ti};
    uint64_t parts[FR_MAXD] = {0}, rs[FR_MAXD] = {0};
    bool has_off, has_shape;
    if ((rc = get_dims(r, j, "offset", false, nd, s.offset, NULL, &has_off)) < 0 ||
        (rc = get_dims(r, j, "shape", false, nd, s.shape, NULL, &has_shape)) < 0 ||
        (rc = get_dims(r, j, "parts", false, nd, parts, NULL, NULL)) < 0 ||
        (rc = get_dims(r, j, "rank_stride", false, nd, rs, NULL, NULL)) < 0 ||
        (rc = get_u32(r, j, "rank", true, 0, &s.rank)) < 0 ||
        (rc = get_u32(r, j, "replicas", false, 1, &s.replicas)) < 0 ||
        (rc = get_u32(r, j, "replica_stride", false, 0, &s.replica_stride)) < 0 ||
        (rc = get_u32(r, j, "replica", false, 0, &s.replica)) < 0)
        return rc;
    if (has_off != has_shape)
        return bad(r, "%s", "'offset' and 'shape' come together");
    bool cut = false;
    for (uint32_t d = 0; d < nd; d++)
        cut |= parts[d] > 1;
    if (cut && !json_object_get(j, "rank_stride"))
        return bad(r, "%s", "a split into several pieces needs 'rank_stride'");
    s.whole = !has_off;
    for (uint32_t d = 0; d < nd; d++) {
        if (parts[d] > UINT32_MAX || rs[d] > UINT32_MAX)
            return bad(r, "%s", "'parts' and 'rank_stride' must fit 32 bits");
        s.parts[d] = (uint32_t)parts[d];
        s.rank_stride[d] = (uint32_t)rs[d];
    }
    return ferry_manifest_add_split(m, &s, r->err);
}

static int read_fragment(rd *r, ferry_manifest *m, const json_t *j)
{
    static const char *const keys[] = {"tensor", "rank", "node", "replica", "offset", "shape", "strides",
                                       "storage_offset", "object", "object_offset", "split", NULL};
    if (!json_is_object(j))
        return bad(r, "%s", "must be an object");
    int rc = only_keys(r, j, keys);
    uint32_t ti = 0;
    if (rc < 0 || (rc = tensor_ref(r, m, j, &ti)) < 0)
        return rc;
    const json_t *split = json_object_get(j, "split");
    if (split) {
        if (json_object_size(j) != 2)
            return bad(r, "%s", "a 'split' entry has only 'tensor' and 'split'");
        return read_split(r, m, ti, split);
    }
    uint32_t nd = m->tensors[ti].ndim, node;
    ferry_fragment f = {.tensor = ti};
    if ((rc = get_u32(r, j, "rank", true, 0, &f.rank)) < 0 || (rc = get_u32(r, j, "replica", false, 0, &f.replica)) < 0 ||
        (rc = get_dims(r, j, "offset", nd > 0, nd, f.offset, NULL, NULL)) < 0 ||
        (rc = get_dims(r, j, "shape", nd > 0, nd, f.shape, NULL, NULL)) < 0 ||
        (rc = get_dims(r, j, "strides", false, nd, f.strides, NULL, &f.has_strides)) < 0 ||
        (rc = get_u64(r, j, "storage_offset", false, 0, INT64_MAX, &f.storage_offset)) < 0 ||
        (rc = get_u64(r, j, "object_offset", false, 0, INT64_MAX, &f.object_offset)) < 0 ||
        (rc = get_u32(r, j, "node", false, UINT32_MAX, &node)) < 0)
        return rc;
    const json_t *obj = json_object_get(j, "object");
    if (obj && !json_is_string(obj))
        return bad(r, "%s", "'object' must be a string");
    f.object = obj ? json_string_value(obj) : NULL;
    if (node != UINT32_MAX && f.rank < m->nranks && m->nodes[f.rank] != node)
        return bad(r, "%s", "'node' disagrees with the topology");
    return ferry_manifest_add_fragment(m, &f, r->err);
}

/* "quantize": the manifest read so far is the layout before; the named
 * tensors are quantized with the scale tensors named (quant.c). */
static int read_quantize(rd *r, const ferry_manifest *m, const json_t *j, ferry_manifest **out)
{
    static const char *const keys[] = {"dtype", "block", "scale_format", "cut_blocks",
                                       "tensors", NULL};
    static const char *const tkeys[] = {"name", "scale", NULL};
    if (!json_is_object(j))
        return bad(r, "%s", "must be an object");
    int rc = only_keys(r, j, keys);
    if (rc < 0)
        return rc;
    fr_quant_spec q = { .dtype = json_string_value(json_object_get(j, "dtype")) };
    const char *fmt = json_string_value(json_object_get(j, "scale_format"));
    const json_t *ts = json_object_get(j, "tensors");
    uint64_t block[2];
    if (!q.dtype || !fmt || !json_is_array(ts))
        return bad(r, "%s", "'dtype' and 'scale_format' must be strings, 'tensors' an array");
    if ((rc = get_dims(r, j, "block", true, 2, block, NULL, NULL)) < 0)
        return rc;
    if (block[0] > UINT32_MAX || block[1] > UINT32_MAX)
        return bad(r, "%s", "'block' out of range");
    q.block[0] = (uint32_t)block[0], q.block[1] = (uint32_t)block[1];
    if (strcmp(fmt, "f32") && strcmp(fmt, "ue8m0"))
        return bad(r, "%s", "'scale_format' must be \"f32\" or \"ue8m0\"");
    q.format = strcmp(fmt, "f32") ? FERRY_FP8_SCALE_UE8M0 : FERRY_FP8_SCALE_F32;
    const json_t *cut = json_object_get(j, "cut_blocks");
    if (cut && !json_is_boolean(cut))
        return bad(r, "%s", "'cut_blocks' must be true or false");
    q.cut = cut && json_is_true(cut);
    size_t n = ferry_manifest_tensor_count(m);
    const char **names = calloc(n ? n : 1, sizeof *names);
    if (!names)
        return fr_fail(r->err, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(ts) && rc >= 0; i++) {
        const json_t *t = json_array_get(ts, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *scale = json_string_value(json_object_get(t, "scale"));
        int idx = name ? ferry_manifest_find_tensor(m, name) : -1;
        if (!json_is_object(t) || (rc = only_keys(r, t, tkeys)) < 0)
            rc = rc < 0 ? rc : bad(r, "%s", "'tensors' holds objects");
        else if (!scale || idx < 0 || names[idx])
            rc = bad(r, "tensor '%s' is not a tensor of the manifest, is listed twice or has no "
                     "'scale'", name ? name : "(null)");
        else
            names[idx] = scale;
    }
    if (rc >= 0)
        rc = fr_manifest_quantize(m, &q, names, out, r->err);
    free(names);
    return rc;
}

static int from_json(const json_t *root, ferry_manifest **out, ferry_error *err)
{
    static const char *const keys[] = {"format", "version", "topology", "tensors", "fragments",
                                       "quantize", NULL};
    rd r = {err, "root"};
    char where[64];
    if (!json_is_object(root))
        return bad(&r, "%s", "must be an object");
    int rc = only_keys(&r, root, keys);
    if (rc < 0)
        return rc;
    const char *fmt = json_string_value(json_object_get(root, "format"));
    uint64_t ver;
    if (!fmt || strcmp(fmt, "ferry.manifest"))
        return bad(&r, "%s", "'format' must be \"ferry.manifest\"");
    if ((rc = get_u64(&r, root, "version", true, 0, 1000, &ver)) < 0)
        return rc;
    if (ver != 1)
        return fr_fail(err, FERRY_ENOTSUP, "manifest: version %llu is not supported (1 is)", (unsigned long long)ver);
    const json_t *tensors = json_object_get(root, "tensors"), *frags = json_object_get(root, "fragments");
    if (!json_is_array(tensors) || !json_is_array(frags))
        return bad(&r, "%s", "'tensors' and 'fragments' must be arrays");
    ferry_manifest *m;
    if ((rc = read_topology(&r, json_object_get(root, "topology"), &m)) < 0)
        return rc;
    for (size_t i = 0; i < json_array_size(tensors) && rc >= 0; i++) {
        snprintf(where, sizeof where, "tensors[%zu]", i);
        r.where = where;
        rc = read_tensor(&r, m, json_array_get(tensors, i));
    }
    for (size_t i = 0; i < json_array_size(frags) && rc >= 0; i++) {
        snprintf(where, sizeof where, "fragments[%zu]", i);
        r.where = where;
        rc = read_fragment(&r, m, json_array_get(frags, i));
    }
    const json_t *quant = json_object_get(root, "quantize");
    if (rc >= 0 && quant) {
        r.where = "quantize";
        ferry_manifest *q = NULL;
        rc = read_quantize(&r, m, quant, &q);
        ferry_manifest_close(m);
        m = q;
    }
    if (rc < 0) {
        ferry_manifest_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

int ferry_manifest_from_json(const char *text, size_t len, ferry_manifest **out, ferry_error *err)
{
    if (!out || (!text && len))
        return fr_fail(err, FERRY_EINVAL, "null argument");
    json_t *root;
    char msg[256];
    int rc = fr_json_parse(text, len, &root, msg, sizeof msg);
    if (rc < 0)
        return fr_fail(err, rc, "manifest: %s", msg);
    rc = from_json(root, out, err);
    json_decref(root);
    return rc;
}

int ferry_manifest_load(const char *path, ferry_manifest **out, ferry_error *err)
{
    if (!path || !out)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    json_t *root;
    char msg[512];
    int rc = fr_json_load_file(path, &root, msg, sizeof msg);
    if (rc < 0)
        return fr_fail(err, rc, "%s", msg);
    rc = from_json(root, out, err);
    json_decref(root);
    return rc;
}

/* ---- writing ------------------------------------------------------------ */

typedef struct sb {
    char *p;
    size_t n, cap;
    bool oom;
} sb;

static void sb_add(sb *b, const char *s, size_t len)
{
    if (b->oom)
        return;
    if (b->n + len + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 4096;
        while (ncap < b->n + len + 1)
            ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

static void sb_puts(sb *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_u64(sb *b, uint64_t v)
{
    char t[24];
    sb_add(b, t, (size_t)snprintf(t, sizeof t, "%llu", (unsigned long long)v));
}

static void sb_kv(sb *b, const char *key, uint64_t v)
{
    sb_puts(b, ",\"");
    sb_puts(b, key);
    sb_puts(b, "\":");
    sb_u64(b, v);
}

static void sb_str(sb *b, const char *s)
{
    sb_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_add(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            sb_add(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
        } else {
            sb_add(b, (const char *)&c, 1);
        }
    }
    sb_puts(b, "\"");
}

static void sb_dims(sb *b, const char *key, const uint64_t *v, uint32_t n)
{
    sb_puts(b, ",\"");
    sb_puts(b, key);
    sb_puts(b, "\":[");
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            sb_puts(b, ",");
        sb_u64(b, v[i]);
    }
    sb_puts(b, "]");
}

static void write_group(sb *b, const ferry_manifest *m, const fr_group *g)
{
    const fr_tensor *t = &m->tensors[g->tensor];
    sb_puts(b, "{\"tensor\":");
    sb_u64(b, g->tensor);
    if (!g->is_split) {
        sb_kv(b, "rank", g->rank);
        if (g->replica)
            sb_kv(b, "replica", g->replica);
        sb_dims(b, "offset", G_OFF(m, g), g->ndim);
        sb_dims(b, "shape", G_EXT(m, g), g->ndim);
        if (g->has_strides)
            sb_dims(b, "strides", G_STRIDES(m, g), g->ndim);
        if (g->storage_offset)
            sb_kv(b, "storage_offset", g->storage_offset);
        if (g->object >= 0) {
            sb_puts(b, ",\"object\":");
            sb_str(b, m->objects[g->object]);
            sb_kv(b, "object_offset", g->object_offset);
        }
        sb_puts(b, "}");
        return;
    }
    sb_puts(b, ",\"split\":{\"rank\":");
    sb_u64(b, g->rank);
    bool whole = true;
    for (uint32_t d = 0; d < g->ndim; d++)
        whole &= G_OFF(m, g)[d] == 0 && G_EXT(m, g)[d] == t->shape[d];
    if (!whole) {
        sb_dims(b, "offset", G_OFF(m, g), g->ndim);
        sb_dims(b, "shape", G_EXT(m, g), g->ndim);
    }
    sb_dims(b, "parts", G_PARTS(m, g), g->ndim);
    sb_dims(b, "rank_stride", G_RSTRIDE(m, g), g->ndim);
    if (g->replicas > 1) {
        sb_kv(b, "replicas", g->replicas);
        sb_kv(b, "replica_stride", g->replica_stride);
    }
    if (g->replica)
        sb_kv(b, "replica", g->replica);
    sb_puts(b, "}}");
}

static void write_quantize(sb *b, const ferry_manifest *m)
{
    fr_quant_spec q;
    if (!fr_manifest_quant_spec(m, &q))
        return;
    sb_puts(b, ",\n\"quantize\":{\"dtype\":");
    sb_str(b, q.dtype);
    uint64_t block[2] = { q.block[0], q.block[1] };
    sb_dims(b, "block", block, 2);
    sb_puts(b, ",\"scale_format\":");
    sb_str(b, q.format == FERRY_FP8_SCALE_UE8M0 ? "ue8m0" : "f32");
    if (q.cut)
        sb_puts(b, ",\"cut_blocks\":true");
    sb_puts(b, ",\"tensors\":[");
    for (size_t i = 0, k = 0; i < m->ntensors; i++) {
        const fr_tensor *t = &m->tensors[i];
        if (t->qrole != FERRY_QUANT_WEIGHT)
            continue;
        sb_puts(b, k++ ? ",\n{\"name\":" : "\n{\"name\":");
        sb_str(b, t->name);
        sb_puts(b, ",\"scale\":");
        sb_str(b, m->tensors[t->qpartner].name);
        sb_puts(b, "}");
    }
    sb_puts(b, "]}");
}

char *ferry_manifest_to_json(const ferry_manifest *m)
{
    if (!m)
        return NULL;
    sb b = {0};
    sb_puts(&b, "{\"format\":\"ferry.manifest\",\"version\":1,\n\"topology\":{");
    if (m->gpus_per_node) {
        sb_puts(&b, "\"ranks\":");
        sb_u64(&b, m->nranks);
        sb_kv(&b, "gpus_per_node", m->gpus_per_node);
    } else {
        sb_puts(&b, "\"nodes\":[");
        for (uint32_t r = 0; r < m->nranks; r++) {
            if (r)
                sb_puts(&b, ",");
            sb_u64(&b, m->nodes[r]);
        }
        sb_puts(&b, "]");
    }
    sb_puts(&b, "},\n\"tensors\":[");
    /* a quantized layout: the layout before, and "quantize" (the scale
     * tensors come after every other tensor, their fragments after every
     * other fragment: ferry_manifest_quantize derives them again) */
    for (size_t i = 0, k = 0; i < m->ntensors; i++) {
        const fr_tensor *t = &m->tensors[i];
        if (t->qrole == FERRY_QUANT_SCALE)
            continue;
        const char *dtype = t->qrole == FERRY_QUANT_WEIGHT ? t->qfrom : t->dtype;
        sb_puts(&b, k++ ? ",\n{\"name\":" : "\n{\"name\":");
        sb_str(&b, t->name);
        sb_puts(&b, ",\"dtype\":");
        sb_str(&b, dtype);
        sb_kv(&b, "itemsize", ferry_dtype_size(dtype));
        sb_dims(&b, "shape", t->shape, t->ndim);
        sb_puts(&b, "}");
    }
    sb_puts(&b, "],\n\"fragments\":[");
    for (size_t g = 0, k = 0; g < m->ngroups; g++) {
        if (m->tensors[m->groups[g].tensor].qrole == FERRY_QUANT_SCALE)
            continue;
        sb_puts(&b, k++ ? ",\n" : "\n");
        write_group(&b, m, &m->groups[g]);
    }
    sb_puts(&b, "]");
    write_quantize(&b, m);
    sb_puts(&b, "}\n");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int ferry_manifest_save(const ferry_manifest *m, const char *path, ferry_error *err)
{
    if (!m || !path)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    char *text = ferry_manifest_to_json(m);
    if (!text)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    size_t plen = strlen(path);
    char *tmp = fr_malloc(plen + 16);
    int rc = tmp ? 0 : FERRY_ENOMEM;
    if (tmp) {
        snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
        int fd = mkstemp(tmp);
        if (fd < 0) {
            rc = -errno;
        } else {
            rc = fchmod(fd, 0644) < 0 ? -errno : 0;
            if (rc == 0)
                rc = write_all(fd, text, strlen(text));
            if (rc == 0 && fsync(fd) < 0)
                rc = -errno;
            if (close(fd) < 0 && rc == 0)
                rc = -errno;
            if (rc == 0 && rename(tmp, path) < 0)
                rc = -errno;
            if (rc < 0)
                unlink(tmp);
        }
    }
    free(text);
    fr_free(tmp);
    return rc < 0 ? fr_fail(err, rc, "%s: %s", path, ferry_strerror(rc)) : 0;
}
