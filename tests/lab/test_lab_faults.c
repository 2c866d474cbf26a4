/* Faults on the lab (issue 29 item 5; docs/lab.md, "Faults"): a 4-host
 * `ferry-lab cluster up` (links shaped to 20mbit each way; h0 holds the
 * master), trainer ranks 0 and 1 on h0 and h1 (each publishing into its
 * own host's node), rollout workers on h2 and h3, all of them this test
 * binary started again inside their hosts' network namespaces.
 *  - A rollout host's link cut in the middle of an update (its switch
 *    port set down once bytes of the update have reached it): every
 *    worker of the group fails the update, none at the new generation;
 *    the workers on the other host name the cut host's address; both
 *    generations stay loadable from the store; with the link back, the
 *    next update succeeds with every element checked.
 *  - A trainer host lost in the middle of a publish (every process of h1,
 *    its node included, killed after rank 1 stored a piece there and
 *    while rank 0 publishes): the generation is not announced, rank 0
 *    fails naming the rank that did not come and removes what it stored;
 *    a replaced host (a new node under the same name, a new rank 1)
 *    publishes the next generation, which sweeps the failed one's
 *    leftovers, and the rollouts take it.
 *  - A rollout host lost during an elastic group's update: the members on
 *    the other host answer, and finish the next update without it.
 * Nothing of the lab is left afterwards. No time is asserted: every wait
 * has a deadline far above what it takes, the times are printed. Needs
 * root (network namespaces); otherwise it skips and says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry/weights.h"
#include "rl/keys.h"   /* fr_key_gen_object, fr_key_gen_prefix */
#include "util/ftgroup.h"
#include "util/ftlab.h"
#include "util/ftstore.h"
#include "util/testutil.h"

#define HOSTS 4
#define RATE "20mbit"       /* a rollout host takes in the model in ~1.8 s: time to cut it */
#define TMO_MS 3000         /* the publish's and the group's timeout_ms */
#define LAB_UP_MS 300000    /* the lab's setup (link checks, master, nodes) on a loaded machine */
#define REPLY_MS 120000     /* a backstop for one reply, far above TMO_MS multiples */
#define CUT_AFTER (512u << 10)   /* bytes into the cut host before its link goes */
/* docs/lab.md, "Faults": a worker of a group that loses a host fails
 * within 2 x the store's call timeout (ferry_store_config.timeout_ms,
 * 10 s by default; the rollouts here set it to TMO_MS) + 5 x the group's
 * timeout_ms. The test allows twice that (a loaded machine), never less. */
#define STORE_CALL_MS TMO_MS
#define FAIL_BOUND_MS (2 * STORE_CALL_MS + 5 * TMO_MS)
#define NW 8                /* worker slots */
#define MODEL "labfault"

#define NT 3
static const uint64_t shapes[NT][2] = { { 1024, 1024 }, { 512, 1024 }, { 1000, 520 } };
static const ftg_model model = { .name = MODEL, .prefix = "layers", .nt = NT, .shapes = shapes,
                                 .bits = ftg_bits };

/* ---- the worker processes ---------------------------------------------------------------- */

static void reply_err(int rc, uint64_t held, const ferry_error *err)
{
    printf("ERR %d %" PRIu64 " %s\n", rc, held, err->msg);
}

/* "load G": generation G read from the store tensor by tensor (its
 * manifest, every checksum) and every element checked. */
static void load_gen(ferry_store *s, uint64_t g)
{
    ferry_weight_manifest m = {0};
    ferry_error err = {0};
    int rc = ferry_weights_manifest(s, MODEL, g, &m, &err);
    uint64_t bad = 0;
    for (size_t i = 0; rc == 0 && i < m.n; i++) {
        unsigned t = NT;   /* "layers.<t>.weight" */
        if (sscanf(m.entries[i].name, "layers.%u.weight", &t) != 1 || t >= NT) {
            rc = FERRY_EPROTO;
            snprintf(err.msg, sizeof err.msg, "unknown tensor %.200s", m.entries[i].name);
            break;
        }
        uint16_t *d = malloc(m.entries[i].bytes);
        rc = d ? ferry_weights_read(s, &m.entries[i], d, m.entries[i].bytes, &err) : FERRY_ENOMEM;
        for (uint64_t k = 0; rc == 0 && k < m.entries[i].bytes / 2; k++)
            bad += d[k] != ftg_bits(g, t, k);
        free(d);
    }
    if (rc == 0)
        printf("OK %zu %" PRIu64 "\n", m.n, bad);
    else
        reply_err(rc, 0, &err);
    ferry_weight_manifest_free(&m);
}

/* Commands every worker answers: "active", "objects G", "load G". 1 when
 * line was one of them (replied), 0 otherwise. */
static int common_cmd(ferry_store *s, const char *line)
{
    unsigned long long g;
    ferry_error err = {0};
    if (!strncmp(line, "active", 6)) {
        uint64_t a = 0;
        int rc = ferry_weights_active(s, MODEL, &a, NULL, &err);
        printf("OK %d %" PRIu64 "\n", rc, a);
    } else if (sscanf(line, "objects %llu", &g) == 1) {
        char prefix[FR_KEY_MAX];
        char **keys = NULL;
        size_t n = 0;
        (void)fr_key_gen_prefix(prefix, sizeof prefix, MODEL, g);
        int rc = ferry_store_list(s, prefix, NULL, 1000, &keys, &n, NULL, &err);
        ferry_store_free(keys);
        if (rc == 0)
            printf("OK %zu\n", n);
        else
            reply_err(rc, 0, &err);
    } else if (sscanf(line, "load %llu", &g) == 1) {
        load_gen(s, g);
    } else {
        return 0;
    }
    return 1;
}

/* A trainer rank of two: "publish G" publishes the whole model (each
 * tensor stored once, by the rank ferry_weights_assign picks, into this
 * host's segment); "stage G" stores one piece of G under this rank's
 * first object key, as a rank that dies in the middle of its puts leaves. */
static int trainer_main(const char *addr, uint32_t rank, uint64_t segment)
{
    ferry_store *s = NULL;
    if (ftg_worker_store(addr, &s) < 0)
        return 1;
    char names[NT][32];
    ftg_names(&model, names);
    ferry_weight_tensor t[NT];
    for (size_t k = 0; k < NT; k++) {
        uint16_t *d = malloc(shapes[k][0] * shapes[k][1] * 2);
        if (!d)
            return 1;
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = "bf16", .ndim = 2,
                                      .shape = { shapes[k][0], shapes[k][1] }, .data = d };
    }
    static const uint32_t nodes[2] = { 0, 1 };
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, "%s", MODEL);
    pc.rank = rank;
    pc.world = 2;
    pc.rank_node = nodes;
    pc.segment = segment;
    pc.timeout_ms = TMO_MS;
    printf("READY\n");
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long g;
        ferry_error err = {0};
        if (common_cmd(s, line)) {
        } else if (sscanf(line, "publish %llu", &g) == 1) {
            for (size_t k = 0; k < NT; k++)
                for (uint64_t i = 0; i < shapes[k][0] * shapes[k][1]; i++)
                    ((uint16_t *)(uintptr_t)t[k].data)[i] = ftg_bits(g, k, i);
            int rc = ferry_publish(s, &pc, g, t, NT, NULL, &err);
            if (rc == 0)
                printf("OK\n");
            else
                reply_err(rc, 0, &err);
        } else if (sscanf(line, "stage %llu", &g) == 1) {
            char key[FR_KEY_MAX];
            (void)fr_key_gen_object(key, sizeof key, MODEL, g, rank, 0);
            ferry_replicate_config rc = { .preferred_segments = &segment, .npreferred = 1,
                                          .hard_pin = true };
            int r = ferry_store_put(s, key, t[0].data, 4096, &rc, NULL, &err);
            if (r == 0)
                printf("OK\n");
            else
                reply_err(r, 0, &err);
        } else {
            break;
        }
        fflush(stdout);
    }
    for (size_t k = 0; k < NT; k++)
        free((void *)t[k].data);
    ferry_store_close(s);
    return 0;
}

/* A rollout worker: TP shard tp of 2 of every tensor. A fixed group's
 * rank of world (world > 0), or an elastic group's member `name` (world
 * 0). "update G": the group update, every element checked: "OK G bad
 * members" or "ERR code held message". */
static int rollout_main(const char *addr, uint32_t rank, uint32_t world, uint32_t node,
                        uint64_t segment, const char *name)
{
    ferry_subscriber_config sc;
    ferry_subscriber_config_init(&sc);
    snprintf(sc.model, sizeof sc.model, "%s", MODEL);
    snprintf(sc.group, sizeof sc.group, "rollout");
    sc.rank = world ? rank : 0;
    sc.world = world;
    sc.node = node;
    sc.local_segment = segment;
    sc.timeout_ms = TMO_MS;
    sc.batch_bytes = 256u << 10;   /* reads and pushes in small steps: the cut falls between them */
    snprintf(sc.member, sizeof sc.member, "%s", name);
    /* the store's calls bounded by the group's timeout too: a worker cut
     * off from the master fails within 2 x + 5 x TMO_MS, not 2 x 10 s + 5 x */
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.lease_ms = 1;
    cfg.timeout_ms = STORE_CALL_MS;
    ferry_store *s = NULL;
    ferry_error oerr = {0};
    if (ferry_store_open(&cfg, &s, &oerr) < 0) {
        printf("ERR open %s\n", oerr.msg);
        return 1;
    }
    ftg_sub w;
    if (ftg_sub_open_on(&w, &model, s, &sc, rank % 2, 2) < 0)
        return 1;
    printf("READY\n");
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long g;
        if (common_cmd(w.s, line)) {
        } else if (sscanf(line, "update %llu", &g) == 1) {
            ferry_update_stats st;
            ferry_error err = {0};
            int rc = ferry_subscriber_update(w.sub, &w.gen, &st, &err);
            if (rc == 0)
                printf("OK %" PRIu64 " %" PRIu64 " %u\n", w.gen, ftg_sub_bad(&w, g), st.members);
            else
                reply_err(rc, w.gen, &err);
        } else {
            break;
        }
        fflush(stdout);
    }
    ftg_sub_close(&w);
    return 0;
}

/* ---- the lab ------------------------------------------------------------------------------- */

typedef struct fx {
    char tmp[256], ready[300], log[300];
    pid_t lab;
    char prefix[32], master[64], dir[256], net[16];
    uint64_t seg[HOSTS];
    ft_peer w[NW];
    int host[NW];          /* each slot's host, -1: unused */
    ft_peer node;          /* a replacement node the test started */
    bool node_on;
} fx;

static fx F;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A short pause between two looks at a condition (a file appearing, a
 * counter growing) that has no event to wait on; every such loop has a
 * deadline. */
static void tick(void)
{
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    nanosleep(&ts, NULL);
}

/* The first line of path into out: 0, or -1 while it is not there. */
static int first_line(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    bool ok = f && fgets(out, (int)cap, f);
    if (f)
        fclose(f);
    if (ok)
        out[strcspn(out, "\n")] = 0;
    return ok ? 0 : -1;
}

static int lab_setup(void **state)
{
    *state = NULL;
    memset(&F, 0, sizeof F);
    for (int i = 0; i < NW; i++)
        F.host[i] = -1;
    F.lab = -1;
    if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1") != 0)
        return 0;   /* the test skips, saying why */
    snprintf(F.tmp, sizeof F.tmp, "/tmp/ferry-test-labfault-XXXXXX");
    if (!mkdtemp(F.tmp))
        return -1;
    snprintf(F.ready, sizeof F.ready, "%s/ready", F.tmp);
    snprintf(F.log, sizeof F.log, "%s/lab.log", F.tmp);
    F.lab = fork();
    if (F.lab == 0) {
        setpgid(0, 0);
        FILE *o = freopen(F.log, "w", stdout);
        if (!o || dup2(fileno(stdout), 2) < 0)
            _exit(126);
        const char *argv[] = { "ferry-lab", "cluster", "up", "--hosts", "4", "--rate", RATE,
                               "--check-seconds", "0.3", "--node-size", "32M", "--ready-file",
                               F.ready, NULL };
        execv(ft_lab_bin(), (char *const *)argv);
        _exit(127);
    }
    double end = now_s() + LAB_UP_MS / 1000.0;
    char line[512];
    FILE *f = NULL;
    while (!(f = fopen(F.ready, "r"))) {
        int st;
        if (waitpid(F.lab, &st, WNOHANG) == F.lab || now_s() > end) {
            char out[4096];
            ft_run(out, sizeof out, "tail -c 3000 '%s'", F.log);
            fprintf(stderr, "the lab did not come up:\n%s\n", out);
            return -1;
        }
        tick();
    }
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "prefix ", 7))
            snprintf(F.prefix, sizeof F.prefix, "%.30s", line + 7);
        else if (!strncmp(line, "master ", 7))
            snprintf(F.master, sizeof F.master, "%.60s", line + 7);
        else if (!strncmp(line, "dir ", 4))
            snprintf(F.dir, sizeof F.dir, "%.250s", line + 4);
    }
    fclose(f);
    snprintf(F.net, sizeof F.net, "%.*s", (int)(strrchr(F.master, '.') - F.master), F.master);
    char path[400], tok[128];
    snprintf(path, sizeof path, "%s/token", F.dir);
    if (first_line(path, tok, sizeof tok) < 0)
        return -1;
    setenv("FERRY_TOKEN", tok, 1);   /* the lab's token, for the workers */
    for (unsigned h = 0; h < HOSTS; h++) {
        snprintf(path, sizeof path, "%s/h%u-node.ready", F.dir, h);
        if (first_line(path, line, sizeof line) < 0)
            return -1;
        F.seg[h] = strtoull(line, NULL, 10);
    }
    fprintf(stderr, "lab %s: master %s, segments %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
            F.prefix, F.master, F.seg[0], F.seg[1], F.seg[2], F.seg[3]);
    *state = &F;
    return 0;
}

/* Workers, the replacement node and the lab stopped (SIGTERM: the lab's
 * own teardown), then nothing of it may be left. */
static int lab_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < NW; i++)
        if (F.host[i] >= 0)
            ft_peer_stop(&F.w[i]);
    if (F.node_on)
        ft_proc_kill(&F.node, SIGKILL);
    if (F.lab <= 0)
        return 0;
    int st = 0, left = 0;
    kill(F.lab, SIGTERM);
    if (ft_wait_status(F.lab, 120000, &st) < 0) {
        fprintf(stderr, "the lab did not stop on SIGTERM: killed, then cleaned\n");
        kill(-F.lab, SIGKILL);
        (void)ft_wait_status(F.lab, 30000, &st);
        char out[256];
        ft_run(out, sizeof out, "'%s' cluster clean --prefix %s", ft_lab_bin(), F.prefix);
        left++;
    }
    left += ft_lab_leftovers(F.lab, F.tmp);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", F.tmp);
    if (system(cmd) != 0)
        left++;
    return left ? -1 : 0;
}

/* This test binary as a worker in host, its engine on the host's address. */
static void spawn(int slot, unsigned host, const char *const *args)
{
    char listen[40], ns[64], line[FTG_LINE] = "";
    snprintf(listen, sizeof listen, "%s.%u:0", F.net, host + 1);
    snprintf(ns, sizeof ns, "%s-h%u", F.prefix, host);
    setenv("FERRY_LISTEN", listen, 1);
    int rc = ft_spawn(&F.w[slot], ns, args);
    unsetenv("FERRY_LISTEN");
    assert_int_equal(rc, 0);
    F.host[slot] = (int)host;
    if (ft_read_line(&F.w[slot], line, sizeof line, FT_START_MS) < 0 || strcmp(line, "READY"))
        fail_msg("worker %d on host %u did not start: %s", slot, host, line);
}

static void start_trainer(int slot, unsigned host, unsigned rank, uint64_t segment)
{
    char r[16], seg[32];
    snprintf(r, sizeof r, "%u", rank);
    snprintf(seg, sizeof seg, "%" PRIu64, segment);
    const char *args[] = { "--trainer", F.master, r, seg, NULL };
    spawn(slot, host, args);
}

/* Rollout workers in slots 2..5: ranks 0, 1 on h2 and 2, 3 on h3 (TP2 x
 * DP2: a replica per host); world 0: an elastic group of members m0..m3. */
static void start_rollouts(unsigned world)
{
    for (unsigned k = 0; k < 4; k++) {
        unsigned host = 2 + k / 2;
        char r[16], wd[16], nd[16], seg[32], name[16];
        snprintf(r, sizeof r, "%u", k);
        snprintf(wd, sizeof wd, "%u", world);
        snprintf(nd, sizeof nd, "%u", host);
        snprintf(seg, sizeof seg, "%" PRIu64, F.seg[host]);
        snprintf(name, sizeof name, "m%u", k);
        const char *args[] = { "--rollout", F.master, r, wd, nd, seg, name, NULL };
        spawn(2 + (int)k, host, args);
    }
}

/* Send cmd to the slots, then collect one reply each (printed with the
 * time it took); replies[i] for slots[i]. */
static void round_of(const int *slots, int n, const char *cmd, char (*replies)[FTG_LINE])
{
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        assert_int_equal(ft_peer_send(&F.w[slots[i]], "%s", cmd), 0);
    for (int i = 0; i < n; i++) {
        replies[i][0] = 0;
        if (ft_read_line(&F.w[slots[i]], replies[i], FTG_LINE, REPLY_MS) < 0)
            fail_msg("slot %d (host %d) gave no reply to '%s'", slots[i], F.host[slots[i]], cmd);
        fprintf(stderr, "%-10s slot %d host h%d after %5.2f s: %s\n", cmd, slots[i],
                F.host[slots[i]], now_s() - t0, replies[i]);
    }
}

/* Every slot answers OK. */
static void all_ok(const int *slots, int n, const char *cmd)
{
    char r[NW][FTG_LINE];
    round_of(slots, n, cmd, r);
    for (int i = 0; i < n; i++)
        if (strncmp(r[i], "OK", 2))
            fail_msg("slot %d: '%s' -> %s", slots[i], cmd, r[i]);
}

static const int TRAINERS[2] = { 0, 1 };
static const int ROLLOUTS[4] = { 2, 3, 4, 5 };

static void publish(uint64_t g)
{
    char cmd[32];
    snprintf(cmd, sizeof cmd, "publish %" PRIu64, g);
    all_ok(TRAINERS, 2, cmd);
}

/* Every given rollout at generation g, every element right, the group of
 * `members`. */
static void update_ok(const int *slots, int n, uint64_t g, unsigned members)
{
    char cmd[32], r[NW][FTG_LINE];
    snprintf(cmd, sizeof cmd, "update %" PRIu64, g);
    round_of(slots, n, cmd, r);
    for (int i = 0; i < n; i++) {
        unsigned long long at, bad;
        unsigned m;
        if (sscanf(r[i], "OK %llu %llu %u", &at, &bad, &m) != 3)
            fail_msg("slot %d: update %" PRIu64 " -> %s", slots[i], g, r[i]);
        assert_int_equal(at, g);
        assert_int_equal(bad, 0);
        assert_int_equal(m, members);
    }
}

/* The bytes the switch's port p<host> has sent to it (the host's
 * download), from the switch namespace's counters. */
static uint64_t down_bytes(unsigned host)
{
    char out[8192], want[16];
    ft_run(out, sizeof out, "ip netns exec %s-sw cat /proc/net/dev", F.prefix);
    snprintf(want, sizeof want, "p%u:", host);
    const char *p = strstr(out, want);
    unsigned long long v[9] = { 0 };
    if (!p || sscanf(p + strlen(want), "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                     &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) != 9)
        fail_msg("no counters of port p%u in the switch namespace", host);
    return v[8];
}

/* Wait (a deadline) until `bytes` more have gone down host's link. */
static void wait_bytes_in(unsigned host, uint64_t from, uint64_t bytes)
{
    double end = now_s() + REPLY_MS / 1000.0;
    while (down_bytes(host) < from + bytes) {
        if (now_s() > end)
            fail_msg("host h%u took in fewer than %" PRIu64 " bytes of the update", host, bytes);
        tick();
    }
}

/* Every process in host's namespace killed (its node included): a lost
 * machine. The test's workers there are reaped. */
static void lose_host(unsigned host)
{
    char out[256];
    assert_int_equal(ft_run(out, sizeof out, "ip netns pids %s-h%u | xargs -r kill -9", F.prefix, host),
                     0);
    for (int i = 0; i < NW; i++)
        if (F.host[i] == (int)host) {
            assert_int_equal(ft_peer_wait_exit(&F.w[i], REPLY_MS), 0);
            ft_peer_stop(&F.w[i]);
            F.host[i] = -1;
        }
}

static void set_link(unsigned host, bool up)
{
    char out[256];
    assert_int_equal(ft_run(out, sizeof out, "ip -n %s-sw link set p%u %s", F.prefix, host,
                            up ? "up" : "down"), 0);
    fprintf(stderr, "host h%u's link %s\n", host, up ? "back up" : "cut (switch port down)");
}

/* ---- the faults ---------------------------------------------------------------------------- */

static void test_rollout_link_cut(void **state)
{
    ft_lab_need_root();
    assert_non_null(*state);
    start_trainer(0, 0, 0, F.seg[0]);
    start_trainer(1, 1, 1, F.seg[1]);
    start_rollouts(4);
    publish(1);
    update_ok(ROLLOUTS, 4, 1, 4);
    publish(2);
    /* the update to 2, and h3's link cut once part of it has come in */
    uint64_t from = down_bytes(3);
    double t0 = now_s();
    for (int i = 0; i < 4; i++)
        assert_int_equal(ft_peer_send(&F.w[ROLLOUTS[i]], "update 2"), 0);
    wait_bytes_in(3, from, CUT_AFTER);
    set_link(3, false);
    fprintf(stderr, "cut %.2f s into the update, %" PRIu64 " bytes into h3\n", now_s() - t0,
            down_bytes(3) - from);
    char host3[32];
    snprintf(host3, sizeof host3, "%s.4", F.net);   /* h3's address */
    char cut[4][FTG_LINE];
    for (int i = 0; i < 4; i++) {
        cut[i][0] = 0;
        if (ft_read_line(&F.w[ROLLOUTS[i]], cut[i], FTG_LINE, 2 * FAIL_BOUND_MS) < 0)
            fail_msg("rollout slot %d gave no answer within 2 x %d ms of the cut", ROLLOUTS[i],
                     FAIL_BOUND_MS);
        fprintf(stderr, "update 2 slot %d host h%d after %5.2f s: %s\n", ROLLOUTS[i],
                F.host[ROLLOUTS[i]], now_s() - t0, cut[i]);
    }
    for (int i = 0; i < 4; i++) {
        int code = 0;
        unsigned long long held = 0;
        /* failed, and nobody at the new generation: none half-visible */
        if (sscanf(cut[i], "ERR %d %llu", &code, &held) != 2)
            fail_msg("slot %d took generation 2 across a cut link: %s", ROLLOUTS[i], cut[i]);
        assert_int_equal(held, 1);
        /* every worker names the host it lost: h2's the cut h3 */
        if (F.host[ROLLOUTS[i]] == 2 && !strstr(cut[i], host3))
            fail_msg("slot %d's error does not name the cut host %s: %s", ROLLOUTS[i], host3, cut[i]);
    }
    set_link(3, true);
    /* both generations whole in the store: the previous one loadable */
    char r[1][FTG_LINE];
    for (uint64_t g = 1; g <= 2; g++) {
        char cmd[32];
        snprintf(cmd, sizeof cmd, "load %" PRIu64, g);
        round_of(&ROLLOUTS[0], 1, cmd, r);
        unsigned long long n = 0, bad = 1;
        assert_int_equal(sscanf(r[0], "OK %llu %llu", &n, &bad), 2);
        assert_int_equal(n, NT);
        assert_int_equal(bad, 0);
    }
    /* the link back: the next update succeeds, every element checked */
    update_ok(ROLLOUTS, 4, 2, 4);
}

static void test_trainer_host_lost(void **state)
{
    ft_lab_need_root();
    assert_non_null(*state);
    start_trainer(0, 0, 0, F.seg[0]);
    start_trainer(1, 1, 1, F.seg[1]);
    start_rollouts(4);
    publish(1);
    update_ok(ROLLOUTS, 4, 1, 4);
    /* rank 1 has stored a piece of generation 2 on its host; rank 0 is
     * publishing 2 when h1 (rank 1 and its node) is lost */
    char r[NW][FTG_LINE];
    all_ok(&TRAINERS[1], 1, "stage 2");
    assert_int_equal(ft_peer_send(&F.w[0], "publish 2"), 0);
    double t0 = now_s();
    lose_host(1);
    fprintf(stderr, "host h1 lost (rank 1 and its node killed)\n");
    assert_int_equal(ft_read_line(&F.w[0], r[0], FTG_LINE, REPLY_MS), 0);
    fprintf(stderr, "publish 2, rank 0, after %.2f s: %s\n", now_s() - t0, r[0]);
    char want[64];
    snprintf(want, sizeof want, "ERR %d ", FERRY_ETIMEDOUT);
    assert_true(strncmp(r[0], want, strlen(want)) == 0);
    assert_non_null(strstr(r[0], "not every trainer rank arrived"));
    /* not announced; rank 0 removed what it stored (what is left of 2 is
     * rank 1's piece, on the lost node, at most) */
    round_of(&TRAINERS[0], 1, "active", r);
    int code;
    unsigned long long active = 0, n = 99;
    assert_int_equal(sscanf(r[0], "OK %d %llu", &code, &active), 2);
    assert_int_equal(active, 1);
    round_of(&TRAINERS[0], 1, "objects 2", r);
    assert_int_equal(sscanf(r[0], "OK %llu", &n), 1);
    assert_true(n <= 1);
    /* a replaced host: a new node under the same name, a new rank 1 */
    char listen[40], ns[64], ready[300], seg[64], size[32] = "33554432", tokf[300];
    snprintf(listen, sizeof listen, "%s.2:0", F.net);
    snprintf(ns, sizeof ns, "%s-h1", F.prefix);
    snprintf(ready, sizeof ready, "%s/h1-again.ready", F.tmp);
    snprintf(tokf, sizeof tokf, "%s/token", F.dir);
    const char *na[] = { "node", "--master", F.master, "--listen", listen, "--size", size, "--name",
                         "h1", "--token-file", tokf, "--ready-file", ready, NULL };
    assert_int_equal(ft_spawn_exe(&F.node, ns, ft_ferry_bin(), na), 0);
    F.node_on = true;
    double end = now_s() + FT_START_MS / 1000.0;
    while (first_line(ready, seg, sizeof seg) < 0) {
        if (now_s() > end)
            fail_msg("the replacement node on h1 was not ready");
        tick();
    }
    start_trainer(1, 1, 1, strtoull(seg, NULL, 10));
    /* the next publish succeeds and sweeps what generation 2 left; the
     * rollouts take it */
    publish(3);
    round_of(&TRAINERS[0], 1, "objects 2", r);
    assert_int_equal(sscanf(r[0], "OK %llu", &n), 1);
    assert_int_equal(n, 0);
    update_ok(ROLLOUTS, 4, 3, 4);
}

static void test_elastic_rollout_host_lost(void **state)
{
    ft_lab_need_root();
    assert_non_null(*state);
    start_trainer(0, 0, 0, F.seg[0]);
    start_trainer(1, 1, 1, F.seg[1]);
    start_rollouts(0);
    publish(1);
    update_ok(ROLLOUTS, 4, 1, 4);
    publish(2);
    /* h3 (members m2, m3 and its node) lost in the middle of the update to 2 */
    uint64_t from = down_bytes(3);
    double t0 = now_s();
    for (int i = 0; i < 4; i++)
        assert_int_equal(ft_peer_send(&F.w[ROLLOUTS[i]], "update 2"), 0);
    wait_bytes_in(3, from, CUT_AFTER);
    lose_host(3);
    fprintf(stderr, "host h3 lost %.2f s into the update\n", now_s() - t0);
    for (int i = 0; i < 2; i++) {
        char r[FTG_LINE] = "";
        if (ft_read_line(&F.w[ROLLOUTS[i]], r, sizeof r, 2 * FAIL_BOUND_MS) < 0)
            fail_msg("member slot %d gave no answer within 2 x %d ms of losing h3", ROLLOUTS[i],
                     FAIL_BOUND_MS);
        fprintf(stderr, "update 2 slot %d after %5.2f s: %s\n", ROLLOUTS[i], now_s() - t0, r);
        unsigned long long at = 0, bad = 1;
        unsigned m = 0;
        int code;
        /* either it failed, or it holds every byte of 2 */
        if (sscanf(r, "OK %llu %llu %u", &at, &bad, &m) == 3)
            assert_true(at == 2 && bad == 0);
        else
            assert_int_equal(sscanf(r, "ERR %d %llu", &code, &at), 2);
    }
    /* the next update goes without the lost host */
    publish(3);
    update_ok(ROLLOUTS, 2, 3, 2);
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--trainer"))
        return trainer_main(argv[2], (uint32_t)atoi(argv[3]), strtoull(argv[4], NULL, 10));
    if (argc == 8 && !strcmp(argv[1], "--rollout"))
        return rollout_main(argv[2], (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]),
                            (uint32_t)atoi(argv[5]), strtoull(argv[6], NULL, 10), argv[7]);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rollout_link_cut, lab_setup, lab_teardown),
        cmocka_unit_test_setup_teardown(test_trainer_host_lost, lab_setup, lab_teardown),
        cmocka_unit_test_setup_teardown(test_elastic_rollout_host_lost, lab_setup, lab_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
