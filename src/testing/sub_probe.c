/* The subscriber's planning, run outside a subscriber (testing.h): what
 * `ferry-lab bench weights --scale` times at a rollout group's scale. */
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "../rl/pull_int.h"   /* the subscriber's planning, as pull.c runs it */
#include "testing.h"

struct fr_test_sub {
    fr_sub_cache c;
    const ferry_manifest *m;   /* the last plan's generation's placement */
};

int fr_test_gen_build(const ferry_model *model, const char *src, fr_gen **out, ferry_error *err)
{
    ferry_layout l;
    ferry_manifest *pl = NULL, *st = NULL;
    fr_gen *g = calloc(1, sizeof *g);
    if (!g)
        return FERRY_ENOMEM;
    snprintf(g->model, sizeof g->model, "%s", ferry_model_name(model));
    g->generation = 1;
    int rc = ferry_layout_parse(src, &l, err);
    if (rc == 0)
        rc = ferry_layout_build(model, &l, &pl, err);
    if (rc == 0)
        rc = ferry_manifest_stored(pl, NULL, &st, err);
    ferry_manifest_close(pl);
    char *json = rc == 0 ? ferry_manifest_to_json(st) : NULL;
    ferry_manifest_close(st);
    if (rc == 0 && !json)
        rc = FERRY_ENOMEM;
    if (rc == 0) {   /* what fr_gen_load checks the JSON against and keeps */
        fr_hash128_t h = fr_hash128(json, strlen(json), 0);
        memcpy(g->placement, h.b, sizeof g->placement);
        rc = ferry_manifest_from_json(json, strlen(json), &g->m, err);
    }
    free(json);
    if (rc == 0)
        rc = ferry_manifest_pack(g->m, FR_GEN_ALIGN, FR_GEN_OBJECT_MAX, &g->pack, err);
    if (rc == 0) {
        g->nranks = ferry_manifest_rank_count(g->m);
        g->ranks = calloc(g->nranks, sizeof *g->ranks);   /* segments unknown: off every node */
        rc = g->ranks ? 0 : FERRY_ENOMEM;
    }
    if (rc < 0) {
        fr_gen_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void fr_test_gen_free(fr_gen *g)
{
    fr_gen_free(g);
}

const ferry_manifest *fr_test_gen_manifest(const fr_gen *g)
{
    return g->m;
}

int fr_test_sub_encode(const ferry_subscriber_config *cfg, const fr_gen *g, const ferry_param_shard *sh,
                       size_t n, ferry_region *const *regs, ferry_engine *e, uint8_t **rec, size_t *len,
                       ferry_error *err)
{
    return fr_sub_encode(cfg, g, sh, n, regs, e, rec, len, err);
}

int fr_test_sub_plan(fr_test_sub **s, const fr_gen *g, uint64_t generation, ferry_kv_value *recs,
                     uint32_t world, uint32_t me, ferry_error *err)
{
    if (!*s && (*s = calloc(1, sizeof **s)) == NULL)
        return FERRY_ENOMEM;
    (*s)->m = g->m;
    fr_gen at = *g;   /* the same stored placement (its JSON's hash), at that generation */
    at.generation = generation;
    return fr_sub_plan_records(&(*s)->c, &at, recs, world, me, NULL, err);
}

static uint64_t box_bytes(const ferry_manifest *m, uint32_t tensor, uint32_t ndim, const uint64_t *shape)
{
    ferry_tensor_desc d;
    (void)ferry_manifest_tensor(m, tensor, &d);
    uint64_t b = d.itemsize;
    for (uint32_t k = 0; k < ndim; k++)
        b *= shape[k];
    return b;
}

void fr_test_sub_figures_get(const fr_test_sub *s, uint32_t me, fr_test_sub_figures *out)
{
    const fr_work *w = &s->c.plan;
    const fr_member *mb = &s->c.mbs[me];
    memset(out, 0, sizeof *out);
    for (uint32_t i = 0; i < mb->nshards; i++) {
        const fr_sfrag *f = &mb->frags[i];
        out->demand += box_bytes(s->m, f->tensor, f->ndim, f->dims + f->ndim);
    }
    out->reused = s->c.reused;
    out->my_read = w->my_read;
    out->received = w->received;
    out->group_read = w->group_read;
    out->sets = w->sets, out->shared_sets = w->shared_sets;
    out->reads = w->ngreads, out->pieces = w->nreads, out->pushes = w->hop[0].n + w->hop[1].n;
}

void fr_test_sub_free(fr_test_sub *s)
{
    if (!s)
        return;
    fr_sub_cache_free(&s->c);   /* and the records it took over */
    free(s);
}
