/* The text of sparse generations (gen_int.h): parsing it, reading a
 * generation's text back, and removing a sparse generation's objects
 * (retention, publish_keep.c). Below gen.c, which loads any generation,
 * and gen_sparse.c, which announces and chains sparse ones. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/sparse.h"
#include "rl/gen_int.h"
#include "rl/keys.h"

/* ---- the generation text ------------------------------------------------------------------ */

bool fr_sgen_is(const char *text, size_t len)
{
    size_t m = strlen(FR_SGEN_MAGIC);
    return text && len >= m && memcmp(text, FR_SGEN_MAGIC, m) == 0;
}

void fr_sgen_free(fr_sgen *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->nkeys; i++)
        free(g->keys[i]);
    free(g->keys);
    memset(g, 0, sizeof *g);
}

static int hex_digest(const char *h, uint8_t out[16])
{
    if (strlen(h) != 32)
        return FERRY_EPROTO;
    for (int i = 0; i < 16; i++) {
        unsigned x;
        if (sscanf(h + 2 * i, "%2x", &x) != 1)
            return FERRY_EPROTO;
        out[i] = (uint8_t)x;
    }
    return 0;
}

int fr_sgen_parse(const char *text, size_t len, uint64_t generation, fr_sgen *out)
{
    memset(out, 0, sizeof *out);
    out->generation = generation;
    if (!fr_sgen_is(text, len))
        return FERRY_EPROTO;
    char *t = malloc(len + 1);
    if (!t)
        return FERRY_ENOMEM;
    memcpy(t, text, len);
    t[len] = '\0';
    char *save = NULL, *line = strtok_r(t, "\n", &save);   /* the magic */
    int rc = 0, have = 0;
    size_t cap = 0;
    while (rc == 0 && (line = strtok_r(NULL, "\n", &save)) != NULL) {
        unsigned long long a;
        char hx[40];
        if (sscanf(line, "base %llu %39s", &a, hx) == 2 && hex_digest(hx, out->base_digest) == 0) {
            out->base = a;
            have |= 1;
        } else if (sscanf(line, "dense %llu", &a) == 1) {
            out->dense = a;
            have |= 2;
        } else if (!strncmp(line, "object ", 7) && line[7]) {
            if (fr_grow((void **)&out->keys, &cap, out->nkeys + 1, sizeof *out->keys) < 0 ||
                !(out->keys[out->nkeys] = strdup(line + 7)))
                rc = FERRY_ENOMEM;
            else
                out->nkeys++;
        } else {
            rc = FERRY_EPROTO;
        }
    }
    free(t);
    if (rc == 0 && (have != 3 || out->base >= generation || out->dense > out->base ||
                    out->dense == 0))
        rc = FERRY_EPROTO;
    if (rc < 0)
        fr_sgen_free(out);
    return rc;
}

int fr_sgen_text(ferry_store *s, const char *model, uint64_t gen, char **text, size_t *len,
                 uint8_t digest[16], ferry_error *err)
{
    char k[FR_KEY_MAX];
    fr_key_wk(k, sizeof k, model, gen, "manifest");
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v, err);
    if (rc < 0)
        return rc;
    *text = malloc(v.len + 1);
    if (!*text) {
        ferry_store_free(v.val);
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    }
    memcpy(*text, v.val, v.len);
    (*text)[v.len] = '\0';
    *len = v.len;
    fr_hash128_t h = fr_hash128(v.val, v.len, 0);
    memcpy(digest, h.b, 16);
    ferry_store_free(v.val);
    return 0;
}

/* ---- retention ------------------------------------------------------------------------------ */

bool fr_sgen_drop_objects(ferry_store *s, const char *model, uint64_t g)
{
    char *text = NULL;
    size_t len = 0;
    uint8_t dg[16];
    if (fr_sgen_text(s, model, g, &text, &len, dg, NULL) < 0)
        return true;   /* no text: nothing of it is known here */
    fr_sgen sg;
    int rc = fr_sgen_is(text, len) ? fr_sgen_parse(text, len, g, &sg) : -1;
    free(text);
    if (rc < 0)
        return true;   /* a dense generation (or unreadable): its objects are ferry/w/ */
    bool gone = true;
    /* every object and its admission key, in two round trips however many
     * (a generation is one object per changed tensor, hundreds: one by one
     * a dense publish retiring a chain spent half a second here) */
    int *res = calloc(sg.nkeys ? sg.nkeys : 1, sizeof *res);
    if (!res || ferry_sparse_remove_many(s, (const char *const *)sg.keys, sg.nkeys, res, NULL) ==
                    FERRY_ENOMEM)
        gone = false;
    for (size_t i = 0; res && gone && i < sg.nkeys; i++)
        if (res[i] < 0 && res[i] != FERRY_ENOENT)
            gone = false;   /* leased: a later publish retires it */
    free(res);
    fr_sgen_free(&sg);
    return gone;
}
