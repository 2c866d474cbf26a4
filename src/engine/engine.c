/* Engine lifecycle, configuration and peers. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine_int.h"

/* Indexed like e->tp_state (FR_TP_*): the one place that lists the
 * transports a build has. */
const fr_transport *const fr_transports[FR_TP_COUNT] = {
    &fr_transport_shm, &fr_transport_tcp,
#ifdef FERRY_HAVE_UCX
    &fr_transport_ucx,
#else
    NULL,
#endif
};

/* The transport of this build named tr, or NULL. */
static const fr_transport *transport_named(const char *tr)
{
    for (int i = 0; i < FR_TP_COUNT; i++)
        if (fr_transports[i] && strcmp(fr_transports[i]->name, tr) == 0)
            return fr_transports[i];
    return NULL;
}

static int env_u64(const char *name, uint64_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end != '\0' || x == 0) {
        FR_ERROR("engine", "%s=%s is not a positive integer", name, v);
        return FERRY_EINVAL;
    }
    *out = x;
    return 0;
}

int ferry_engine_config_token_file(ferry_engine_config *cfg, const char *path, ferry_error *err)
{
    if (!cfg || !path)
        return fr_fail(err, FERRY_EINVAL, "token file: no config or no path");
    FILE *f = fopen(path, "r");
    if (!f)
        return fr_fail(err, FERRY_ENOENT, "cannot read token file %s: %s", path, strerror(errno));
    size_t n = fread(cfg->token, 1, sizeof cfg->token, f);
    fclose(f);
    while (n > 0 && (cfg->token[n - 1] == '\n' || cfg->token[n - 1] == '\r'))
        n--;
    if (n == 0)
        return fr_fail(err, FERRY_EINVAL, "token file %s is empty", path);
    cfg->token_len = n;
    return 0;
}

int ferry_engine_config_init(ferry_engine_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->listen_addr, sizeof cfg->listen_addr, "%s",
             getenv("FERRY_LISTEN") ? getenv("FERRY_LISTEN") : "127.0.0.1:0");
    cfg->tcp_streams = 4;
    cfg->tcp_chunk = 4u << 20;
    cfg->shm_threads = 2;
    cfg->window_bytes = 1ull << 30;
    cfg->window_ops = 4096;
    cfg->connect_timeout_ms = 5000;
    const char *tr = getenv("FERRY_TRANSPORT");
    if (tr && *tr) {
        if (!transport_named(tr)) {
            char names[64] = "";
            for (int i = 0; i < FR_TP_COUNT; i++)
                if (fr_transports[i])
                    snprintf(names + strlen(names), sizeof names - strlen(names), " %s", fr_transports[i]->name);
            FR_ERROR("engine", "FERRY_TRANSPORT=%s: expected one of this build's transports:%s", tr, names);
            return FERRY_EINVAL;
        }
        snprintf(cfg->transport, sizeof cfg->transport, "%s", tr);
    }
    uint64_t v = cfg->tcp_streams;
    int rc = env_u64("FERRY_TCP_STREAMS", &v);
    if (rc < 0)
        return rc;
    cfg->tcp_streams = (unsigned)v;
    const char *fault = getenv("FERRY_FAULT");
    if (fault && *fault)
        snprintf(cfg->fault, sizeof cfg->fault, "%s", fault);
    const char *tok = getenv("FERRY_TOKEN");
    if (tok && *tok) {
        size_t n = strlen(tok);
        if (n > sizeof cfg->token) {
            FR_ERROR("engine", "FERRY_TOKEN has %zu bytes; at most %u", n, (unsigned)FERRY_TOKEN_MAX);
            return FERRY_EINVAL;
        }
        memcpy(cfg->token, tok, n);
        cfg->token_len = n;
    } else if (getenv("FERRY_TOKEN_FILE")) {
        /* No ferry_error here (every *_config_init takes the config only):
         * the log says which file. */
        ferry_error err = {0};
        rc = ferry_engine_config_token_file(cfg, getenv("FERRY_TOKEN_FILE"), &err);
        if (rc < 0)
            FR_ERROR("engine", "FERRY_TOKEN_FILE: %s", err.msg);
        return rc;
    }
    return 0;
}

void ferry_token_generate(char out[65])
{
    uint8_t raw[32];
    fr_random_bytes(raw, sizeof raw);
    sodium_bin2hex(out, 65, raw, sizeof raw);
}

/* Host identity: the boot id and the network namespace. Two engines share a
 * host (and so use shm) only when both match; namespaces joined by veth are
 * separate hosts, which is how multi-host tests run on one machine. */
static void host_identity(uint8_t out[16])
{
    char buf[128] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(buf, 64, f))
            buf[0] = 0;
        fclose(f);
    }
    struct stat st;
    if (stat("/proc/self/ns/net", &st) == 0)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "/%llu/%llu",
                 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    fr_hash128_t h = fr_hash128(buf, strlen(buf), 0);
    memcpy(out, h.b, 16);
}

/* The names of this build's transports, " shm tcp ucx", into out. */
static void transport_names(char *out, size_t cap)
{
    out[0] = 0;
    for (int i = 0; i < FR_TP_COUNT; i++)
        if (fr_transports[i])
            snprintf(out + strlen(out), cap - strlen(out), " %s", fr_transports[i]->name);
}

#define FR_MAX_STREAMS 64   /* tcp_streams and shm_threads at most */

static int validate_config(const ferry_engine_config *c, ferry_error *err)
{
    if (c->token_len == 0)
        return fr_fail(err, FERRY_EAUTH, "engine config: no cluster token (set FERRY_TOKEN or "
                       "FERRY_TOKEN_FILE, or fill token)");
    if (c->token_len > FERRY_TOKEN_MAX)
        return fr_fail(err, FERRY_EINVAL, "engine config: token_len %zu exceeds %u", c->token_len,
                       (unsigned)FERRY_TOKEN_MAX);
    if (c->tcp_streams == 0 || c->tcp_streams > FR_MAX_STREAMS)
        return fr_fail(err, FERRY_EINVAL, "engine config: tcp_streams %u is not in 1..%u", c->tcp_streams,
                       (unsigned)FR_MAX_STREAMS);
    if (c->tcp_chunk == 0 || c->tcp_chunk > FR_WIRE_MAX_DATA)
        return fr_fail(err, FERRY_EINVAL, "engine config: tcp_chunk %llu is not in 1..%llu",
                       (unsigned long long)c->tcp_chunk, (unsigned long long)FR_WIRE_MAX_DATA);
    if (c->shm_threads == 0 || c->shm_threads > FR_MAX_STREAMS)
        return fr_fail(err, FERRY_EINVAL, "engine config: shm_threads %u is not in 1..%u", c->shm_threads,
                       (unsigned)FR_MAX_STREAMS);
    if (c->window_bytes == 0 || c->window_ops == 0)
        return fr_fail(err, FERRY_EINVAL, "engine config: window_bytes and window_ops must not be 0");
    if (c->transport[0] && !transport_named(c->transport)) {
        char names[64];
        transport_names(names, sizeof names);
        return fr_fail(err, FERRY_EINVAL, "engine config: transport \"%.*s\" is none of this build's:%s",
                       (int)sizeof c->transport, c->transport, names);
    }
    return 0;
}

int ferry_engine_open(const ferry_engine_config *cfg, ferry_engine **out, ferry_error *err)
{
    if (!cfg || !out)
        return fr_fail(err, FERRY_EINVAL, "engine open: no config or no out");
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "engine config: its reserved fields must be zero (start from "
                       "ferry_engine_config_init)");
    int rc = validate_config(cfg, err);
    if (rc < 0)
        return rc;
    ferry_engine *e = fr_calloc(1, sizeof *e);
    if (!e)
        return fr_fail(err, FERRY_ENOMEM, "engine open: out of memory");
    e->cfg = *cfg;
    e->keytab_fd = -1;
    fr_auth_key(cfg->token, cfg->token_len, e->auth_key);
    pthread_mutex_init(&e->lock, NULL);
    fr_cond_init_monotonic(&e->cond);
    pthread_mutex_init(&e->nlock, NULL);
    fr_cond_init_monotonic(&e->ncond);
    e->ep.instance = fr_random_u64();
    e->ep.pid = (uint32_t)getpid();
    host_identity(e->ep.host);
    rc = fr_keytab_create(e);
    if (rc < 0) {
        fr_fail(err, rc, "engine open: cannot create the key table: %s", ferry_strerror(rc));
        goto fail;
    }
    if (cfg->fault[0]) {
        rc = fr_fault_create(cfg->fault, &e->fault, err);
        if (rc < 0)
            goto fail;
        FR_WARN("engine", "fault injection on: %s", cfg->fault);
    }
    for (int i = 0; i < FR_TP_COUNT; i++) {
        const fr_transport *tp = fr_transports[i];
        if (!tp || (tp->on_demand && strcmp(cfg->transport, tp->name) != 0))
            continue;
        ferry_error why = {0};
        rc = tp->start(e, &e->tp_state[i], &why);
        if (rc < 0) {
            fr_fail(err, rc, "engine open: cannot start the %s transport: %s", tp->name,
                    why.code ? why.msg : ferry_strerror(rc));
            goto fail;
        }
    }
    FR_INFO("engine", "open: %s instance %016llx", e->address, (unsigned long long)e->ep.instance);
    *out = e;
    return 0;
fail:
    ferry_engine_close(e);
    return rc;
}

static void peer_disconnect(ferry_engine *e, fr_peer *p)
{
    pthread_rwlock_wrlock(&p->rw);
    void *conn = p->conn;
    const fr_transport *tp = p->tp;
    p->conn = NULL;
    pthread_rwlock_unlock(&p->rw);
    if (conn)
        tp->disconnect(conn);   /* fails and completes every chunk it held */
    (void)e;
}

void ferry_engine_close(ferry_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->lock);
    e->closing = true;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
    for (size_t i = 0; i < e->npeers; i++)
        if (e->peers[i])
            peer_disconnect(e, e->peers[i]);
    fr_tickets_wait_drained(e);
    for (int i = FR_TP_COUNT - 1; i >= 0; i--)   /* ucx first: it reads the region list */
        if (e->tp_state[i])
            fr_transports[i]->stop(e->tp_state[i]);
    fr_tickets_destroy_all(e);
    for (size_t i = 0; i < e->npeers; i++) {
        if (!e->peers[i])
            continue;
        pthread_rwlock_destroy(&e->peers[i]->rw);
        pthread_mutex_destroy(&e->peers[i]->imp_lock);
        fr_free(e->peers[i]->imports);
        fr_free(e->peers[i]);
    }
    fr_free(e->peers);
    fr_region_destroy_all(e);
    fr_mem_destroy_all(e);
    fr_keytab_destroy(e);
    fr_notify_destroy(e);
    fr_fault_destroy(e->fault);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->cond);
    pthread_mutex_destroy(&e->nlock);
    pthread_cond_destroy(&e->ncond);
    fr_free(e);
}

int ferry_engine_export(const ferry_engine *e, void *buf, size_t cap)
{
    if (!e || !buf)
        return FERRY_EINVAL;
    return fr_endpoint_encode(&e->ep, buf, cap);
}

const char *ferry_engine_address(const ferry_engine *e) { return e ? e->address : ""; }

/* ---- peers --------------------------------------------------------------- */

static const fr_transport *choose_transport(const ferry_engine *e, const fr_endpoint *ep)
{
    const fr_transport *named = e->cfg.transport[0] ? transport_named(e->cfg.transport) : NULL;
    if (named && named->on_demand)   /* the only one this engine reaches peers by */
        return (ep->transports & named->bit) ? named : NULL;
    if (strcmp(e->cfg.transport, "tcp") == 0)
        return &fr_transport_tcp;
    bool same_host = memcmp(ep->host, e->ep.host, 16) == 0;
    if (strcmp(e->cfg.transport, "shm") == 0 || (same_host && (ep->transports & FR_TRANSPORT_SHM)))
        return same_host ? &fr_transport_shm : NULL;
    return (ep->transports & FR_TRANSPORT_TCP) ? &fr_transport_tcp : NULL;
}

static fr_peer *peer_get(ferry_engine *e, ferry_peer_id id);

/* The transports an endpoint offers, " shm tcp", into out. */
static void endpoint_transports(const fr_endpoint *ep, char *out, size_t cap)
{
    out[0] = 0;
    for (int i = 0; i < FR_TP_COUNT; i++)
        if (fr_transports[i] && (ep->transports & fr_transports[i]->bit))
            snprintf(out + strlen(out), cap - strlen(out), " %s", fr_transports[i]->name);
}

static int peer_add_ep(ferry_engine *e, const fr_endpoint *ep, ferry_peer_id *out, ferry_error *err)
{
    const fr_transport *tp = choose_transport(e, ep);
    if (!tp) {
        char offers[64];
        endpoint_transports(ep, offers, sizeof offers);
        return fr_fail(err, FERRY_ENOTSUP, "no common transport with peer instance %016llx (it offers:%s%s%s%s)",
                       (unsigned long long)ep->instance, offers[0] ? offers : " none",
                       memcmp(ep->host, e->ep.host, 16) == 0 ? "; same host" : "; another host",
                       e->cfg.transport[0] ? "; this engine uses only " : "", e->cfg.transport);
    }
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < e->npeers; i++) {
        if (e->peers[i]->ep.instance == ep->instance) {
            *out = (ferry_peer_id)i;
            pthread_mutex_unlock(&e->lock);
            return 0;
        }
    }
    fr_peer *p = fr_calloc(1, sizeof *p);
    int rc = p ? fr_grow((void **)&e->peers, &e->cap_peers, e->npeers + 1, sizeof *e->peers) : FERRY_ENOMEM;
    if (rc < 0) {
        pthread_mutex_unlock(&e->lock);
        fr_free(p);
        return fr_fail(err, rc, "cannot add a peer: %s", ferry_strerror(rc));
    }
    p->id = (ferry_peer_id)e->npeers;
    p->ep = *ep;
    p->tp = tp;
    if (e->fault) {   /* every peer goes through the fault wrapper */
        p->inner_tp = tp;
        p->tp = &fr_transport_fault;
    }
    pthread_rwlock_init(&p->rw, NULL);
    pthread_mutex_init(&p->imp_lock, NULL);
    e->peers[e->npeers++] = p;
    *out = p->id;
    pthread_mutex_unlock(&e->lock);
    return 0;
}

int ferry_peer_add(ferry_engine *e, const void *desc, size_t len, ferry_peer_id *out, ferry_error *err)
{
    if (!e || !desc || !out)
        return fr_fail(err, FERRY_EINVAL, "peer add: no engine, descriptor or out");
    fr_endpoint ep;
    int rc = fr_endpoint_decode(desc, len, &ep);
    if (rc < 0)
        return fr_fail(err, rc, "peer add: the %zu-byte endpoint descriptor does not decode: %s", len,
                       ferry_strerror(rc));
    rc = peer_add_ep(e, &ep, out, err);
    return rc < 0 ? rc : fr_peer_connect(e, *out, err);
}

int ferry_region_desc_local(const ferry_engine *e, const void *desc, size_t len)
{
    fr_region_desc d;
    if (!e || !desc || fr_region_desc_decode(desc, len, &d) < 0)
        return FERRY_EINVAL;
    return memcmp(d.ep.host, e->ep.host, 16) == 0;
}

int ferry_region_import(ferry_engine *e, const void *desc, size_t len, ferry_remote_region *out,
                        ferry_error *err)
{
    if (!e || !desc || !out)
        return fr_fail(err, FERRY_EINVAL, "region import: no engine, descriptor or out");
    fr_region_desc d;
    int rc = fr_region_desc_decode(desc, len, &d);
    if (rc < 0)
        return fr_fail(err, rc, "region import: the %zu-byte region descriptor does not decode: %s", len,
                       ferry_strerror(rc));
    ferry_peer_id id;
    rc = peer_add_ep(e, &d.ep, &id, err);
    if (rc == 0 && (d.ep.transports & FR_TRANSPORT_UCX)) {   /* the ucx transport checks against it */
        rc = fr_peer_import_add(peer_get(e, id), &d);
        if (rc < 0)
            fr_fail(err, rc, "region import: cannot record the region of peer %u: %s", id, ferry_strerror(rc));
    }
    if (rc == 0)
        rc = fr_peer_connect(e, id, err);
    if (rc < 0)
        return rc;
    *out = (ferry_remote_region){.peer = id, .addr = d.base, .len = d.len, .key = d.key, .flags = d.flags};
    return 0;
}

static fr_peer *peer_get(ferry_engine *e, ferry_peer_id id)
{
    pthread_mutex_lock(&e->lock);
    fr_peer *p = id < e->npeers ? e->peers[id] : NULL;
    pthread_mutex_unlock(&e->lock);
    return p;
}

int fr_peer_connect(ferry_engine *e, ferry_peer_id id, ferry_error *err)
{
    fr_peer *p = peer_get(e, id);
    if (!p)
        return fr_fail(err, FERRY_ENOENT, "no peer %u: add it first (ferry_peer_add, ferry_region_import)", id);
    pthread_rwlock_rdlock(&p->rw);
    bool ok = p->conn && p->tp->alive(p->conn);
    pthread_rwlock_unlock(&p->rw);
    if (ok)
        return 0;

    pthread_rwlock_wrlock(&p->rw);
    int rc = 0;
    if (!(p->conn && p->tp->alive(p->conn))) {
        void *old = p->conn;
        p->conn = NULL;
        if (old)
            p->tp->disconnect(old);
        ferry_error why = {0};
        if (e->closing)
            rc = fr_fail(&why, FERRY_ECANCELED, "the engine is closing");
        else
            rc = p->tp->connect(e, p, &p->conn, &why);
        if (rc < 0) {
            p->conn = NULL;
            const fr_transport *tp = p->inner_tp ? p->inner_tp : p->tp;
            /* The caller decides what to tell: debug only here. */
            FR_DEBUG("engine", "cannot connect to peer %u over %s: %s", id, tp->name,
                     why.code ? why.msg : ferry_strerror(rc));
            fr_fail(err, rc, "cannot connect to peer %u (instance %016llx) over %s: %s", id,
                    (unsigned long long)p->ep.instance, tp->name, why.code ? why.msg : ferry_strerror(rc));
        }
    }
    pthread_rwlock_unlock(&p->rw);
    return rc;
}

int fr_peer_post(ferry_engine *e, ferry_peer_id id, fr_chunk **c, size_t n, bool from_completion)
{
    fr_peer *p = peer_get(e, id);
    if (!p)
        return FERRY_ENOENT;
    if (from_completion) {
        /* The connection may be tearing down (and joining the very thread
         * that runs this completion): never wait for it. */
        if (pthread_rwlock_tryrdlock(&p->rw) != 0)
            return FERRY_ECONNRESET;
    } else {
        pthread_rwlock_rdlock(&p->rw);
    }
    int rc = p->conn ? p->tp->post(p->conn, c, n) : FERRY_ECONNRESET;
    pthread_rwlock_unlock(&p->rw);
    return rc;
}

int ferry_peer_reset(ferry_engine *e, ferry_peer_id id)
{
    if (!e)
        return FERRY_EINVAL;
    fr_peer *p = peer_get(e, id);
    if (!p)
        return FERRY_ENOENT;
    peer_disconnect(e, p);
    pthread_mutex_lock(&e->lock);
    p->fenced = 0;
    p->reset_gen++;
    pthread_mutex_unlock(&e->lock);
    FR_INFO("engine", "peer %u reset", id);
    return 0;
}

int fr_peer_import_add(fr_peer *p, const fr_region_desc *d)
{
    const fr_import imp = {.key = d->key, .base = d->base, .len = d->len, .flags = d->flags,
                           .rkey_len = d->rkey_len};
    int rc = 0;
    pthread_mutex_lock(&p->imp_lock);
    size_t i = 0;
    while (i < p->nimports && p->imports[i].key != d->key)
        i++;
    if (i == p->nimports)
        rc = fr_grow((void **)&p->imports, &p->cap_imports, p->nimports + 1, sizeof *p->imports);
    if (rc == 0) {
        p->imports[i] = imp;
        memcpy(p->imports[i].rkey, d->rkey, d->rkey_len);
        if (i == p->nimports)
            p->nimports++;
    }
    pthread_mutex_unlock(&p->imp_lock);
    return rc;
}

bool fr_peer_import_find(fr_peer *p, uint64_t key, fr_import *out)
{
    bool found = false;
    pthread_mutex_lock(&p->imp_lock);
    for (size_t i = 0; i < p->nimports && !found; i++)
        if (p->imports[i].key == key) {
            *out = p->imports[i];
            found = true;
        }
    pthread_mutex_unlock(&p->imp_lock);
    return found;
}

/* The peer of rr connected and read-locked with a live connection (the
 * caller unlocks p->rw), or NULL with *rc set and err filled (what: the
 * call, for the sentence). */
static fr_peer *peer_conn_locked(ferry_engine *e, const ferry_remote_region *rr, int *rc, const char *what,
                                 ferry_error *err)
{
    if ((*rc = fr_peer_connect(e, rr->peer, err)) < 0) {
        if (err)
            fr_fail(err, *rc, "%s: %s", what, err->msg);
        return NULL;
    }
    fr_peer *p = peer_get(e, rr->peer);
    pthread_rwlock_rdlock(&p->rw);
    if (!p->conn) {
        pthread_rwlock_unlock(&p->rw);
        *rc = fr_fail(err, FERRY_ECONNRESET, "%s: the connection to peer %u was lost", what, rr->peer);
        return NULL;
    }
    return p;
}

/* Why a same-host access to a peer's region was refused (ferry_remote_map,
 * warm, access_begin), from the transport's code: into err, naming the
 * range and peer. */
static int remote_refused(ferry_error *err, int rc, const char *what, const fr_peer *p,
                          const ferry_remote_region *rr, uint64_t addr, uint64_t len, const char *access)
{
    const char *why;
    switch (rc) {
    case FERRY_EACCES: why = "the peer has no region with this key that allows it (unregistered, or not remote-"; break;
    case FERRY_EFAULT: why = "the range lies outside the peer's region"; break;
    case FERRY_ENOTSUP: why = "no mapping of the peer's memory to use (it is reached over tcp or ucx, or the "
                              "region is not memory from ferry_mem_alloc): move the bytes with ops"; break;
    case FERRY_ECONNRESET: why = "the connection to the peer was lost"; break;
    default: why = ferry_strerror(rc); break;
    }
    const fr_transport *tp = p->inner_tp ? p->inner_tp : p->tp;
    return fr_fail(err, rc, "%s of %llu bytes at 0x%llx of peer %u's region (key %016llx) over %s: %s%s%s", what,
                   (unsigned long long)len, (unsigned long long)addr, rr->peer, (unsigned long long)rr->key,
                   tp->name, why, rc == FERRY_EACCES ? access : "", rc == FERRY_EACCES ? ")" : "");
}

int ferry_remote_map(ferry_engine *e, const ferry_remote_region *rr, uint64_t addr, uint64_t len,
                     ferry_mapping *out, ferry_error *err)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!e || !rr || !out || len == 0)
        return fr_fail(err, FERRY_EINVAL, "remote map: no engine, region or out, or an empty range");
    int rc;
    fr_peer *p = peer_conn_locked(e, rr, &rc, "remote map", err);
    if (!p)
        return rc;
    rc = p->tp->map ? p->tp->map(p->conn, rr->key, addr, len, out) : FERRY_ENOTSUP;
    if (rc < 0)
        remote_refused(err, rc, "remote map", p, rr, addr, len, "readable");
    pthread_rwlock_unlock(&p->rw);
    return rc;
}

int ferry_remote_warm(ferry_engine *e, const ferry_remote_region *rr, uint64_t addr, uint64_t len,
                      bool write, uint64_t *touched, ferry_error *err)
{
    uint64_t none = 0;
    if (!touched)
        touched = &none;
    *touched = 0;
    if (!e || !rr)
        return fr_fail(err, FERRY_EINVAL, "remote warm: no engine or region");
    int rc;
    fr_peer *p = peer_conn_locked(e, rr, &rc, "remote warm", err);
    if (!p)
        return rc;
    rc = p->tp->warm ? p->tp->warm(p->conn, rr->key, addr, len, write, touched) : 0;
    if (rc < 0)
        remote_refused(err, rc, write ? "remote warm for writing" : "remote warm", p, rr, addr, len,
                       write ? "writable" : "readable");
    pthread_rwlock_unlock(&p->rw);
    return rc;
}

struct ferry_remote_access { fr_peer *p; };

int ferry_remote_access_begin(ferry_engine *e, const ferry_remote_region *rr, uint64_t addr,
                              uint64_t len, unsigned access, void **ptr,
                              ferry_remote_access **out, ferry_error *err)
{
    if (out)
        *out = NULL;
    if (ptr)
        *ptr = NULL;
    if (!e || !rr || !ptr || !out || len == 0)
        return fr_fail(err, FERRY_EINVAL, "remote access: no engine, region, ptr or out, or an empty range");
    if (!access || (access & ~FERRY_REMOTE_RW))
        return fr_fail(err, FERRY_EINVAL, "remote access: access 0x%x is not FERRY_REMOTE_READ and/or "
                       "FERRY_REMOTE_WRITE", access);
    ferry_remote_access *a = fr_calloc(1, sizeof *a);
    if (!a)
        return fr_fail(err, FERRY_ENOMEM, "remote access: out of memory");
    int rc;
    fr_peer *p = peer_conn_locked(e, rr, &rc, "remote access", err);
    if (!p) {
        fr_free(a);
        return rc;
    }
    rc = p->tp->access ? p->tp->access(p->conn, rr->key, addr, len, access, ptr) : FERRY_ENOTSUP;
    if (rc < 0) {
        remote_refused(err, rc, "remote access", p, rr, addr, len,
                       access == FERRY_REMOTE_RW ? "readable and writable"
                       : access == FERRY_REMOTE_WRITE ? "writable" : "readable");
        pthread_rwlock_unlock(&p->rw);
        fr_free(a);
        *ptr = NULL;
        return rc;
    }
    a->p = p;
    *out = a;
    return 0;
}

void ferry_remote_access_end(ferry_remote_access *a)
{
    if (!a)
        return;
    pthread_rwlock_unlock(&a->p->rw);
    fr_free(a);
}

void ferry_remote_unmap(ferry_mapping *m)
{
    if (!m)
        return;
    if (m->base)
        (void)munmap(m->base, m->len);
    memset(m, 0, sizeof *m);
}

const char *ferry_peer_transport(const ferry_engine *e, ferry_peer_id id)
{
    if (!e)
        return NULL;
    fr_peer *p = peer_get((ferry_engine *)e, id);
    return p ? (p->inner_tp ? p->inner_tp : p->tp)->name : NULL;
}

void ferry_engine_get_stats(const ferry_engine *e, ferry_engine_stats *o)
{
    if (!e || !o)
        return;
#define LD(f) o->f = atomic_load_explicit(&e->stats.f, memory_order_relaxed)
    LD(bytes_written); LD(bytes_read); LD(ops_completed); LD(ops_failed);
    LD(tickets_completed); LD(tickets_aborted); LD(tickets_failed); LD(tickets_unknown);
    LD(remote_refused); LD(auth_refused); LD(frames_rejected); LD(notify_dropped);
    LD(served_read_bytes); LD(served_write_bytes); LD(shm_maps_served); LD(notify_peer_capped);
#undef LD
}
