/* ferry_remote_warm against a real peer process over shm: a write warm-up
 * keeps every byte the peer holds, also while the peer rewrites the region,
 * and after it a WRITE of the warmed range takes almost no page faults in
 * this process where a cold one takes about one per page (4 KiB pages); a read warm-up
 * of a read-only region; a write warm-up of it, a range past the end and
 * bad arguments are refused; heap memory and a peer over tcp have nothing
 * to warm (0 bytes, no error). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "ferry/engine.h"
#include "util/testutil.h"

#define SIZE (16u << 20)
#define PAGES (SIZE / 4096u)

static uint64_t faults(void)
{
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    return (uint64_t)ru.ru_minflt;
}

/* The minor faults this process takes for one WRITE of SIZE bytes from a
 * warm local buffer into the whole remote region. */
static uint64_t write_faults(ferry_engine *e, const ferry_remote_region *rr, void *src)
{
    ferry_op op = { .opcode = FERRY_OP_WRITE, .local = src, .len = SIZE, .peer = rr->peer,
                    .remote_addr = rr->addr, .key = rr->key };
    ferry_ticket *t = NULL;
    uint64_t f0 = faults();
    assert_int_equal(ferry_submit(e, &op, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 60000), FERRY_TICKET_COMPLETED);
    uint64_t f = faults() - f0;
    ferry_ticket_free(t);
    return f;
}

static void *local_source(ferry_engine *e, ferry_region **r)
{
    void *src = NULL;
    assert_int_equal(ferry_mem_alloc(e, SIZE, &src, NULL), 0);
    ft_pattern(src, SIZE, 11, 0);   /* the source's own pages are written here, not in the WRITE */
    assert_int_equal(ferry_region_register(e, src, SIZE, 0, FERRY_MEM_HOST, r, NULL), 0);
    return src;
}

static void test_warm_write_keeps_bytes(void **state)
{
    (void)state;
    ft_peer p;
    ft_peer_opts o = {.size = SIZE, .flags = "rw"};
    assert_int_equal(ft_peer_start(&p, &o), 0);
    char reply[128];
    assert_int_equal(ft_peer_cmd(&p, reply, sizeof reply, 10000, "fill 7"), 0);
    ferry_engine *e = ft_engine_open("");
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    /* the peer rewrites its region while this process warms it */
    assert_int_equal(ft_peer_send(&p, "fill 9"), 0);
    uint64_t touched = 0;
    assert_int_equal(ferry_remote_warm(e, &rr, rr.addr, SIZE, true, &touched, NULL), 0);
    assert_string_equal(ferry_peer_transport(e, rr.peer), "shm");
    assert_int_equal(touched, SIZE);
    assert_int_equal(ft_peer_reply(&p, reply, sizeof reply, 10000), 0);
    uint8_t *want = malloc(SIZE);
    assert_non_null(want);
    ft_pattern(want, SIZE, 9, 0);
    assert_true(ft_peer_hash(&p, 0, SIZE) == ft_hash(want, SIZE));   /* nothing lost */
    /* warm: the WRITE copies through entries this process made */
    ferry_region *lr = NULL;
    void *src = local_source(e, &lr);
    uint64_t warm = write_faults(e, &rr, src);
    ft_pattern(want, SIZE, 11, 0);
    assert_true(ft_peer_hash(&p, 0, SIZE) == ft_hash(want, SIZE));
    /* cold: a second engine, its own fresh mapping of the same region */
    ferry_engine *e2 = ft_engine_open("");
    ferry_remote_region rr2;
    assert_int_equal(ferry_region_import(e2, p.desc, p.desc_len, &rr2, NULL), 0);
    ferry_region *lr2 = NULL;
    void *src2 = local_source(e2, &lr2);
    uint64_t cold = write_faults(e2, &rr2, src2);
    print_message("WRITE of %u pages: %llu faults after a warm-up, %llu cold\n", PAGES,
                  (unsigned long long)warm, (unsigned long long)cold);
    assert_true(warm <= PAGES / 100);
    assert_true(cold > warm);   /* about one a page with 4 KiB shmem pages; fewer with huge ones */
    free(want);
    ferry_engine_close(e2);
    ferry_engine_close(e);
    ft_peer_stop(&p);
}

static void test_warm_read_only(void **state)
{
    (void)state;
    ft_peer p;
    ft_peer_opts o = {.size = SIZE, .flags = "r"};
    assert_int_equal(ft_peer_start(&p, &o), 0);
    ferry_engine *e = ft_engine_open("");
    /* the peer runs here (what ferry_store_warm asks before connecting) */
    assert_int_equal(ferry_region_desc_local(e, p.desc, p.desc_len), 1);
    const uint8_t junk[8] = {0};
    assert_int_equal(ferry_region_desc_local(e, junk, sizeof junk), FERRY_EINVAL);
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    uint64_t touched = 1;
    assert_int_equal(ferry_remote_warm(e, &rr, rr.addr, SIZE, true, &touched, NULL), FERRY_EACCES);
    assert_int_equal(touched, 0);
    assert_int_equal(ferry_remote_warm(e, &rr, rr.addr + 4096, SIZE - 8192, false, &touched, NULL), 0);
    assert_int_equal(touched, SIZE - 8192);
    assert_int_equal(ferry_remote_warm(e, &rr, rr.addr + 4096, SIZE, false, &touched, NULL),
                     FERRY_EFAULT);
    assert_int_equal(ferry_remote_warm(e, &rr, rr.addr, 1, false, NULL, NULL), 0);
    assert_int_equal(ferry_remote_warm(NULL, &rr, rr.addr, 1, false, NULL, NULL), FERRY_EINVAL);
    assert_int_equal(ferry_remote_warm(e, NULL, 0, 1, false, NULL, NULL), FERRY_EINVAL);
    ferry_engine_close(e);
    ft_peer_stop(&p);
}

/* Nothing to warm where the engine copies through no mapping of its own. */
static void nothing_to_warm(bool heap, const char *transport)
{
    ft_peer p;
    ft_peer_opts o = {.size = SIZE, .flags = "rw", .malloc_mem = heap};
    assert_int_equal(ft_peer_start(&p, &o), 0);
    ferry_engine *e = ft_engine_open(transport);
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    uint64_t touched = 1;
    assert_int_equal(ferry_remote_warm(e, &rr, rr.addr, SIZE, true, &touched, NULL), 0);
    assert_int_equal(touched, 0);
    ferry_engine_close(e);
    ft_peer_stop(&p);
}

static void test_warm_nothing(void **state)
{
    (void)state;
    nothing_to_warm(true, "");      /* heap: cross-memory attach */
    nothing_to_warm(false, "tcp");  /* not a same-host mapping */
}

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warm_write_keeps_bytes),
        cmocka_unit_test(test_warm_read_only),
        cmocka_unit_test(test_warm_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
