/* What `ferry up` checks --size against (src/cli/up_mem.c, included here
 * and run on made-up /proc and /sys/fs/cgroup trees): MemAvailable, and the
 * tightest cgroup memory limit on the process's cgroup and its ancestors,
 * for cgroup v2 (memory.max, memory.current; "max" is no limit) and v1
 * (memory.limit_in_bytes, memory.usage_in_bytes; a huge number is no
 * limit), and with no limit at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/up_mem.c"

static char root[64];

static void put(const char *rel, const char *text)
{
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/ferry-cli-mem-XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void probe(cli_mem *m)
{
    char proc[128], cg[128];
    snprintf(proc, sizeof proc, "%s/proc", root);
    snprintf(cg, sizeof cg, "%s/cg", root);
    assert_int_equal(cli_mem_probe(proc, cg, m), 0);
}

#define MiB (1ull << 20)

static void test_v2(void **state)
{
    (void)state;
    put("proc/meminfo", "MemTotal:       8388608 kB\nMemFree:        1000 kB\nMemAvailable:    4194304 kB\n");
    put("proc/self/cgroup", "0::/a/b\n");
    put("cg/cgroup.controllers", "cpu memory\n");
    put("cg/a/memory.max", "1073741824\n");
    put("cg/a/memory.current", "268435456\n");
    put("cg/a/b/memory.max", "max\n");
    put("cg/a/b/memory.current", "1000\n");
    cli_mem m;
    probe(&m);
    assert_int_equal(m.avail, 4096 * MiB);
    assert_true(m.cg);
    assert_int_equal(m.cg_limit, 1024 * MiB);
    assert_int_equal(m.cg_used, 256 * MiB);
    assert_non_null(strstr(m.cg_file, "/cg/a/memory.max"));
    assert_int_equal(cli_mem_headroom(&m), 768 * MiB);
}

static void test_v2_tightest_ancestor(void **state)
{
    (void)state;
    put("proc/meminfo", "MemAvailable:    4194304 kB\n");
    put("proc/self/cgroup", "0::/a/b\n");
    put("cg/cgroup.controllers", "memory\n");
    put("cg/a/memory.max", "1073741824\n");   /* 1 GiB, 900 MiB used: 124 MiB left */
    put("cg/a/memory.current", "943718400\n");
    put("cg/a/b/memory.max", "536870912\n");  /* 512 MiB, 100 MiB used: 412 MiB left */
    put("cg/a/b/memory.current", "104857600\n");
    cli_mem m;
    probe(&m);
    assert_true(m.cg);
    assert_int_equal(m.cg_limit, 1024 * MiB);
    assert_int_equal(cli_mem_headroom(&m), 124 * MiB);
}

static void test_v1_over_limit(void **state)
{
    (void)state;
    put("proc/meminfo", "MemAvailable:    4194304 kB\n");
    put("proc/self/cgroup", "9:name=systemd:/\n4:memory:/x\n3:cpu,cpuacct:/\n0::/x\n");
    put("cg/memory/x/memory.limit_in_bytes", "2147483648\n");
    put("cg/memory/x/memory.usage_in_bytes", "2684354560\n");   /* above its limit */
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");   /* the root: none */
    put("cg/memory/memory.usage_in_bytes", "5000000000\n");
    cli_mem m;
    probe(&m);
    assert_true(m.cg);
    assert_int_equal(m.cg_limit, 2048 * MiB);
    assert_int_equal(m.cg_used, 2048 * MiB);   /* use is capped at the limit */
    assert_int_equal(cli_mem_headroom(&m), 0);
}

static void test_no_limit(void **state)
{
    (void)state;
    put("proc/meminfo", "MemAvailable:    2097152 kB\n");
    put("proc/self/cgroup", "4:memory:/y\n0::/\n");
    put("cg/memory/y/memory.limit_in_bytes", "9223372036854771712\n");
    put("cg/memory/y/memory.usage_in_bytes", "1000\n");
    cli_mem m;
    probe(&m);
    assert_false(m.cg);
    assert_int_equal(m.avail, 2048 * MiB);
    assert_int_equal(cli_mem_headroom(&m), 2048 * MiB);
    /* and this machine's own files can be read */
    assert_int_equal(cli_mem_probe("/proc", "/sys/fs/cgroup", &m), 0);
    assert_true(m.avail > 0 && m.avail != UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_v2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v2_tightest_ancestor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1_over_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_limit, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
