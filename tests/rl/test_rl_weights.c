/* Publisher assignment (determinism across processes, balance on the
 * kimi-k2 preset over 32 nodes), rollout dtype conversion against
 * independent references, generation keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry/ferry.h"

static uint64_t *kimi_bytes(size_t *n)
{
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_preset("kimi-k2", &m, NULL), 0);
    *n = ferry_model_tensor_count(m);
    uint64_t *b = malloc(*n * sizeof *b);
    assert_non_null(b);
    for (size_t i = 0; i < *n; i++) {
        ferry_model_tensor t;
        assert_int_equal(ferry_model_tensor_at(m, i, &t), 0);
        uint64_t e = t.desc.itemsize;
        for (uint32_t d = 0; d < t.desc.ndim; d++)
            e *= t.desc.shape[d];
        b[i] = e;
    }
    ferry_model_free(m);
    return b;
}

static uint64_t fnv(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void test_assign_balanced_and_deterministic(void **state)
{
    (void)state;
    size_t n;
    uint64_t *bytes = kimi_bytes(&n);
    enum { NODES = 32, PER = 8, RANKS = NODES * PER };
    uint32_t rank_node[RANKS];
    for (uint32_t r = 0; r < RANKS; r++)
        rank_node[r] = r / PER;
    uint32_t *pub = malloc(n * sizeof *pub);
    assert_int_equal(ferry_weights_assign(bytes, n, rank_node, RANKS, pub, NULL), 0);
    uint64_t node_load[NODES] = {0}, rank_load[RANKS] = {0}, total = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(pub[i] < RANKS);
        node_load[rank_node[pub[i]]] += bytes[i];
        rank_load[pub[i]] += bytes[i];
        total += bytes[i];
    }
    uint64_t mx = 0, rmx = 0;
    for (int k = 0; k < NODES; k++)
        mx = node_load[k] > mx ? node_load[k] : mx;
    for (int r = 0; r < RANKS; r++)
        rmx = rank_load[r] > rmx ? rank_load[r] : rmx;
    double ratio = (double)mx / ((double)total / NODES);
    double rratio = (double)rmx / ((double)total / RANKS);
    fprintf(stderr, "kimi-k2: %zu tensors, %.1f GiB over %d nodes: max/mean per node %.5f, "
            "per rank %.5f\n", n, (double)total / (1ull << 30), NODES, ratio, rratio);
    assert_true(ratio <= 1.05);
    assert_true(rratio <= 1.05);

    /* Every rank computes the same answer: four processes, one hash. */
    uint64_t want = fnv(pub, n * sizeof *pub);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    for (int k = 0; k < 4; k++) {
        pid_t p = fork();
        if (p == 0) {
            uint32_t *mine = malloc(n * sizeof *mine);
            uint64_t h = 0;
            if (mine && ferry_weights_assign(bytes, n, rank_node, RANKS, mine, NULL) == 0)
                h = fnv(mine, n * sizeof *mine);
            _exit(write(fds[1], &h, sizeof h) == sizeof h ? 0 : 1);
        }
        assert_true(p > 0);
    }
    for (int k = 0; k < 4; k++) {
        uint64_t h = 0;
        assert_int_equal(read(fds[0], &h, sizeof h), (ssize_t)sizeof h);
        assert_int_equal(h, want);
        int st;
        wait(&st);
    }
    close(fds[0]);
    close(fds[1]);

    /* Uneven nodes: a node with more ranks still gets its byte share by node. */
    uint32_t rn[5] = {7, 7, 7, 3, 9};
    uint64_t b[9] = {10, 10, 10, 10, 10, 10, 9, 1, 0};
    uint32_t pb[9];
    assert_int_equal(ferry_weights_assign(b, 9, rn, 5, pb, NULL), 0);
    uint64_t per[10] = {0};
    for (int i = 0; i < 9; i++)
        per[rn[pb[i]]] += b[i];
    assert_int_equal(per[3] + per[7] + per[9], 70);
    assert_true(per[3] >= 20 && per[7] >= 20 && per[9] >= 20);
    ferry_error err = {0};
    assert_int_equal(ferry_weights_assign(b, 9, rn, 0, pb, &err), FERRY_EINVAL);
    free(pub);
    free(bytes);
}

/* Nearest bf16 to an f32 by exhaustive neighbour comparison in double. */
static uint16_t ref_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    uint32_t lu = (uint32_t)lo << 16, hu = (uint32_t)hi << 16;
    float lf, hf;
    memcpy(&lf, &lu, 4);
    memcpy(&hf, &hu, 4);
    double dl = (double)f - (double)lf, dh = (double)hf - (double)f;
    if (dl < 0)
        dl = -dl;
    if (dh < 0)
        dh = -dh;
    if (dl < dh)
        return lo;
    if (dh < dl)
        return hi;
    return (lo & 1) ? hi : lo;
}

static void test_convert(void **state)
{
    (void)state;
    /* Every bf16 and every f16 value survives a round trip through f32. */
    for (uint32_t v = 0; v < 65536; v++) {
        uint16_t h = (uint16_t)v, back;
        float f;
        for (int k = 0; k < 2; k++) {
            const char *dt = k ? "f16" : "bf16";
            assert_int_equal(ferry_convert(&h, dt, &f, "f32", 1), 0);
            assert_int_equal(ferry_convert(&f, "f32", &back, dt, 1), 0);
            if (f == f)
                assert_int_equal(back, h);
            else if (k)   /* NaN stays a NaN, sign kept */
                assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff) && (back >> 15) == (h >> 15));
            else
                assert_true((back & 0x7f80) == 0x7f80 && (back & 0x7f) && (back >> 15) == (h >> 15));
        }
    }
    /* f32 -> f16 against the compiler's own conversion (round to nearest
     * even), f32 -> bf16 against the neighbour reference, on random bits. */
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < 2000000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t u = (uint32_t)s;
        if (i % 4 == 0)   /* many values near f16's range */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + (s >> 40) % 45) << 23);
        float f;
        memcpy(&f, &u, 4);
        uint16_t h, b;
        assert_int_equal(ferry_convert(&f, "f32", &h, "f16", 1), 0);
        assert_int_equal(ferry_convert(&f, "f32", &b, "bf16", 1), 0);
        if (f != f) {
            assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff));
            assert_true((b & 0x7f80) == 0x7f80 && (b & 0x7f));
            continue;
        }
        _Float16 r = (_Float16)f;
        uint16_t rh;
        memcpy(&rh, &r, 2);
        if (h != rh)
            fail_msg("f16 of %a: got %04x, want %04x", (double)f, h, rh);
        if (b != ref_bf16(f) && (b & 0x7f80) != 0x7f80)
            fail_msg("bf16 of %a: got %04x, want %04x", (double)f, b, ref_bf16(f));
    }
    /* bf16 -> f16 rounds once; unknown dtypes refused. */
    uint16_t bf = 0x3f80, out;   /* 1.0 */
    assert_int_equal(ferry_convert(&bf, "bf16", &out, "f16", 1), 0);
    assert_int_equal(out, 0x3c00);
    assert_int_equal(ferry_convert(&bf, "fp8_e4m3", &out, "f16", 1), FERRY_EINVAL);
}

static void test_keys(void **state)
{
    (void)state;
    char k[128];
    assert_int_equal(ferry_weights_key("qwen3-8b", 12, "layers.0.mlp.up/3", k, sizeof k),
                     (int)strlen("ferry/w/qwen3-8b/00000000000000000012/layers.0.mlp.up/3"));
    assert_string_equal(k, "ferry/w/qwen3-8b/00000000000000000012/layers.0.mlp.up/3");
    assert_int_equal(ferry_weights_key("a/b", 1, "x", k, sizeof k), FERRY_EINVAL);
    assert_int_equal(ferry_weights_key("m", 1, "x", k, 10), FERRY_EMSGSIZE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_assign_balanced_and_deterministic),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
