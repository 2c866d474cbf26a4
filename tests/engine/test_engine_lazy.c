/* Transports cost nothing unused: an engine that does not run the ucx
 * transport never maps UCX, whatever it allocates and registers; the first
 * engine that does loads it (and its memory hooks give a region a remote
 * key); and where UCX cannot be loaded (ctest's second run names a library
 * that is not there in FERRY_UCX_LIBRARY), opening a ucx engine fails with
 * FERRY_ENOTSUP, every time, while other engines still open. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "util/testutil.h"

#define MiB (1024ull * 1024)

/* Whether a file whose name contains lib is mapped into this process. */
static bool mapped(const char *lib)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    bool yes = false;
    while (!yes && fgets(line, sizeof line, f))
        yes = strstr(line, lib) != NULL;
    fclose(f);
    return yes;
}

/* Allocate, register for remote access and export on e: what reaches the
 * memory hooks of the transports e runs. Returns the exported rkey's length. */
static uint16_t use_memory(ferry_engine *e)
{
    void *m;
    ferry_region *r;
    assert_int_equal(ferry_mem_alloc(e, MiB, &m, NULL), 0);
    assert_int_equal(ferry_region_register(e, m, MiB, FERRY_REMOTE_RW, FERRY_MEM_HOST, &r, NULL), 0);
    uint8_t d[FERRY_DESC_MAX];
    int dn = ferry_region_export(r, d, sizeof d);
    assert_true(dn > 0);
    fr_region_desc rd;
    assert_int_equal(fr_region_desc_decode(d, (size_t)dn, &rd), 0);
    assert_int_equal(ferry_region_unregister(r, NULL), 0);
    assert_int_equal(ferry_mem_free(e, m, NULL), 0);
    return rd.rkey_len;
}

static void test_unused_ucx_is_not_loaded(void **s)
{
    (void)s;
    const char *tps[] = {"", "shm", "tcp"};
    for (size_t i = 0; i < sizeof tps / sizeof *tps; i++) {
        ferry_engine *e = ft_engine_open(tps[i]);
        assert_int_equal(use_memory(e), 0);   /* no memory transport: no remote key */
        ferry_engine_close(e);
    }
    assert_false(mapped("libucp"));
    assert_false(mapped("libucs"));
}

static void test_ucx_engine_loads_ucx(void **s)
{
    (void)s;
#ifndef FERRY_HAVE_UCX
    fprintf(stderr, "skipped: this build has no ucx transport (pkg-config found no UCX "
                    "headers; scripts/deps.sh installs libucx-dev)\n");
    skip();
#else
    const char *lib = getenv("FERRY_UCX_LIBRARY");
    ferry_engine_config c;
    ft_config(&c, "ucx");
    ferry_engine *e = NULL;
    if (lib && *lib) {   /* UCX cannot be loaded: a clear refusal, every time */
        fprintf(stderr, "FERRY_UCX_LIBRARY=%s: a ucx engine must not open\n", lib);
        ferry_error err = {0};
        for (int k = 0; k < 2; k++) {   /* the second open says why as well as the first */
            memset(&err, 0, sizeof err);
            assert_int_equal(ferry_engine_open(&c, &e, &err), FERRY_ENOTSUP);
            assert_null(e);
            assert_int_equal(err.code, FERRY_ENOTSUP);
            assert_non_null(strstr(err.msg, "cannot start the ucx transport: cannot load "));
            assert_non_null(strstr(err.msg, lib));
        }
        assert_false(mapped("libucp"));
        e = ft_engine_open("tcp");   /* the other transports are unaffected */
        assert_int_equal(use_memory(e), 0);
        ferry_engine_close(e);
        return;
    }
    assert_int_equal(ferry_engine_open(&c, &e, NULL), 0);
    assert_true(mapped("libucp"));
    assert_true(use_memory(e) > 0);   /* the ucx reg hook packed the region's rkey */
    ferry_engine_close(e);
#endif
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unused_ucx_is_not_loaded),   /* first: nothing loaded yet */
        cmocka_unit_test(test_ucx_engine_loads_ucx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
