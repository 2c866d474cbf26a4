/* `ferry-lab worker exec`: one process of `ferry-lab bench exec` — a source or a
 * target rank of a reshard. It plans the same reshard as its parent (a pure
 * function of the arguments, so every process holds the same plan), lays
 * its fragments out in one memfd buffer registered REMOTE_RW, fills source
 * fragments with a pattern that is a function of (tensor, global element
 * index), and answers commands on stdin, one reply line each:
 *
 *   (start)                      READY <buffer addr hex> <region desc hex>
 *   peer s|d RANK ADDR DESC      (no reply) where every rank's buffer lives
 *   bind                         OK <counterparts> | ERR ...
 *   go sink TAG | go reader      DONE <seconds> <ops> | ERR ...
 *   check                        OK <bad elements>  (targets: verify, then zero)
 *   quit
 *
 * Both bindings are built from the same broadcast lines in every process,
 * so their digests, and the attestation, agree everywhere. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

#define XW_GENERATION 1
#define XW_MAX_RANKS 64

typedef struct xw_side {
    ferry_manifest *m;          /* borrowed from the plan */
    uint32_t nranks;
    uint64_t *off;              /* per fragment: byte offset in its rank's buffer */
    uint64_t *rank_len;         /* per rank: buffer length */
    uint64_t base[XW_MAX_RANKS];
    uint8_t desc[XW_MAX_RANKS][FERRY_DESC_MAX];
    size_t desc_len[XW_MAX_RANKS];
    bool known[XW_MAX_RANKS];
    ferry_binding *b;
} xw_side;

typedef struct xw {
    bool is_src;
    uint32_t rank;
    unsigned window;
    uint64_t max_ops;           /* ops per batch (0: the executor's default) */
    ferry_plan *plan;
    xw_side side[2];            /* 0 source, 1 target */
    ferry_engine *e;
    uint8_t *mem;
    uint64_t memlen;
    ferry_region *reg;
    ferry_attested_plan *att;
    ferry_peer_map pm[XW_MAX_RANKS];
    size_t npm;
    uint32_t counterparts;
} xw;

/* ---- the model slice and the plan (shared with the parent) -------------- */

static uint64_t tensor_bytes(const ferry_tensor_desc *d)
{
    uint64_t n = d->itemsize;
    for (uint32_t i = 0; i < d->ndim; i++)
        n *= d->shape[i];
    return n;
}

/* The preset's layer tensors in order until the next one would pass the
 * budget, then each embedding / head tensor that still fits. */
static int slice_model(const char *preset, uint64_t budget, ferry_model **out, ferry_error *err)
{
    ferry_model *full = NULL, *m = NULL;
    int rc = ferry_model_preset(preset, &full, err);
    if (rc < 0)
        return rc;
    if ((rc = ferry_model_create(preset, ferry_model_layers(full), ferry_model_experts(full), &m)) < 0)
        goto out;
    uint64_t used = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        for (size_t i = 0; i < ferry_model_tensor_count(full) && rc == 0; i++) {
            ferry_model_tensor t;
            if ((rc = ferry_model_tensor_at(full, i, &t)) < 0)
                break;
            if ((t.layer < 0) != (pass == 1))
                continue;
            uint64_t b = tensor_bytes(&t.desc);
            if (used + b > budget) {
                if (pass == 0)
                    break;
                continue;
            }
            rc = ferry_model_add_tensor(m, &t, err);
            used += b;
        }
    }
    if (rc == 0 && used == 0) {
        rc = FERRY_EINVAL;
        if (err)
            snprintf(err->msg, sizeof err->msg, "--bytes is smaller than every tensor of %s", preset);
    }
out:
    ferry_model_free(full);
    if (rc < 0)
        ferry_model_free(m);
    else
        *out = m;
    return rc;
}

int cli_exec_plan(const char *preset, uint64_t budget, const char *src, const char *dst,
                  ferry_plan **out, uint64_t *model_bytes, ferry_error *err)
{
    ferry_model *m = NULL;
    ferry_manifest *ms = NULL, *md = NULL;
    ferry_layout ls, ld;
    int rc = slice_model(preset, budget, &m, err);
    if (rc == 0)
        rc = ferry_layout_parse(src, &ls, err);
    if (rc == 0)
        rc = ferry_layout_parse(dst, &ld, err);
    if (rc == 0)
        rc = ferry_layout_build(m, &ls, &ms, err);
    if (rc == 0)
        rc = ferry_layout_build(m, &ld, &md, err);
    if (rc == 0)
        rc = ferry_plan_create(ms, md, NULL, out, err);
    if (rc == 0 && model_bytes)
        *model_bytes = ferry_model_bytes(m);
    ferry_manifest_close(ms);
    ferry_manifest_close(md);
    ferry_model_free(m);
    return rc;
}

/* ---- fragment layout and pattern ---------------------------------------- */

/* Every rank's fragments sit in fragment-id order in its buffer, 64-byte
 * aligned: each process computes every rank's layout the same way. */
static int layout_side(xw_side *s)
{
    uint64_t n = ferry_manifest_fragment_count(s->m);
    s->nranks = ferry_manifest_rank_count(s->m);
    if (s->nranks > XW_MAX_RANKS)
        return FERRY_ERANGE;
    s->off = calloc(n ? n : 1, sizeof *s->off);
    s->rank_len = calloc(s->nranks, sizeof *s->rank_len);
    if (!s->off || !s->rank_len)
        return FERRY_ENOMEM;
    for (uint64_t id = 0; id < n; id++) {
        ferry_fragment f;
        ferry_tensor_desc t;
        int rc = ferry_manifest_fragment(s->m, id, &f);
        if (rc == 0)
            rc = ferry_manifest_tensor(s->m, f.tensor, &t);
        if (rc < 0)
            return rc;
        uint64_t b = t.itemsize;
        for (uint32_t d = 0; d < t.ndim; d++)
            b *= f.shape[d];
        uint64_t *cur = &s->rank_len[f.rank];
        *cur = (*cur + 63) & ~63ull;
        s->off[id] = *cur;
        *cur += b;
    }
    return 0;
}

static uint64_t name_seed(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static inline uint64_t pat(uint64_t seed, uint64_t x)
{
    x = x * 0x9E3779B97F4A7C15ull + seed;
    return x ^ (x >> 31);
}

/* Fill or check `n` elements whose global flat indices start at g. */
static uint64_t row(uint8_t *p, uint32_t itemsize, uint64_t n, uint64_t seed, uint64_t g, bool fill)
{
    uint64_t bad = 0;
    switch (itemsize) {
    case 2: {
        uint16_t *q = (uint16_t *)(void *)p;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t v = (uint16_t)pat(seed, g + i);
            if (fill)
                q[i] = v;
            else
                bad += q[i] != v;
        }
        break;
    }
    case 4: {
        uint32_t *q = (uint32_t *)(void *)p;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t v = (uint32_t)pat(seed, g + i);
            if (fill)
                q[i] = v;
            else
                bad += q[i] != v;
        }
        break;
    }
    default:
        for (uint64_t i = 0; i < n; i++) {
            uint64_t v = pat(seed, g + i);
            for (uint32_t k = 0; k < itemsize; k++, p++) {
                uint8_t c = (uint8_t)(v >> (8 * (k & 7)));
                if (fill)
                    *p = c;
                else if (*p != c) {
                    bad++;
                    p += itemsize - k;
                    break;
                }
            }
        }
    }
    return bad;
}

/* Walk fragment `id` of a side stored contiguously at p, row by row. */
static uint64_t walk(const ferry_manifest *m, uint64_t id, uint8_t *p, bool fill)
{
    ferry_fragment f;
    ferry_tensor_desc t;
    if (ferry_manifest_fragment(m, id, &f) < 0 || ferry_manifest_tensor(m, f.tensor, &t) < 0)
        return 1;
    uint32_t nd = t.ndim;
    uint64_t gs[FERRY_MAX_DIMS], idx[FERRY_MAX_DIMS] = {0}, rows = 1;
    uint64_t prod = 1;
    for (int d = (int)nd - 1; d >= 0; d--) {
        gs[d] = prod;
        prod *= t.shape[d];
    }
    for (uint32_t d = 0; d + 1 < nd; d++)
        rows *= f.shape[d];
    uint64_t inner = nd ? f.shape[nd - 1] : 1, seed = name_seed(t.name), bad = 0;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t g = 0;
        for (uint32_t d = 0; d < nd; d++)
            g += (f.offset[d] + (d + 1 < nd ? idx[d] : 0)) * gs[d];
        bad += row(p, t.itemsize, inner, seed, g, fill);
        p += inner * t.itemsize;
        for (int d = (int)nd - 2; d >= 0; d--) {
            if (++idx[d] < f.shape[d])
                break;
            idx[d] = 0;
        }
    }
    return bad;
}

/* Fill (source) or check (target) every fragment this process holds. */
static uint64_t walk_mine(xw *w, bool fill)
{
    xw_side *s = &w->side[w->is_src ? 0 : 1];
    uint64_t bad = 0, n = ferry_manifest_fragment_count(s->m);
    for (uint64_t id = 0; id < n; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(s->m, id, &f) == 0 && f.rank == w->rank)
            bad += walk(s->m, id, w->mem + s->off[id], fill);
    }
    return bad;
}

/* ---- bindings, attestation, peers --------------------------------------- */

static int bind_side(xw_side *s, ferry_error *err)
{
    int rc = ferry_binding_create(s->m, 1, XW_GENERATION, 1, &s->b, err);
    uint64_t n = ferry_manifest_fragment_count(s->m);
    for (uint64_t id = 0; id < n && rc == 0; id++) {
        ferry_fragment f;
        ferry_tensor_desc t;
        if ((rc = ferry_manifest_fragment(s->m, id, &f)) < 0 ||
            (rc = ferry_manifest_tensor(s->m, f.tensor, &t)) < 0)
            break;
        if (!s->known[f.rank]) {
            rc = FERRY_ENOENT;
            snprintf(err->msg, sizeof err->msg, "no buffer announced for rank %u", f.rank);
            break;
        }
        ferry_binding_entry e = {.fragment = id, .addr = s->base[f.rank] + s->off[id], .worker = f.rank,
                                 .kind = FERRY_MEM_HOST, .itemsize = t.itemsize, .ndim = t.ndim,
                                 .desc_len = (uint32_t)s->desc_len[f.rank]};
        uint64_t st = 1;
        for (int d = (int)t.ndim - 1; d >= 0; d--) {
            e.shape[d] = f.shape[d];
            e.strides[d] = st;
            st *= f.shape[d];
        }
        e.nbytes = st * t.itemsize;
        memcpy(e.desc, s->desc[f.rank], s->desc_len[f.rank]);
        rc = ferry_binding_add(s->b, &e, err);
    }
    return rc;
}

static int do_bind(xw *w, ferry_error *err)
{
    int rc = bind_side(&w->side[0], err);
    if (rc == 0)
        rc = bind_side(&w->side[1], err);
    if (rc == 0)
        rc = ferry_attest(w->plan, w->side[0].b, w->side[1].b, XW_GENERATION, &w->att, err);
    /* The other side's workers are this process's peers in both modes. */
    xw_side *o = &w->side[w->is_src ? 1 : 0];
    for (uint32_t r = 0; r < o->nranks && rc == 0; r++) {
        ferry_remote_region rr;
        if ((rc = ferry_region_import(w->e, o->desc[r], o->desc_len[r], &rr, err)) < 0) {
            char why[sizeof err->msg];
            memcpy(why, err->msg, sizeof why);
            snprintf(err->msg, sizeof err->msg, "importing the region of %s rank %u: %.400s",
                     w->is_src ? "target" : "source", r, why);
            break;
        }
        w->pm[w->npm++] = (ferry_peer_map){.worker = r, .peer = rr.peer, .key = rr.key};
    }
    if (rc == 0) {
        uint32_t ids[XW_MAX_RANKS];
        size_t n = 0;
        rc = ferry_exec_counterparts(w->att, w->side[0].b, w->side[1].b, !w->is_src, &w->rank, 1, ids,
                                     XW_MAX_RANKS, &n, err);
        w->counterparts = (uint32_t)n;
    }
    return rc;
}

static int do_run(xw *w, enum ferry_exec_mode mode, uint64_t tag, uint64_t *ops, ferry_error *err)
{
    ferry_exec_config cfg = {.mode = mode, .engine = w->e, .workers = &w->rank, .nworkers = 1,
                             .peers = w->pm, .npeers = w->npm, .window = w->window,
                             .limits = {.max_ops = w->max_ops},
                             .timeout_ms = FERRY_DEFAULT_TIMEOUT_MS, .notify_tag = mode == FERRY_EXEC_SINK ? tag : 0};
    ferry_executor *x = NULL;
    ferry_exec_result res = {0};
    int rc = ferry_executor_create(&cfg, &x, err);
    if (rc == 0) {
        rc = ferry_executor_run(x, w->att, w->side[0].b, w->side[1].b, &res, err);
        *ops = res.ops;
        if (rc < 0 && !err->msg[0])
            snprintf(err->msg, sizeof err->msg, "run ended %s: %s", ferry_ticket_state_name(res.state),
                     ferry_strerror(res.error));
        ferry_exec_result_free(&res);
    }
    ferry_executor_free(x);
    return rc;
}

/* ---- process ------------------------------------------------------------ */

static int setup(xw *w, int argc, char **argv, ferry_error *err)
{
    const char *model = "qwen3-8b", *src = "fsdp:8", *dst = "tp:4,dp:2";
    uint64_t budget = 1ull << 30;
    unsigned threads = 0;
    w->window = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--side"))
            w->is_src = !strcmp(v, "src");
        else if (!strcmp(a, "--rank"))
            w->rank = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--bytes"))
            budget = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--src"))
            src = v;
        else if (!strcmp(a, "--dst"))
            dst = v;
        else if (!strcmp(a, "--threads"))
            threads = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--window"))
            w->window = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--max-ops"))
            w->max_ops = strtoull(v, NULL, 10);
    }
    int rc = cli_exec_plan(model, budget, src, dst, &w->plan, NULL, err);
    if (rc < 0)
        return rc;
    w->side[0].m = ferry_plan_src(w->plan);
    w->side[1].m = ferry_plan_dst(w->plan);
    if ((rc = layout_side(&w->side[0])) < 0 || (rc = layout_side(&w->side[1])) < 0)
        return rc;
    xw_side *me = &w->side[w->is_src ? 0 : 1];
    if (w->rank >= me->nranks)
        return FERRY_EINVAL;
    ferry_engine_config cfg;
    if ((rc = ferry_engine_config_init(&cfg)) < 0)
        return rc;
    if (threads)
        cfg.shm_threads = threads;
    if ((rc = ferry_engine_open(&cfg, &w->e, NULL)) < 0)
        return rc;
    w->memlen = (me->rank_len[w->rank] + 4095) & ~4095ull;
    if (w->memlen == 0)
        w->memlen = 4096;
    void *mem;
    if ((rc = ferry_mem_alloc(w->e, w->memlen, &mem, NULL)) < 0)
        return rc;
    w->mem = mem;
    if (w->is_src)
        walk_mine(w, true);
    return ferry_region_register(w->e, w->mem, w->memlen, FERRY_REMOTE_RW, FERRY_MEM_HOST, &w->reg, NULL);
}

static void teardown(xw *w)
{
    ferry_attested_free(w->att);
    for (int s = 0; s < 2; s++) {
        ferry_binding_free(w->side[s].b);
        free(w->side[s].off);
        free(w->side[s].rank_len);
    }
    ferry_plan_free(w->plan);
    ferry_engine_close(w->e);   /* unregisters the region, frees the memory */
}

static void reply_err(const char *what, int rc, const ferry_error *err)
{
    printf("ERR %s: %s\n", what, err->msg[0] ? err->msg : ferry_strerror(rc));
}

static void on_peer(xw *w, const char *line)
{
    char side;
    unsigned r;
    unsigned long long addr;
    int n = 0;
    if (sscanf(line, "peer %c %u %llx %n", &side, &r, &addr, &n) < 3 || n == 0 || r >= XW_MAX_RANKS)
        return;
    xw_side *s = &w->side[side == 's' ? 0 : 1];
    s->base[r] = addr;
    s->desc_len[r] = cli_unhex(line + n, s->desc[r], sizeof s->desc[r]);
    s->known[r] = true;
}

int cli_exec_worker_main(int argc, char **argv)
{
    xw w = {0};
    ferry_error err = {0};
    int rc = setup(&w, argc, argv, &err);
    uint8_t d[FERRY_DESC_MAX];
    int dn = rc == 0 ? ferry_region_export(w.reg, d, sizeof d) : rc;
    if (rc < 0 || dn < 0) {
        reply_err("setup", rc < 0 ? rc : dn, &err);
        fflush(stdout);
        teardown(&w);
        return 1;
    }
    char hex[2 * FERRY_DESC_MAX + 1];
    cli_hex(d, (size_t)dn, hex);
    printf("READY %llx %s\n", (unsigned long long)(uintptr_t)w.mem, hex);
    fflush(stdout);

    char line[2048];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long tag;
        memset(&err, 0, sizeof err);
        if (!strncmp(line, "quit", 4))
            break;
        if (!strncmp(line, "peer ", 5)) {
            on_peer(&w, line);
            continue;
        }
        if (!strncmp(line, "bind", 4)) {
            rc = w.att ? FERRY_ESTATE : do_bind(&w, &err);
            if (rc < 0)
                reply_err("bind", rc, &err);
            else
                printf("OK %u\n", w.counterparts);
        } else if (sscanf(line, "go sink %llu", &tag) == 1) {
            double t0 = cli_now();
            uint64_t ops = 0;
            rc = w.is_src ? do_run(&w, FERRY_EXEC_SINK, tag, &ops, &err)
                          : ferry_wait_notify(w.e, tag, w.counterparts, FERRY_DEFAULT_TIMEOUT_MS, NULL, &err);
            if (rc < 0)
                reply_err(w.is_src ? "sink run" : "sink wait", rc, &err);
            else
                printf("DONE %.6f %llu\n", cli_now() - t0, (unsigned long long)ops);
        } else if (!strncmp(line, "go reader", 9)) {
            double t0 = cli_now();
            uint64_t ops = 0;
            rc = w.is_src ? 0 : do_run(&w, FERRY_EXEC_READER, 0, &ops, &err);
            if (rc < 0)
                reply_err("reader run", rc, &err);
            else
                printf("DONE %.6f %llu\n", cli_now() - t0, (unsigned long long)ops);
        } else if (!strncmp(line, "check", 5)) {
            uint64_t bad = w.is_src ? 0 : walk_mine(&w, false);
            if (!w.is_src)
                memset(w.mem, 0, w.memlen);   /* the next run must write everything again */
            printf("OK %llu\n", (unsigned long long)bad);
        } else {
            printf("ERR unknown command\n");
        }
        fflush(stdout);
    }
    teardown(&w);
    return 0;
}
