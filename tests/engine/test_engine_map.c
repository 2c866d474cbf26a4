/* ferry_remote_map against a real peer process: a read-only view of its
 * ferry_mem_alloc'd region shows its bytes as it writes them and outlives
 * the peer; a region that is not remote-readable, a range outside it, heap
 * memory, a peer reached over tcp and bad arguments are refused with
 * nothing mapped. ferry_remote_access_begin: bytes written through its
 * pointer are the peer's (its own hash of them agrees), and the same
 * refusals hold for it, with nothing held. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ferry/engine.h"
#include "util/testutil.h"

#define SIZE (1u << 20)
#define OFF 4096u
#define LEN (256u << 10)

/* The peer's pattern `seed` over [OFF, OFF + LEN) equals the view. */
static bool view_is(const ferry_mapping *m, uint64_t seed)
{
    uint8_t *want = malloc(SIZE);
    assert_non_null(want);
    ft_pattern(want, SIZE, seed, 0);
    bool same = memcmp(m->addr, want + OFF, LEN) == 0;
    free(want);
    return same;
}

static void test_map_live_and_outlives_peer(void **state)
{
    (void)state;
    ft_peer p;
    ft_peer_opts o = {.size = SIZE, .flags = "rw"};
    assert_int_equal(ft_peer_start(&p, &o), 0);
    ferry_engine *e = ft_engine_open("");
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    char reply[128];
    assert_int_equal(ft_peer_cmd(&p, reply, sizeof reply, 10000, "fill 7"), 0);
    ferry_mapping m;
    assert_int_equal(ferry_remote_map(e, &rr, rr.addr + OFF, LEN, &m, NULL), 0);
    assert_string_equal(ferry_peer_transport(e, rr.peer), "shm");
    assert_non_null(m.addr);
    assert_true(m.len >= OFF + LEN);
    assert_true(view_is(&m, 7));
    /* live: what the peer writes next is there, no copy made */
    assert_int_equal(ft_peer_cmd(&p, reply, sizeof reply, 10000, "fill 9"), 0);
    assert_true(view_is(&m, 9));
    /* the view outlives the peer: its pages stay while mapped */
    ft_peer_signal(&p, SIGKILL);
    assert_int_equal(ft_peer_wait_exit(&p, 10000), 0);
    assert_true(view_is(&m, 9));
    ferry_remote_unmap(&m);
    assert_null(m.addr);
    ferry_remote_unmap(&m);   /* an empty view: a no-op */
    ft_peer_stop(&p);
    ferry_engine_close(e);
}

static void refused(const char *flags, bool heap, const char *transport, uint64_t off,
                    uint64_t len, int want)
{
    ft_peer p;
    ft_peer_opts o = {.size = SIZE, .flags = flags, .malloc_mem = heap};
    assert_int_equal(ft_peer_start(&p, &o), 0);
    ferry_engine *e = ft_engine_open(transport);
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    ferry_mapping m = { .addr = &m };
    assert_int_equal(ferry_remote_map(e, &rr, rr.addr + off, len, &m, NULL), want);
    assert_null(m.addr);
    assert_null(m.base);
    ferry_engine_close(e);
    ft_peer_stop(&p);
}

static void test_map_refused(void **state)
{
    (void)state;
    refused("w", false, "", OFF, LEN, FERRY_EACCES);           /* not remote-readable */
    refused("rw", false, "", SIZE - 16, 32, FERRY_EFAULT);     /* past the region's end */
    refused("rw", true, "", OFF, LEN, FERRY_ENOTSUP);          /* heap: cross-memory attach only */
    refused("rw", false, "tcp", OFF, LEN, FERRY_ENOTSUP);      /* not a same-host mapping */
    refused("rw", false, "", OFF, 0, FERRY_EINVAL);            /* nothing asked for */
    ferry_mapping m;
    assert_int_equal(ferry_remote_map(NULL, NULL, 0, 1, &m, NULL), FERRY_EINVAL);
}

static void test_access_writes_in_place(void **state)
{
    (void)state;
    ft_peer p;
    ft_peer_opts o = {.size = SIZE, .flags = "rw"};
    assert_int_equal(ft_peer_start(&p, &o), 0);
    ferry_engine *e = ft_engine_open("");
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    uint8_t *want = malloc(LEN);
    assert_non_null(want);
    ft_pattern(want, LEN, 31, 0);
    void *at = NULL;
    ferry_remote_access *a = NULL;
    assert_int_equal(ferry_remote_access_begin(e, &rr, rr.addr + OFF, LEN, FERRY_REMOTE_WRITE,
                                               &at, &a, NULL), 0);
    assert_non_null(at);
    assert_non_null(a);
    memcpy(at, want, LEN);
    ferry_remote_access_end(a);
    ferry_remote_access_end(NULL);   /* a no-op */
    assert_int_equal(ft_peer_hash(&p, OFF, LEN), ft_hash(want, LEN));
    /* reading: what the peer wrote */
    char reply[128];
    assert_int_equal(ft_peer_cmd(&p, reply, sizeof reply, 10000, "fill 5"), 0);
    assert_int_equal(ferry_remote_access_begin(e, &rr, rr.addr, SIZE, FERRY_REMOTE_READ, &at,
                                               &a, NULL), 0);
    assert_int_equal(ft_hash(at, SIZE), ft_peer_hash(&p, 0, SIZE));
    ferry_remote_access_end(a);
    /* the connection is not held after the end: a reset goes through */
    assert_int_equal(ferry_peer_reset(e, rr.peer), 0);
    free(want);
    ferry_engine_close(e);
    ft_peer_stop(&p);
}

static void access_refused(const char *flags, bool heap, const char *transport, uint64_t off,
                           uint64_t len, unsigned access, int want)
{
    ft_peer p;
    ft_peer_opts o = {.size = SIZE, .flags = flags, .malloc_mem = heap};
    assert_int_equal(ft_peer_start(&p, &o), 0);
    ferry_engine *e = ft_engine_open(transport);
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    void *at = &at;
    ferry_remote_access *a = (ferry_remote_access *)&at;
    assert_int_equal(ferry_remote_access_begin(e, &rr, rr.addr + off, len, access, &at, &a, NULL), want);
    assert_null(at);
    assert_null(a);
    assert_int_equal(ferry_peer_reset(e, rr.peer), 0);   /* nothing held */
    ferry_engine_close(e);
    ft_peer_stop(&p);
}

static void test_access_refused(void **state)
{
    (void)state;
    access_refused("r", false, "", OFF, LEN, FERRY_REMOTE_WRITE, FERRY_EACCES);
    access_refused("w", false, "", OFF, LEN, FERRY_REMOTE_READ, FERRY_EACCES);
    access_refused("rw", false, "", SIZE - 16, 32, FERRY_REMOTE_WRITE, FERRY_EFAULT);
    access_refused("rw", true, "", OFF, LEN, FERRY_REMOTE_WRITE, FERRY_ENOTSUP);
    access_refused("rw", false, "tcp", OFF, LEN, FERRY_REMOTE_WRITE, FERRY_ENOTSUP);
    access_refused("rw", false, "", OFF, 0, FERRY_REMOTE_WRITE, FERRY_EINVAL);
    access_refused("rw", false, "", OFF, LEN, 0, FERRY_EINVAL);
    void *at;
    ferry_remote_access *a;
    assert_int_equal(ferry_remote_access_begin(NULL, NULL, 0, 1, FERRY_REMOTE_READ, &at, &a, NULL),
                     FERRY_EINVAL);
}

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_live_and_outlives_peer),
        cmocka_unit_test(test_map_refused),
        cmocka_unit_test(test_access_writes_in_place),
        cmocka_unit_test(test_access_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
