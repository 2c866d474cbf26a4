/* Block quantization as a property of a layout (reshard.h, "block
 * quantization of a layout"; docs/weights.md, "FP8 rollouts"): the rules
 * that pick the tensors, the quantized manifest with its derived scale
 * tensors, and the agreement the planner asks of a source and a target.
 *
 * A rollout layout whose shards hold whole blocks can be planned like any
 * other: each worker's scale rows and columns are the blocks of its weight
 * shard, a box of the scale tensor, and the planner moves them as it moves
 * the weight. A shard boundary inside a block would need the block's scale
 * from values the worker does not hold (vLLM refuses such layouts too), so
 * the layout is refused where it is built, before a plan exists. */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "reshard/reshard_int.h"

typedef fr_quant_spec quant_rules;   /* the rules with their defaults filled in */

int ferry_quant_rules_init(ferry_quant_rules *r)
{
    if (!r)
        return FERRY_EINVAL;
    *r = (ferry_quant_rules){ .dtype = "f8e4m3",
                              .include = FERRY_QUANT_INCLUDE,
                              .exclude = FERRY_QUANT_EXCLUDE,
                              .scale_name = FERRY_QUANT_SCALE_NAME };
    ferry_fp8_options_init(&r->fp8);
    return 0;
}

/* "%s" exactly once, "%%" for a '%', no other directive. */
static bool scale_name_ok(const char *fmt)
{
    int n = 0;
    for (const char *p = fmt; *p; p++) {
        if (*p != '%')
            continue;
        if (p[1] == 's')
            n++;
        else if (p[1] != '%')
            return false;
        p++;
    }
    return n == 1;
}

static int spec_check(const quant_rules *q, ferry_error *err)
{
    if (!q->block[0] || !q->block[1])
        return fr_fail(err, FERRY_EINVAL, "quantize: blocks of %u x %u: a block has at least "
                       "one row and one column", q->block[0], q->block[1]);
    if (!fr_fp8_fmt_of(q->dtype))
        return fr_fail(err, FERRY_EINVAL, "quantize: dtype %s is not f8e4m3 or f8e5m2", q->dtype);
    if (q->format != FERRY_FP8_SCALE_F32 && q->format != FERRY_FP8_SCALE_UE8M0)
        return fr_fail(err, FERRY_EINVAL, "quantize: unknown scale format %u", q->format);
    if (q->scale_name && !scale_name_ok(q->scale_name))
        return fr_fail(err, FERRY_EINVAL,
                       "quantize: scale name '%s' must hold \"%%s\" exactly once and no other "
                       "%% directive but \"%%%%\"", q->scale_name);
    return 0;
}

static int rules_resolve(const ferry_quant_rules *in, quant_rules *q, ferry_error *err)
{
    ferry_quant_rules d;
    ferry_quant_rules_init(&d);
    if (!in)
        in = &d;
    if (!FR_RESERVED_OK(in) || !FR_RESERVED_OK(&in->fp8) || in->fp8.reserved32)
        return fr_fail(err, FERRY_EINVAL, "quantize: the rules' reserved fields must be zero");
    *q = (quant_rules){ .dtype = in->dtype ? in->dtype : d.dtype,
                        .include = in->include ? in->include : d.include,
                        .exclude = in->exclude ? in->exclude : d.exclude,
                        .scale_name = in->scale_name ? in->scale_name : d.scale_name,
                        .block = { in->fp8.block_rows ? in->fp8.block_rows : d.fp8.block_rows,
                                   in->fp8.block_cols ? in->fp8.block_cols : d.fp8.block_cols },
                        .format = in->fp8.scale_format };
    return spec_check(q, err);
}

/* Whether name matches one of the comma-separated globs of list. */
static bool globs_match(const char *list, const char *name)
{
    char pat[FR_NAME_MAX];
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n && n < sizeof pat) {
            memcpy(pat, p, n);
            pat[n] = 0;
            if (fnmatch(pat, name, 0) == 0)
                return true;
        }
        p += n + (p[n] == ',');
    }
    return false;
}

static int rules_select(const quant_rules *q, const ferry_tensor_desc *t, ferry_error *err)
{
    if (!t->name || !globs_match(q->include, t->name) || globs_match(q->exclude, t->name))
        return 0;
    if (t->ndim != 2)
        return fr_fail(err, FERRY_EINVAL,
                       "quantize: tensor '%s' has %u dims: FP8 blocks need a 2-D tensor (leave it "
                       "out with the rules' exclude)", t->name, t->ndim);
    if (fr_ftype_of(t->dtype) == FR_FT_NONE)
        return fr_fail(err, FERRY_EINVAL,
                       "quantize: tensor '%s' is %s: FP8 blocks are quantized from f32, bf16 or "
                       "f16", t->name, t->dtype ? t->dtype : "(null)");
    return 1;
}

int ferry_quant_rules_match(const ferry_quant_rules *r, const ferry_tensor_desc *t,
                            ferry_error *err)
{
    quant_rules q;
    if (!t)
        return fr_fail(err, FERRY_EINVAL, "quantize: null tensor");
    int rc = rules_resolve(r, &q, err);
    return rc < 0 ? rc : rules_select(&q, t, err);
}

/* The scale tensor's name: fmt with "%s" replaced by the weight's name. */
static int scale_name(const char *fmt, const char *weight, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = fmt; *p; p++) {
        const char *piece = p;
        size_t len = 1;
        if (*p == '%') {
            piece = p[1] == 's' ? weight : "%";
            len = p[1] == 's' ? strlen(weight) : 1;
            p++;
        }
        if (n + len >= cap)
            return FERRY_EMSGSIZE;
        memcpy(out + n, piece, len);
        n += len;
    }
    out[n] = 0;
    return 0;
}

/* ---- the quantized manifest ------------------------------------------------------------- */

/* Group g of m, every copy, as a split or a fragment of tensor `tensor` of out. */
static int copy_group(const ferry_manifest *m, const fr_group *g, uint32_t tensor,
                      ferry_manifest *out, ferry_error *err)
{
    if (g->is_split) {
        ferry_split s = { .tensor = tensor, .rank = g->rank, .replicas = g->replicas,
                          .replica_stride = g->replica_stride, .replica = g->replica };
        for (uint32_t d = 0; d < g->ndim; d++) {
            s.offset[d] = G_OFF(m, g)[d];
            s.shape[d] = G_EXT(m, g)[d];
            s.parts[d] = (uint32_t)G_PARTS(m, g)[d];
            s.rank_stride[d] = (uint32_t)G_RSTRIDE(m, g)[d];
        }
        return ferry_manifest_add_split(out, &s, err);
    }
    ferry_fragment f = { .tensor = tensor, .rank = g->rank, .replica = g->replica,
                         .has_strides = g->has_strides, .storage_offset = g->storage_offset,
                         .object = g->object >= 0 ? m->objects[g->object] : NULL,
                         .object_offset = g->object_offset };
    for (uint32_t d = 0; d < g->ndim; d++) {
        f.offset[d] = G_OFF(m, g)[d];
        f.shape[d] = G_EXT(m, g)[d];
        if (g->has_strides)
            f.strides[d] = G_STRIDES(m, g)[d];
    }
    return ferry_manifest_add_fragment(out, &f, err);
}

/* The piece of g whose index is k along dim d and 0 along the others. */
static void piece_along(const ferry_manifest *m, const fr_group *g, uint32_t d, uint64_t k,
                        uint64_t *off, uint64_t *shape, uint32_t *rank)
{
    uint64_t lin = k, idx[FR_MAXD];
    for (uint32_t e = d + 1; e < g->ndim; e++)
        lin *= G_PARTS(m, g)[e];
    fr_group_piece(m, g, lin, idx, off, shape);
    *rank = fr_group_rank(m, g, idx, 0);
}

/* Every boundary of g's pieces on a block boundary or the tensor's edge;
 * else the sentence names the tensor, the worker, the dim and the place. */
static int check_blocks(const ferry_manifest *m, const fr_group *g, const quant_rules *q,
                        ferry_error *err)
{
    const fr_tensor *t = &m->tensors[g->tensor];
    static const char *const dim_name[2] = { "row", "column" };
    for (uint32_t d = 0; d < 2 && !q->cut; d++) {
        uint64_t b = q->block[d], off = G_OFF(m, g)[d], end = off + G_EXT(m, g)[d];
        uint64_t chunk = G_CHUNK(m, g)[d], parts = G_PARTS(m, g)[d], at = 0, k = 0;
        bool starts = false;
        if (off % b)
            at = off, starts = true;
        else if (parts > 1 && chunk % b)
            at = off + chunk;
        else if (end != t->shape[d] && end % b)
            at = end, k = parts - 1;
        else
            continue;
        uint64_t poff[FR_MAXD], pshape[FR_MAXD];
        uint32_t rank;
        char b1[200], b2[200];
        piece_along(m, g, d, k, poff, pshape, &rank);
        return fr_fail(err, FERRY_EINVAL,
                       "quantize: tensor '%s' (%s in %u x %u blocks): the shard of worker %u "
                       "(offset %s, shape %s) %s at %s %llu, inside block %s %llu (%ss %llu..%llu): "
                       "a rollout shard must hold whole blocks", t->name, q->dtype, q->block[0],
                       q->block[1], rank, fr_fmt_dims(b1, sizeof b1, poff, 2),
                       fr_fmt_dims(b2, sizeof b2, pshape, 2), starts ? "starts" : "ends",
                       dim_name[d], (unsigned long long)at, dim_name[d],
                       (unsigned long long)(at / b), dim_name[d],
                       (unsigned long long)(at / b * b), (unsigned long long)(at / b * b + b - 1));
    }
    if (g->object >= 0)
        return fr_fail(err, FERRY_EINVAL,
                       "quantize: tensor '%s': a fragment bound to store object '%s': quantize "
                       "the layout before binding it", t->name, m->objects[g->object]);
    return 0;
}

/* Whether every piece of g starts on a block boundary and ends on one or
 * at the tensor's edge along both dims: its scale fragments are then the
 * blocks of its pieces, a split for a split. */
static bool whole_blocks(const ferry_manifest *m, const fr_group *g, const quant_rules *q)
{
    const fr_tensor *t = &m->tensors[g->tensor];
    for (uint32_t d = 0; d < 2; d++) {
        uint64_t b = q->block[d], off = G_OFF(m, g)[d], end = off + G_EXT(m, g)[d];
        if (off % b || (G_PARTS(m, g)[d] > 1 && G_CHUNK(m, g)[d] % b) ||
            (end != t->shape[d] && end % b))
            return false;
    }
    return true;
}

/* A source layout whose shards cut blocks: each block's scale is held by
 * the piece holding the block's first element (first row, first column),
 * so the scale fragments tile the scale tensor once: piece [off, end)
 * holds block indices [ceil(off / B), ceil(end / B)) in each dim, none when
 * that is empty. One fragment per piece and copy. */
static int scale_pieces(const ferry_manifest *m, const fr_group *g, uint32_t scale,
                        const quant_rules *q, ferry_manifest *out, ferry_error *err)
{
    uint64_t npieces = g->ncells;
    for (uint64_t lin = 0; lin < npieces; lin++) {
        uint64_t idx[FR_MAXD], off[FR_MAXD], shape[FR_MAXD];
        fr_group_piece(m, g, lin, idx, off, shape);
        ferry_fragment f = { .tensor = scale };
        bool empty = false;
        for (uint32_t d = 0; d < 2; d++) {
            uint64_t b = q->block[d], lo = (off[d] + b - 1) / b, hi = (off[d] + shape[d] + b - 1) / b;
            empty |= hi <= lo;
            f.offset[d] = lo, f.shape[d] = hi - lo;
        }
        for (uint32_t k = 0; !empty && k < (g->replicas ? g->replicas : 1); k++) {
            f.rank = fr_group_rank(m, g, idx, k);
            f.replica = g->replica + k;
            int rc = ferry_manifest_add_fragment(out, &f, err);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* The scale fragment(s) of weight group g: the blocks of each piece. */
static int scale_group(const ferry_manifest *m, const fr_group *g, uint32_t scale,
                       const quant_rules *q, ferry_manifest *out, ferry_error *err)
{
    if (q->cut && !whole_blocks(m, g, q))
        return scale_pieces(m, g, scale, q, out, err);
    uint64_t off[2], ext[2];
    for (uint32_t d = 0; d < 2; d++) {
        uint64_t b = q->block[d], end = G_OFF(m, g)[d] + G_EXT(m, g)[d];
        off[d] = G_OFF(m, g)[d] / b;
        ext[d] = (end + b - 1) / b - off[d];
    }
    if (g->is_split) {
        /* pieces of chunk = k * block along a dim give pieces of k blocks:
         * the same count of non-empty pieces, on the same ranks */
        ferry_split s = { .tensor = scale, .rank = g->rank, .replicas = g->replicas,
                          .replica_stride = g->replica_stride, .replica = g->replica };
        for (uint32_t d = 0; d < 2; d++) {
            s.offset[d] = off[d], s.shape[d] = ext[d];
            s.parts[d] = (uint32_t)G_PARTS(m, g)[d];
            s.rank_stride[d] = (uint32_t)G_RSTRIDE(m, g)[d];
        }
        return ferry_manifest_add_split(out, &s, err);
    }
    ferry_fragment f = { .tensor = scale, .rank = g->rank, .replica = g->replica };
    memcpy(f.offset, off, sizeof off);
    memcpy(f.shape, ext, sizeof ext);
    return ferry_manifest_add_fragment(out, &f, err);
}

/* The tensors of out: m's (the selected ones as FP8), then the scales. */
static int quant_tensors(const ferry_manifest *m, const quant_rules *q,
                         const char *const *names, ferry_manifest *out, uint32_t *scale_of,
                         ferry_error *err)
{
    for (uint32_t i = 0; i < m->ntensors; i++) {
        ferry_tensor_desc d;
        ferry_manifest_tensor(m, i, &d);
        int sel = names ? names[i] != NULL : rules_select(q, &d, err);
        if (names && sel && (d.ndim != 2 || fr_ftype_of(d.dtype) == FR_FT_NONE))
            sel = rules_select(&(quant_rules){ .include = "*", .exclude = "" }, &d, err);
        if (sel < 0)
            return sel;
        scale_of[i] = sel ? 0 : UINT32_MAX;
        if (sel)
            d.dtype = q->dtype, d.itemsize = 1;
        int rc = ferry_manifest_add_tensor(out, &d, err);
        if (rc < 0)
            return rc;
    }
    char name[FR_NAME_MAX];
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (scale_of[i] == UINT32_MAX)
            continue;
        const fr_tensor *w = &m->tensors[i];
        if (names && strlen(names[i]) < sizeof name)
            strcpy(name, names[i]);
        else if (names || scale_name(q->scale_name, w->name, name, sizeof name) < 0)
            return fr_fail(err, FERRY_EINVAL, "quantize: tensor '%s': its scale name is longer "
                           "than %d bytes", w->name, FR_NAME_MAX - 1);
        if (ferry_manifest_find_tensor(out, name) >= 0)
            return fr_fail(err, FERRY_EEXIST, "quantize: tensor '%s': its scale tensor's name "
                           "'%s' is taken by another tensor", w->name, name);
        ferry_tensor_desc s = { .name = name, .dtype = "f32", .itemsize = 4, .ndim = 2,
                                .shape = { (w->shape[0] + q->block[0] - 1) / q->block[0],
                                           (w->shape[1] + q->block[1] - 1) / q->block[1] } };
        int rc = ferry_manifest_add_tensor(out, &s, err);
        if (rc < 0)
            return rc;
        scale_of[i] = (uint32_t)rc;
    }
    return 0;
}

static void mark(fr_tensor *t, uint32_t role, uint32_t partner, const quant_rules *q,
                 const char *from)
{
    t->qrole = role, t->qpartner = partner;
    snprintf(t->qfrom, sizeof t->qfrom, "%s", from);
    t->qblock[0] = q->block[0], t->qblock[1] = q->block[1];
    t->qformat = q->format;
    t->qcut = q->cut;
    snprintf(t->qdtype, sizeof t->qdtype, "%s", q->dtype);
}

int ferry_manifest_quantize(const ferry_manifest *m, const ferry_quant_rules *r,
                            ferry_manifest **out, ferry_error *err)
{
    if (!m || !out)
        return fr_fail(err, FERRY_EINVAL, "quantize: null argument");
    *out = NULL;
    quant_rules q;
    int rc = rules_resolve(r, &q, err);
    return rc < 0 ? rc : fr_manifest_quantize(m, &q, NULL, out, err);
}

int ferry_manifest_quantize_source(const ferry_manifest *m, const ferry_quant_rules *r,
                                   ferry_manifest **out, ferry_error *err)
{
    if (!m || !out)
        return fr_fail(err, FERRY_EINVAL, "quantize: null argument");
    *out = NULL;
    quant_rules q;
    int rc = rules_resolve(r, &q, err);
    q.cut = true;
    return rc < 0 ? rc : fr_manifest_quantize(m, &q, NULL, out, err);
}

int fr_manifest_quantize(const ferry_manifest *m, const fr_quant_spec *spec,
                         const char *const *names, ferry_manifest **out, ferry_error *err)
{
    *out = NULL;
    quant_rules q = *spec;
    int rc = spec_check(&q, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < m->ntensors; i++)
        if (m->tensors[i].qrole)
            return fr_fail(err, FERRY_EINVAL, "quantize: the manifest is quantized already "
                           "(tensor '%s')", m->tensors[i].name);
    uint32_t *scale_of = malloc((m->ntensors ? m->ntensors : 1) * sizeof *scale_of);
    ferry_manifest *x = NULL;
    if (!scale_of)
        return fr_fail(err, FERRY_ENOMEM, "quantize: out of memory");
    rc = ferry_manifest_create(m->nranks, m->gpus_per_node ? NULL : m->nodes, m->gpus_per_node,
                               &x);
    if (rc < 0)
        fr_fail(err, rc, "quantize: %s", ferry_strerror(rc));
    if (rc == 0)
        rc = quant_tensors(m, &q, names, x, scale_of, err);
    for (size_t i = 0; rc == 0 && i < m->ngroups; i++) {
        const fr_group *g = &m->groups[i];
        if (scale_of[g->tensor] != UINT32_MAX)
            rc = check_blocks(m, g, &q, err);
        if (rc == 0)
            rc = copy_group(m, g, g->tensor, x, err);
    }
    for (size_t i = 0; rc == 0 && i < m->ngroups; i++) {
        const fr_group *g = &m->groups[i];
        if (scale_of[g->tensor] != UINT32_MAX)
            rc = scale_group(m, g, scale_of[g->tensor], &q, x, err);
    }
    for (uint32_t i = 0; rc == 0 && i < m->ntensors; i++)
        if (scale_of[i] != UINT32_MAX) {
            mark(&x->tensors[i], FERRY_QUANT_WEIGHT, scale_of[i], &q, m->tensors[i].dtype);
            mark(&x->tensors[scale_of[i]], FERRY_QUANT_SCALE, i, &q, "f32");
        }
    free(scale_of);
    if (rc < 0) {
        ferry_manifest_close(x);
        return rc;
    }
    x->digest_valid = false;
    *out = x;
    return 0;
}

bool fr_manifest_quant_spec(const ferry_manifest *m, fr_quant_spec *q)
{
    for (size_t i = 0; i < m->ntensors; i++) {
        const fr_tensor *t = &m->tensors[i];
        if (t->qrole != FERRY_QUANT_WEIGHT)
            continue;
        *q = (fr_quant_spec){ .dtype = t->qdtype, .block = { t->qblock[0], t->qblock[1] },
                              .format = t->qformat, .cut = t->qcut != 0 };
        return true;
    }
    return false;
}

int ferry_manifest_tensor_quant(const ferry_manifest *m, uint32_t index, ferry_tensor_quant *out)
{
    if (!m || !out || index >= m->ntensors)
        return FERRY_EINVAL;
    const fr_tensor *t = &m->tensors[index];
    memset(out, 0, sizeof *out);
    if (!t->qrole)
        return 0;
    out->role = t->qrole;
    out->partner = t->qpartner;
    out->fp8.block_rows = t->qblock[0];
    out->fp8.block_cols = t->qblock[1];
    out->fp8.scale_format = t->qformat;
    snprintf(out->fp8_dtype, sizeof out->fp8_dtype, "%s", t->qdtype);
    return 0;
}

/* ---- what the planner asks ---------------------------------------------------------------- */

static const char *stored_as(const fr_tensor *t, char *buf, size_t cap)
{
    if (t->qrole == FERRY_QUANT_NONE)
        snprintf(buf, cap, "%s", t->dtype);
    else
        snprintf(buf, cap, "%s %s %u x %u blocks (%s scales)",
                 t->qrole == FERRY_QUANT_WEIGHT ? t->qdtype : "the scales of",
                 t->qrole == FERRY_QUANT_WEIGHT ? "in" : t->qdtype, t->qblock[0], t->qblock[1],
                 t->qformat == FERRY_FP8_SCALE_UE8M0 ? "ue8m0" : "f32");
    return buf;
}

int fr_quant_agree(const fr_tensor *s, const fr_tensor *t, ferry_error *err)
{
    if (s->qrole == t->qrole &&
        (t->qrole == FERRY_QUANT_NONE ||
         (s->qblock[0] == t->qblock[0] && s->qblock[1] == t->qblock[1] &&
          s->qformat == t->qformat && !strcmp(s->qdtype, t->qdtype))))
        return 0;
    char b1[96], b2[96];
    const char *why = t->qrole == FERRY_QUANT_WEIGHT && s->qrole == FERRY_QUANT_NONE ?
                          ": the source must store it quantized the same way" :
                      s->qrole == FERRY_QUANT_WEIGHT && t->qrole == FERRY_QUANT_NONE ?
                          ": a target that asks another dtype of an FP8 tensor is not planned" :
                          "";
    return fr_fail(err, FERRY_EINVAL, "tensor '%s': stored as %s in the source, as %s in the "
                   "target%s", t->name, stored_as(s, b1, sizeof b1), stored_as(t, b2, sizeof b2),
                   why);
}

int fr_manifest_quant_like(ferry_manifest *t, const ferry_manifest *src, bool check,
                           ferry_error *err)
{
    for (size_t i = 0; i < src->ntensors; i++) {
        const fr_tensor *w = &src->tensors[i];
        if (w->qrole != FERRY_QUANT_WEIGHT)
            continue;
        int ti = ferry_manifest_find_tensor(t, w->name);
        int si = ferry_manifest_find_tensor(t, src->tensors[w->qpartner].name);
        if (ti < 0 && si < 0)
            continue;   /* a target of some tensors only (a subscriber's reads) */
        quant_rules q = { .dtype = w->qdtype, .block = { w->qblock[0], w->qblock[1] },
                          .format = w->qformat };
        for (size_t g = 0; check && ti >= 0 && g < t->ngroups; g++)
            if (t->groups[g].tensor == (uint32_t)ti) {
                int rc = check_blocks(t, &t->groups[g], &q, err);
                if (rc < 0)
                    return rc;
            }
        if (ti >= 0)   /* the partner of one without the other: none (UINT32_MAX) */
            mark(&t->tensors[ti], FERRY_QUANT_WEIGHT, (uint32_t)si, &q, w->qfrom);
        if (si >= 0)
            mark(&t->tensors[si], FERRY_QUANT_SCALE, (uint32_t)ti, &q, "f32");
    }
    t->digest_valid = false;
    return 0;
}
