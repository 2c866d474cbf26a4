/* `ferry-lab demo --sparse` end to end through the built binary, small sizes:
 * trainers publish a dense base and sparse delta generations, EP2 x TP2
 * rollouts apply them; every generation must verify (no wrong element),
 * move fewer sparse bytes than a dense update of the same boxes, need no
 * full-object get (the tiles are small enough that no box needs a whole
 * object), refuse a stale base in every rollout, and the node-batched read
 * must dedup the replicated tensors' ranges between the EP replicas. Every
 * generation is announced in the weights registry (the chain grows from
 * dense generation 1), the rollouts take each delta's keys from it, and a
 * rollout restarted fresh at the end gets dense generation 1 plus the whole
 * chain, every byte verified. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "util/ftstore.h"

static char out[1 << 17];

/* Run `ferry-lab demo --sparse ARGS --json`; the exit status. */
static int run(const char *args)
{
    int st = ft_run(out, sizeof out, "%s demo --sparse %s --json", ft_lab_bin(), args);
    fprintf(stderr, "%s: %s", args, out);
    return st;
}

static json_int_t get_int(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    assert_non_null(v);
    return json_integer_value(v);
}

static void test_sparse_generations(void **state)
{
    (void)state;
    int st = run("--hidden 256 --ffn 512 --experts 4 --generations 2 --tile 64 --density 0.02");
    assert_int_equal(st, 0);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    assert_non_null(o);
    assert_true(json_is_true(json_object_get(o, "ok")));
    assert_int_equal(get_int(o, "rollouts"), 4);
    assert_int_equal(get_int(json_object_get(o, "base"), "wrong_elements"), 0);
    const json_t *gens = json_object_get(o, "generations");
    assert_int_equal(json_array_size(gens), 2);
    size_t i;
    const json_t *g;
    json_array_foreach(gens, i, g) {
        const json_t *c = json_object_get(g, "counters"), *nd = json_object_get(g, "node_batched");
        assert_true(json_is_true(json_object_get(g, "ok")));
        assert_int_equal(get_int(g, "generation"), (json_int_t)i + 2);
        assert_int_equal(get_int(g, "wrong_elements"), 0);
        assert_int_equal(get_int(g, "fence_refused"), 4);
        assert_true(get_int(g, "nnz") > 0);
        /* 4 experts w1/w2 put by their trainer, 4 replicated tensors by the admitted one */
        assert_int_equal(get_int(g, "puts"), 12);
        assert_int_equal(get_int(g, "admission_skips"), 4);
        assert_true(get_int(g, "sparse_bytes") < get_int(g, "dense_bytes"));
        assert_int_equal(get_int(c, "full_indices_values_get_count"), 0);
        assert_int_equal(get_int(nd, "full_indices_values_get_count"), 0);
        /* every rollout: 4 replicated objects, its 2 experts' 4 owned ones */
        assert_int_equal(get_int(c, "non_ep_source_object_count"), 4 * 4);
        assert_int_equal(get_int(nd, "non_ep_source_object_count"), 4);
        assert_true(get_int(nd, "dedup_hits") > 0);
        assert_true(get_int(nd, "unique_range_gets") < get_int(c, "unique_range_gets"));
        assert_true(get_int(nd, "bytes_read") < get_int(c, "bytes_read"));
        /* the index reads and the per-member ranged reads, counted */
        assert_int_equal(get_int(c, "index_checks"), get_int(c, "source_objects"));
        assert_int_equal(get_int(c, "index_range_bytes") + get_int(c, "value_range_bytes"),
                         get_int(c, "bytes_read"));
        assert_true(get_int(c, "index_range_bytes") > get_int(c, "value_range_bytes"));
        assert_true(get_int(c, "index_bytes_read") > 0 || get_int(c, "index_cache_hits") > 0);
        const json_t *an = json_object_get(c, "announce");
        assert_int_equal(get_int(an, "objects"), 12);
        assert_int_equal(get_int(an, "dense_generation"), 1);
        assert_int_equal(get_int(an, "chain"), (json_int_t)i + 2);   /* 1 -> 2 (-> 3) */
    }
    const json_t *fw = json_object_get(o, "fresh_worker");
    assert_non_null(fw);
    assert_true(json_is_true(json_object_get(fw, "ok")));
    assert_int_equal(get_int(fw, "generation"), 3);
    assert_int_equal(get_int(fw, "dense_generation"), 1);
    assert_int_equal(get_int(fw, "deltas"), 2);
    assert_int_equal(get_int(fw, "wrong_elements"), 0);
    assert_true(get_int(fw, "dense_bytes") > 0);
    assert_true(get_int(fw, "sparse_bytes") > 0);
    json_decref(o);
}

static void test_bad_shape_refused(void **state)
{
    (void)state;
    int st = ft_run(out, sizeof out, "%s demo --sparse --rollouts 3 --ep 2 2>&1", ft_lab_bin());
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "usage: ferry-lab demo"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sparse_generations),
        cmocka_unit_test(test_bad_shape_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
