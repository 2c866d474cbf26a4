/* Single-pull update of a rollout group: four rollout processes in TP2 x
 * DP2 (each TP shard held by two replicas) take two generations together,
 * applying in 64 KiB batches (reads of one batch overlap the pushes of the
 * one before); the store serves every published byte exactly once (1.00x),
 * the other replica gets it pushed, every parameter byte is checked, and
 * the group counters every worker reports say the same. Then a
 * reader whose engine fails during apply: both workers get FERRY_EREBUILD. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/ftstore.h"
#include "ferry/weights.h"

#define NT 6
#define WORLD 4
static const uint64_t shapes[NT][2] = {
    {1024, 256}, {512, 512}, {2048, 64}, {333, 77}, {4096, 1}, {2, 2},
};

static uint16_t bits(uint64_t g, size_t t, uint64_t i)
{
    return (uint16_t)(0x3c00u | ((g * 40503u + t * 977u + i) & 0x1ffu));
}

static void names_of(char names[NT][32])
{
    for (size_t k = 0; k < NT; k++)
        snprintf(names[k], 32, "model.%zu.weight", k);
}

/* ---- a rollout process ------------------------------------------------------------------ */

static int rollout_main(const char *addr, uint32_t rank, uint32_t world, uint32_t tpdeg,
                        const char *group, uint64_t timeout_ms)
{
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.lease_ms = 1;
    ferry_store *s = NULL;
    if (ferry_store_open(&cfg, &s) < 0) {
        printf("ERR open %s\n", ferry_store_last_error());
        return 1;
    }
    char names[NT][32];
    names_of(names);
    uint32_t tp = rank % tpdeg;   /* TP shard of this rank; the others are its DP replicas */
    ferry_param_shard sh[NT];
    for (size_t k = 0; k < NT; k++) {
        uint64_t half = (shapes[k][0] + tpdeg - 1) / tpdeg, r0 = tp * half;
        uint64_t rows = r0 + half <= shapes[k][0] ? half : shapes[k][0] - r0;
        sh[k] = (ferry_param_shard){ .tensor = names[k], .ndim = 2, .offset = { r0, 0 },
                                     .shape = { rows, shapes[k][1] },
                                     .dst = calloc(rows * shapes[k][1], 2) };
    }
    ferry_subscriber_config sc = { .model = "pull", .rank = rank, .world = world,
                                   .timeout_ms = timeout_ms,
                                   .batch_bytes = 64u << 10 };   /* apply in several batches */
    snprintf(sc.group, sizeof sc.group, "%s", group);
    ferry_subscriber *sub = NULL;
    ferry_error err = {0};
    if (ferry_subscriber_open(s, &sc, sh, NT, &sub, &err) < 0) {
        printf("ERR %s\n", err.msg);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    uint64_t gen = 0;
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long want;
        if (sscanf(line, "update %llu", &want) != 1)
            break;
        ferry_update_stats st;
        int rc = ferry_subscriber_update(sub, &gen, &st, &err);
        uint64_t bad = 0;
        for (size_t k = 0; rc == 0 && k < NT; k++) {
            const uint16_t *p = sh[k].dst;
            for (uint64_t i = 0; i < sh[k].shape[0] * shapes[k][1]; i++)
                bad += p[i] != bits(want, k, sh[k].offset[0] * shapes[k][1] + i);
        }
        ferry_update_node nd[2];
        int nn = ferry_subscriber_nodes(sub, nd, 2);
        if (rc == 0 && gen == want)
            printf("OK %llu %llu %llu %llu %llu %llu %llu %u %d %llu %llu %llu\n",
                   (unsigned long long)st.bytes_read,
                   (unsigned long long)st.group_bytes_read, (unsigned long long)st.bytes_pushed,
                   (unsigned long long)st.bytes_received, (unsigned long long)bad,
                   (unsigned long long)st.group_pushed_cross,
                   (unsigned long long)st.group_pushed_intra, st.nodes, nn,
                   (unsigned long long)(nn == 1 ? nd[0].store_read : 0),
                   (unsigned long long)(nn == 1 ? nd[0].pushed_intra : 0),
                   (unsigned long long)st.batches);
        else
            printf("ERR %d %s\n", rc, err.msg);
        fflush(stdout);
    }
    ferry_subscriber_close(sub);
    for (size_t k = 0; k < NT; k++)
        free(sh[k].dst);
    ferry_store_close(s);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------------ */

static uint64_t publish(ferry_store *s, uint64_t g)
{
    char names[NT][32];
    names_of(names);
    ferry_weight_tensor t[NT];
    uint64_t total = 0;
    for (size_t k = 0; k < NT; k++) {
        uint64_t n = shapes[k][0] * shapes[k][1];
        uint16_t *d = malloc(n * 2);
        for (uint64_t i = 0; i < n; i++)
            d[i] = bits(g, k, i);
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = "bf16", .ndim = 2,
                                      .shape = { shapes[k][0], shapes[k][1] }, .data = d };
        total += n * 2;
    }
    uint32_t node0 = 0;
    ferry_publisher_config pc = { .model = "pull", .rank = 0, .world = 1, .rank_node = &node0,
                                  .keep = 2, .timeout_ms = 10000 };
    ferry_error err = {0};
    assert_int_equal(ferry_publish(s, &pc, g, t, NT, NULL, &err), 0);
    for (size_t k = 0; k < NT; k++)
        free((void *)t[k].data);
    return total;
}

static void test_single_pull(void **state)
{
    (void)state;
    ft_cluster c;
    memset(&c, 0, sizeof c);
    assert_int_equal(ft_master_start(&c, NULL, NULL), 0);
    assert_int_equal(ft_node_start(&c, 0, 64u << 20, NULL, NULL), 0);
    ferry_store_config cfg;
    ft_store_config(&c, &cfg);
    cfg.lease_ms = 1;
    ferry_store *s = NULL;
    assert_int_equal(ferry_store_open(&cfg, &s), 0);
    ft_peer r[WORLD];
    for (int k = 0; k < WORLD; k++) {
        char rk[8];
        snprintf(rk, sizeof rk, "%d", k);
        const char *args[] = { "--rollout", c.addr, rk, "4", "2", "rollout", "20000", NULL };
        assert_int_equal(ft_spawn(&r[k], NULL, args), 0);
        char line[256];
        assert_int_equal(ft_read_line(&r[k], line, sizeof line, 20000), 0);
        assert_string_equal(line, "READY");
    }
    for (uint64_t g = 1; g <= 2; g++) {
        uint64_t published = publish(s, g);
        for (int k = 0; k < WORLD; k++)
            assert_int_equal(ft_peer_send(&r[k], "update %llu", (unsigned long long)g), 0);
        uint64_t read = 0, pushed = 0, received = 0, batches = 0;
        for (int k = 0; k < WORLD; k++) {
            char line[512];
            assert_int_equal(ft_peer_reply(&r[k], line, sizeof line, 30000), 0);
            unsigned long long a, b, c2, d, bad, cross, intra, nread, nintra, nb;
            unsigned nodes;
            int nn;
            if (sscanf(line, "OK %llu %llu %llu %llu %llu %llu %llu %u %d %llu %llu %llu", &a, &b,
                       &c2, &d, &bad, &cross, &intra, &nodes, &nn, &nread, &nintra, &nb) != 12)
                fail_msg("worker %d: %s", k, line);
            assert_int_equal(bad, 0);
            assert_int_equal(b, published);   /* the group read every byte once */
            /* the group's counters: one node, nothing crosses, each byte
             * pushed once to the other replica; store reads = the union
             * of the demands = every published byte */
            assert_int_equal(nodes, 1);
            assert_int_equal(nn, 1);
            assert_int_equal(cross, 0);
            assert_int_equal(intra, published);
            assert_int_equal(nintra, published);
            assert_int_equal(nread, published);
            batches += nb;
            read += a;
            pushed += c2;
            received += d;
        }
        fprintf(stderr, "generation %llu: published %llu, store read %llu (%.2fx), pushed %llu\n",
                (unsigned long long)g, (unsigned long long)published, (unsigned long long)read,
                (double)read / (double)published, (unsigned long long)pushed);
        assert_int_equal(read, published);
        assert_int_equal(pushed, published);     /* each byte to the other replica */
        assert_int_equal(received, published);
        assert_true(batches > WORLD);   /* 64 KiB batches: the reads were pipelined */
    }
    for (int k = 0; k < WORLD; k++)
        ft_peer_stop(&r[k]);

    /* A reader fails during apply (its engine cannot post: no read, no push,
     * no notification): the worker it feeds gets FERRY_EREBUILD, not a
     * hang, and so does the reader. */
    ft_peer f[2];
    for (int k = 0; k < 2; k++) {
        char rk[8];
        snprintf(rk, sizeof rk, "%d", k);
        if (k == 1)
            setenv("FERRY_FAULT", "post_fail_after=0", 1);
        const char *args[] = { "--rollout", c.addr, rk, "2", "1", "faulty", "1500", NULL };
        assert_int_equal(ft_spawn(&f[k], NULL, args), 0);
        unsetenv("FERRY_FAULT");
        char line[256];
        assert_int_equal(ft_read_line(&f[k], line, sizeof line, 20000), 0);
        assert_string_equal(line, "READY");
    }
    (void)publish(s, 3);
    for (int k = 0; k < 2; k++)
        assert_int_equal(ft_peer_send(&f[k], "update 3"), 0);
    for (int k = 0; k < 2; k++) {
        char line[512];
        assert_int_not_equal(ft_peer_reply(&f[k], line, sizeof line, 30000), 0);
        fprintf(stderr, "faulty group, worker %d: %s\n", k, line);
        char want[32];
        snprintf(want, sizeof want, "ERR %d ", FERRY_EREBUILD);
        assert_true(strncmp(line, want, strlen(want)) == 0);
    }
    for (int k = 0; k < 2; k++)
        ft_peer_stop(&f[k]);
    ferry_store_close(s);
    ft_cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc == 8 && !strcmp(argv[1], "--rollout"))
        return rollout_main(argv[2], (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]),
                            (uint32_t)atoi(argv[5]), argv[6], strtoull(argv[7], NULL, 10));
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_pull),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
