/* Test helpers for groups of worker processes (ftgroup.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/weights.h"
#include "util/ftgroup.h"

int ftg_setup(void **state)
{
    const char *const *extra = *state;
    ftg_env *e = calloc(1, sizeof *e);
    *state = NULL;
    if (!e)
        return -1;
    for (int k = 0; k < FTG_MAX; k++)
        e->w[k].pid = -1;
    if (ft_solo_open(&e->c, &e->s, 64u << 20, extra) != 0) {
        free(e);   /* cmocka runs no teardown after a failed setup */
        return -1;
    }
    *state = e;
    return 0;
}

int ftg_teardown(void **state)
{
    ftg_env *e = *state;
    if (!e)
        return 0;
    ftg_stop(e);
    ft_solo_close(&e->c, &e->s);
    free(e);
    *state = NULL;
    return 0;
}

int ftg_spawn(ftg_env *e, int n, ftg_args_fn *fn, const void *ctx, int fault_rank,
              const char *fault)
{
    ftg_stop(e);
    if (n > FTG_MAX)
        return -1;
    for (int k = 0; k < n; k++) {
        ftg_args a;
        memset(&a, 0, sizeof a);
        fn(ctx, k, &a);
        /* the child takes the environment at fork: set for that one only */
        if (k == fault_rank)
            setenv("FERRY_FAULT", fault, 1);
        int rc = ft_spawn(&e->w[k], NULL, a.argv);
        unsetenv("FERRY_FAULT");
        if (rc != 0)
            return -1;
        e->n = k + 1;
    }
    return 0;
}

int ftg_start(ftg_env *e, int n, ftg_args_fn *fn, const void *ctx, int fault_rank,
              const char *fault)
{
    if (ftg_spawn(e, n, fn, ctx, fault_rank, fault) != 0)
        return -1;
    for (int k = 0; k < n; k++) {
        char line[256] = "";
        if (ft_read_line(&e->w[k], line, sizeof line, FT_START_MS) != 0 || strcmp(line, "READY") != 0) {
            fprintf(stderr, "worker %d did not start: \"%s\"\n", k, line);
            return -1;
        }
    }
    return 0;
}

int ftg_send(ftg_env *e, const char *fmt, ...)
{
    char cmd[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof cmd)
        return -1;
    for (int k = 0; k < e->n; k++)
        if (ft_peer_send(&e->w[k], "%s", cmd) != 0)
            return -1;
    return 0;
}

int ftg_collect(ftg_env *e, int timeout_ms, int skip)
{
    int ok = 0;
    for (int k = 0; k < e->n; k++) {
        e->line[k][0] = 0;
        e->rc[k] = -1;
        if (k == skip)
            continue;
        e->rc[k] = ft_peer_reply(&e->w[k], e->line[k], sizeof e->line[k], timeout_ms);
        ok += e->rc[k] == 0;
    }
    return ok;
}

void ftg_stop(ftg_env *e)
{
    for (int k = 0; k < e->n; k++)
        ft_peer_stop(&e->w[k]);
    e->n = 0;
}

uint16_t ftg_bits(uint64_t gen, size_t t, uint64_t i)
{
    return (uint16_t)(0x3c00u | ((gen * 40503u + t * 977u + i) & 0x1ffu));
}

void ftg_names(const ftg_model *m, char (*names)[32])
{
    for (size_t k = 0; k < m->nt; k++)
        snprintf(names[k], 32, "%s.%zu.weight", m->prefix, k);
}

int ftg_publish(ferry_store *s, const ftg_model *m, uint64_t gen, uint64_t *bytes)
{
    char (*names)[32] = calloc(m->nt, sizeof *names);
    ferry_weight_tensor *t = calloc(m->nt, sizeof *t);
    int rc = FERRY_ENOMEM;
    uint64_t total = 0;
    if (!names || !t)
        goto out;
    ftg_names(m, names);
    for (size_t k = 0; k < m->nt; k++) {
        uint64_t n = m->shapes[k][0] * m->shapes[k][1];
        uint16_t *d = malloc(n * 2);
        if (!d)
            goto out;
        for (uint64_t i = 0; i < n; i++)
            d[i] = m->bits(gen, k, i);
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = "bf16", .ndim = 2,
                                      .shape = { m->shapes[k][0], m->shapes[k][1] }, .data = d };
        total += n * 2;
    }
    uint32_t node0 = 0;
    ferry_publisher_config pc = { .rank = 0, .world = 1, .rank_node = &node0, .keep = 2,
                                  .timeout_ms = 10000 };
    snprintf(pc.model, sizeof pc.model, "%s", m->name);
    ferry_error err = {0};
    rc = ferry_publish(s, &pc, gen, t, m->nt, NULL, &err);
    if (rc != 0)
        fprintf(stderr, "publish %s generation %llu: %s\n", m->name, (unsigned long long)gen,
                err.msg);
out:
    for (size_t k = 0; t && k < m->nt; k++)
        free((void *)t[k].data);
    free(t);
    free(names);
    if (rc == 0 && bytes)
        *bytes = total;
    return rc;
}

int ftg_worker_store(const char *addr, ferry_store **s)
{
    return ftg_worker_store_lease(addr, 1, s);
}

int ftg_worker_store_lease(const char *addr, uint64_t lease_ms, ferry_store **s)
{
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.lease_ms = lease_ms;
    *s = NULL;
    ferry_error e = {0};
    if (ferry_store_open(&cfg, s, &e) < 0) {
        printf("ERR open %s\n", e.msg);
        return -1;
    }
    return 0;
}

void ftg_worker_serve(void (*update)(void *ctx, uint64_t gen), void *ctx)
{
    printf("READY\n");
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long want;
        if (sscanf(line, "update %llu", &want) != 1)
            break;
        update(ctx, want);
        fflush(stdout);
    }
}

int ftg_sub_open(ftg_sub *w, const ftg_model *m, const char *addr,
                 const ferry_subscriber_config *sc, uint32_t tp, uint32_t tpdeg)
{
    return ftg_sub_open_lease(w, m, addr, sc, tp, tpdeg, 1);
}

int ftg_sub_open_lease(ftg_sub *w, const ftg_model *m, const char *addr,
                       const ferry_subscriber_config *sc, uint32_t tp, uint32_t tpdeg,
                       uint64_t lease_ms)
{
    ferry_store *s = NULL;
    if (ftg_worker_store_lease(addr, lease_ms, &s) < 0)
        return -1;
    return ftg_sub_open_on(w, m, s, sc, tp, tpdeg);
}

int ftg_sub_open_on(ftg_sub *w, const ftg_model *m, ferry_store *s,
                    const ferry_subscriber_config *sc, uint32_t tp, uint32_t tpdeg)
{
    memset(w, 0, sizeof *w);
    w->m = m;
    w->s = s;
    w->names = calloc(m->nt, sizeof *w->names);
    w->sh = calloc(m->nt, sizeof *w->sh);
    if (!w->names || !w->sh) {
        printf("ERR out of memory\n");
        goto fail;
    }
    ftg_names(m, w->names);
    for (size_t k = 0; k < m->nt; k++) {
        const uint64_t *shape = m->shapes[k];
        uint64_t part = (shape[0] + tpdeg - 1) / tpdeg, r0 = tp * part;
        uint64_t rows = r0 + part <= shape[0] ? part : shape[0] - r0;
        w->sh[k] = (ferry_param_shard){ .tensor = w->names[k], .ndim = 2, .offset = { r0, 0 },
                                        .shape = { rows, shape[1] },
                                        .dst = calloc(rows * shape[1] + 1, 2) };
        if (!w->sh[k].dst) {
            printf("ERR out of memory\n");
            goto fail;
        }
    }
    ferry_error err = {0};
    if (ferry_subscriber_open(w->s, sc, w->sh, m->nt, &w->sub, &err) < 0) {
        printf("ERR %s\n", err.msg);
        goto fail;
    }
    return 0;
fail:
    ftg_sub_close(w);
    return -1;
}

typedef struct sub_serve { ftg_sub *w; ftg_sub_report_fn *report; } sub_serve;

uint64_t ftg_sub_bad(const ftg_sub *w, uint64_t gen)
{
    uint64_t bad = 0;
    for (size_t k = 0; k < w->m->nt; k++) {
        const uint16_t *p = w->sh[k].dst;
        uint64_t cols = w->m->shapes[k][1], first = w->sh[k].offset[0] * cols;
        for (uint64_t i = 0; i < w->sh[k].shape[0] * cols; i++)
            bad += p[i] != w->m->bits(gen, k, first + i);
    }
    return bad;
}

static void sub_update(void *ctx, uint64_t want)
{
    const sub_serve *c = ctx;
    ftg_sub *w = c->w;
    ferry_update_stats st;
    ferry_error err = {0};
    int rc = ferry_subscriber_update(w->sub, &w->gen, &st, &err);
    c->report(w, want, rc, &st, rc == 0 ? ftg_sub_bad(w, want) : 0, &err);
}

void ftg_sub_serve(ftg_sub *w, ftg_sub_report_fn *report)
{
    sub_serve c = { w, report };
    ftg_worker_serve(sub_update, &c);
}

void ftg_sub_close(ftg_sub *w)
{
    ferry_subscriber_close(w->sub);
    for (size_t k = 0; w->sh && k < w->m->nt; k++)
        free(w->sh[k].dst);
    free(w->sh);
    free(w->names);
    ferry_store_close(w->s);
    memset(w, 0, sizeof *w);
}
