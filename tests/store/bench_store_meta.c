/* Micro benchmark of the metadata core, run by hand (not a ctest):
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc -Iinclude -Itests \
 *      tests/store/bench_store_meta.c build/libferry.a \
 *      $(pkg-config --cflags --libs libxxhash jansson libsodium) -lpthread -lm \
 *      -o /tmp/bench_store_meta && /tmp/bench_store_meta [objects] [dir]
 *
 * Prints operations per second of the in-process core: put_start+put_end
 * pairs, get (lease + LRU touch), remove, KV put, queue push/pop/ack; then
 * the pairs again with the write-ahead log as the sink (commit every 1000
 * pairs, without and with fsync). dir (default /tmp) holds the log. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_int.h"

static double rate(uint64_t n, uint64_t t0)
{
    return (double)n * 1e9 / (double)(fr_now_ns() - t0);
}

static void check(int rc, const char *what, fr_meta *m)
{
    if (rc < 0) {
        fprintf(stderr, "%s: %s (%s)\n", what, ferry_strerror(rc), fr_meta_errmsg(m));
        exit(1);
    }
}

static double pairs(fr_meta *m, char **keys, size_t n, fr_wal *w)
{
    uint64_t t0 = fr_now_ns();
    for (size_t i = 0; i < n; i++) {
        check(fr_meta_put_start(m, keys[i], 4096, NULL, i, NULL), "put_start", m);
        check(fr_meta_put_end(m, keys[i], i), "put_end", m);
        if (w != NULL && i % 1000 == 999)
            check(fr_wal_commit(w), "commit", m);
    }
    if (w != NULL)
        check(fr_wal_commit(w), "commit", m);
    return rate(n, t0);
}

static void wal_run(const char *base, char **keys, size_t n, bool sync)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/ferry-bench-wal-%d", base, (int)sync);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        exit(1);
    fr_meta *m;
    fr_wal *w;
    fr_wal_opts o = { .no_sync = !sync };
    check(fr_meta_new(NULL, &m), "new", NULL);
    check(fr_wal_open(dir, &o, m, &w, NULL), "wal_open", m);
    check(fr_meta_mount(m, 1, 1, 1ull << 40, 0), "mount", m);
    double r = pairs(m, keys, n, w);
    fr_wal_stats st;
    fr_wal_stats_get(w, &st);
    printf("put_start+put_end pairs/s, WAL %-8s %12.0f  (%llu records, %.1f MB, %llu fsyncs)\n",
           sync ? "fsync" : "no fsync", r, (unsigned long long)st.appends, st.bytes / 1e6,
           (unsigned long long)st.fsyncs);
    uint64_t t0 = fr_now_ns();
    check(fr_wal_checkpoint(w, m), "checkpoint", m);
    printf("checkpoint (snapshot of %zu objects)        %9.1f ms\n", n, (fr_now_ns() - t0) / 1e6);
    fr_wal_close(w, m);
    fr_meta_destroy(m);
    check(fr_meta_new(NULL, &m), "new", NULL);
    t0 = fr_now_ns();
    check(fr_wal_open(dir, &o, m, &w, NULL), "recover", m);
    printf("recovery from the snapshot                  %9.1f ms\n", (fr_now_ns() - t0) / 1e6);
    fr_wal_close(w, m);
    fr_meta_destroy(m);
    if (system(cmd) != 0)
        exit(1);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    const char *base = argc > 2 ? argv[2] : "/tmp";
    char **keys = malloc(n * sizeof(*keys));
    for (size_t i = 0; i < n; i++) {
        char k[64];
        snprintf(k, sizeof(k), "weights/gen-%zu/layer-%zu/shard-%zu", i / 10000, i / 100 % 100, i % 100);
        keys[i] = strdup(k);
    }
    fr_meta *m;
    check(fr_meta_new(NULL, &m), "new", NULL);
    check(fr_meta_mount(m, 1, 1, 1ull << 40, 0), "mount", m);
    check(fr_meta_mount(m, 2, 2, 1ull << 40, 0), "mount", m);
    printf("objects: %zu, 2 segments\n", n);
    printf("put_start+put_end pairs/s, no log        %12.0f\n", pairs(m, keys, n, NULL));

    fr_obj_desc d;
    uint64_t t0 = fr_now_ns();
    for (size_t i = 0; i < n; i++)
        check(fr_meta_get(m, keys[(i * 7919) % n], 1000, n + i, &d), "get", m);
    printf("get (lease + LRU touch)/s                %12.0f\n", rate(n, t0));
    t0 = fr_now_ns();
    for (size_t i = 0; i < n; i++)
        check(fr_meta_remove(m, keys[i], 10 * n), "remove", m);
    printf("remove/s                                 %12.0f\n", rate(n, t0));

    uint64_t rev, id;
    t0 = fr_now_ns();
    for (size_t i = 0; i < n; i++)
        check(fr_meta_kv_put(m, keys[i % 1000], "0123456789abcdef", 16, &rev), "kv_put", m);
    printf("kv put/s (1000 keys, 16 B values)         %12.0f\n", rate(n, t0));

    fr_qrec_view v[64];
    size_t got;
    t0 = fr_now_ns();
    for (size_t i = 0; i < n; i += 64) {
        for (int k = 0; k < 64; k++)
            check(fr_meta_queue_push(m, "samples", "a-rollout-sample-record", 23, &id), "push", m);
        check(fr_meta_queue_pop(m, "samples", 64, 1000, i, v, &got), "pop", m);
        for (size_t k = 0; k < got; k++)
            check(fr_meta_queue_ack(m, v[k].id, v[k].deliveries), "ack", m);
    }
    printf("queue push+pop+ack records/s (pop by 64)  %12.0f\n", rate(n, t0));
    fr_meta_destroy(m);

    wal_run(base, keys, n, false);
    wal_run(base, keys, n / 10, true);
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    return 0;
}
