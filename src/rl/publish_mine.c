/* One trainer rank's side of a publish (publish_int.h, "this rank's
 * pieces"): check the placement, find the pieces this rank stores, pack
 * them into objects (converting, checksumming), and the declaration the
 * coordinator compares across ranks. Stored layout: gen_int.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

void fr_pub_mine_free(fr_pub_mine *p)
{
    if (!p)
        return;
    ferry_manifest_close(p->stored);
    ferry_pack_free(p->pack);
    fr_pub_quant_free(p);
    free(p->pieces);
    free(p->sums);
    free(p->decl);
    free(p->json);
    memset(p, 0, sizeof *p);
}

static int by_fragment(const void *a, const void *b)
{
    const ferry_shard_data *x = a, *y = b;
    return x->fragment < y->fragment ? -1 : x->fragment > y->fragment;
}

static const char *dims(char *buf, size_t cap, const uint64_t *v, uint32_t n)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRIu64, i ? "," : "", v[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
    return buf;
}

typedef struct box { uint64_t off[FERRY_MAX_DIMS], end[FERRY_MAX_DIMS]; } box;

static bool box_holds(const box *b, uint32_t nd, const uint64_t *p)
{
    for (uint32_t d = 0; d < nd; d++)
        if (p[d] < b->off[d] || p[d] >= b->end[d])
            return false;
    return true;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A box of tensor d that none of b[0..n) holds: the lexicographically
 * first element no box holds (each of its coordinates is 0 or the end of
 * some box in that dim, so only those are tried), grown dim by dim from
 * the last as far as no box starts. false when every element is held, or
 * when the search would take too long (a placement of very many pieces). */
static bool find_gap(const ferry_tensor_desc *d, const box *b, size_t n, uint64_t *off,
                     uint64_t *shape)
{
    uint32_t nd = d->ndim;
    uint64_t *cand[FERRY_MAX_DIMS] = {0}, nc[FERRY_MAX_DIMS], work = 1;
    bool found = false, ok = true;
    for (uint32_t k = 0; k < nd && ok; k++) {
        cand[k] = malloc((n + 1) * sizeof *cand[k]);
        ok = cand[k] != NULL;
        size_t c = 0;
        for (size_t i = 0; ok && i <= n; i++) {
            uint64_t v = i == n ? 0 : b[i].end[k];
            if (v < d->shape[k])
                cand[k][c++] = v;
        }
        if (ok) {
            qsort(cand[k], c, sizeof *cand[k], cmp_u64);
            size_t u = 0;
            for (size_t i = 0; i < c; i++)
                if (!u || cand[k][u - 1] != cand[k][i])
                    cand[k][u++] = cand[k][i];
            nc[k] = u;
            work = work * u > (1ull << 40) ? (1ull << 40) : work * u;
        }
    }
    if (ok && work * (n ? n : 1) <= (1ull << 28)) {
        uint64_t ctr[FERRY_MAX_DIMS] = {0};
        for (;;) {
            for (uint32_t k = 0; k < nd; k++)
                off[k] = cand[k][ctr[k]];
            size_t i = 0;
            while (i < n && !box_holds(&b[i], nd, off))
                i++;
            if (i == n) {
                found = true;
                break;
            }
            int k = (int)nd - 1;
            while (k >= 0 && ++ctr[k] == nc[k])
                ctr[k--] = 0;
            if (k < 0)
                break;
        }
    }
    for (uint32_t k = 0; k < nd; k++)
        free(cand[k]);
    if (!found)
        return false;
    /* Grow: the box so far is held by nobody, so a box meeting it in every
     * other dim lies wholly before or after it in dim k. */
    for (uint32_t k = 0; k < nd; k++)
        shape[k] = 1;
    for (int k = (int)nd - 1; k >= 0; k--) {
        uint64_t end = d->shape[k];
        for (size_t i = 0; i < n; i++) {
            bool meets = true;
            for (uint32_t j = 0; j < nd && meets; j++)
                meets = (int)j == k || (b[i].off[j] < off[j] + shape[j] && b[i].end[j] > off[j]);
            if (meets && b[i].off[k] >= off[k] && b[i].off[k] < end)
                end = b[i].off[k];
        }
        shape[k] = end - off[k];
    }
    return true;
}

/* The first tensor of m whose fragments (copy 0 only, with copy0) leave
 * elements unheld, described into err. FERRY_EINVAL when one is found, 0
 * when every element is held. */
static int name_gap(ferry_manifest *m, bool copy0, const char *what, ferry_error *err)
{
    uint32_t nt = ferry_manifest_tensor_count(m);
    uint64_t nf = ferry_manifest_fragment_count(m);
    uint64_t *vol = calloc(nt ? nt : 1, sizeof *vol);
    if (!vol)
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        (void)ferry_manifest_fragment(m, id, &f);
        if (copy0 && f.replica != 0)
            continue;
        uint64_t v = 1;
        for (uint32_t k = 0; k < FERRY_MAX_DIMS && f.shape[k]; k++)
            v *= f.shape[k];
        vol[f.tensor] += v;
    }
    int rc = 0;
    for (uint32_t t = 0; t < nt && rc == 0; t++) {
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(m, t, &d);
        uint64_t elems = 1;
        for (uint32_t k = 0; k < d.ndim; k++)
            elems *= d.shape[k];
        if (vol[t] >= elems)
            continue;   /* held (or overlapping: the planner says where) */
        box *b = NULL;
        size_t n = 0, cap = 0;
        for (uint64_t id = 0; id < nf; id++) {
            ferry_fragment f;
            (void)ferry_manifest_fragment(m, id, &f);
            if (f.tensor != t || (copy0 && f.replica != 0))
                continue;
            if (fr_grow((void **)&b, &cap, n + 1, sizeof *b) < 0)
                break;
            for (uint32_t k = 0; k < d.ndim; k++) {
                b[n].off[k] = f.offset[k];
                b[n].end[k] = f.offset[k] + f.shape[k];
            }
            n++;
        }
        uint64_t off[FERRY_MAX_DIMS], shape[FERRY_MAX_DIMS];
        char b1[160], b2[160];
        if (find_gap(&d, b, n, off, shape))
            rc = fr_fail(err, FERRY_EINVAL, "tensor %s: %s the box at offset %s, shape %s "
                         "(%" PRIu64 " of %" PRIu64 " elements held)", d.name, what,
                         dims(b1, sizeof b1, off, d.ndim), dims(b2, sizeof b2, shape, d.ndim),
                         vol[t], elems);
        else
            rc = fr_fail(err, FERRY_EINVAL, "tensor %s: %s some of its elements (%" PRIu64
                         " of %" PRIu64 " held)", d.name, what, vol[t], elems);
        free(b);
    }
    free(vol);
    return rc;
}

/* A plan of m onto every tensor whole: the planner's checks of a source
 * (boxes that overlap are declared replicas of one box; every element is
 * held). */
static int plan_whole(ferry_manifest *m, ferry_error *err)
{
    ferry_manifest *whole = NULL;
    uint32_t nt = ferry_manifest_tensor_count(m);
    int rc = ferry_manifest_create(1, NULL, 1, &whole);
    for (uint32_t t = 0; t < nt && rc >= 0; t++) {
        ferry_tensor_desc d;
        rc = ferry_manifest_tensor(m, t, &d);
        if (rc == 0)
            rc = ferry_manifest_add_tensor(whole, &d, err);
        ferry_split sp = { .tensor = t, .whole = true };
        if (rc >= 0)
            rc = ferry_manifest_add_split(whole, &sp, err);
    }
    ferry_plan *p = NULL;
    if (rc >= 0)
        rc = ferry_plan_create(m, whole, NULL, &p, err);
    ferry_plan_free(p);
    ferry_manifest_close(whole);
    return rc < 0 ? rc : 0;
}

/* Every tensor held exactly once: the placement's pieces either tile it
 * or overlap only as declared replicas (identical boxes, distinct replica
 * numbers: the planner names the two fragments, their ranks and boxes,
 * otherwise), and copy 0 of every box (what is stored) tiles it. A box no
 * rank holds is named. */
static int check_cover(ferry_manifest *placement, ferry_manifest *stored, ferry_error *err)
{
    ferry_error pe = {0};
    int rc = plan_whole(placement, &pe);
    if (rc < 0) {
        if (name_gap(placement, false, "no rank holds", err) < 0)
            return err ? err->code : FERRY_EINVAL;
        return fr_fail(err, rc, "the placement does not hold every tensor exactly once: %s",
                       pe.msg);
    }
    /* Replicas dropped: a box declared only as copies numbered above 0
     * is stored by nobody. */
    if (ferry_manifest_fragment_count(stored) == ferry_manifest_fragment_count(placement) ||
        plan_whole(stored, &pe) == 0)
        return 0;
    if (name_gap(placement, true, "no rank holds copy 0 of", err) < 0)
        return err ? err->code : FERRY_EINVAL;
    return fr_fail(err, FERRY_EINVAL, "the placement's copies numbered 0 do not hold every "
                   "tensor exactly once: %s", pe.msg);
}

/* Per tensor: hashes of its name, of the dtype this rank holds it in (the
 * placement's, before any conversion), of its shape and of its stored
 * pieces (rank, box), so the coordinator can say where two ranks differ;
 * then p->digest covers the stored manifest and the declaration. */
static int make_decl(fr_pub_mine *p, ferry_manifest *placement, ferry_error *err)
{
    uint32_t nt = ferry_manifest_tensor_count(p->stored);
    p->ntensors = nt;
    p->decl = calloc((size_t)nt * FR_PUB_DECL + 1, sizeof *p->decl);
    if (!p->decl)
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    p->decl[0] = nt;
    for (uint32_t t = 0; t < nt; t++) {
        ferry_tensor_desc d, src;
        (void)ferry_manifest_tensor(p->stored, t, &d);
        if (ferry_manifest_tensor(placement, t, &src) < 0)
            src = d;   /* a scale tensor of the quantization */
        uint64_t *h = p->decl + 1 + FR_PUB_DECL * (size_t)t;
        h[0] = fr_hash64(d.name, strlen(d.name), 0);
        h[1] = fr_hash64(src.dtype, strlen(src.dtype), 0);
        h[2] = fr_hash64(d.shape, d.ndim * sizeof d.shape[0], d.ndim);
    }
    uint64_t nf = ferry_manifest_fragment_count(p->stored);
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        (void)ferry_manifest_fragment(p->stored, id, &f);
        uint64_t rec[1 + 2 * FERRY_MAX_DIMS] = { f.rank };
        for (uint32_t k = 0; k < FERRY_MAX_DIMS; k++) {
            rec[1 + k] = f.offset[k];
            rec[1 + FERRY_MAX_DIMS + k] = f.shape[k];
        }
        uint64_t *h = p->decl + 1 + FR_PUB_DECL * (size_t)f.tensor + 3;
        *h = fr_hash64(rec, sizeof rec, *h);
    }
    uint8_t both[16 + 16];
    memcpy(both, p->digest, 16);
    fr_hash128_t dh = fr_hash128(p->decl, ((size_t)nt * FR_PUB_DECL + 1) * 8, 0);
    memcpy(both + 16, dh.b, 16);
    fr_hash128_t all = fr_hash128(both, sizeof both, 0);
    memcpy(p->digest, all.b, 16);
    return 0;
}

/* The stored copies this rank holds, with their data: the k-th source
 * fragment numbered replica 0 is stored fragment k. */
static int find_mine(fr_pub_mine *p, const ferry_publisher_config *c, ferry_manifest *placement,
                     const ferry_shard_data *data, size_t n, ferry_error *err)
{
    ferry_shard_data *by = malloc((n ? n : 1) * sizeof *by);
    if (!by)
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    memcpy(by, data, n * sizeof *by);
    qsort(by, n, sizeof *by, by_fragment);
    uint64_t nf = ferry_manifest_fragment_count(placement), sid = 0;
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        ferry_fragment f;
        if (by[i].fragment >= nf || (i && by[i].fragment == by[i - 1].fragment))
            rc = fr_fail(err, FERRY_EINVAL, "rank %u: data for fragment %" PRIu64 " is %s",
                         c->rank, by[i].fragment, by[i].fragment >= nf ? "not in the placement"
                                                                           : "given twice");
        else if (ferry_manifest_fragment(placement, by[i].fragment, &f) == 0 && f.rank != c->rank)
            rc = fr_fail(err, FERRY_EINVAL, "rank %u: fragment %" PRIu64 " is on rank %u, not "
                         "this one", c->rank, by[i].fragment, f.rank);
    }
    for (uint64_t id = 0; id < nf && rc == 0; id++) {
        ferry_fragment f;
        if ((rc = ferry_manifest_fragment(placement, id, &f)) < 0)
            break;
        if (f.replica != 0)
            continue;   /* a replica: stored by the holder of copy 0 */
        uint64_t me = sid++;
        if (f.rank != c->rank)
            continue;
        ferry_shard_data key = { .fragment = id };
        const ferry_shard_data *hit = bsearch(&key, by, n, sizeof *by, by_fragment);
        if (!hit || !hit->data) {
            ferry_tensor_desc d;
            (void)ferry_manifest_tensor(placement, f.tensor, &d);
            rc = fr_fail(err, FERRY_EINVAL, "rank %u holds fragment %" PRIu64 " of tensor %s "
                         "(stored once, by it) but was given no data for it", c->rank, id,
                         d.name);
            break;
        }
        if (fr_grow((void **)&p->pieces, &cap, p->npieces + 1, sizeof *p->pieces) < 0) {
            rc = fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
            break;
        }
        fr_pub_piece *pc = &p->pieces[p->npieces++];
        *pc = (fr_pub_piece){ .sid = me, .src = f, .data = hit->data };
        (void)ferry_pack_fragment(p->pack, me, &pc->at);
    }
    free(by);
    return rc;
}

/* Whether a fragment of a quantized weight starts or ends inside a block
 * (away from the tensor's edge). */
static bool cuts_block(ferry_manifest *m, const ferry_fragment *f)
{
    ferry_tensor_quant q;
    ferry_tensor_desc d;
    (void)ferry_manifest_tensor_quant(m, f->tensor, &q);
    if (q.role != FERRY_QUANT_WEIGHT)
        return false;
    (void)ferry_manifest_tensor(m, f->tensor, &d);
    uint32_t b[2] = { q.fp8.block_rows, q.fp8.block_cols };
    for (uint32_t k = 0; k < 2; k++) {
        uint64_t end = f->offset[k] + f->shape[k];
        if (f->offset[k] % b[k] || (end % b[k] && end != d.shape[k]))
            return true;
    }
    return false;
}

/* The stored layout quantized as a source (shards may cut blocks); whether
 * any shard cuts a block: the ranks then agree on scales (publish_quant.c).
 * A pure function of the placement, so every rank decides the same. */
static int quantize(fr_pub_mine *p, const ferry_publisher_config *c, ferry_error *err)
{
    ferry_manifest *q = NULL;
    int rc = ferry_manifest_quantize_source(p->stored, c->quant, &q, err);
    if (rc < 0)
        return rc;
    ferry_manifest_close(p->stored);
    p->stored = q;
    uint64_t nf = ferry_manifest_fragment_count(q);
    for (uint64_t id = 0; id < nf && !p->exchange; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(q, id, &f) == 0)
            p->exchange = cuts_block(q, &f);
    }
    return 0;
}

/* The scale fragments this rank stores (after every weight's, ids from
 * nweights on): pieces of their own, their values from its weight pieces. */
static int scale_pieces(fr_pub_mine *p, const ferry_publisher_config *c, uint64_t nweights,
                        ferry_error *err)
{
    uint64_t nf = ferry_manifest_fragment_count(p->stored);
    size_t cap = p->npieces;
    for (uint64_t id = nweights; id < nf; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(p->stored, id, &f) < 0 || f.rank != c->rank)
            continue;
        if (fr_grow((void **)&p->pieces, &cap, p->npieces + 1, sizeof *p->pieces) < 0)
            return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
        fr_pub_piece *pc = &p->pieces[p->npieces++];
        *pc = (fr_pub_piece){ .sid = id, .src = f };
        (void)ferry_pack_fragment(p->pack, id, &pc->at);
    }
    return 0;
}

int fr_pub_mine_prepare(fr_pub_mine *p, const ferry_publisher_config *c, ferry_manifest *placement,
                        const ferry_shard_data *data, size_t n, ferry_error *err)
{
    memset(p, 0, sizeof *p);
    if (ferry_manifest_rank_count(placement) != c->world)
        return fr_fail(err, FERRY_EINVAL, "the placement has %u ranks, the trainer world %u",
                       ferry_manifest_rank_count(placement), c->world);
    uint32_t nt = ferry_manifest_tensor_count(placement);
    for (uint32_t t = 0; t < nt; t++) {
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(placement, t, &d);
        if (c->out_dtype[0] && strcmp(d.dtype, c->out_dtype) != 0 &&
            ferry_convert(NULL, d.dtype, NULL, c->out_dtype, 0) < 0)
            return fr_fail(err, FERRY_EINVAL, "tensor %s: cannot convert %s to %s", d.name,
                           d.dtype, c->out_dtype);
        if (strpbrk(d.name, "\t\n") || strlen(d.name) >= sizeof ((ferry_weight_entry *)0)->name)
            return fr_fail(err, FERRY_EINVAL, "tensor %u has no usable name", t);
    }
    int rc = ferry_manifest_stored(placement, c->out_dtype[0] ? c->out_dtype : NULL, &p->stored,
                                   err);
    if (rc == 0)
        rc = check_cover(placement, p->stored, err);
    uint64_t nweights = rc == 0 ? ferry_manifest_fragment_count(p->stored) : 0;
    if (rc == 0 && c->quant)
        rc = quantize(p, c, err);
    if (rc == 0)
        rc = ferry_manifest_digest(p->stored, p->digest);
    if (rc == 0)
        rc = ferry_manifest_pack(p->stored, FR_GEN_ALIGN, FR_GEN_OBJECT_MAX, &p->pack, err);
    if (rc == 0)
        rc = make_decl(p, placement, err);
    if (rc == 0)
        rc = find_mine(p, c, placement, data, n, err);
    if (rc == 0 && c->quant)
        rc = scale_pieces(p, c, nweights, err);
    if (rc == 0 && c->quant)
        rc = fr_pub_quant_prepare(p, c, placement, err);
    if (rc == 0 && c->rank == 0) {
        p->json = ferry_manifest_to_json(p->stored);
        p->json_len = p->json ? strlen(p->json) : 0;
        if (!p->json)
            rc = fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    }
    p->nobjects = p->pack ? ferry_pack_objects(p->pack, c->rank) : 0;
    return rc;
}

int fr_pub_mine_most(const ferry_publisher_config *c, ferry_manifest *placement, uint64_t *most,
                     ferry_error *err)
{
    ferry_manifest *stored = NULL;
    ferry_pack *pack = NULL;
    *most = 0;
    int rc = ferry_manifest_stored(placement, c->out_dtype[0] ? c->out_dtype : NULL, &stored, err);
    if (rc == 0 && c->quant) {
        ferry_manifest *q = NULL;
        rc = ferry_manifest_quantize_source(stored, c->quant, &q, err);
        ferry_manifest_close(stored);
        stored = q;
    }
    if (rc == 0)
        rc = ferry_manifest_pack(stored, FR_GEN_ALIGN, FR_GEN_OBJECT_MAX, &pack, err);
    uint32_t n = rc == 0 ? ferry_pack_objects(pack, c->rank) : 0;
    for (uint32_t k = 0; k < n; k++)
        if (ferry_pack_object_bytes(pack, c->rank, k) > *most)
            *most = ferry_pack_object_bytes(pack, c->rank, k);
    ferry_pack_free(pack);
    ferry_manifest_close(stored);
    return rc;
}

/* ---- storing ------------------------------------------------------------------------------ */

/* Piece pc into its packed place at base: rows copied or converted out of
 * its source layout, and hashed as they are written (*sum: what
 * fr_gen_bytes_hash gives over the packed bytes). In chunks of PACK_CHUNK
 * elements, each hashed while it is still in cache: hashing the piece
 * after packing it read every published byte from memory a second time
 * (2-core VM, bench --torch: the trainers' conversion and checksums 0.040
 * s, 0.033 fused). */
#define PACK_CHUNK 8192u

static void pack_piece(const fr_pub_piece *pc, const ferry_tensor_desc *src,
                       const char *out_dtype, uint8_t *base, uint64_t *sum)
{
    fr_hasher *h = fr_hasher_new(0);
    uint64_t st[FERRY_MAX_DIMS], dense[FERRY_MAX_DIMS], s = 1;
    for (int d = (int)src->ndim - 1; d >= 0; d--) {
        dense[d] = s;
        s *= pc->src.shape[d];
    }
    memcpy(st, pc->src.has_strides ? pc->src.strides : dense, sizeof st);
    ferry_run run;   /* in elements: itemsize 1 */
    ferry_box_lower(src->ndim, pc->src.shape, 1, st, dense, &run);
    uint32_t isz = src->itemsize, osz = ferry_dtype_size(out_dtype);
    bool same = strcmp(src->dtype, out_dtype) == 0;
    const uint8_t *in = (const uint8_t *)pc->data + pc->src.storage_offset * isz;
    uint8_t *out = base + pc->at.offset;
    uint64_t rows = 1, ctr[FERRY_MAX_DIMS] = {0};
    for (uint32_t i = 0; i < run.nouter; i++)
        rows *= run.count[i];
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t so = 0, dof = 0;
        for (uint32_t i = 0; i < run.nouter; i++) {
            so += ctr[i] * run.src_stride[i];
            dof += ctr[i] * run.dst_stride[i];
        }
        for (uint64_t e = 0; e < run.len; e += PACK_CHUNK) {
            uint64_t k = run.len - e < PACK_CHUNK ? run.len - e : PACK_CHUNK;
            uint8_t *o = out + (dof + e) * osz;
            if (same)
                memcpy(o, in + (so + e) * isz, k * isz);
            else
                (void)ferry_convert(in + (so + e) * isz, src->dtype, o, out_dtype, k);
            if (h)
                fr_hasher_update(h, o, k * osz);
        }
        for (int i = (int)run.nouter - 1; i >= 0 && ++ctr[i] == run.count[i]; i--)
            ctr[i] = 0;
    }
    if (h) {
        fr_hash128_t d = fr_hasher_digest(h);
        memcpy(sum, d.b, sizeof *sum);
        fr_hasher_free(h);
    } else {   /* no memory for the state: the same hash, in a second pass */
        *sum = fr_gen_bytes_hash(out, pc->at.bytes);
    }
}

/* Put one object; an object already under the key is the leftover of an
 * earlier attempt at this generation (never announced: the caller checked
 * that the generation is newer than the active one) and is replaced. */
int fr_pub_put(ferry_store *s, const char *key, const void *data, uint64_t nb,
               const ferry_replicate_config *repl, ferry_object_desc *d, ferry_error *err)
{
    int rc = ferry_store_put_from(s, key, data, nb, repl, d, err);
    if (rc != FERRY_EEXIST)
        return rc;
    rc = ferry_store_remove(s, key, err);
    if (rc < 0 && rc != FERRY_ENOENT)
        return rc;
    return ferry_store_put_from(s, key, data, nb, repl, d, err);
}

/* The placement slot of one of this rank's objects (store.h): the same for
 * that object in every generation, so that the master puts it where the
 * same object of a retired generation was — memory this rank's process
 * and its readers have written and read before (docs/weights.md, "Warm
 * memory"). */
uint64_t fr_pub_slot(const char *model, uint32_t rank, const char *what)
{
    char b[FR_KEY_MAX];
    int n = snprintf(b, sizeof b, "%s/r%u/%s", model, rank, what);
    uint64_t h = fr_hash64(b, n > 0 ? (size_t)n : 0, 0x736c6f74u);
    return h ? h : 1;
}

static int store_files(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                       fr_pub_mine *p, ferry_replicate_config *rp, ferry_error *err);

/* The segments are full: retired generations whose objects readers still
 * lease (every read leases its object, 5 s by default) hold the space a
 * fast publisher needs. Each call removes what of them is free and says
 * whether to try the put again: at once the first time, then as their
 * leases lapse, for at most half of timeout_ms (the other ranks wait
 * timeout_ms at the barrier), while anything retired is still leased. */
bool fr_pub_space_wait(ferry_store *s, const ferry_publisher_config *c, fr_space_wait *w)
{
    if (w->tries == 0) {
        w->deadline = fr_deadline_ns((int64_t)(c->timeout_ms / 2));
        w->pause_ms = 5;
    } else {
        int left = fr_ms_left(w->deadline);
        if (!w->leased || left == 0)
            return false;
        if (w->tries == 1)
            FR_INFO("rl", "publish of %s, rank %u: the segments are full; waiting up to %" PRIu64
                    " ms for readers' leases on retired generations to lapse", c->model, c->rank,
                    c->timeout_ms / 2);
        long ms = left < w->pause_ms ? left : w->pause_ms;
        struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
        w->pause_ms = w->pause_ms < 200 ? w->pause_ms * 2 : 200;
    }
    w->tries++;
    w->leased = fr_rl_reclaim(s, c);
    return true;
}

int fr_pub_mine_store(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                      ferry_manifest *placement, fr_pub_mine *p, ferry_publish_stats *st,
                      ferry_error *err)
{
    ferry_replicate_config repl = { .replica_num = 1, .hard_pin = true,
                                    .preferred_segments = &c->segment,
                                    .npreferred = c->segment ? 1 : 0 };
    if (p->streamed)   /* the objects are stored (publish_stream.c): the files are left */
        return store_files(s, c, gen, p, &repl, err);
    p->sums = calloc(p->npieces ? p->npieces : 1, sizeof *p->sums);
    if (!p->sums)
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    /* Each object is packed where the store will keep it: a put written
     * in place (ferry_store_put_begin) hands out its bytes in the segment
     * itself when the segment is on this machine — no copy after the
     * conversion — or else the store client's staging buffer, whose pages
     * stay resident from one generation to the next (a fresh buffer per
     * object paid a page fault per 4 KiB: on this VM 0.10 s with the
     * pages resident against 2.5-6.4 s fresh for 83 MB). */
    size_t next = 0;   /* pieces are in id order, and so in object order */
    int rc = 0;
    for (uint32_t k = 0; k < p->nobjects && rc == 0; k++) {
        uint64_t nb = ferry_pack_object_bytes(p->pack, c->rank, k);
        char key[FR_KEY_MAX], what[16];
        ferry_object_desc d = {0};
        (void)fr_key_gen_object(key, sizeof key, c->model, gen, c->rank, k);
        snprintf(what, sizeof what, "%u", k);
        repl.slot = fr_pub_slot(c->model, c->rank, what);
        uint64_t c0 = fr_now_ns();
        void *at = NULL;
        ferry_put_slot *ps = NULL;
        rc = nb ? ferry_store_put_begin(s, key, nb, &repl, &at, &ps, NULL) : 0;
        if (rc == FERRY_EEXIST) {   /* a leftover of an earlier attempt: replaced */
            rc = ferry_store_remove(s, key, NULL);
            if (rc == 0 || rc == FERRY_ENOENT)
                rc = ferry_store_put_begin(s, key, nb, &repl, &at, &ps, NULL);
        }
        for (fr_space_wait w = {0}; rc == FERRY_ENOSPC && fr_pub_space_wait(s, c, &w);)
            rc = ferry_store_put_begin(s, key, nb, &repl, &at, &ps, NULL);
        uint64_t c1 = fr_now_ns();
        uint8_t *buf = at;
        uint64_t pos = 0;   /* the alignment gaps are zeroed here */
        for (; rc == 0 && next < p->npieces && p->pieces[next].at.object == k; next++) {
            fr_pub_piece *pc = &p->pieces[next];
            if (pc->at.offset > pos)
                memset(buf + pos, 0, pc->at.offset - pos);
            if (pc->at.offset < pos)
                memset(buf, 0, nb);   /* out of order: not seen, but stay exact */
            ferry_tensor_desc src;
            if (p->q && p->q[next].role) {   /* FP8 in blocks, or scales (publish_quant.c) */
                (void)ferry_manifest_tensor(p->q[next].role == FERRY_QUANT_WEIGHT ? placement
                                                                                  : p->stored,
                                            pc->src.tensor, &src);
                fr_pub_quant_pack(p, next, &src, buf + pc->at.offset);
                p->sums[next] = fr_gen_bytes_hash(buf + pc->at.offset, pc->at.bytes);
            } else {
                (void)ferry_manifest_tensor(placement, pc->src.tensor, &src);
                pack_piece(pc, &src, c->out_dtype[0] ? c->out_dtype : src.dtype, buf,
                           &p->sums[next]);
            }
            st->tensors += next == 0 || p->pieces[next - 1].src.tensor != pc->src.tensor;
            st->bytes += pc->at.bytes;
            if (pc->at.offset + pc->at.bytes > pos)
                pos = pc->at.offset + pc->at.bytes;
        }
        if (rc == 0 && nb > pos)
            memset(buf + pos, 0, nb - pos);
        uint64_t c2 = fr_now_ns();
        if (rc == 0)
            rc = nb ? ferry_store_put_end(ps, true, &d, err) : fr_pub_put(s, key, "", 0, &repl, &d, err);
        st->convert_s += (double)(c2 - c1) / 1e9;
        st->store_s += (double)(c1 - c0 + fr_now_ns() - c2) / 1e9;
        if (rc < 0)
            return fr_fail(err, rc, "could not store %" PRIu64 " bytes of rank %u's pieces: %s",
                           nb, c->rank, fr_why(err, rc));
        p->segment = d.nreplicas ? d.replicas[0].segment : 0;
        if (c->segment && p->segment != c->segment)
            st->cross_node_bytes += nb;
        else if (c->segment)
            st->local_bytes += nb;
    }
    return store_files(s, c, gen, p, &repl, err);
}

/* A rank's files beside its objects: its checksums and declaration, and
 * rank 0's stored manifest. */
static int store_files(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                       fr_pub_mine *p, ferry_replicate_config *rp, ferry_error *err)
{
    ferry_replicate_config repl = *rp;
    int rc = 0;
    char key[FR_KEY_MAX];
    struct { const char *what; const void *data; uint64_t len; } extra[3] = {
        { "sums", p->sums, p->npieces * 8 },
        { "decl", p->decl, ((uint64_t)p->ntensors * FR_PUB_DECL + 1) * 8 },
        { NULL, p->json, p->json_len },
    };
    p->sums_hash = fr_hash64(p->sums, p->npieces * 8, 0);
    for (int i = 0; i < 3 && rc == 0; i++) {
        if (!extra[i].what && !p->json)
            continue;
        char what[40];
        if (extra[i].what)
            snprintf(what, sizeof what, "r%u.%s", c->rank, extra[i].what);
        else
            snprintf(what, sizeof what, "manifest.json");
        (void)fr_key_gen_file(key, sizeof key, c->model, gen, what);
        repl.slot = fr_pub_slot(c->model, c->rank, what);
        rc = fr_pub_put(s, key, extra[i].data, extra[i].len, &repl, NULL, err);
        if (rc < 0)
            fr_fail(err, rc, "could not store %s: %s", what, fr_why(err, rc));
    }
    return rc;
}

void fr_pub_mine_remove(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                        const fr_pub_mine *p)
{
    char key[FR_KEY_MAX];
    for (uint32_t k = 0; k < p->nobjects; k++)
        if (fr_key_gen_object(key, sizeof key, c->model, gen, c->rank, k) > 0)
            (void)ferry_store_remove(s, key, NULL);
    const char *what[] = { "sums", "decl", "amax" };
    for (int i = 0; i < 3; i++) {
        char w[40];
        snprintf(w, sizeof w, "r%u.%s", c->rank, what[i]);
        if (fr_key_gen_file(key, sizeof key, c->model, gen, w) > 0)
            (void)ferry_store_remove(s, key, NULL);
    }
    if (c->rank == 0 && fr_key_gen_file(key, sizeof key, c->model, gen, "manifest.json") > 0)
        (void)ferry_store_remove(s, key, NULL);
}
