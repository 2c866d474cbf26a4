/* Replicated masters killed under the whole workload (docs/store.md,
 * "Operating replicated masters", fault classes (a) and (d)): a 3-member
 * etcd cluster, two `ferry master --etcd` (default TTL) and the trainers'
 * node, all started here. The test's main thread runs rounds of object
 * puts, KV compare-and-swaps, queue pushes, pops and acks, a weight
 * generation published by two trainer ranks (threads of their own, the C
 * weights API) and a rollout update of it, retrying each operation until
 * it is acknowledged and logging every acknowledgement. A killer thread
 * strikes while an operation is in flight:
 *  - test_kill_loop: the leader SIGKILLed (3 times; FERRY_HA_KILLS=30 for
 *    the note), each time in another phase of a round;
 *  - test_host_lost_mid_publish: the leader runs in a network namespace of
 *    the test's own with its co-located node (a "host"); in the middle of a
 *    publish the host goes silent (its link down) and every process in it
 *    is SIGKILLed at once (once; FERRY_HA_HOST_KILLS for more), then the
 *    host is rebuilt as a standby and leads again.
 * After every failover the test checks every acknowledged operation
 * (objects, CAS values, the active generation loaded whole and newer than
 * or equal to the last acknowledged one, every acknowledged push delivered)
 * and prints per fault class: acknowledged operations lost, failover times
 * (the kill to the first write acknowledged by the new leader), queue
 * records delivered more often than they were pushed, half-visible
 * generations. Waits are conditions with deadlines, never timings. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "util/ftetcd.h"
#include "util/ftlab.h"
#include "util/ftnetns.h"
#include "util/ftstore.h"

enum {
    OPS = 6,                    /* puts, CAS and pushes of a round, each */
    OBJ_BYTES = 1024,
    NT = 4, ROWS = 32, COLS = 256,   /* a generation: NT f32 tensors */
    WORLD = 2,
    MAX_KILLS = 200,
    MAX_PUSH = (MAX_KILLS * 2 + 4) * OPS,
    MAX_FO = 2 * MAX_KILLS + 2,
};
#define RETRY_MS 90000          /* an operation is retried this long across a failover */
/* A publish's barrier wait: an attempt that one rank left early (its call
 * failed at the failover) fails after it on the other, and is retried. */
#define PUB_TIMEOUT_MS 10000
#define MODEL "hak"
#define QUEUE "hak/q"
#define TENSOR_BYTES ((size_t)ROWS * COLS * 4)

typedef struct member { char port[40], dir[64], mdir[96]; const char *ns; ft_peer p; } member;

/* failover times of one fault class */
typedef struct fclass { const char *name; double t[MAX_FO]; int n; } fclass;

typedef struct env {
    ft_etcd3 e;
    member ms[2];
    ft_peer node[2];            /* node[1]: the trainers' (here); node[0]: host A's (test d) */
    uint64_t seg;               /* node[1]'s segment: every put and publish prefers it */
    char list[96];              /* both masters */
    /* test d: host A, a namespace joined to this one by a veth pair */
    char ns[32], va[16], vb[16], here[16], there[16];
    bool made;
    ferry_store *s, *rank[WORLD], *probe;
    /* what the clients saw acknowledged */
    int objs, cas, npushed;
    int tries[MAX_PUSH], times[MAX_PUSH];   /* push attempts; acked deliveries */
    uint64_t gen_acked, gen_next;
    int lost, dups, half, split, announced, not_announced;
    /* host A's node (each incarnation's segment): what landed there is lost
     * with the host, by the placement's own rule (one replica; a preferred
     * segment is a preference: during a takeover's re-attach window a put
     * lands on whichever node re-attached first) — counted, not a loss of
     * an acknowledgement */
    uint64_t seg_a[MAX_KILLS + 2];
    int nseg_a, with_host, objs_with_host;
    uint64_t gen_with_host;     /* the last generation found lost with the host */
    uint64_t obj_seg[MAX_PUSH]; /* where each object landed (0: not known) */
    bool obj_gone[MAX_PUSH];
    char why[512];              /* the first loss or half-visible generation */
    /* the killer thread */
    pthread_t killer;
    bool killer_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long ops, target;           /* acknowledged steps; the one the next kill waits for */
    bool armed, struck, quit, host_mode;
    int kphase;                 /* test d: 0 publish started, 1 a part recorded, 2 decision claimed */
    uint64_t kgen;              /* the generation being published */
    char kerr[256];
    fclass sigkill, host;
} env;

/* ---- processes -------------------------------------------------------------------- */

static void member_start(env *v, int i)
{
    member *m = &v->ms[i];
    const char *args[] = { "master", "--dir", m->mdir, "--listen", m->port, "--etcd", v->e.urls,
                           "--cluster", "hak", NULL };
    if (ft_spawn_exe(&m->p, m->ns, ft_ferry_bin(), args) != 0)
        m->p.pid = -1;
}

static int node_start(env *v, int i, const char *ns, const char *listen, uint64_t *seg)
{
    const char *args[] = { "node", "--master", v->list, "--size", "32M", "--listen", listen, NULL };
    if (ft_spawn_exe(&v->node[i], ns, ft_ferry_bin(), args) != 0)
        return -1;
    char line[512] = "";
    if (ft_read_line(&v->node[i], line, sizeof line, FT_START_MS) != 0 || !strstr(line, "mounted"))
        return -1;
    const char *at = strstr(line, "segment ");
    uint64_t id = at ? strtoull(at + 8, NULL, 16) : 0;
    if (seg)
        *seg = id;
    if (i == 0 && v->nseg_a < MAX_KILLS + 2)
        v->seg_a[v->nseg_a++] = id;
    return 0;
}

/* Whether something accepts connections at HOST:PORT now (a standby does
 * not listen); a silent host answers nothing within 300 ms. */
static bool accepts(const char *hostport)
{
    char host[40];
    snprintf(host, sizeof host, "%s", hostport);
    char *colon = strrchr(host, ':');
    if (!colon)
        return false;
    *colon = 0;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return false;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return false;
    bool ok = false;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        ok = true;
    } else if (errno == EINPROGRESS) {
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        int e = 0;
        socklen_t el = sizeof e;
        ok = poll(&p, 1, 300) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0;
    }
    close(fd);
    return ok;
}

/* The member that leads (listens), within the deadline; -1. */
static int leader_of(env *v, int timeout_ms)
{
    for (uint64_t dl = fr_deadline_ns(timeout_ms); fr_ms_left(dl); ft_pause_20ms())
        for (int i = 0; i < 2; i++)
            if (v->ms[i].p.pid > 0 && ft_proc_alive(v->ms[i].p.pid, ft_proc_start(v->ms[i].p.pid)) &&
                accepts(v->ms[i].port))
                return i;
    return -1;
}

/* A master that stopped by itself (its lease lapsed on a loaded machine)
 * is started again as a standby, as a service manager would. */
static void restart_stopped(env *v)
{
    for (int i = 0; i < 2; i++) {
        member *m = &v->ms[i];
        if (m->p.pid > 0 && ft_proc_alive(m->p.pid, ft_proc_start(m->p.pid)))
            continue;
        if (m->ns && !v->made)
            continue;
        ft_proc_kill(&m->p, SIGKILL);   /* reaps */
        member_start(v, i);
    }
}

/* ---- the workload ----------------------------------------------------------------- */

static void step(env *v)
{
    pthread_mutex_lock(&v->mu);
    v->ops++;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

static bool transient(int rc)
{
    return rc != 0 && rc != FERRY_ENOENT && rc != FERRY_EEXIST && rc != FERRY_ESTATE &&
           rc != FERRY_ESTALE && rc != FERRY_EINVAL;
}

/* An earlier try of a put landed: the object is there, complete, with its
 * bytes (EEXIST alone is no proof: a try whose answer was lost may have
 * left it pending, and then it is revoked, not completed). */
static bool complete(env *v, const char *k, const uint8_t *want)
{
    void *got = NULL;
    size_t len = 0;
    bool ok = ferry_store_get(v->s, k, &got, &len, NULL) == 0 && len == OBJ_BYTES &&
              !memcmp(got, want, OBJ_BYTES);
    ferry_store_free(got);
    return ok;
}

static void put_objects(env *v)
{
    static uint8_t buf[OBJ_BYTES];
    const ferry_replicate_config rc = { .replica_num = 1, .preferred_segments = &v->seg,
                                        .npreferred = 1 };
    char k[48];
    for (int i = 0; i < OPS; i++) {
        int id = v->objs, r;
        snprintf(k, sizeof k, "hak/obj/%d", id);
        ft_pattern(buf, OBJ_BYTES, (uint64_t)id, 0);
        uint64_t dl = fr_deadline_ns(RETRY_MS);
        ferry_object_desc placed;
        memset(&placed, 0, sizeof placed);
        while ((r = ferry_store_put(v->s, k, buf, OBJ_BYTES, &rc, &placed, NULL)) != 0 &&
               !(r == FERRY_EEXIST && complete(v, k, buf)) && fr_ms_left(dl))
            ft_pause_20ms();
        assert_true(r == 0 || r == FERRY_EEXIST);   /* EEXIST: an earlier try landed, whole */
        v->obj_seg[id] = r == 0 && placed.nreplicas ? placed.replicas[0].segment : 0;
        v->objs++;
        step(v);
    }
}

static void cas_values(env *v)
{
    char k[48], val[32];
    for (int i = 0; i < OPS; i++) {
        int id = v->cas, r;
        snprintf(k, sizeof k, "hak/cas/%d", id);
        snprintf(val, sizeof val, "c%d", id * 3);
        r = ft_kv_create_retried(v->s, k, val, RETRY_MS);   /* ESTATE: another value there */
        assert_int_equal(r, 0);
        v->cas++;
        step(v);
    }
}

static void push_records(env *v)
{
    char rec[24];
    for (int i = 0; i < OPS && v->npushed < MAX_PUSH; i++) {
        int n = v->npushed, r;
        snprintf(rec, sizeof rec, "r%d", n);
        r = ft_queue_push_retried(v->s, QUEUE, rec, RETRY_MS, &v->tries[n]);
        assert_int_equal(r, 0);
        v->npushed++;
        step(v);
    }
}

/* Ack one delivery, retried across a failover: true when it is acked
 * (FERRY_ENOENT after a try whose answer was lost: that try landed);
 * false when its lease lapsed (it comes back: FERRY_ESTALE). */
static bool ack_one(env *v, const ferry_qrecord *r)
{
    uint64_t dl = fr_deadline_ns(RETRY_MS);
    int rc, tries = 0;
    while (tries++, (rc = ferry_queue_ack(v->s, r->id, r->token, NULL)) != 0 && transient(rc) &&
           fr_ms_left(dl))
        ft_pause_20ms();
    return rc == 0 || (rc == FERRY_ENOENT && tries > 1);
}

/* Pop up to max records (leased 2 s) and ack them; how many were acked. */
static int pop_ack(env *v, uint32_t max)
{
    ferry_qrecord recs[16];
    size_t n = 0;
    if (max > 16)
        max = 16;
    if (ferry_queue_pop(v->s, QUEUE, max, 2000, recs, &n, NULL) != 0)
        return 0;   /* a pop whose answer was lost: its records come back after the lease */
    int acked = 0;
    for (size_t i = 0; i < n; i++) {
        int p = -1;
        if (recs[i].len > 1 && recs[i].len < 16 && ((const char *)recs[i].data)[0] == 'r') {
            char num[16];
            snprintf(num, sizeof num, "%.*s", (int)recs[i].len - 1, (const char *)recs[i].data + 1);
            p = atoi(num);
        }
        if (!ack_one(v, &recs[i]))
            continue;
        acked++;
        if (p < 0 || p >= v->npushed) {
            snprintf(v->why, sizeof v->why, "a record nobody pushed was delivered: %.*s",
                     (int)recs[i].len, (const char *)recs[i].data);
            v->lost++;
            continue;
        }
        if (++v->times[p] > v->tries[p])
            v->dups++;   /* delivered and acked more often than it was pushed */
    }
    ferry_qrecords_free(recs, n);
    return acked;
}

/* Every acknowledged push delivered and acked (records whose pop answer
 * was lost come back after their 2 s lease). */
static void drain(env *v)
{
    uint64_t dl = fr_deadline_ns(RETRY_MS);
    for (;;) {
        int missing = 0, first = -1;
        for (int i = 0; i < v->npushed; i++)
            if (v->times[i] == 0 && missing++ == 0)
                first = i;
        if (missing == 0)
            return;
        if (!fr_ms_left(dl)) {
            v->lost += missing;
            snprintf(v->why, sizeof v->why, "%d acknowledged pushes never delivered (r%d first)",
                     missing, first);
            return;
        }
        if (pop_ack(v, 16) == 0)
            ft_pause_20ms();
    }
}

/* ---- generations ------------------------------------------------------------------ */

static void tensor_bytes(uint8_t *b, uint64_t gen, int k)
{
    ft_pattern(b, TENSOR_BYTES, gen * 100 + (uint64_t)k, 0);
}

typedef struct rank_job {
    env *v;
    uint32_t rank;
    uint64_t gen;
    int rc;
    char msg[sizeof(ferry_error){0}.msg];
    pthread_t t;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    static const uint32_t rank_node[WORLD] = { 0, 0 };
    uint8_t *data = malloc(NT * TENSOR_BYTES);
    char names[NT][24];
    ferry_weight_tensor t[NT];
    memset(t, 0, sizeof t);
    j->rc = FERRY_ENOMEM;
    if (!data)
        return NULL;
    for (int k = 0; k < NT; k++) {
        snprintf(names[k], sizeof names[k], "layer.%d.w", k);
        tensor_bytes(data + k * TENSOR_BYTES, j->gen, k);
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = "f32", .ndim = 2,
                                      .shape = { ROWS, COLS }, .data = data + k * TENSOR_BYTES };
    }
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, "%s", MODEL);
    pc.rank = j->rank;
    pc.world = WORLD;
    pc.rank_node = rank_node;
    pc.segment = j->v->seg;
    pc.timeout_ms = PUB_TIMEOUT_MS;
    ferry_error err = {0};
    j->rc = ferry_publish(j->v->rank[j->rank], &pc, j->gen, t, NT, NULL, &err);
    snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    free(data);
    return NULL;
}

/* A rollout update of the active generation into buffers of its own,
 * every byte compared with what the trainers held: 0 with *gen, or the
 * error (FERRY_ECORRUPT for a byte that differs). */
static int update_check(ferry_store *s, uint64_t *gen, char *why, size_t cap)
{
    static uint8_t got[NT][TENSOR_BYTES], want[TENSOR_BYTES];
    char names[NT][24];
    ferry_param_shard sh[NT];
    memset(sh, 0, sizeof sh);
    for (int k = 0; k < NT; k++) {
        snprintf(names[k], sizeof names[k], "layer.%d.w", k);
        sh[k] = (ferry_param_shard){ .tensor = names[k], .ndim = 2, .shape = { ROWS, COLS },
                                     .dst = got[k], .dst_bytes = TENSOR_BYTES, .elem_bytes = 4 };
    }
    uint64_t g = 0;
    ferry_error err = {0};
    int rc = ferry_weights_update_direct(s, MODEL, &g, sh, NT, NULL, &err);
    if (rc != 0) {
        snprintf(why, cap, "update: %d %.300s", rc, err.msg);
        return rc;
    }
    for (int k = 0; k < NT; k++) {
        tensor_bytes(want, g, k);
        if (memcmp(got[k], want, TENSOR_BYTES)) {
            snprintf(why, cap, "generation %llu: tensor %d differs", (unsigned long long)g, k);
            return FERRY_ECORRUPT;
        }
    }
    *gen = g;
    return 0;
}

/* update_check retried across a failover; a lost generation (FERRY_ELOST,
 * its node gone) for at most LOST_MS: nodes re-attach to a new leader
 * within that. */
#define LOST_MS 15000
static int update_retried(ferry_store *s, uint64_t *g, char *why, size_t cap)
{
    uint64_t dl = fr_deadline_ns(RETRY_MS), lost_dl = fr_deadline_ns(LOST_MS);
    int rc;
    while ((rc = update_check(s, g, why, cap)) != 0 && fr_ms_left(dl) &&
           (rc != FERRY_ELOST || fr_ms_left(lost_dl)))
        ft_pause_20ms();
    return rc;
}

static bool on_host_a(const env *v, uint64_t seg)
{
    for (int i = 0; i < v->nseg_a; i++)
        if (seg && seg == v->seg_a[i])
            return true;
    return false;
}

/* The active generation is lost (FERRY_ELOST): whether it landed on host
 * A's node (its probes name one segment per segment it landed on), and
 * then counted once as lost with the host. */
static bool with_host(env *v, ferry_store *s)
{
    uint64_t g = 0;
    uint8_t d[16];
    if (ferry_weights_active(s, MODEL, &g, d, NULL) != FERRY_ELOST || g == 0)
        return false;
    char k[128], text[2048];
    snprintf(k, sizeof k, "ferry/wk/%s/%020llu/probe", MODEL, (unsigned long long)g);
    ferry_kv_value kv = {0};
    if (ferry_kv_get(s, k, &kv, NULL) != 0)
        return false;
    snprintf(text, sizeof text, "%.*s", (int)kv.len, (const char *)kv.val);
    ferry_store_free(kv.val);
    bool on = false;
    for (char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        on |= on_host_a(v, strtoull(p, NULL, 10));   /* "segment TAB key" lines */
    if (on && g != v->gen_with_host) {
        v->with_host++;
        v->gen_with_host = g;
        fprintf(stderr, "generation %llu lost with host A's node (placed there)\n",
                (unsigned long long)g);
    }
    return on;
}

/* The active generation loads whole and is not older than the last one
 * acknowledged; retried across a failover. Counts a half-visible or lost
 * generation. */
static void check_generation(env *v, ferry_store *s)
{
    if (v->gen_acked == 0)
        return;
    char why[400] = "";
    uint64_t g = 0;
    int rc = update_retried(s, &g, why, sizeof why);
    if (rc == FERRY_ELOST && with_host(v, s)) {
        /* counted by with_host */
    } else if (rc != 0) {
        v->half++;
        snprintf(v->why, sizeof v->why, "the active generation does not load whole: %s", why);
    } else if (g < v->gen_acked) {
        v->lost++;
        snprintf(v->why, sizeof v->why, "active generation %llu, generation %llu was acknowledged",
                 (unsigned long long)g, (unsigned long long)v->gen_acked);
    }
}

/* The active generation, retried across a failover (0: none). */
static uint64_t active_gen(env *v)
{
    uint64_t g = 0;
    uint8_t d[16];
    uint64_t dl = fr_deadline_ns(RETRY_MS);
    int rc;
    while ((rc = ferry_weights_active(v->s, MODEL, &g, d, NULL)) != 0 && rc != FERRY_ENOENT &&
           rc != FERRY_ELOST && fr_ms_left(dl))
        ft_pause_20ms();
    return rc == FERRY_ENOENT ? 0 : g;
}

/* Publish the next generation from both ranks, again while it was not
 * announced. The verdict of every attempt: announced whole or not at all
 * (the previous generation still active and whole). */
static void publish_round(env *v)
{
    uint64_t gen = ++v->gen_next;
    uint64_t dl = fr_deadline_ns(2 * RETRY_MS);
    for (int attempt = 0; fr_ms_left(dl); attempt++) {
        rank_job j[WORLD];
        pthread_mutex_lock(&v->mu);
        v->kgen = gen;
        pthread_mutex_unlock(&v->mu);
        for (uint32_t r = 0; r < WORLD; r++) {
            j[r] = (rank_job){ .v = v, .rank = r, .gen = gen };
            assert_int_equal(pthread_create(&j[r].t, NULL, rank_main, &j[r]), 0);
        }
        step(v);   /* the publish is in flight */
        for (int r = 0; r < WORLD; r++)
            pthread_join(j[r].t, NULL);
        if ((j[0].rc == 0) != (j[1].rc == 0)) {
            v->split++;
            fprintf(stderr, "generation %llu: the ranks were told apart: %d '%s' / %d '%s'\n",
                    (unsigned long long)gen, j[0].rc, j[0].msg, j[1].rc, j[1].msg);
        }
        uint64_t a = active_gen(v);
        if (j[0].rc == 0 || j[1].rc == 0) {   /* acknowledged: announced */
            if (a < gen) {
                v->lost++;
                snprintf(v->why, sizeof v->why, "generation %llu acknowledged, %llu active",
                         (unsigned long long)gen, (unsigned long long)a);
            }
            v->gen_acked = gen;
            v->announced++;
            return;
        }
        if (a >= gen) {   /* announced, its answer lost */
            v->gen_acked = gen;
            v->announced++;
            return;
        }
        v->not_announced++;
        fprintf(stderr, "generation %llu attempt %d not announced (%d %s); active %llu\n",
                (unsigned long long)gen, attempt, j[0].rc, j[0].msg, (unsigned long long)a);
        check_generation(v, v->s);   /* the previous one still loads whole */
        ft_pause_20ms();
    }
    fail_msg("generation %llu was never published", (unsigned long long)gen);
}

/* A round: puts, CAS, pushes, a pop and its acks, a publish, an update. */
static void round_of(env *v)
{
    put_objects(v);
    cas_values(v);
    push_records(v);
    (void)pop_ack(v, OPS);
    step(v);
    publish_round(v);
    step(v);
    char why[400] = "";
    uint64_t g = 0;
    int rc = update_retried(v->s, &g, why, sizeof why);
    if (rc == FERRY_ELOST && with_host(v, v->s)) {
        /* counted by with_host */
    } else if (rc != 0 || g < v->gen_acked) {
        v->half += rc != 0;
        v->lost += rc == 0;
        snprintf(v->why, sizeof v->why, "the update after generation %llu: %s (got %llu)",
                 (unsigned long long)v->gen_acked, why, (unsigned long long)g);
    }
    step(v);
}

/* Every acknowledged operation so far, after a failover. */
static void check_all(env *v)
{
    static uint8_t want[OBJ_BYTES];
    char k[48], val[32];
    for (int id = 0; id < v->objs; id++) {
        if (v->obj_gone[id])
            continue;
        snprintf(k, sizeof k, "hak/obj/%d", id);
        void *got = NULL;
        size_t len = 0;
        int rc;
        uint64_t dl = fr_deadline_ns(RETRY_MS);
        while (transient(rc = ferry_store_get(v->s, k, &got, &len, NULL)) && fr_ms_left(dl))
            ft_pause_20ms();
        ft_pattern(want, OBJ_BYTES, (uint64_t)id, 0);
        if ((rc == FERRY_ELOST || rc == FERRY_ENOENT) && on_host_a(v, v->obj_seg[id])) {
            v->obj_gone[id] = true;   /* it landed on host A's node */
            v->objs_with_host++;
        } else if (rc != 0 || len != OBJ_BYTES || memcmp(got, want, OBJ_BYTES)) {
            v->lost++;
            snprintf(v->why, sizeof v->why, "object %s: %d", k, rc);
        }
        ferry_store_free(got);
    }
    for (int id = 0; id < v->cas; id++) {
        snprintf(k, sizeof k, "hak/cas/%d", id);
        snprintf(val, sizeof val, "c%d", id * 3);
        ferry_kv_value kv = {0};
        int rc;
        uint64_t dl = fr_deadline_ns(RETRY_MS);
        while (transient(rc = ferry_kv_get(v->s, k, &kv, NULL)) && fr_ms_left(dl))
            ft_pause_20ms();
        if (rc != 0 || kv.len != strlen(val) || memcmp(kv.val, val, kv.len)) {
            v->lost++;
            snprintf(v->why, sizeof v->why, "CAS %s: %d", k, rc);
        }
        if (rc == 0)
            ferry_store_free(kv.val);
    }
    check_generation(v, v->s);
    drain(v);
}

/* ---- the killer ------------------------------------------------------------------- */

static double median(double *t, int n)
{
    for (int i = 1; i < n; i++)   /* insertion sort: a few dozen figures */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return n == 0 ? 0 : n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* From t0 to the first write the new leader acknowledges (the killer's own
 * client); negative past the deadline. */
static double first_ack(env *v, uint64_t t0, int k)
{
    char key[32];
    snprintf(key, sizeof key, "hak/probe/%d", k);
    for (uint64_t dl = fr_deadline_ns(RETRY_MS); fr_ms_left(dl); ft_pause_20ms())
        if (ferry_kv_put(v->probe, key, "1", 1, NULL, NULL) == 0)
            return (double)(fr_now_ns() - t0) / 1e9;
    return -1;
}

static int sigkill_leader(env *v, fclass *c, int k)
{
    restart_stopped(v);   /* a standby to take over */
    int l = leader_of(v, RETRY_MS);
    if (l < 0) {
        snprintf(v->kerr, sizeof v->kerr, "no master led before kill %d", k);
        return -1;
    }
    uint64_t t0 = fr_now_ns();
    ft_proc_kill(&v->ms[l].p, SIGKILL);
    double took = first_ack(v, t0, k);
    if (took < 0) {
        snprintf(v->kerr, sizeof v->kerr, "no write acknowledged after kill %d", k);
        return -1;
    }
    c->t[c->n++] = took;
    member_start(v, l);   /* back, as a standby */
    return l;
}

static bool key_seen(env *v, const char *what)
{
    char k[128];
    snprintf(k, sizeof k, "ferry/wk/%s/%020llu/%s", MODEL, (unsigned long long)v->kgen, what);
    ferry_kv_value kv = {0};
    if (ferry_kv_get(v->probe, k, &kv, NULL) != 0)
        return false;
    ferry_store_free(kv.val);
    return true;
}

/* Host A lost: silent first (its link down: no FIN, no RST leaves it),
 * then every process in it SIGKILLed at once. */
static int host_lost(env *v, int k)
{
    /* the phase of the publish to strike in: started, a part recorded, the decision claimed */
    const char *wait_for = v->kphase == 1 ? "part/0" : v->kphase == 2 ? "status" : NULL;
    for (uint64_t dl = fr_deadline_ns(PUB_TIMEOUT_MS); wait_for && fr_ms_left(dl); ft_pause_20ms()) {
        uint64_t a = 0;
        uint8_t d[16];
        if (key_seen(v, wait_for) ||
            (ferry_weights_active(v->probe, MODEL, &a, d, NULL) == 0 && a >= v->kgen))
            break;
    }
    if (leader_of(v, RETRY_MS) != 0) {
        snprintf(v->kerr, sizeof v->kerr, "host A's master did not lead before loss %d", k);
        return -1;
    }
    uint64_t t0 = fr_now_ns();
    char out[1024];
    if (ft_sh("ip -n %s link set %s down", v->ns, v->vb) != 0 ||
        ft_run(out, sizeof out, "ip netns pids %s", v->ns) != 0) {
        snprintf(v->kerr, sizeof v->kerr, "could not cut host A");
        return -1;
    }
    int n = 0;
    for (char *p = strtok(out, " \n"); p; p = strtok(NULL, " \n"))
        n += kill((pid_t)atoi(p), SIGKILL) == 0;
    ft_proc_kill(&v->ms[0].p, SIGKILL);   /* reaped */
    ft_proc_kill(&v->node[0], SIGKILL);
    if (ft_run(out, sizeof out, "ip netns pids %s", v->ns) != 0 || out[0] || n < 2) {
        snprintf(v->kerr, sizeof v->kerr, "host A's processes: %d killed, left: %.100s", n, out);
        return -1;
    }
    double took = first_ack(v, t0, k);
    if (took < 0) {
        snprintf(v->kerr, sizeof v->kerr, "no write acknowledged after host loss %d", k);
        return -1;
    }
    v->host.t[v->host.n++] = took;
    fprintf(stderr, "host A lost (phase %d of generation %llu): %d processes killed, the first "
            "write acknowledged %.2f s later\n", v->kphase, (unsigned long long)v->kgen, n, took);
    /* rebuilt: its link up, its master a standby, its node a new incarnation */
    char listen[40];
    snprintf(listen, sizeof listen, "%s:0", v->there);
    if (ft_sh("ip -n %s link set %s up", v->ns, v->vb) != 0 ||
        (member_start(v, 0), v->ms[0].p.pid < 0) ||
        node_start(v, 0, v->ns, listen, NULL) != 0) {
        snprintf(v->kerr, sizeof v->kerr, "host A could not be rebuilt");
        return -1;
    }
    /* and leads again: the other master killed (a plain leader kill) */
    return sigkill_leader(v, &v->sigkill, 1000 + k) < 0 ? -1 : 0;
}

static void *killer_main(void *arg)
{
    env *v = arg;
    for (int k = 0;; k++) {
        pthread_mutex_lock(&v->mu);
        while (!v->quit && !(v->armed && v->ops >= v->target)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;   /* woken by every step; the second only bounds a lost wake-up */
            pthread_cond_timedwait(&v->cv, &v->mu, &ts);
        }
        bool quit = v->quit;
        v->armed = false;
        pthread_mutex_unlock(&v->mu);
        if (quit)
            return NULL;
        int rc = v->host_mode ? host_lost(v, k) : sigkill_leader(v, &v->sigkill, k);
        restart_stopped(v);
        pthread_mutex_lock(&v->mu);
        v->struck = true;
        if (rc < 0)
            v->quit = true;
        pthread_cond_broadcast(&v->cv);
        pthread_mutex_unlock(&v->mu);
        if (rc < 0)
            return NULL;
    }
}

/* Arm the next kill at step `offset` of the coming round. */
static void arm(env *v, long offset, int phase)
{
    pthread_mutex_lock(&v->mu);
    v->target = v->ops + offset;
    v->kphase = phase;
    v->struck = false;
    v->armed = true;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

/* After the round: until the killer has struck and the cluster is back. */
static void wait_struck(env *v)
{
    uint64_t dl = fr_deadline_ns(4 * RETRY_MS);
    pthread_mutex_lock(&v->mu);
    while (!v->struck && !v->quit && fr_ms_left(dl)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&v->cv, &v->mu, &ts);
    }
    bool ok = v->struck && !v->kerr[0];
    pthread_mutex_unlock(&v->mu);
    if (!ok)
        fail_msg("the kill did not complete: %s", v->kerr[0] ? v->kerr : "past its deadline");
}

/* ---- fixtures --------------------------------------------------------------------- */

static int open_client(env *v, ferry_store **s)
{
    ft_cluster any;
    memset(&any, 0, sizeof any);
    snprintf(any.addr, sizeof any.addr, "%s", v->ms[1].port);
    ferry_store_config cfg;
    ft_store_config(&any, &cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", v->list);
    cfg.timeout_ms = 3000;   /* a silent host is given up after this, then the other master */
    return ferry_store_open(&cfg, s, NULL);
}

/* host: where etcd, master 1 and the clients are reached (this namespace);
 * there: master 0's address (host A's with a namespace, else the same). */
static int env_start(env *v, const char *here, const char *there)
{
    if (ft_etcd3_start_on(&v->e, here) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        member *m = &v->ms[i];
        m->ns = i == 0 && v->made ? v->ns : NULL;
        snprintf(m->port, sizeof m->port, "%s:%d", i == 0 ? there : here, ft_free_port());
        snprintf(m->dir, sizeof m->dir, "/tmp/ferry-ha-kill-XXXXXX");
        if (!mkdtemp(m->dir)) {
            m->dir[0] = 0;
            return -1;
        }
        char md[sizeof m->mdir];
        snprintf(md, sizeof md, "%s/master", m->dir);
        memcpy(m->mdir, md, sizeof md);
    }
    snprintf(v->list, sizeof v->list, "%s,%s", v->ms[0].port, v->ms[1].port);
    member_start(v, 0);
    char line[512] = "";
    if (v->ms[0].p.pid < 0 || ft_read_line(&v->ms[0].p, line, sizeof line, FT_START_MS) != 0 ||
        !strstr(line, "listening on"))
        return -1;
    member_start(v, 1);   /* the standby */
    char listen[40];
    snprintf(listen, sizeof listen, "%s:0", there);
    if ((v->made && node_start(v, 0, v->ns, listen, NULL) != 0))
        return -1;
    snprintf(listen, sizeof listen, "%s:0", here);
    if (node_start(v, 1, NULL, listen, &v->seg) != 0 || v->seg == 0)
        return -1;
    if (open_client(v, &v->s) != 0 || open_client(v, &v->probe) != 0)
        return -1;
    for (int r = 0; r < WORLD; r++)
        if (open_client(v, &v->rank[r]) != 0)
            return -1;
    if (pthread_create(&v->killer, NULL, killer_main, v) != 0)
        return -1;
    v->killer_on = true;
    return 0;
}

static env *env_new(void)
{
    env *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    for (int i = 0; i < 3; i++)
        v->e.p[i].pid = -1;
    for (int i = 0; i < 2; i++)
        v->ms[i].p.pid = v->node[i].pid = -1;
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->cv, NULL);
    v->sigkill.name = "leader SIGKILL";
    v->host.name = "leader's host lost mid-publish";
    return v;
}

static int teardown(void **state);

/* cmocka runs no teardown after a failed setup: a failed start is undone here */
static int started(void **state, int rc)
{
    if (rc != 0) {
        teardown(state);
        *state = NULL;
    }
    return rc;
}

static int setup(void **state)
{
    env *v = env_new();
    *state = v;
    return started(state, v && env_start(v, "127.0.0.1", "127.0.0.1") == 0 ? 0 : -1);
}


static int host_setup(void **state)
{
    env *v = env_new();
    *state = v;
    if (!v)
        return -1;
    if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1") != 0)
        return 0;   /* the test skips, saying why */
    int id = (int)getpid() % 100000;
    snprintf(v->ns, sizeof v->ns, "ferryhk-%d", (int)getpid());
    snprintf(v->va, sizeof v->va, "fhk%da", id);
    snprintf(v->vb, sizeof v->vb, "fhk%db", id);
    /* a subnet of this run's own: two runs at once must not share one */
    snprintf(v->here, sizeof v->here, "10.215.%d.1", (int)getpid() % 250);
    snprintf(v->there, sizeof v->there, "10.215.%d.2", (int)getpid() % 250);
    v->made = ft_sh("ip netns add %s", v->ns) == 0;
    if (!v->made || ft_sh("ip link add %s type veth peer name %s", v->va, v->vb) != 0 ||
        ft_sh("ip link set %s netns %s", v->vb, v->ns) != 0 ||
        ft_sh("ip addr add %s/24 dev %s && ip link set %s up", v->here, v->va, v->va) != 0 ||
        ft_sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up && ip -n %s link set lo up",
              v->ns, v->there, v->vb, v->ns, v->vb, v->ns) != 0)
        return started(state, -1);
    return started(state, env_start(v, v->here, v->there));
}

static int teardown(void **state)
{
    env *v = *state;
    if (!v)
        return 0;
    if (v->killer_on) {
        pthread_mutex_lock(&v->mu);
        v->quit = true;
        pthread_cond_broadcast(&v->cv);
        pthread_mutex_unlock(&v->mu);
        pthread_join(v->killer, NULL);
    }
    for (int r = 0; r < WORLD; r++)
        ferry_store_close(v->rank[r]);
    ferry_store_close(v->s);
    ferry_store_close(v->probe);
    char cmd[160];
    for (int i = 0; i < 2; i++) {
        ft_proc_kill(&v->node[i], SIGKILL);
        ft_proc_kill(&v->ms[i].p, SIGKILL);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", v->ms[i].dir);
        if (v->ms[i].dir[0] && system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", v->ms[i].dir);
    }
    ft_etcd3_stop(&v->e);
    if (v->made) {
        char out[512] = "";
        if (ft_run(out, sizeof out, "ip netns pids %s", v->ns) == 0)
            for (char *p = strtok(out, " \n"); p; p = strtok(NULL, " \n"))
                kill((pid_t)atoi(p), SIGKILL);   /* nothing of the host outlives the test */
        (void)ft_sh("ip netns del %s", v->ns);   /* its end of the pair goes with it */
    }
    if (v->va[0]) {
        snprintf(cmd, sizeof cmd, "ip link del %s 2>/dev/null", v->va);
        (void)!system(cmd);
    }
    pthread_cond_destroy(&v->cv);
    pthread_mutex_destroy(&v->mu);
    free(v);
    return 0;
}

/* ---- the tests -------------------------------------------------------------------- */

static int env_int(const char *name, int dflt)
{
    const char *s = getenv(name);
    int n = s && *s ? atoi(s) : dflt;
    return n < 1 ? 1 : n > MAX_KILLS ? MAX_KILLS : n;
}

static void report(env *v, fclass *c, int kills)
{
    double t[MAX_FO];
    memcpy(t, c->t, sizeof t);
    double med = median(t, c->n);
    fprintf(stderr, "%s, %d times: acknowledged %d objects, %d CAS, %d pushes, %llu generations "
            "(%d announced, %d attempts not announced, %d answered apart); acked lost %d; "
            "failover (kill to the first acknowledged write) min %.2f / median %.2f / max %.2f s "
            "over %d; duplicate deliveries %d; half-visible generations %d; lost with host A's "
            "node (placed there): %d generations, %d objects%s%s\n",
            c->name, kills, v->objs, v->cas, v->npushed, (unsigned long long)v->gen_acked,
            v->announced, v->not_announced, v->split, v->lost, c->n ? t[0] : 0, med,
            c->n ? t[c->n - 1] : 0, c->n, v->dups, v->half, v->with_host, v->objs_with_host,
            v->why[0] ? ": " : "", v->why);
}

/* Item 4 (a): the leader SIGKILLed, each time in another phase of a round
 * (mid-puts, mid-CAS, mid-pushes, mid-publish, mid-update). */
static void test_kill_loop(void **state)
{
    env *v = *state;
    int kills = env_int("FERRY_HA_KILLS", 3);
    static const long at[] = { 3, OPS + 3, 2 * OPS + 3, 3 * OPS + 2, 3 * OPS + 3 };
    round_of(v);   /* a generation to keep loadable */
    for (int k = 0; k < kills; k++) {
        arm(v, at[(k + 3) % 5], 0);   /* the first kill mid-publish */
        round_of(v);
        wait_struck(v);
        check_all(v);
    }
    round_of(v);
    check_all(v);
    report(v, &v->sigkill, kills);
    assert_int_equal(v->sigkill.n, kills);
    assert_int_equal(v->lost, 0);
    assert_int_equal(v->dups, 0);
    assert_int_equal(v->half, 0);
    assert_true(v->gen_acked >= (uint64_t)kills + 2);
}

/* Item 4 (d): the leader's host lost in the middle of a publish (phases:
 * the publish started, a rank's part recorded, the decision claimed). */
static void test_host_lost_mid_publish(void **state)
{
    env *v = *state;
    ft_lab_need_root();   /* a network namespace of its own */
    assert_true(v->made);
    int kills = env_int("FERRY_HA_HOST_KILLS", 1);
    v->host_mode = true;
    round_of(v);   /* generation 1: active while the next is published */
    for (int k = 0; k < kills; k++) {
        arm(v, 3 * OPS + 2, k % 3);   /* the step that starts the publish */
        round_of(v);
        wait_struck(v);
        check_all(v);
    }
    round_of(v);   /* the rebuilt cluster publishes again */
    check_all(v);
    report(v, &v->host, kills);
    report(v, &v->sigkill, v->sigkill.n);
    assert_int_equal(v->host.n, kills);
    assert_int_equal(v->lost, 0);
    assert_int_equal(v->dups, 0);
    assert_int_equal(v->half, 0);
    assert_true(v->gen_acked >= (uint64_t)kills + 2);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_lost_mid_publish, host_setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
