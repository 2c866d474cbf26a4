/* JSON form of a binding manifest (docs/exec.md). 64-bit values that may
 * exceed JSON's safe integers (addresses, instance and lease ids) are
 * written as "0x..." hex strings. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "exec/exec_int.h"

static int hex_u64(const json_t *v, uint64_t *out)
{
    const char *s = json_string_value(v);
    if (s == NULL || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') || s[2] == '\0' || strlen(s) > 18)
        return FERRY_EINVAL;
    uint64_t x = 0;
    for (const char *p = s + 2; *p; p++) {
        int c = (unsigned char)*p, d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return FERRY_EINVAL;
        x = (x << 4) | (uint64_t)d;
    }
    *out = x;
    return 0;
}

static int hex_bytes(const char *s, uint8_t *out, size_t cap, size_t *n)
{
    size_t len = strlen(s);
    if (len % 2 != 0 || len / 2 > cap)
        return FERRY_EINVAL;
    for (size_t i = 0; i < len / 2; i++) {
        unsigned hi, lo;
        char pair[3] = {s[2 * i], s[2 * i + 1], 0};
        if (sscanf(pair, "%1x%1x", &hi, &lo) != 2)
            return FERRY_EINVAL;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    *n = len / 2;
    return 0;
}

static int dims(const json_t *obj, const char *key, uint64_t *out, uint32_t *ndim)
{
    const json_t *a = json_object_get(obj, key);
    if (!json_is_array(a) || json_array_size(a) > FERRY_MAX_DIMS)
        return FERRY_EINVAL;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return FERRY_EINVAL;
        out[i] = (uint64_t)json_integer_value(v);
    }
    *ndim = (uint32_t)json_array_size(a);
    return 0;
}

static int parse_entry(const json_t *o, size_t idx, ferry_binding_entry *e, ferry_error *err)
{
    char m[256] = "";
    uint64_t u;
    const char *s;
    uint32_t nd_strides;

    memset(e, 0, sizeof(*e));
    if (!json_is_object(o))
        return fr_fail(err, FERRY_EINVAL, "entries[%zu]: expected an object", idx);
    if (fr_json_get_u64(o, "fragment", &e->fragment, m, sizeof(m)) < 0)
        return fr_fail(err, FERRY_EINVAL, "entries[%zu]: %s", idx, m);
#define BAD(...) fr_fail(err, FERRY_EINVAL, "entries[%zu] (fragment %" PRIu64 "): " __VA_ARGS__)
    if (hex_u64(json_object_get(o, "addr"), &e->addr) < 0)
        return BAD("'addr': expected a \"0x...\" string", idx, e->fragment);
    if (fr_json_get_u64(o, "nbytes", &e->nbytes, m, sizeof(m)) < 0 ||
        fr_json_get_u64(o, "worker", &u, m, sizeof(m)) < 0 || u > UINT32_MAX ||
        fr_json_get_u64(o, "storage_offset", &e->storage_offset, m, sizeof(m)) < 0)
        return BAD("%s", idx, e->fragment, m[0] ? m : "'worker' out of range");
    e->worker = (uint32_t)u;
    if (fr_json_get_u64(o, "itemsize", &u, m, sizeof(m)) < 0 || u > UINT32_MAX)
        return BAD("%s", idx, e->fragment, m[0] ? m : "'itemsize' out of range");
    e->itemsize = (uint32_t)u;
    if (fr_json_get_str(o, "kind", &s, m, sizeof(m)) < 0)
        return BAD("%s", idx, e->fragment, m);
    if (strcmp(s, "host") == 0)
        e->kind = FERRY_MEM_HOST;
    else if (strcmp(s, "device") == 0)
        e->kind = FERRY_MEM_DEVICE;
    else
        return BAD("'kind': expected \"host\" or \"device\", got \"%s\"", idx, e->fragment, s);
    if (dims(o, "shape", e->shape, &e->ndim) < 0 || dims(o, "strides", e->strides, &nd_strides) < 0)
        return BAD("'shape' and 'strides': expected arrays of at most %d non-negative integers",
                   idx, e->fragment, FERRY_MAX_DIMS);
    if (nd_strides != e->ndim)
        return BAD("'strides' has %u dims, 'shape' %u", idx, e->fragment, nd_strides, e->ndim);
    size_t dl = 0;
    if (fr_json_get_str(o, "desc", &s, m, sizeof(m)) < 0 || hex_bytes(s, e->desc, FERRY_DESC_MAX, &dl) < 0)
        return BAD("'desc': expected hex of at most %d bytes", idx, e->fragment, FERRY_DESC_MAX);
    e->desc_len = (uint32_t)dl;
#undef BAD
    return 0;
}

int ferry_binding_from_json(const char *text, size_t len, ferry_manifest *placement,
                            ferry_binding **out, ferry_error *err)
{
    char m[256] = "";
    json_t *j = NULL;
    ferry_binding *b = NULL;
    uint64_t inst, gen, lease, ver;
    const char *s;
    int rc;

    if (out == NULL)
        return fr_fail(err, FERRY_EINVAL, "binding: no output");
    *out = NULL;
    rc = fr_json_parse(text, len, &j, m, sizeof(m));
    if (rc < 0)
        return fr_fail(err, rc, "binding: %s", m);
    if (!json_is_object(j) || fr_json_get_str(j, "format", &s, m, sizeof(m)) < 0 ||
        strcmp(s, "ferry-binding") != 0 || fr_json_get_u64(j, "version", &ver, m, sizeof(m)) < 0 || ver != 1) {
        rc = fr_fail(err, FERRY_EINVAL, "binding: not a ferry-binding version 1 document");
        goto fail;
    }
    if (hex_u64(json_object_get(j, "instance"), &inst) < 0 || hex_u64(json_object_get(j, "lease"), &lease) < 0 ||
        fr_json_get_u64(j, "generation", &gen, m, sizeof(m)) < 0) {
        rc = fr_fail(err, FERRY_EINVAL, "binding: 'instance', 'lease' (\"0x...\") and 'generation' are required");
        goto fail;
    }
    rc = ferry_binding_create(placement, inst, gen, lease, &b, err);
    if (rc < 0)
        goto fail;
    char want[33];
    ferry_digest_hex(b->placement_digest, want);
    if (fr_json_get_str(j, "placement", &s, m, sizeof(m)) < 0 || strcmp(s, want) != 0) {
        rc = fr_fail(err, FERRY_EINVAL, "binding: 'placement' digest is not the placement's (%s)", want);
        goto fail;
    }
    const json_t *a = json_object_get(j, "entries");
    if (!json_is_array(a)) {
        rc = fr_fail(err, FERRY_EINVAL, "binding: 'entries': expected an array");
        goto fail;
    }
    for (size_t i = 0; i < json_array_size(a); i++) {
        ferry_binding_entry e;
        rc = parse_entry(json_array_get(a, i), i, &e, err);
        if (rc == 0)
            rc = ferry_binding_add(b, &e, err);
        if (rc < 0)
            goto fail;
    }
    json_decref(j);
    *out = b;
    return 0;
fail:
    ferry_binding_free(b);
    json_decref(j);
    return rc;
}

static json_t *hex_str(uint64_t x)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "0x%" PRIx64, x);
    return json_string(buf);
}

static json_t *u64_array(const uint64_t *v, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a != NULL && i < n; i++)
        if (v[i] > INT64_MAX || json_array_append_new(a, json_integer((json_int_t)v[i])) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Integers past INT64_MAX cannot be written as JSON integers; validation
 * keeps nbytes, strides and offsets far below that in practice, and an
 * entry that is not is refused here rather than written wrongly. */
char *ferry_binding_to_json(const ferry_binding *b)
{
    char hex[33];
    json_t *j = json_object(), *a = json_array();
    char *text = NULL;

    if (j == NULL || a == NULL)
        goto out;
    ferry_digest_hex(b->placement_digest, hex);
    json_object_set_new(j, "format", json_string("ferry-binding"));
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "placement", json_string(hex));
    json_object_set_new(j, "instance", hex_str(b->instance));
    json_object_set_new(j, "generation", json_integer((json_int_t)b->generation));
    json_object_set_new(j, "lease", hex_str(b->lease));
    for (size_t i = 0; i < b->n; i++) {
        const ferry_binding_entry *e = &b->v[i];
        if (e->nbytes > INT64_MAX || e->storage_offset > INT64_MAX || e->fragment > INT64_MAX ||
            b->generation > INT64_MAX)
            goto out;
        char desc[2 * FERRY_DESC_MAX + 1];
        for (uint32_t k = 0; k < e->desc_len; k++)
            snprintf(desc + 2 * k, 3, "%02x", e->desc[k]);
        desc[2 * e->desc_len] = '\0';
        json_t *o = json_pack("{s:I, s:o, s:I, s:I, s:s, s:I, s:o, s:o, s:I, s:s}",
                              "fragment", (json_int_t)e->fragment, "addr", hex_str(e->addr),
                              "nbytes", (json_int_t)e->nbytes, "worker", (json_int_t)e->worker,
                              "kind", e->kind == FERRY_MEM_DEVICE ? "device" : "host",
                              "itemsize", (json_int_t)e->itemsize,
                              "shape", u64_array(e->shape, e->ndim),
                              "strides", u64_array(e->strides, e->ndim),
                              "storage_offset", (json_int_t)e->storage_offset, "desc", desc);
        if (o == NULL || json_array_append_new(a, o) < 0)
            goto out;
    }
    json_object_set(j, "entries", a);
    text = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
out:
    json_decref(a);
    json_decref(j);
    return text;
}
