/* `ferry-lab bench store --ha`: what replication through etcd costs, against
 * the single master in the same run (docs/store.md, "Benchmark").
 *
 * Two private clusters side by side, each with a node: a single master
 * with its local log; a one-member etcd and two replicated masters
 * (`ferry master --etcd`, the first leads, the second follows as a
 * standby).
 *  - metadata: the --clients processes of `bench store` for --seconds,
 *    --reps times on each cluster, alternating, so that both see the same
 *    noise (PUT_START + PUT_END + GET_REPLICAS per second, summed);
 *  - put latency: --puts puts of a 4 KiB object, one after the other from
 *    one client, each timed (p50, p99);
 *  - with HA, the bytes the leader appended to the cluster's log in etcd
 *    during the metadata phase, per metadata operation;
 *  - with HA, a client writing KV keys one after the other, every
 *    acknowledgement logged; halfway the leader is killed with SIGKILL (its
 *    machine gone): failover_s from the kill to the first write the new
 *    leader acknowledged, acked_lost the acknowledged keys the new leader
 *    does not hold with their value. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lab.h"
#include "bench_store.h"

#define HA_RATIO_GOAL 0.5
#define FAILOVER_GOAL_S 3.0
#define PUT_BYTES 4096
#define FAILOVER_WRITES 200      /* acknowledged before the kill, and as many after */
#define RETRY_S 60.0             /* a write is retried this long across a failover */

typedef struct ha_side {
    bs_meta m;
    double p50, p99;            /* put latency, ms */
    uint64_t log_bytes;          /* HA: appended to the cluster's log in the metadata phase */
} ha_side;

typedef struct ha_fail {
    double secs;
    uint64_t acked, lost;
} ha_fail;

static int open_client(const char *master, ferry_store **s, ferry_error *err)
{
    ferry_store_config cfg;
    int rc = ferry_store_config_init(&cfg);
    if (rc < 0)
        return rc;
    snprintf(cfg.master, sizeof cfg.master, "%s", master);
    cfg.lease_ms = 1;
    return ferry_store_open(&cfg, s, err);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* o->puts puts of PUT_BYTES, one after the other, each timed. */
static int put_latency(const bs_opts *o, const char *master, const char *label, ha_side *r)
{
    ferry_store *s = NULL;
    ferry_error err = {0};
    double *ms = calloc(o->puts, sizeof *ms);
    char *buf = calloc(1, PUT_BYTES);
    int rc = ms && buf ? open_client(master, &s, &err) : FERRY_ENOMEM;
    char key[96];
    for (unsigned i = 0; rc == 0 && i < o->puts; i++) {
        snprintf(key, sizeof key, "bench-lat/%u", i);
        memcpy(buf, &i, sizeof i);
        double t0 = cli_now();
        rc = ferry_store_put(s, key, buf, PUT_BYTES, NULL, NULL, &err);
        ms[i] = (cli_now() - t0) * 1e3;
        cli_progress(label, (double)(i + 1) / o->puts);
    }
    cli_progress_done();
    if (rc == 0) {
        qsort(ms, o->puts, sizeof *ms, cmp_double);
        r->p50 = ms[o->puts / 2];
        r->p99 = ms[(o->puts * 99 + 99) / 100 - 1];
        uint64_t n = 0;
        rc = ferry_store_remove_prefix(s, "bench-lat/", &n, &err);
    }
    if (rc < 0)
        fprintf(stderr, "ferry-lab bench store: %s: %s\n", label,
                err.msg[0] ? err.msg : ferry_strerror(rc));
    ferry_store_close(s);
    free(ms);
    free(buf);
    return rc;
}

/* The leader's "ha" status: bytes appended to the cluster's log so far. */
static int log_bytes(const char *master, uint64_t *bytes)
{
    ferry_store *s = NULL;
    char *text = NULL;
    ferry_error err = {0};
    int rc = open_client(master, &s, &err);
    if (rc == 0)
        rc = ferry_store_status_json(s, &text, &err);
    json_t *j = rc == 0 ? json_loads(text, 0, NULL) : NULL;
    json_t *b = json_object_get(json_object_get(j, "ha"), "log_bytes");
    if (rc == 0 && !json_is_integer(b))
        rc = FERRY_EPROTO;
    if (rc == 0)
        *bytes = (uint64_t)json_integer_value(b);
    else
        fprintf(stderr, "ferry-lab bench store: the leader's status: %s\n",
                err.msg[0] ? err.msg : ferry_strerror(rc));
    json_decref(j);
    ferry_store_free(text);
    ferry_store_close(s);
    return rc;
}

/* key i = its value, retried across a failover for RETRY_S. */
static int write_acked(ferry_store *s, uint64_t i, ferry_error *err)
{
    char key[48], val[48];
    snprintf(key, sizeof key, "bench-fo/%llu", (unsigned long long)i);
    snprintf(val, sizeof val, "v%llu", (unsigned long long)(i * 7 + 1));
    int rc;
    for (double end = cli_now() + RETRY_S;
         (rc = ferry_kv_put(s, key, val, strlen(val), NULL, err)) != 0 && cli_now() < end;) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
    }
    return rc;
}

static int failover(bs_cluster *c, ha_fail *f)
{
    ferry_store *s = NULL;
    ferry_error err = {0};
    int rc = open_client(c->master, &s, &err);
    double t0 = 0;
    for (uint64_t i = 0; rc == 0 && i < 2 * FAILOVER_WRITES; i++) {
        if (i == FAILOVER_WRITES) {
            t0 = cli_now();
            bs_kill(&c->mpid);   /* the leader's machine gone */
        }
        if ((rc = write_acked(s, i, &err)) == 0)
            f->acked++;
        if (rc == 0 && i == FAILOVER_WRITES)
            f->secs = cli_now() - t0;
        cli_progress("failover", (double)(i + 1) / (2 * FAILOVER_WRITES));
    }
    cli_progress_done();
    for (uint64_t i = 0; rc == 0 && i < f->acked; i++) {
        char key[48], val[48];
        snprintf(key, sizeof key, "bench-fo/%llu", (unsigned long long)i);
        snprintf(val, sizeof val, "v%llu", (unsigned long long)(i * 7 + 1));
        ferry_kv_value kv = { 0 };
        int g = ferry_kv_get(s, key, &kv, &err);
        f->lost += g != 0 || kv.len != strlen(val) || memcmp(kv.val, val, kv.len) != 0;
        if (g == 0)
            ferry_store_free(kv.val);
        else if (g != FERRY_ENOENT)
            rc = g;   /* the new leader did not answer: no verdict */
    }
    if (rc < 0)
        fprintf(stderr, "ferry-lab bench store: failover: %s\n",
                err.msg[0] ? err.msg : ferry_strerror(rc));
    ferry_store_close(s);
    return rc;
}

/* One metadata phase on one setup, added to r; ha: the log's bytes too. */
static int meta_rep(const bs_opts *o, const char *self, const bs_cluster *c, bool ha, ha_side *r)
{
    bs_meta m = { 0 };
    uint64_t b0 = 0, b1 = 0;
    int rc = ha ? log_bytes(c->master, &b0) : 0;
    if (rc == 0)
        rc = bs_meta_phase(o, self, c->master, &m);
    if (rc == 0 && ha && (rc = log_bytes(c->master, &b1)) == 0)
        r->log_bytes += b1 - b0;
    r->m.pairs += m.pairs;
    r->m.gets += m.gets;
    r->m.failed += m.failed;
    r->m.secs += m.secs;
    return rc;
}

/* Both setups side by side (one etcd, three masters, two nodes), their
 * phases interleaved so that both see the same noise of a shared machine:
 * --reps metadata phases each, alternating, then the put latency of each,
 * then the failover. */
static int run_both(const bs_opts *o, const char *self, ha_side *one, ha_side *ha, ha_fail *f)
{
    bs_cluster c1, c2;
    int rc = bs_cluster_start(&c1, o, self, false);
    c2.dir[0] = '\0';
    c2.mpid = c2.m2pid = c2.npid = c2.epid = -1;
    if (rc == 0)
        rc = bs_cluster_start(&c2, o, self, true);
    for (unsigned rep = 0; rc == 0 && rep < o->reps; rep++) {
        rc = meta_rep(o, self, &c1, false, one);
        if (rc == 0)
            rc = meta_rep(o, self, &c2, true, ha);
    }
    if (rc == 0)
        rc = put_latency(o, c1.master, "put latency, single", one);
    if (rc == 0)
        rc = put_latency(o, c2.master, "put latency, replicated", ha);
    if (rc == 0)
        rc = failover(&c2, f);
    bs_cluster_stop(&c2);
    bs_cluster_stop(&c1);
    return rc < 0 ? -1 : 0;
}

static void print_ha(const bs_opts *o, const ha_side *one, const ha_side *ha, const ha_fail *f,
                     const double load[2])
{
    double ops1 = bs_meta_ops(&one->m), ops2 = bs_meta_ops(&ha->m);
    double ratio = ops1 > 0 ? ops2 / ops1 : 0;
    double nops = (double)(2 * ha->m.pairs + ha->m.gets);
    double bpo = nops > 0 ? (double)ha->log_bytes / nops : 0;
    uint64_t failed = one->m.failed + ha->m.failed;
    bool met = ratio >= HA_RATIO_GOAL && f->secs <= FAILOVER_GOAL_S && f->lost == 0 && !failed;
    if (o->json) {
        printf("{\"meta_ops_per_s\":%.0f,\"ha_meta_ops_per_s\":%.0f,\"ha_ops_ratio\":%.3f,"
               "\"put_p50_ms\":%.3f,\"put_p99_ms\":%.3f,\"ha_put_p50_ms\":%.3f,"
               "\"ha_put_p99_ms\":%.3f,\"log_bytes_per_op\":%.1f,\"failover_s\":%.3f,"
               "\"acked_writes\":%llu,\"acked_lost\":%llu,\"ha_ttl_s\":%u,\"clients\":%u,"
               "\"seconds\":%u,\"reps\":%u,\"puts\":%u,\"put_bytes\":%d,\"sync\":%s,\"failed\":%llu,"
               "\"load_avg_start\":%.2f,\"load_avg_end\":%.2f,\"goals_met\":%s}\n",
               ops1, ops2, ratio, one->p50, one->p99, ha->p50, ha->p99, bpo, f->secs,
               (unsigned long long)f->acked, (unsigned long long)f->lost, o->ha_ttl, o->clients,
               o->seconds, o->reps, o->puts, PUT_BYTES, o->sync ? "true" : "false",
               (unsigned long long)failed, load[0], load[1], met ? "true" : "false");
        return;
    }
    printf("%-34s %14s %14s %7s %8s %4s\n", "figure", "single", "replicated", "ratio", "goal", "met");
    printf("%-34s %14.0f %14.0f %7.3f %8s %4s\n", "metadata ops/s", ops1, ops2, ratio, ">= 0.5",
           ratio >= HA_RATIO_GOAL ? "yes" : "no");
    printf("%-34s %14.3f %14.3f\n", "put p50, ms (4 KiB, one client)", one->p50, ha->p50);
    printf("%-34s %14.3f %14.3f\n", "put p99, ms", one->p99, ha->p99);
    printf("%-34s %14s %14.1f\n", "cluster log bytes per metadata op", "-", bpo);
    printf("%-34s %14s %14.3f %7s %8s %4s\n", "failover, s (leader SIGKILLed)", "-", f->secs, "-",
           "<= 3", f->secs <= FAILOVER_GOAL_S ? "yes" : "no");
    printf("%-34s %14s %14llu %7s %8s %4s\n", "acknowledged writes lost", "-",
           (unsigned long long)f->lost, "-", "0", f->lost == 0 ? "yes" : "no");
    printf("%llu writes acknowledged, %d before the kill; lease TTL %u s; load average %.2f at "
           "the start, %.2f at the end\n", (unsigned long long)f->acked, FAILOVER_WRITES,
           o->ha_ttl, load[0], load[1]);
    if (failed)
        printf("FAILED: %llu metadata puts/gets failed\n", (unsigned long long)failed);
}

int bs_ha_run(const bs_opts *o, const char *self)
{
    ha_side one = { 0 }, ha = { 0 };
    ha_fail f = { 0 };
    double load[2] = { 0, 0 }, l3[3];
    if (getloadavg(l3, 3) > 0)
        load[0] = l3[0];
    if (!o->json) {
        printf("ferry-lab bench store --ha: a single master and two replicated masters on a "
               "local etcd (TTL %u s), side by side, master fsync %s; %u metadata clients, %u x %u "
               "s each, interleaved; %u timed puts each\n", o->ha_ttl, o->sync ? "on" : "off",
               o->clients, o->reps, o->seconds, o->puts);
        fflush(stdout);
    }
    if (run_both(o, self, &one, &ha, &f) != 0)
        return 1;
    if (getloadavg(l3, 3) > 0)
        load[1] = l3[0];
    print_ha(o, &one, &ha, &f, load);
    return one.m.failed || ha.m.failed || f.lost ? 1 : 0;
}
