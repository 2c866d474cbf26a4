/* Layouts: "fsdp:256", "tp:8,dp:16", "ep:32,tp:8", "pp:4,tp:8" parsed, and
 * turned into manifests of splits (one or a few per tensor, never one
 * entry per fragment). Semantics in include/ferry/reshard.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard/reshard_int.h"

#define MAX_RANKS (1u << 24)

uint32_t ferry_layout_ranks(const ferry_layout *l)
{
    if (!l)
        return 0;
    uint64_t w = 1;
    const uint32_t v[5] = {l->pp, l->dp, l->ep, l->fsdp, l->tp};
    for (int i = 0; i < 5; i++) {
        w *= v[i] ? v[i] : 1;
        if (w > UINT32_MAX)
            return 0;
    }
    return (uint32_t)w;
}

int ferry_layout_parse(const char *text, ferry_layout *out, ferry_error *err)
{
    if (!text || !out)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    ferry_layout l = {1, 1, 1, 1, 1, 8, 0};
    if (!strcmp(text, "replicated")) {
        *out = l;
        return 0;
    }
    bool seen[7] = {0};
    static const char *const keys[] = {"fsdp", "tp", "dp", "ep", "pp", "gpn", "node"};
    uint32_t *slot[] = {&l.fsdp, &l.tp, &l.dp, &l.ep, &l.pp, &l.gpus_per_node, &l.first_node};
    const char *p = text;
    if (!*p)
        return fr_fail(err, FERRY_EINVAL, "layout is empty");
    while (*p) {
        const char *colon = strchr(p, ':');
        size_t klen = colon ? (size_t)(colon - p) : 0;
        int k = -1;
        for (int i = 0; colon && i < 7; i++)
            if (strlen(keys[i]) == klen && !strncmp(p, keys[i], klen))
                k = i;
        if (k < 0)
            return fr_fail(err, FERRY_EINVAL,
                           "layout '%s': expected NAME:N with NAME one of fsdp, tp, dp, ep, pp, gpn, node at '%s'",
                           text, p);
        if (seen[k])
            return fr_fail(err, FERRY_EINVAL, "layout '%s': %s given twice", text, keys[k]);
        seen[k] = true;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(colon + 1, &end, 10);
        bool min0 = k == 6;
        if (errno || end == colon + 1 || (*end && *end != ',') || (!min0 && v == 0) || v > MAX_RANKS ||
            colon[1] == '-' || colon[1] == '+')
            return fr_fail(err, FERRY_EINVAL, "layout '%s': %s needs a number in [%d, %u]", text, keys[k],
                           min0 ? 0 : 1, MAX_RANKS);
        *slot[k] = (uint32_t)v;
        p = *end ? end + 1 : end;
        if (*end && !*p)
            return fr_fail(err, FERRY_EINVAL, "layout '%s': trailing comma", text);
    }
    uint32_t w = ferry_layout_ranks(&l);
    if (w == 0 || w > MAX_RANKS)
        return fr_fail(err, FERRY_EINVAL, "layout '%s': more than %u ranks", text, MAX_RANKS);
    *out = l;
    return 0;
}

int ferry_layout_format(const ferry_layout *l, char *buf, size_t cap)
{
    if (!l || !buf || !cap)
        return FERRY_EINVAL;
    const char *names[] = {"pp", "dp", "ep", "fsdp", "tp"};
    const uint32_t v[] = {l->pp, l->dp, l->ep, l->fsdp, l->tp};
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < 5; i++)
        if (v[i] > 1)
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s:%u", n ? "," : "", names[i], v[i]);
    if (!n)
        n = (size_t)snprintf(buf, cap, "replicated");
    if (l->gpus_per_node && l->gpus_per_node != 8)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, ",gpn:%u", l->gpus_per_node);
    if (l->first_node)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, ",node:%u", l->first_node);
    return n < cap ? (int)n : FERRY_ENOSPC;
}

/* ---- building ----------------------------------------------------------- */

typedef struct lay {
    uint64_t F, T, D, E, P;
    ferry_manifest *m;
    ferry_error *err;
} lay;

/* Add split s with `inner` copies (stride s->replica_stride) times `outer`
 * copies at stride ostride, merging the two levels when they line up. */
static int add_copies(lay *L, ferry_split *s, uint64_t outer, uint64_t ostride)
{
    uint64_t inner = s->replicas ? s->replicas : 1;
    if (outer == 1)
        return ferry_manifest_add_split(L->m, s, L->err);
    if (inner == 1 || ostride == inner * s->replica_stride) {
        if (inner == 1)
            s->replica_stride = (uint32_t)ostride;
        s->replicas = (uint32_t)(inner * outer);
        return ferry_manifest_add_split(L->m, s, L->err);
    }
    uint32_t rank = s->rank;
    for (uint64_t q = 0; q < outer; q++) {
        s->rank = (uint32_t)(rank + q * ostride);
        s->replica = (uint32_t)(q * inner);
        int rc = ferry_manifest_add_split(L->m, s, L->err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int place(lay *L, const ferry_model *model, uint32_t ti, const ferry_model_tensor *t)
{
    uint64_t F = L->F, T = L->T, D = L->D, E = L->E, P = L->P;
    uint64_t layers = ferry_model_layers(model), experts = ferry_model_experts(model);
    uint64_t stage = t->layer == FERRY_LAYER_FIRST ? 0 : t->layer == FERRY_LAYER_LAST ? P - 1
                                                                                     : (uint64_t)t->layer * P / layers;
    uint64_t group = D * E * F * T;   /* ranks per stage */
    uint64_t base = stage * group, outer, ostride;
    if (t->expert >= 0) {
        base += (uint64_t)t->expert * E / experts * F * T;
        outer = D;
        ostride = E * F * T;
    } else {
        outer = D * E;
        ostride = F * T;
    }
    uint32_t nd = t->desc.ndim;
    ferry_split s = {.tensor = ti, .whole = true, .rank = (uint32_t)base, .replicas = 1};
    if (nd >= 1) {
        s.parts[0] = (uint32_t)F;
        s.rank_stride[0] = (uint32_t)T;
    }
    switch (t->role) {
    case FERRY_TP_ROW:
        s.parts[1] = (uint32_t)T;
        s.rank_stride[1] = 1;
        return add_copies(L, &s, outer, ostride);
    case FERRY_TP_REPLICATED:
        s.replicas = (uint32_t)T;
        s.replica_stride = 1;
        return add_copies(L, &s, outer, ostride);
    case FERRY_TP_COLUMN:
    case FERRY_TP_VOCAB:
        if (F == 1) {
            s.parts[0] = (uint32_t)T;
            s.rank_stride[0] = 1;
            return add_copies(L, &s, outer, ostride);
        }
        /* FSDP inside each TP piece of dim 0: one split per TP piece. */
        s.whole = false;
        uint64_t n0 = t->desc.shape[0], chunk = (n0 + T - 1) / T;
        for (uint64_t j = 0; j * chunk < n0; j++) {
            memcpy(s.shape, t->desc.shape, sizeof s.shape);
            memset(s.offset, 0, sizeof s.offset);
            s.offset[0] = j * chunk;
            s.shape[0] = n0 - j * chunk < chunk ? n0 - j * chunk : chunk;
            s.rank = (uint32_t)(base + j);
            s.replicas = 1;
            s.replica = 0;
            int rc = add_copies(L, &s, outer, ostride);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    return fr_fail(L->err, FERRY_EINVAL, "tensor '%s': unknown role", t->desc.name);
}

int ferry_layout_build(const ferry_model *model, const ferry_layout *l, ferry_manifest **out,
                       ferry_error *err)
{
    if (!model || !l || !out)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    uint32_t w = ferry_layout_ranks(l);
    if (w == 0 || w > MAX_RANKS)
        return fr_fail(err, FERRY_EINVAL, "layout has more than %u ranks", MAX_RANKS);
    lay L = {l->fsdp ? l->fsdp : 1, l->tp ? l->tp : 1, l->dp ? l->dp : 1, l->ep ? l->ep : 1,
             l->pp ? l->pp : 1, NULL, err};
    if (L.P > 1 && L.P > ferry_model_layers(model))
        return fr_fail(err, FERRY_EINVAL, "layout: pp:%llu but model '%s' has %u layers", (unsigned long long)L.P,
                       ferry_model_name(model), ferry_model_layers(model));
    uint32_t gpn = l->gpus_per_node ? l->gpus_per_node : 8;
    uint32_t *nodes = fr_calloc(w, sizeof *nodes);
    if (!nodes)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    for (uint32_t r = 0; r < w; r++)
        nodes[r] = l->first_node + r / gpn;
    int rc = ferry_manifest_create(w, nodes, 0, &L.m);
    fr_free(nodes);
    if (rc < 0)
        return fr_fail(err, rc, "out of memory");
    L.m->gpus_per_node = l->first_node ? 0 : gpn;   /* regular: JSON writes it compactly */
    size_t n = ferry_model_tensor_count(model);
    for (size_t i = 0; i < n && rc >= 0; i++) {
        ferry_model_tensor t;
        ferry_model_tensor_at(model, i, &t);
        rc = ferry_manifest_add_tensor(L.m, &t.desc, err);
    }
    for (size_t i = 0; i < n && rc >= 0; i++) {
        ferry_model_tensor t;
        ferry_model_tensor_at(model, i, &t);
        rc = place(&L, model, (uint32_t)i, &t);
    }
    if (rc < 0) {
        ferry_manifest_close(L.m);
        return rc;
    }
    *out = L.m;
    return 0;
}
