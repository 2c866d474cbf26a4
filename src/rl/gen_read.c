/* Reading a stored generation through the reshard planner (gen_int.h):
 * planned runs become strided store reads; whole tensors are a target of
 * every tensor whole, checked fragment by fragment against the checksums
 * the publishers recorded; the target, binding and attestation every
 * consumer plans its reads with (rl_int.h). Below update.c and
 * weights_read.c, which call it, and above gen.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "reshard/reshard_int.h"
#include "rl/gen_int.h"
#include "rl/rl_int.h"

#define READ_BATCH 8192

int fr_gread_add(fr_gread **v, size_t *n, size_t *cap, const ferry_run *run, uint8_t *dst_base)
{
    /* The innermost loop rides in the strided read; outer ones are unrolled. */
    uint32_t outer = run->nouter ? run->nouter - 1 : 0;
    uint64_t reps = 1, ctr[FERRY_MAX_DIMS] = {0};
    for (uint32_t i = 0; i < outer; i++)
        reps *= run->count[i];
    if (fr_grow((void **)v, cap, *n + reps, sizeof **v) < 0)
        return FERRY_ENOMEM;
    for (uint64_t r = 0; r < reps; r++) {
        uint64_t so = run->src_offset, dof = run->dst_offset;
        for (uint32_t i = 0; i < outer; i++) {
            so += ctr[i] * run->src_stride[i];
            dof += ctr[i] * run->dst_stride[i];
        }
        fr_gread *g = &(*v)[(*n)++];
        *g = (fr_gread){ .frag = run->src_fragment, .src = so, .dst = dst_base + dof,
                         .len = run->len, .count = 1 };
        if (run->nouter) {
            g->count = run->count[outer];
            g->sstride = run->src_stride[outer];
            g->dstride = run->dst_stride[outer];
        }
        for (int i = (int)outer - 1; i >= 0 && ++ctr[i] == run->count[i]; i--)
            ctr[i] = 0;
    }
    return 0;
}

int fr_gread_run(ferry_store *s, const fr_gen *g, const fr_gread *v, size_t n, uint64_t *bytes,
                 ferry_error *err)
{
    size_t batch = n < READ_BATCH ? n : READ_BATCH;
    ferry_strided_range *r = malloc((batch ? batch : 1) * sizeof *r);
    int64_t *res = malloc((batch ? batch : 1) * sizeof *res);
    int rc = r && res ? 0 : fr_fail(err, FERRY_ENOMEM, "out of memory for the reads");
    for (size_t at = 0; at < n && rc == 0; at += batch) {
        size_t k = n - at < batch ? n - at : batch;
        for (size_t i = 0; i < k && rc == 0; i++) {
            const fr_gread *x = &v[at + i];
            const char *key;
            uint64_t off;
            if (fr_gen_where(g, x->frag, &key, &off, NULL) < 0)
                rc = fr_fail(err, FERRY_EPROTO, "a read names fragment %" PRIu64 ", not in "
                             "generation %" PRIu64, x->frag, g->generation);
            r[i] = (ferry_strided_range){ .key = key, .src_offset = off + x->src, .dst = x->dst,
                                          .len = x->len, .count = x->count,
                                          .src_stride = x->sstride, .dst_stride = x->dstride };
        }
        if (rc < 0)
            break;
        rc = ferry_store_get_into_strided(s, r, k, res, err);
        for (size_t i = 0; i < k; i++) {
            uint64_t want = r[i].len * (r[i].count ? r[i].count : 1);
            if (res[i] == (int64_t)want) {
                if (bytes)
                    *bytes += want;
                continue;
            }
            rc = fr_fail(err, res[i] < 0 ? (int)res[i] : FERRY_EIO,
                         "reading %s at %" PRIu64 " failed: %s", r[i].key, r[i].src_offset,
                         res[i] < 0 ? fr_why(err, (int)res[i]) : "short read");
            break;
        }
    }
    free(r);
    free(res);
    return rc;
}

/* ---- whole tensors --------------------------------------------------------------------- */

/* The plan of every tensor whole on one rank, made once per generation. */
static int whole_plan(fr_gen *g, ferry_error *err)
{
    if (g->whole)
        return 0;
    uint32_t nt = ferry_manifest_tensor_count(g->m);
    int rc = ferry_manifest_create(1, NULL, 1, &g->whole_m);
    for (uint32_t t = 0; t < nt && rc == 0; t++) {
        ferry_tensor_desc d;
        rc = ferry_manifest_tensor(g->m, t, &d);
        if (rc == 0)
            rc = ferry_manifest_add_tensor(g->whole_m, &d, err);
        ferry_split sp = { .tensor = t, .whole = true };
        if (rc >= 0)
            rc = ferry_manifest_add_split(g->whole_m, &sp, err);
    }
    if (rc >= 0)   /* whole tensors hold whole blocks */
        rc = fr_manifest_quant_like(g->whole_m, g->m, false, err);
    if (rc >= 0)
        rc = ferry_plan_create(g->m, g->whole_m, NULL, &g->whole, err);
    return rc < 0 ? rc : 0;
}

int fr_gen_verify_tensor(ferry_store *s, fr_gen *g, uint32_t tensor, const void *data,
                         ferry_error *err)
{
    ferry_tensor_desc d;
    int rc = ferry_manifest_tensor(g->m, tensor, &d);
    if (rc < 0)
        return fr_fail(err, FERRY_EINVAL, "no tensor %u", tensor);
    uint64_t strides[FERRY_MAX_DIMS], st = 1;
    for (int k = (int)d.ndim - 1; k >= 0; k--) {
        strides[k] = st;
        st *= d.shape[k];
    }
    if ((rc = whole_plan(g, err)) < 0)
        return rc;
    /* The tensor's fragments, from the plan's regions (each once). */
    ferry_plan_filter f = { .tensor = tensor, .src_rank = -1, .dst_rank = -1 };
    ferry_plan_iter *it = NULL;
    rc = ferry_plan_iter_open(g->whole, &f, &it);
    ferry_region r;
    uint64_t last = UINT64_MAX;
    while (rc == 0 && (rc = ferry_plan_iter_next_region(it, &r)) == 1) {
        rc = 0;
        if (r.src_fragment == last)
            continue;
        last = r.src_fragment;
        ferry_fragment fr;
        uint64_t want = 0;
        if ((rc = ferry_manifest_fragment(g->m, r.src_fragment, &fr)) < 0 ||
            (rc = fr_gen_checksum(s, g, r.src_fragment, &want, err)) < 0)
            break;
        uint64_t off = 0;
        for (uint32_t k = 0; k < d.ndim; k++)
            off += fr.offset[k] * strides[k];
        if (fr_gen_box_hash((const uint8_t *)data + off * d.itemsize, d.ndim, fr.shape, strides,
                            d.itemsize) != want)
            rc = fr_fail(err, FERRY_ECORRUPT, "tensor %s: the bytes of fragment %" PRIu64
                         " (published by rank %u) fail its checksum", d.name, r.src_fragment,
                         fr.rank);
    }
    ferry_plan_iter_close(it);
    return rc < 0 ? rc : 0;
}

/* ---- the public manifest ------------------------------------------------------------------ */

int fr_gen_to_manifest(fr_gen *g, ferry_weight_manifest *out, ferry_error *err)
{
    memset(out, 0, sizeof *out);
    uint32_t nt = ferry_manifest_tensor_count(g->m);
    out->entries = calloc(nt ? nt : 1, sizeof *out->entries);
    if (!out->entries)
        return fr_fail(err, FERRY_ENOMEM, "manifest: out of memory");
    if (whole_plan(g, err) < 0) {
        free(out->entries);
        out->entries = NULL;
        return err ? err->code : FERRY_EINVAL;
    }
    /* The first fragment of each tensor names a publisher and an object. */
    uint64_t nf = ferry_manifest_fragment_count(g->m);
    uint64_t *first = malloc((nt ? nt : 1) * sizeof *first);
    if (!first) {
        free(out->entries);
        return fr_fail(err, FERRY_ENOMEM, "manifest: out of memory");
    }
    for (uint32_t t = 0; t < nt; t++)
        first[t] = UINT64_MAX;
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment fr;
        if (ferry_manifest_fragment(g->m, id, &fr) == 0 && first[fr.tensor] == UINT64_MAX)
            first[fr.tensor] = id;
    }
    for (uint32_t t = 0; t < nt; t++) {
        ferry_weight_entry *e = &out->entries[t];
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(g->m, t, &d);
        snprintf(e->name, sizeof e->name, "%s", d.name);
        snprintf(e->dtype, sizeof e->dtype, "%s", d.dtype);
        e->ndim = d.ndim;
        e->bytes = d.itemsize;
        for (uint32_t k = 0; k < d.ndim; k++) {
            e->shape[k] = d.shape[k];
            e->bytes *= d.shape[k];
        }
        e->index = t;
        e->internal = g;
        if (first[t] != UINT64_MAX) {
            ferry_packed p;
            const char *key = "";
            (void)ferry_pack_fragment(g->pack, first[t], &p);
            (void)fr_gen_where(g, first[t], &key, NULL, NULL);
            e->publisher = p.rank;
            e->segment = p.rank < g->nranks ? g->ranks[p.rank].segment : 0;
            snprintf(e->key, sizeof e->key, "%s", key);
        }
        out->bytes += e->bytes;
    }
    free(first);
    out->n = nt;
    out->generation = g->generation;
    memcpy(out->digest, g->digest, 16);
    out->stored = g->m;
    out->internal = g;
    return 0;
}

fr_gen *fr_gen_of(const ferry_weight_manifest *m)
{
    return m ? m->internal : NULL;
}

/* ---- a worker's shards of a given generation --------------------------------------------- */

int fr_gen_read_shards(ferry_store *s, fr_gen *g, const ferry_param_shard *shards, size_t n,
                       uint64_t *bytes, uint64_t *ranges, ferry_error *err)
{
    ferry_manifest *tgt = NULL;
    ferry_plan *plan = NULL;
    ferry_plan_iter *it = NULL;
    fr_gread *v = NULL;
    size_t nv = 0, cap = 0, *shard_of = NULL;
    int rc = fr_rl_target(g, shards, n, 1, NULL, &tgt, &shard_of, err);
    if (rc == 0)
        rc = ferry_plan_create(g->m, tgt, NULL, &plan, err);
    if (rc == 0)
        rc = ferry_plan_iter_open(plan, NULL, &it);
    ferry_run run;
    while (rc == 0 && (rc = ferry_plan_iter_next_run(it, &run)) == 1)
        rc = fr_gread_add(&v, &nv, &cap, &run, shards[shard_of[run.dst_fragment]].dst);
    ferry_plan_iter_close(it);
    if (rc < 0 && err && !err->msg[0])
        fr_fail(err, rc, "planning the reads of generation %" PRIu64 ": %s", g->generation,
                ferry_strerror(rc));
    if (rc == 0) {
        ferry_error e = {0};
        rc = fr_gread_run(s, g, v, nv, bytes, &e);
        if (ranges)
            *ranges += nv;
        if (rc < 0)   /* the parameters may be partly written */
            rc = fr_fail(err, FERRY_EREBUILD, "%s; the parameters must be rebuilt", e.msg);
    }
    free(v);
    free(shard_of);
    ferry_plan_free(plan);
    ferry_manifest_close(tgt);
    return rc;
}

/* ---- planning reads of a generation (update.c, weights_read.c) ---------------------------- */

int fr_rl_target(const fr_gen *g, const ferry_param_shard *shards, size_t n, uint32_t ranks,
                 const uint32_t *rank_of, ferry_manifest **out, size_t **shard_of,
                 ferry_error *err)
{
    *out = NULL;
    *shard_of = malloc((n ? n : 1) * sizeof **shard_of);
    if (!*shard_of)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    size_t nf = 0;
    ferry_manifest *t = NULL;
    int rc = ferry_manifest_create(ranks ? ranks : 1, NULL, 1, &t);
    uint32_t nt = ferry_manifest_tensor_count(g->m);
    for (uint32_t i = 0; i < nt && rc >= 0; i++) {
        ferry_tensor_desc d;
        rc = ferry_manifest_tensor(g->m, i, &d);
        if (rc == 0)
            rc = ferry_manifest_add_tensor(t, &d, err);
    }
    for (size_t i = 0; i < n && rc >= 0; i++) {
        const ferry_param_shard *p = &shards[i];
        int ti = ferry_manifest_find_tensor(g->m, p->tensor ? p->tensor : "");
        if (ti < 0) {
            rc = fr_fail(err, FERRY_ENOENT, "tensor %s is not in generation %" PRIu64 " of %s",
                         p->tensor ? p->tensor : "(null)", g->generation, g->model);
            break;
        }
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(g->m, (uint32_t)ti, &d);
        if (p->ndim != d.ndim) {
            rc = fr_fail(err, FERRY_EINVAL, "shard of %s has %u dims, the tensor %u", d.name,
                         p->ndim, d.ndim);
            break;
        }
        if ((rc = fr_rl_shard_quant_check(g, (uint32_t)ti, p, err)) < 0 ||
            (rc = fr_rl_shard_check(p, &d, NULL, err)) < 0)   /* FP8 blocks; a buffer too small */
            break;
        ferry_fragment f = { .tensor = (uint32_t)ti, .rank = rank_of ? rank_of[i] : 0 };
        bool strided = false, empty = false;
        for (uint32_t k = 0; k < d.ndim; k++) {
            if (p->offset[k] > d.shape[k] || p->shape[k] > d.shape[k] - p->offset[k]) {
                rc = fr_fail(err, FERRY_ERANGE, "shard of %s: dim %u [%" PRIu64 ", +%" PRIu64
                             ") outside %" PRIu64, d.name, k, p->offset[k], p->shape[k],
                             d.shape[k]);
                break;
            }
            if (p->strides[k] < 0) {
                rc = fr_fail(err, FERRY_EINVAL, "shard of %s: negative stride", d.name);
                break;
            }
            f.offset[k] = p->offset[k];
            f.shape[k] = p->shape[k];
            f.strides[k] = (uint64_t)p->strides[k];
            strided |= p->strides[k] != 0;
            empty |= p->shape[k] == 0;
        }
        if (rc < 0)
            break;
        if (empty)   /* nothing of the tensor: an empty box is no fragment */
            continue;
        f.has_strides = strided;
        for (uint32_t k = 0; strided && k < d.ndim; k++)
            if (f.strides[k] == 0)
                f.strides[k] = p->shape[k] == 1 ? 1 : 0;   /* extent 1: any stride */
        rc = ferry_manifest_add_fragment(t, &f, err);
        if (rc < 0 && err)
            fr_fail(err, rc, "shard %zu of %s: %s", i, d.name, err->msg);
        else
            (*shard_of)[nf++] = i;
    }
    if (rc >= 0)   /* stored as the generation stores it (FP8 blocks: checked above) */
        rc = fr_manifest_quant_like(t, g->m, false, err);
    if (rc < 0) {
        ferry_manifest_close(t);
        free(*shard_of);
        *shard_of = NULL;
        return rc;
    }
    *out = t;
    return 0;
}

int fr_rl_locate(void *g, uint64_t fragment, const char **key, uint64_t *offset)
{
    return fr_gen_where(g, fragment, key, offset, NULL);
}

int fr_rl_attest_reads(const fr_gen *g, ferry_plan *plan, const ferry_binding *dst,
                       ferry_attested_plan **out, ferry_error *err)
{
    ferry_binding *src = NULL;
    int rc = ferry_binding_create(g->m, 0, g->generation, 0, &src, err);
    if (rc == 0)
        rc = ferry_attest(plan, src, dst, g->generation, out, err);
    ferry_binding_free(src);
    return rc;
}

int fr_rl_bind(ferry_manifest *t, uint64_t generation, uint32_t worker, const uint64_t *frags,
               size_t n, const uint64_t *addr, const uint64_t *nbytes, ferry_binding **out,
               ferry_error *err)
{
    ferry_binding *b = NULL;
    int rc = ferry_binding_create(t, 0, generation, 0, &b, err);
    uint64_t nf = frags ? n : ferry_manifest_fragment_count(t);
    for (uint64_t i = 0; i < nf && rc == 0; i++) {
        ferry_fragment f;
        ferry_tensor_desc d;
        uint64_t j = frags ? frags[i] : i;
        rc = ferry_manifest_fragment(t, j, &f);
        if (rc == 0)
            rc = ferry_manifest_tensor(t, f.tensor, &d);
        if (rc < 0)
            break;
        ferry_binding_entry e = { .fragment = j, .addr = addr[i], .worker = worker,
                                  .kind = FERRY_MEM_HOST, .itemsize = d.itemsize,
                                  .ndim = d.ndim, .storage_offset = f.storage_offset };
        uint64_t dense = 1, last = f.storage_offset;
        for (uint32_t k = d.ndim; k-- > 0;) {
            e.shape[k] = f.shape[k];
            e.strides[k] = f.has_strides ? f.strides[k] : dense;
            if (e.strides[k] == 0)   /* an extent-1 dim: any stride */
                e.strides[k] = 1;
            dense *= f.shape[k];
            last += (f.shape[k] - 1) * e.strides[k];
        }
        e.nbytes = nbytes && nbytes[i] ? nbytes[i] : (last + 1) * d.itemsize;
        rc = ferry_binding_add(b, &e, err);
    }
    if (rc < 0) {
        ferry_binding_free(b);
        return rc;
    }
    *out = b;
    return 0;
}
