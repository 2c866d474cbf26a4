/* Replicated masters on a 3-member etcd cluster under faults (docs/store.md,
 * "Operating replicated masters"): two `ferry master --etcd` and a node on
 * loopback, a client running a workload of object puts, KV compare-and-swap
 * and queue push/pop/ack, every acknowledgement logged.
 *  - one etcd member killed: quorum holds, the workload goes on;
 *  - a second one killed: no quorum, nothing is acknowledged, the leader
 *    stops, the standby waits;
 *  - both members back: a master leads again (the standby, or the stopped
 *    one started again as a service manager would) and every acknowledged
 *    operation is there, no queue record delivered twice.
 * The fixtures kill and remove everything, also after a failed assertion. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "util/ftetcd.h"
#include "util/ftlab.h"
#include "util/ftnetns.h"
#include "util/ftstore.h"

enum { ROUND_OPS = 15, ROUNDS = 3, OBJ_BYTES = 1024, MAX_PUSH = ROUNDS * ROUND_OPS };
#define RETRY_MS 90000          /* an operation is retried this long across a failover */
#define QUEUE "f/q"

typedef struct member { char port[32], dir[64], mdir[96]; ft_peer p; } member;

typedef struct env {
    ft_etcd3 e;
    member ms[2];
    ft_peer node;
    char dir[64];
    /* what the workload saw acknowledged */
    int objs, cas;
    char pushed[MAX_PUSH][24];
    int tries[MAX_PUSH];         /* push attempts of each */
    int npushed;
    char acked[MAX_PUSH][24];    /* names popped and acknowledged, in order */
    int times[MAX_PUSH];         /* how often each */
    int nacked, dups;
} env;

static int setup(void **state)
{
    env *v = calloc(1, sizeof *v);
    *state = v;
    if (!v)
        return -1;
    v->node.pid = -1;
    for (int i = 0; i < 2; i++)
        v->ms[i].p.pid = -1;
    if (ft_etcd3_start(&v->e) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        member *m = &v->ms[i];
        snprintf(m->port, sizeof m->port, "127.0.0.1:%d", ft_free_port());
        snprintf(m->dir, sizeof m->dir, "/tmp/ferry-ha-faults-XXXXXX");
        if (!mkdtemp(m->dir)) {
            m->dir[0] = 0;
            return -1;
        }
        char md[sizeof m->mdir];
        snprintf(md, sizeof md, "%s/master", m->dir);
        memcpy(m->mdir, md, sizeof md);
    }
    return 0;
}

static int teardown(void **state)
{
    env *v = *state;
    if (!v)
        return 0;
    ft_proc_kill(&v->node, SIGKILL);
    char cmd[160];
    for (int i = 0; i < 2; i++) {
        ft_proc_kill(&v->ms[i].p, SIGKILL);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", v->ms[i].dir);
        if (v->ms[i].dir[0] && system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", v->ms[i].dir);
    }
    ft_etcd3_stop(&v->e);
    free(v);
    return 0;
}

static void start_member(env *v, int i)
{
    member *m = &v->ms[i];
    const char *args[] = { "master", "--dir", m->mdir, "--listen", m->port, "--etcd", v->e.urls,
                           "--cluster", "f", "--ha-ttl", "4", NULL };
    assert_int_equal(ft_spawn_exe(&m->p, NULL, ft_ferry_bin(), args), 0);
}

static void wait_listening(member *m)
{
    char line[512] = "";
    assert_int_equal(ft_read_line(&m->p, line, sizeof line, 120000), 0);
    assert_non_null(strstr(line, "listening on"));
}

static void masters(const env *v, char *out, size_t cap)
{
    snprintf(out, cap, "%s,%s", v->ms[0].port, v->ms[1].port);
}

static void obj_bytes(uint8_t *b, int id)
{
    ft_pattern(b, OBJ_BYTES, (uint64_t)id, 0);
}

/* One round: ROUND_OPS object puts, CAS creations and pushes, each retried
 * until acknowledged; then pops and acks what is there. */
static void workload(env *v, ferry_store *s)
{
    static uint8_t buf[OBJ_BYTES];
    char k[48], val[32];
    for (int i = 0; i < ROUND_OPS; i++) {
        int id = v->objs;
        snprintf(k, sizeof k, "f/obj/%d", id);
        obj_bytes(buf, id);
        int rc;
        uint64_t dl = fr_deadline_ns(RETRY_MS);
        while ((rc = ferry_store_put(s, k, buf, OBJ_BYTES, NULL, NULL, NULL)) != 0 &&
               rc != FERRY_EEXIST && fr_ms_left(dl))
            ft_pause_20ms();
        assert_true(rc == 0 || rc == FERRY_EEXIST);   /* EEXIST: an earlier try landed */
        v->objs++;

        id = v->cas;
        snprintf(k, sizeof k, "f/cas/%d", id);
        snprintf(val, sizeof val, "c%d", id * 3);
        rc = ft_kv_create_retried(s, k, val, RETRY_MS);   /* ESTATE: another value there */
        assert_int_equal(rc, 0);
        v->cas++;

        snprintf(v->pushed[v->npushed], sizeof v->pushed[0], "r%d", v->npushed);
        rc = ft_queue_push_retried(s, QUEUE, v->pushed[v->npushed], RETRY_MS, &v->tries[v->npushed]);
        assert_int_equal(rc, 0);
        v->npushed++;
    }
}

/* Pop and ack until every acknowledged push was delivered (records whose
 * pop answer was lost come back after their 2 s lease). A name delivered
 * and acked more often than its push was tried is a duplicate delivery (a
 * push retried after a lost answer may have queued it twice: those copies
 * are the client's own, not the store's). */
static void drain(env *v, ferry_store *s)
{
    uint64_t dl = fr_deadline_ns(RETRY_MS);
    while (v->nacked < v->npushed && fr_ms_left(dl)) {
        ferry_qrecord recs[16];
        size_t n = 0;
        if (ferry_queue_pop(s, QUEUE, 16, 2000, recs, &n, NULL) != 0 || n == 0) {
            ft_pause_20ms();
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            char name[24];
            snprintf(name, sizeof name, "%.*s", (int)recs[i].len, (const char *)recs[i].data);
            int rc = ferry_queue_ack(s, recs[i].id, recs[i].token, NULL);
            if (rc != 0)
                continue;   /* not acknowledged: it comes back after its lease */
            int j = 0;
            while (j < v->nacked && strcmp(v->acked[j], name))
                j++;
            if (j == v->nacked && v->nacked < MAX_PUSH)
                snprintf(v->acked[v->nacked++], sizeof v->acked[0], "%s", name);
            if (j < v->nacked)
                v->times[j]++;
            int p = atoi(name + 1);
            if (j < v->nacked && p >= 0 && p < v->npushed && v->times[j] > v->tries[p])
                v->dups++;
        }
        ferry_qrecords_free(recs, n);
    }
}

static void verify(env *v, ferry_store *s)
{
    static uint8_t want[OBJ_BYTES];
    char k[48], val[32];
    for (int id = 0; id < v->objs; id++) {
        snprintf(k, sizeof k, "f/obj/%d", id);
        void *got = NULL;
        size_t len = 0;
        assert_int_equal(ferry_store_get(s, k, &got, &len, NULL), 0);
        obj_bytes(want, id);
        assert_int_equal(len, OBJ_BYTES);
        assert_memory_equal(got, want, OBJ_BYTES);
        ferry_store_free(got);
    }
    for (int id = 0; id < v->cas; id++) {
        snprintf(k, sizeof k, "f/cas/%d", id);
        snprintf(val, sizeof val, "c%d", id * 3);
        ferry_kv_value kv;
        assert_int_equal(ferry_kv_get(s, k, &kv, NULL), 0);
        assert_int_equal(kv.len, strlen(val));
        assert_memory_equal(kv.val, val, kv.len);
        ferry_store_free(kv.val);
    }
    drain(v, s);
    for (int i = 0; i < v->npushed; i++) {
        bool got = false;
        for (int j = 0; j < v->nacked; j++)
            got |= !strcmp(v->acked[j], v->pushed[i]);
        if (!got)
            fail_msg("acknowledged push %s never delivered", v->pushed[i]);
    }
}

static void test_etcd_members_lost(void **state)
{
    env *v = *state;
    start_member(v, 0);
    wait_listening(&v->ms[0]);
    start_member(v, 1);   /* the standby */
    char list[80];
    masters(v, list, sizeof list);
    const char *nargs[] = { "node", "--master", list, "--size", "16M", NULL };
    char line[512] = "";
    assert_int_equal(ft_spawn_exe(&v->node, NULL, ft_ferry_bin(), nargs), 0);
    assert_int_equal(ft_read_line(&v->node, line, sizeof line, 120000), 0);
    assert_non_null(strstr(line, "mounted"));
    ft_cluster any;
    memset(&any, 0, sizeof any);
    snprintf(any.addr, sizeof any.addr, "%s", v->ms[0].port);
    ferry_store_config cfg;
    ft_store_config(&any, &cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", list);
    cfg.timeout_ms = 5000;
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);

    workload(v, s);                               /* all three members */
    ft_etcd3_kill(&v->e, 0);                      /* one member's machine gone: quorum holds */
    uint64_t t0 = fr_now_ns();
    workload(v, s);
    double one_lost = (double)(fr_now_ns() - t0) / 1e9;

    ft_etcd3_kill(&v->e, 1);                      /* a second one: no quorum */
    t0 = fr_now_ns();
    int rc = ferry_kv_put(s, "f/no-quorum", "x", 1, NULL, &err);
    double refused = (double)(fr_now_ns() - t0) / 1e9;
    assert_int_not_equal(rc, 0);                  /* nothing acknowledged without quorum */
    fprintf(stderr, "no quorum: a KV put refused after %.2f s: %s\n", refused, err.msg);
    /* the leader stops (its commit cannot be replicated, its lease cannot be renewed) */
    assert_int_equal(ft_peer_wait_exit(&v->ms[0].p, 120000), 0);
    double stopped = (double)(fr_now_ns() - t0) / 1e9;
    v->ms[0].p.pid = -1;
    /* the standby waits the outage out */
    assert_true(ft_proc_alive(v->ms[1].p.pid, ft_proc_start(v->ms[1].p.pid)));

    assert_int_equal(ft_etcd3_restart(&v->e, 0), 0);
    assert_int_equal(ft_etcd3_restart(&v->e, 1), 0);
    t0 = fr_now_ns();
    wait_listening(&v->ms[1]);                    /* quorum back: the standby leads */
    double back = (double)(fr_now_ns() - t0) / 1e9;
    start_member(v, 0);                           /* the stopped one, as a service manager would */
    workload(v, s);
    verify(v, s);
    fprintf(stderr, "one etcd member lost: a round of %d x 3 operations took %.2f s; two lost: "
            "the leader stopped %.2f s after the loss, the standby waited and led %.2f s after "
            "both came back; acknowledged: %d objects, %d CAS, %d pushes, 0 lost; %d queue "
            "records delivered, %d twice\n", ROUND_OPS, one_lost, stopped, back, v->objs, v->cas,
            v->npushed, v->nacked, v->dups);
    assert_int_equal(v->dups, 0);
    ferry_store_close(s);
}

/* ---- the leader partitioned ------------------------------------------------------- */

/* Host X: a network namespace of the test's own, joined to this one by a
 * veth pair (10.214.7.1 here, 10.214.7.2 there). The leader runs in X; etcd,
 * the standby and the client here. Cutting X's link cuts the leader from
 * etcd and from its clients at once. */
typedef struct part {
    char ns[32], va[16], vb[16];
    bool made;
    ft_etcd e;
    member ms[2];
} part;

#define PART_HERE "10.214.7.1"
#define PART_THERE "10.214.7.2"

static int part_setup(void **state)
{
    part *x = calloc(1, sizeof *x);
    *state = x;
    if (!x)
        return -1;
    for (int i = 0; i < 2; i++)
        x->ms[i].p.pid = -1;
    x->e.p.pid = -1;
    if (geteuid() != 0)
        return 0;   /* the test skips, saying why */
    snprintf(x->ns, sizeof x->ns, "ferryha-%d", (int)getpid());
    snprintf(x->va, sizeof x->va, "fha%da", (int)getpid() % 100000);
    snprintf(x->vb, sizeof x->vb, "fha%db", (int)getpid() % 100000);
    x->made = ft_sh("ip netns add %s", x->ns) == 0;
    if (!x->made || ft_sh("ip link add %s type veth peer name %s", x->va, x->vb) != 0 ||
        ft_sh("ip link set %s netns %s", x->vb, x->ns) != 0 ||
        ft_sh("ip addr add " PART_HERE "/24 dev %s && ip link set %s up", x->va, x->va) != 0 ||
        ft_sh("ip -n %s addr add " PART_THERE "/24 dev %s && ip -n %s link set %s up && "
           "ip -n %s link set lo up", x->ns, x->vb, x->ns, x->vb, x->ns) != 0 ||
        ft_etcd_start_on(&x->e, PART_HERE) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        member *m = &x->ms[i];
        snprintf(m->port, sizeof m->port, "%s:%d", i == 0 ? PART_THERE : PART_HERE, ft_free_port());
        snprintf(m->dir, sizeof m->dir, "/tmp/ferry-ha-part-XXXXXX");
        if (!mkdtemp(m->dir)) {
            m->dir[0] = 0;
            return -1;
        }
        char md[sizeof m->mdir];
        snprintf(md, sizeof md, "%s/master", m->dir);
        memcpy(m->mdir, md, sizeof md);
    }
    return 0;
}

static int part_teardown(void **state)
{
    part *x = *state;
    if (!x)
        return 0;
    char cmd[160];
    for (int i = 0; i < 2; i++) {
        ft_proc_kill(&x->ms[i].p, SIGKILL);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", x->ms[i].dir);
        if (x->ms[i].dir[0] && system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", x->ms[i].dir);
    }
    ft_etcd_stop(&x->e);
    if (x->made) {
        (void)ft_sh("ip netns del %s", x->ns);   /* its end of the pair goes with it */
    }
    if (x->va[0]) {
        snprintf(cmd, sizeof cmd, "ip link del %s 2>/dev/null", x->va);
        (void)!system(cmd);
    }
    free(x);
    return 0;
}

static void part_start(part *x, int i)
{
    member *m = &x->ms[i];
    const char *args[] = { "master", "--dir", m->mdir, "--listen", m->port, "--etcd", x->e.url,
                           "--cluster", "p", "--ha-ttl", "4", NULL };
    assert_int_equal(ft_spawn_exe(&m->p, i == 0 ? x->ns : NULL, ft_ferry_bin(), args), 0);
}

static int kv_retry(ferry_store *s, int i)
{
    char k[32], val[32];
    snprintf(k, sizeof k, "p/%d", i);
    snprintf(val, sizeof val, "v%d", i * 11);
    uint64_t dl = fr_deadline_ns(RETRY_MS);
    int rc;
    while ((rc = ferry_kv_put(s, k, val, strlen(val), NULL, NULL)) != 0 && fr_ms_left(dl))
        ft_pause_20ms();
    return rc;
}

/* The leader cut off from etcd and from its clients (its host's link
 * down): it stops by itself (its lease not renewed for a TTL), the standby
 * leads, no write acknowledged before or after is missing from it; with
 * the link back, the old leader comes back as a standby. */
static void test_leader_partitioned(void **state)
{
    part *x = *state;
    ft_lab_need_root();   /* a network namespace of its own */
    part_start(x, 0);
    wait_listening(&x->ms[0]);
    part_start(x, 1);
    ft_cluster any;
    memset(&any, 0, sizeof any);
    snprintf(any.addr, sizeof any.addr, "%s", x->ms[0].port);
    ferry_store_config cfg;
    ft_store_config(&any, &cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s,%s", x->ms[0].port, x->ms[1].port);
    cfg.timeout_ms = 3000;
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    enum { N = 60 };
    for (int i = 0; i < N; i++)
        assert_int_equal(kv_retry(s, i), 0);
    uint64_t t0 = fr_now_ns();
    assert_int_equal(ft_sh("ip -n %s link set %s down", x->ns, x->vb), 0);   /* the partition */
    double first = 0;
    for (int i = N; i < 2 * N; i++) {
        assert_int_equal(kv_retry(s, i), 0);      /* acknowledged by the standby, now leading */
        if (i == N)
            first = (double)(fr_now_ns() - t0) / 1e9;
    }
    /* the cut-off leader stops on its own: its lease could not be renewed */
    assert_int_equal(ft_peer_wait_exit(&x->ms[0].p, 60000), 0);
    double stopped = (double)(fr_now_ns() - t0) / 1e9;
    x->ms[0].p.pid = -1;
    assert_int_equal(ft_sh("ip -n %s link set %s up", x->ns, x->vb), 0);    /* healed */
    part_start(x, 0);                              /* back, as a standby */
    for (int i = 2 * N; i < 3 * N; i++)
        assert_int_equal(kv_retry(s, i), 0);
    for (int i = 0; i < 3 * N; i++) {
        char k[32], val[32];
        snprintf(k, sizeof k, "p/%d", i);
        snprintf(val, sizeof val, "v%d", i * 11);
        ferry_kv_value kv;
        assert_int_equal(ferry_kv_get(s, k, &kv, &err), 0);
        assert_int_equal(kv.len, strlen(val));
        assert_memory_equal(kv.val, val, kv.len);
        ferry_store_free(kv.val);
    }
    fprintf(stderr, "leader partitioned (TTL 4 s): the first write after the cut acknowledged "
            "by the standby %.2f s after it; the old leader had stopped by itself %.2f s after "
            "the cut (its exit seen then); %d acknowledged writes, 0 lost\n", first, stopped,
            3 * N);
    ferry_store_close(s);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_etcd_members_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leader_partitioned, part_setup, part_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
