/* Store client: open/close, errors, round trips to the master, segment
 * descriptors and local buffers (store.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/client_int.h"
#include "wire/sockio.h"

#define TAG "store"

fr_sbytes fr_client_str(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return (fr_sbytes){ .p = n ? (const uint8_t *)s : NULL, .n = (uint32_t)n };
}

int fr_client_key(const char *key, ferry_error *err)
{
    if (!key || !*key)
        return fr_fail(err, FERRY_EINVAL, "empty key");
    if (strlen(key) > FERRY_STORE_KEY_MAX)
        return fr_fail(err, FERRY_EINVAL, "key longer than %d bytes", FERRY_STORE_KEY_MAX);
    return 0;
}

int ferry_store_config_init(ferry_store_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    int rc = ferry_engine_config_init(&cfg->engine);
    const char *m = getenv("FERRY_MASTER");
    if (m && *m) {
        if (strlen(m) >= sizeof cfg->master)
            return FERRY_EINVAL;
        snprintf(cfg->master, sizeof cfg->master, "%s", m);
    }
    cfg->timeout_ms = FR_STORE_TIMEOUT_MS;
    cfg->lease_ms = FR_STORE_LEASE_MS;
    cfg->heartbeat_ms = FR_STORE_HEARTBEAT_MS;
    return rc;
}

/* What a request does, in words, for the errors a user reads: "put of
 * 'k'", "reading 'k'" (several: "reading 16 objects ('k0', ...)"). Never
 * the protocol's name of the message. */
void fr_client_describe(const fr_smsg *q, size_t n, char *out, size_t cap)
{
    char key[224];
    int kn = q->key.n > 200 ? 200 : (int)q->key.n;
    if (n > 1)
        snprintf(key, sizeof key, "%zu objects ('%.*s'%s)", n, kn, q->key.p ? (const char *)q->key.p : "",
                 n > 1 ? ", ..." : "");
    else
        snprintf(key, sizeof key, "'%.*s'%s", kn, q->key.p ? (const char *)q->key.p : "",
                 q->key.n > 200 ? "..." : "");
    switch (q->type) {
    case FR_SMSG_PUT_START: snprintf(out, cap, "put of %s", key); break;
    case FR_SMSG_PUT_END: snprintf(out, cap, "completing the put of %s", key); break;
    case FR_SMSG_PUT_REVOKE: snprintf(out, cap, "undoing the failed put of %s", key); break;
    case FR_SMSG_GET_REPLICAS: snprintf(out, cap, "reading %s", key); break;
    case FR_SMSG_REMOVE: snprintf(out, cap, "removing %s", key); break;
    case FR_SMSG_REMOVE_PREFIX: snprintf(out, cap, "removing the objects under %s", key); break;
    case FR_SMSG_EXIST: snprintf(out, cap, "checking whether %s exists", key); break;
    case FR_SMSG_LIST: snprintf(out, cap, "listing the keys under %s", key); break;
    case FR_SMSG_KV_GET: snprintf(out, cap, "reading KV key %s", key); break;
    case FR_SMSG_KV_PUT: snprintf(out, cap, "writing KV key %s", key); break;
    case FR_SMSG_KV_CAS: snprintf(out, cap, "compare-and-swap of KV key %s", key); break;
    case FR_SMSG_KV_DELETE: snprintf(out, cap, "deleting KV key %s", key); break;
    case FR_SMSG_WATCH: snprintf(out, cap, "watching the keys under %s", key); break;
    case FR_SMSG_UNWATCH: snprintf(out, cap, "ending a watch"); break;
    case FR_SMSG_BARRIER: snprintf(out, cap, "barrier %s", key); break;
    case FR_SMSG_Q_PUSH: snprintf(out, cap, "pushing to queue %s", key); break;
    case FR_SMSG_Q_POP: snprintf(out, cap, "popping from queue %s", key); break;
    case FR_SMSG_Q_ACK: snprintf(out, cap, "acknowledging queue record %llu", (unsigned long long)q->id); break;
    case FR_SMSG_Q_NACK: snprintf(out, cap, "handing back queue record %llu", (unsigned long long)q->id); break;
    case FR_SMSG_Q_CONFIG: snprintf(out, cap, "setting the bound of queue %s", key); break;
    case FR_SMSG_SEGMENT: snprintf(out, cap, "locating segment %016llx", (unsigned long long)q->segment); break;
    case FR_SMSG_STATUS: snprintf(out, cap, "reading the master's status"); break;
    case FR_SMSG_MOUNT: snprintf(out, cap, "mounting a segment"); break;
    case FR_SMSG_UNMOUNT: snprintf(out, cap, "unmounting segment %016llx", (unsigned long long)q->segment); break;
    case FR_SMSG_HEARTBEAT: snprintf(out, cap, "a heartbeat"); break;
    default: snprintf(out, cap, "a call to the master"); break;
    }
}

static void reply_error(const fr_smsg *rep, const char *what, ferry_error *err)
{
    char text[FR_SMSG_TEXT_MAX + 1];
    size_t n = rep->val.n < FR_SMSG_TEXT_MAX ? rep->val.n : FR_SMSG_TEXT_MAX;
    if (n)
        memcpy(text, rep->val.p, n);
    text[n] = '\0';
    fr_fail(err, rep->status, "%s: %s", what, n ? text : ferry_strerror(rep->status));
}

static int conn_error(ferry_store *s, int rc, const char *what, ferry_error *err)
{
    if (rc == FERRY_ECONNRESET)
        return fr_fail(err, rc, "%s: connection to the master at %s lost; the outcome is "
                             "unknown", what, s->cfg.master);
    if (rc == FERRY_ESTATE)   /* only the connection gives it: the master's own are replies */
        return fr_fail(err, rc, "%s: the answer came from a deposed master (an older "
                       "leadership epoch than one heard before) of %s: refused, the outcome is "
                       "unknown", what, s->cfg.master);
    return fr_fail(err, rc, "%s: master at %s: %s", what, s->cfg.master, ferry_strerror(rc));
}

int fr_client_rpc_many(ferry_store *s, const fr_smsg *reqs, size_t n, uint16_t want,
                       fr_smsg *reps, uint8_t **bufs, int *status, ferry_error *err)
{
    char what[320];
    if (n)
        fr_client_describe(&reqs[0], n, what, sizeof what);
    else
        snprintf(what, sizeof what, "a call to the master");
    int rc = fr_mconn_call(s->mc, reqs, n, NULL, reps, bufs, s->cfg.timeout_ms);
    for (size_t i = 0; i < n; i++) {
        if (rc < 0)
            status[i] = rc;
        else if (reps[i].type == FR_SMSG_ERROR) {
            char one[320];
            fr_client_describe(&reqs[i], 1, one, sizeof one);   /* names this item's key */
            status[i] = reps[i].status;
            reply_error(&reps[i], one, err);
        } else if (reps[i].type != want) {
            status[i] = fr_fail(err, FERRY_EPROTO, "%s: the master sent an answer of another kind "
                                      "(message type %u): client and master versions differ?",
                                      what, (unsigned)reps[i].type);
        } else
            status[i] = 0;
    }
    if (rc < 0)
        return conn_error(s, rc, what, err);
    return 0;
}

int fr_client_rpc(ferry_store *s, const fr_smsg *req, uint16_t want, fr_smsg *rep,
                  uint8_t **buf, ferry_error *err)
{
    int st = 0;
    int rc = fr_client_rpc_many(s, req, 1, want, rep, buf, &st, err);
    return rc < 0 ? rc : st;
}

void fr_client_free_bufs(uint8_t **bufs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fr_free(bufs[i]);
        bufs[i] = NULL;
    }
}

/* ---- segments ------------------------------------------------------------------- */

static int segment_ref(ferry_store *s, uint64_t id, bool local_only, fr_segref *out, ferry_error *err);

int fr_client_segment(ferry_store *s, uint64_t id, fr_segref *out, ferry_error *err)
{
    return segment_ref(s, id, false, out, err);
}

/* The segment's reference, imported (and kept) on first use; with
 * local_only, a segment of another machine is neither imported nor
 * connected to: 1 is returned for it (0 when *out is set). */
static int segment_ref(ferry_store *s, uint64_t id, bool local_only, fr_segref *out, ferry_error *err)
{
    pthread_mutex_lock(&s->lock);
    fr_segref *r = fr_umap_get(&s->segs, id);
    if (r)
        *out = *r;
    pthread_mutex_unlock(&s->lock);
    if (r)
        return 0;

    fr_smsg q = {.type = FR_SMSG_SEGMENT, .segment = id}, rep;
    uint8_t *buf = NULL;
    int rc = fr_client_rpc(s, &q, FR_SMSG_SEGMENT_DESC, &rep, &buf, err);
    if (rc < 0) {
        fr_free(buf);
        return rc;
    }
    if (local_only && ferry_region_desc_local(s->eng, rep.val.p, rep.val.n) != 1) {
        fr_free(buf);
        return 1;
    }
    fr_segref nr = {.id = id, .node = rep.node};
    rc = ferry_region_import(s->eng, rep.val.p, rep.val.n, &nr.rr, err);
    fr_free(buf);
    if (rc < 0)
        return fr_fail(err, rc, "segment %016llx of node %016llx: cannot reach its node: %s",
                       (unsigned long long)id, (unsigned long long)nr.node, fr_why(err, rc));
    fr_segref *keep = fr_malloc(sizeof *keep);
    if (!keep)
        return FERRY_ENOMEM;
    *keep = nr;
    pthread_mutex_lock(&s->lock);
    if (!fr_umap_get(&s->segs, id) && fr_umap_put(&s->segs, id, keep) == 0)
        keep = NULL;
    pthread_mutex_unlock(&s->lock);
    fr_free(keep);
    *out = nr;
    return 0;
}

int ferry_store_warm(ferry_store *s, bool write, uint64_t *bytes, ferry_error *err)
{
    uint64_t none = 0;
    if (!bytes)
        bytes = &none;
    *bytes = 0;
    if (!s)
        return FERRY_EINVAL;
    char *text = NULL;
    int rc = ferry_store_status_json(s, &text, err);
    if (rc < 0)
        return fr_fail(err, rc, "warm: cannot list the segments: %s", ferry_strerror(rc));
    json_t *j = NULL;
    char jerr[128];
    rc = fr_json_parse(text, strlen(text), &j, jerr, sizeof jerr);
    free(text);
    if (rc < 0)
        return fr_fail(err, FERRY_EPROTO, "warm: the master's status: %s", jerr);
    const json_t *segs = json_object_get(j, "segments");
    int first = 0;
    for (size_t i = 0; i < json_array_size(segs); i++) {
        uint64_t id = 0, b = 0;
        fr_segref ref;
        ferry_error *e = first ? NULL : err;   /* the first failure is the one said */
        rc = fr_json_get_u64(json_array_get(segs, i), "id", &id, jerr, sizeof jerr);
        if (rc < 0)
            fr_fail(e, rc, "the master's status: %s", jerr);
        if (rc == 0)
            rc = segment_ref(s, id, true, &ref, e);   /* another machine's: nothing to warm */
        if (rc == 0)
            rc = ferry_remote_warm(s->eng, &ref.rr, ref.rr.addr, ref.rr.len, write, &b, e);
        if (rc == 1)
            rc = 0;
        *bytes += b;
        if (rc < 0 && first == 0)
            first = fr_fail(err, rc, "warm: segment %016llx: %s", (unsigned long long)id,
                            fr_why(err, rc));
    }
    json_decref(j);
    return first;
}

void fr_client_forget_segment(ferry_store *s, uint64_t id)
{
    pthread_mutex_lock(&s->lock);
    fr_free(fr_umap_del(&s->segs, id));
    pthread_mutex_unlock(&s->lock);
}

/* ---- local buffers ----------------------------------------------------------------- */

int ferry_store_register_buffer(ferry_store *s, void *buf, size_t len, ferry_error *err)
{
    if (!s || !buf || !len)
        return fr_fail(err, FERRY_EINVAL, "register_buffer: empty buffer");
    uint8_t *p = buf;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    for (size_t i = 0; i < s->nbufs && rc == 0; i++)
        if (p < s->bufs[i].addr + s->bufs[i].len && s->bufs[i].addr < p + len)
            rc = fr_fail(err, FERRY_EEXIST, "register_buffer: overlaps a registered buffer");
    if (rc == 0)
        rc = fr_grow((void **)&s->bufs, &s->cap_bufs, s->nbufs + 1, sizeof *s->bufs);
    ferry_region *reg = NULL;
    if (rc == 0)
        rc = ferry_region_register(s->eng, buf, len, 0, FERRY_MEM_HOST, &reg, err);
    if (rc == 0)
        s->bufs[s->nbufs++] = (fr_ubuf){ .addr = p, .len = len, .reg = reg };
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int ferry_store_unregister_buffer(ferry_store *s, void *buf, ferry_error *err)
{
    if (!s)
        return FERRY_EINVAL;
    pthread_mutex_lock(&s->lock);
    int rc = fr_fail(err, FERRY_ENOENT, "unregister_buffer: not a registered buffer");
    for (size_t i = 0; i < s->nbufs; i++) {
        if (s->bufs[i].addr != buf)
            continue;
        rc = ferry_region_unregister(s->bufs[i].reg, err);
        if (rc == 0)
            s->bufs[i] = s->bufs[--s->nbufs];
        break;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int fr_client_local(ferry_store *s, const void *p, size_t len, ferry_region **tmp, ferry_error *err)
{
    const uint8_t *b = p;
    *tmp = NULL;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->nbufs; i++) {
        if (b >= s->bufs[i].addr && b + len <= s->bufs[i].addr + s->bufs[i].len) {
            pthread_mutex_unlock(&s->lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (ferry_region_covers(s->eng, p, len ? len : 1))   /* registered with the engine itself */
        return 0;
    int rc = ferry_region_register(s->eng, (void *)(uintptr_t)p, len ? len : 1, 0,
                                   FERRY_MEM_HOST, tmp, err);
    if (rc < 0)
        return fr_fail(err, rc, "cannot register the %zu bytes at %p with the engine: %s", len, p,
                       fr_why(err, rc));
    return 0;
}

/* ---- open / close --------------------------------------------------------------------- */

/* Does addr end in ":PORT" (a port number, 1 to 65535)? */
static bool has_port1(const char *addr);

/* "HOST:PORT", or several separated by commas (a cluster's masters). */
static bool has_port(const char *addr)
{
    char one[128];
    for (const char *p = addr;;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof one)
            return false;
        snprintf(one, sizeof one, "%.*s", (int)n, p);
        if (!has_port1(one))
            return false;
        if (!p[n])
            return true;
        p += n + 1;
    }
}

static bool has_port1(const char *addr)
{
    const char *c = strrchr(addr, ':');
    if (!c || !c[1] || (strchr(addr, ':') != c && addr[0] != '['))
        return false;   /* none, empty, or a bare IPv6 address (write [::1]:PORT) */
    char *end;
    unsigned long p = strtoul(c + 1, &end, 10);
    return *end == '\0' && p >= 1 && p <= 65535 && c[1] >= '0' && c[1] <= '9';
}

int ferry_store_open(const ferry_store_config *cfg, ferry_store **out, ferry_error *err)
{
    if (!cfg || !out)
        return FERRY_EINVAL;
    if (!FR_RESERVED_OK(cfg) || !FR_RESERVED_OK(&cfg->engine))
        return fr_fail(err, FERRY_EINVAL, "store config: its reserved fields must be zero "
                             "(start from ferry_store_config_init)");
    if (!cfg->master[0])
        return fr_fail(err, FERRY_EINVAL, "no master address: set FERRY_MASTER=HOST:PORT "
                             "(ferry up prints it)");
    if (!has_port(cfg->master))
        return fr_fail(err, FERRY_EINVAL, "the master address '%s' has no port: give HOST:PORT, "
                             "as ferry up prints it (e.g. 127.0.0.1:7700)", cfg->master);
    if (cfg->engine.token_len == 0)
        return fr_fail(err, FERRY_EAUTH, "no cluster token: set FERRY_TOKEN or FERRY_TOKEN_FILE "
                             "(or give the store a token or a token file; ferry up writes one)");
    if (cfg->lease_ms > FERRY_STORE_LEASE_MAX_MS)
        return fr_fail(err, FERRY_EINVAL, "lease_ms %llu is above the longest lease, %u ms "
                             "(an hour)", (unsigned long long)cfg->lease_ms,
                             FERRY_STORE_LEASE_MAX_MS);
    ferry_store *s = fr_calloc(1, sizeof *s);
    if (!s)
        return FERRY_ENOMEM;
    s->cfg = *cfg;
    /* a zeroed config: ferry_store_config_init's values */
    if (s->cfg.timeout_ms == 0)
        s->cfg.timeout_ms = FR_STORE_TIMEOUT_MS;
    if (s->cfg.lease_ms == 0)
        s->cfg.lease_ms = FR_STORE_LEASE_MS;
    pthread_mutex_init(&s->lock, NULL);
    fr_umap_init(&s->segs);
    fr_umap_init(&s->watches);
    int rc = ferry_engine_open(&s->cfg.engine, &s->eng, err);
    if (rc < 0) {
        fr_fail(err, rc, "cannot open the client's engine: %s", fr_why(err, rc));
        goto fail;
    }
    uint8_t key[32];
    fr_auth_key(s->cfg.engine.token, s->cfg.engine.token_len, key);
    fr_mconn_config mc = {
        .addr = s->cfg.master, .key = key, .role = FR_ROLE_STORE_CLIENT,
        .heartbeat_ms = s->cfg.heartbeat_ms, .timeout_ms = s->cfg.timeout_ms,
        .hooks = { .ctx = s, .push = fr_client_watch_push, .lost = fr_client_watch_lost },
    };
    rc = fr_mconn_open(&mc, &s->mc);
    if (rc < 0) {
        if (rc == FERRY_EAUTH)
            fr_fail(err, rc, "the master at %s refused our cluster token", s->cfg.master);
        else
            fr_fail(err, rc, "cannot reach the master at %s: %s", s->cfg.master,
                          ferry_strerror(rc));
        goto fail;
    }
    *out = s;
    return 0;
fail:
    ferry_store_close(s);
    return rc;
}

void ferry_store_close(ferry_store *s)
{
    if (!s)
        return;
    fr_mconn_close(s->mc);
    size_t pos = 0;
    void *it;
    while ((it = fr_umap_next(&s->segs, &pos)))
        fr_free(it);
    fr_umap_fini(&s->segs);
    /* Watches are the caller's to close; detach any left open. */
    fr_umap_fini(&s->watches);
    fr_client_stage_fini(s);
    for (size_t i = 0; i < s->nbufs; i++)
        (void)ferry_region_unregister(s->bufs[i].reg, NULL);
    fr_free(s->bufs);
    ferry_engine_close(s->eng);
    pthread_mutex_destroy(&s->lock);
    fr_free(s);
}

ferry_engine *ferry_store_engine(ferry_store *s)
{
    return s ? s->eng : NULL;
}

void ferry_store_free(void *buf)
{
    fr_free(buf);
}
