/* Models: named tensor lists with parallelism roles, and presets built
 * from the public configs of Qwen3-8B, Qwen3-30B-A3B, DeepSeek-V3 and
 * Kimi-K2 (tensor names as in their Hugging Face checkpoints, bf16). */
#include <stdio.h>
#include <string.h>

#include "reshard/reshard_int.h"

typedef struct fr_mtensor {
    char *name;
    char dtype[FERRY_DTYPE_MAX];
    uint32_t itemsize, ndim;
    uint64_t shape[FR_MAXD];
    enum ferry_tp_role role;
    int32_t layer, expert;
} fr_mtensor;

struct ferry_model {
    char *name;
    uint32_t layers, experts;
    fr_mtensor *t;
    size_t n, cap;
};

int ferry_model_create(const char *name, uint32_t layers, uint32_t experts, ferry_model **out)
{
    if (!name || !out)
        return FERRY_EINVAL;
    ferry_model *m = fr_calloc(1, sizeof *m);
    if (!m || !(m->name = fr_strdup(name))) {
        fr_free(m);
        return FERRY_ENOMEM;
    }
    m->layers = layers;
    m->experts = experts;
    *out = m;
    return 0;
}

void ferry_model_free(ferry_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++)
        fr_free(m->t[i].name);
    fr_free(m->t);
    fr_free(m->name);
    fr_free(m);
}

int ferry_model_add_tensor(ferry_model *m, const ferry_model_tensor *t, ferry_error *err)
{
    if (!m || !t || !t->desc.name)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    const ferry_tensor_desc *d = &t->desc;
    if (ferry_dtype_size(d->dtype) == 0 || ferry_dtype_size(d->dtype) != d->itemsize)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': dtype/itemsize %s/%u not known", d->name,
                       d->dtype ? d->dtype : "(null)", d->itemsize);
    if (d->ndim > FR_MAXD)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': too many dims", d->name);
    if ((t->role == FERRY_TP_ROW && d->ndim < 2) ||
        ((t->role == FERRY_TP_COLUMN || t->role == FERRY_TP_VOCAB) && d->ndim < 1) ||
        (unsigned)t->role > FERRY_TP_VOCAB)
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': role %d does not fit %u dims", d->name, (int)t->role,
                       d->ndim);
    if (t->layer < FERRY_LAYER_LAST || (t->layer >= 0 && (uint32_t)t->layer >= m->layers))
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': layer %d outside the model's %u layers", d->name,
                       t->layer, m->layers);
    if (t->expert < -1 || (t->expert >= 0 && (uint32_t)t->expert >= m->experts))
        return fr_fail(err, FERRY_EINVAL, "tensor '%s': expert %d outside the model's %u experts", d->name,
                       t->expert, m->experts);
    for (uint32_t i = 0; i < d->ndim; i++)
        if (!d->shape[i])
            return fr_fail(err, FERRY_EINVAL, "tensor '%s': dim %u is 0", d->name, i);
    if (fr_grow((void **)&m->t, &m->cap, m->n + 1, sizeof *m->t) < 0)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    fr_mtensor *x = &m->t[m->n];
    memset(x, 0, sizeof *x);
    if (!(x->name = fr_strdup(d->name)))
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    snprintf(x->dtype, sizeof x->dtype, "%s", d->dtype);
    x->itemsize = d->itemsize;
    x->ndim = d->ndim;
    memcpy(x->shape, d->shape, sizeof x->shape);
    x->role = t->role;
    x->layer = t->layer;
    x->expert = t->expert;
    m->n++;
    return 0;
}

const char *ferry_model_name(const ferry_model *m) { return m ? m->name : NULL; }
uint32_t ferry_model_layers(const ferry_model *m) { return m ? m->layers : 0; }
uint32_t ferry_model_experts(const ferry_model *m) { return m ? m->experts : 0; }
size_t ferry_model_tensor_count(const ferry_model *m) { return m ? m->n : 0; }

int ferry_model_tensor_at(const ferry_model *m, size_t i, ferry_model_tensor *out)
{
    if (!m || !out || i >= m->n)
        return FERRY_EINVAL;
    const fr_mtensor *x = &m->t[i];
    memset(out, 0, sizeof *out);
    out->desc.name = x->name;
    out->desc.dtype = x->dtype;
    out->desc.itemsize = x->itemsize;
    out->desc.ndim = x->ndim;
    memcpy(out->desc.shape, x->shape, sizeof x->shape);
    out->role = x->role;
    out->layer = x->layer;
    out->expert = x->expert;
    return 0;
}

uint64_t ferry_model_param_count(const ferry_model *m)
{
    uint64_t n = 0;
    for (size_t i = 0; m && i < m->n; i++) {
        uint64_t v = 1;
        for (uint32_t d = 0; d < m->t[i].ndim; d++)
            v *= m->t[i].shape[d];
        n += v;
    }
    return n;
}

uint64_t ferry_model_bytes(const ferry_model *m)
{
    uint64_t n = 0;
    for (size_t i = 0; m && i < m->n; i++) {
        uint64_t v = m->t[i].itemsize;
        for (uint32_t d = 0; d < m->t[i].ndim; d++)
            v *= m->t[i].shape[d];
        n += v;
    }
    return n;
}

/* ---- presets ------------------------------------------------------------ */

typedef struct builder {
    ferry_model *m;
    ferry_error *err;
    int rc;
} builder;

/* Add "prefix.name" with a 1-D or 2-D bf16 shape (d1 == 0: 1-D). */
static void add(builder *b, const char *prefix, const char *name, uint64_t d0, uint64_t d1,
                enum ferry_tp_role role, int32_t layer, int32_t expert)
{
    if (b->rc < 0)
        return;
    char full[256];
    snprintf(full, sizeof full, "%s%s%s", prefix, prefix[0] ? "." : "", name);
    ferry_model_tensor t = {.desc = {.name = full, .dtype = "bf16", .itemsize = 2, .ndim = d1 ? 2 : 1,
                                     .shape = {d0, d1}},
                            .role = role, .layer = layer, .expert = expert};
    b->rc = ferry_model_add_tensor(b->m, &t, b->err);
}

static void mlp(builder *b, const char *prefix, uint64_t hidden, uint64_t inter, int32_t layer, int32_t expert)
{
    add(b, prefix, "gate_proj.weight", inter, hidden, FERRY_TP_COLUMN, layer, expert);
    add(b, prefix, "up_proj.weight", inter, hidden, FERRY_TP_COLUMN, layer, expert);
    add(b, prefix, "down_proj.weight", hidden, inter, FERRY_TP_ROW, layer, expert);
}

typedef struct qwen3_cfg {
    uint64_t hidden, layers, heads, kv_heads, head_dim, inter, vocab, experts, moe_inter;
} qwen3_cfg;

static void qwen3(builder *b, const qwen3_cfg *c)
{
    uint64_t h = c->hidden, q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
    add(b, "", "model.embed_tokens.weight", c->vocab, h, FERRY_TP_VOCAB, FERRY_LAYER_FIRST, -1);
    for (int32_t l = 0; l < (int32_t)c->layers; l++) {
        char p[96], e[128];
        snprintf(p, sizeof p, "model.layers.%d", l);
        add(b, p, "input_layernorm.weight", h, 0, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "self_attn.q_proj.weight", q, h, FERRY_TP_COLUMN, l, -1);
        add(b, p, "self_attn.k_proj.weight", kv, h, FERRY_TP_COLUMN, l, -1);
        add(b, p, "self_attn.v_proj.weight", kv, h, FERRY_TP_COLUMN, l, -1);
        add(b, p, "self_attn.o_proj.weight", h, q, FERRY_TP_ROW, l, -1);
        add(b, p, "self_attn.q_norm.weight", c->head_dim, 0, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "self_attn.k_norm.weight", c->head_dim, 0, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "post_attention_layernorm.weight", h, 0, FERRY_TP_REPLICATED, l, -1);
        if (!c->experts) {
            snprintf(e, sizeof e, "%s.mlp", p);
            mlp(b, e, h, c->inter, l, -1);
            continue;
        }
        add(b, p, "mlp.gate.weight", c->experts, h, FERRY_TP_REPLICATED, l, -1);
        for (int32_t x = 0; x < (int32_t)c->experts; x++) {
            snprintf(e, sizeof e, "%s.mlp.experts.%d", p, x);
            mlp(b, e, h, c->moe_inter, l, x);
        }
    }
    add(b, "", "model.norm.weight", h, 0, FERRY_TP_REPLICATED, FERRY_LAYER_LAST, -1);
    add(b, "", "lm_head.weight", c->vocab, h, FERRY_TP_VOCAB, FERRY_LAYER_LAST, -1);
}

typedef struct mla_cfg {
    uint64_t hidden, layers, dense_layers, inter, experts, moe_inter, shared, heads;
    uint64_t q_lora, kv_lora, nope, rope, v_head, vocab;
} mla_cfg;

/* DeepSeek-V3 architecture (also Kimi-K2): MLA attention, dense first
 * layers, then routed experts + shared experts with a sigmoid router. */
static void deepseek(builder *b, const mla_cfg *c)
{
    uint64_t h = c->hidden;
    add(b, "", "model.embed_tokens.weight", c->vocab, h, FERRY_TP_VOCAB, FERRY_LAYER_FIRST, -1);
    for (int32_t l = 0; l < (int32_t)c->layers; l++) {
        char p[96], e[128];
        snprintf(p, sizeof p, "model.layers.%d", l);
        add(b, p, "input_layernorm.weight", h, 0, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "self_attn.q_a_proj.weight", c->q_lora, h, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "self_attn.q_a_layernorm.weight", c->q_lora, 0, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "self_attn.q_b_proj.weight", c->heads * (c->nope + c->rope), c->q_lora, FERRY_TP_COLUMN, l, -1);
        add(b, p, "self_attn.kv_a_proj_with_mqa.weight", c->kv_lora + c->rope, h, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "self_attn.kv_a_layernorm.weight", c->kv_lora, 0, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "self_attn.kv_b_proj.weight", c->heads * (c->nope + c->v_head), c->kv_lora, FERRY_TP_COLUMN, l, -1);
        add(b, p, "self_attn.o_proj.weight", h, c->heads * c->v_head, FERRY_TP_ROW, l, -1);
        add(b, p, "post_attention_layernorm.weight", h, 0, FERRY_TP_REPLICATED, l, -1);
        if ((uint64_t)l < c->dense_layers) {
            snprintf(e, sizeof e, "%s.mlp", p);
            mlp(b, e, h, c->inter, l, -1);
            continue;
        }
        add(b, p, "mlp.gate.weight", c->experts, h, FERRY_TP_REPLICATED, l, -1);
        add(b, p, "mlp.gate.e_score_correction_bias", c->experts, 0, FERRY_TP_REPLICATED, l, -1);
        for (int32_t x = 0; x < (int32_t)c->experts; x++) {
            snprintf(e, sizeof e, "%s.mlp.experts.%d", p, x);
            mlp(b, e, h, c->moe_inter, l, x);
        }
        snprintf(e, sizeof e, "%s.mlp.shared_experts", p);
        mlp(b, e, h, c->moe_inter * c->shared, l, -1);
    }
    add(b, "", "model.norm.weight", h, 0, FERRY_TP_REPLICATED, FERRY_LAYER_LAST, -1);
    add(b, "", "lm_head.weight", c->vocab, h, FERRY_TP_VOCAB, FERRY_LAYER_LAST, -1);
}

static const char *const presets[] = {"qwen3-8b", "qwen3-30b-a3b", "deepseek-v3", "kimi-k2"};

const char *ferry_model_preset_name(size_t i)
{
    return i < sizeof presets / sizeof presets[0] ? presets[i] : NULL;
}

int ferry_model_preset(const char *name, ferry_model **out, ferry_error *err)
{
    if (!name || !out)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    static const qwen3_cfg q8 = {4096, 36, 32, 8, 128, 12288, 151936, 0, 0};
    static const qwen3_cfg q30 = {2048, 48, 32, 4, 128, 6144, 151936, 128, 768};
    static const mla_cfg dsv3 = {7168, 61, 3, 18432, 256, 2048, 1, 128, 1536, 512, 128, 64, 128, 129280};
    static const mla_cfg kimi = {7168, 61, 1, 18432, 384, 2048, 1, 64, 1536, 512, 128, 64, 128, 163840};
    const qwen3_cfg *q = NULL;
    const mla_cfg *d = NULL;
    if (!strcmp(name, "qwen3-8b"))
        q = &q8;
    else if (!strcmp(name, "qwen3-30b-a3b"))
        q = &q30;
    else if (!strcmp(name, "deepseek-v3"))
        d = &dsv3;
    else if (!strcmp(name, "kimi-k2"))
        d = &kimi;
    else
        return fr_fail(err, FERRY_ENOENT, "no model preset '%s' (qwen3-8b, qwen3-30b-a3b, deepseek-v3, kimi-k2)",
                       name);
    ferry_model *m;
    int rc = ferry_model_create(name, (uint32_t)(q ? q->layers : d->layers), (uint32_t)(q ? q->experts : d->experts), &m);
    if (rc < 0)
        return fr_fail(err, rc, "out of memory");
    builder b = {m, err, 0};
    if (q)
        qwen3(&b, q);
    else
        deepseek(&b, d);
    if (b.rc < 0) {
        ferry_model_free(m);
        return b.rc;
    }
    *out = m;
    return 0;
}
