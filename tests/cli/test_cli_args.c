/* The CLI's options through the built binary: a bad value (trailing
 * characters, no digits, a sign, out of range) is refused before anything
 * starts, with exit status 2 and one line that names the option and the
 * value; a good one still works; every command's -h/--help prints its
 * usage to stdout and exits 0 without starting anything; an unknown option
 * is a usage error naming it, exit 2. Every command here would start processes
 * (a cluster, workers, a benchmark) if its value were taken, so each runs
 * under `timeout` and must return at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/ftstore.h"
#include "util/testutil.h"

static char out[1 << 16];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* `ferry ARGS` (`ferry-lab` for demo and bench) must fail with status 2,
 * its first line "ferry: OPT ... (or "ferry-lab: OPT ...
 * 'BAD'", before it starts anything: within seconds on a loaded machine,
 * where a started cluster or benchmark would run far longer (a master or a
 * node forever, until `timeout` ends it with 124). */
static void refused(const char *args, const char *opt, const char *bad)
{
    double t0 = now();
    const char *bin = ft_bin_for(args);
    int st = ft_run(out, sizeof out, "timeout 60 %s %s 2>&1", bin, args);
    double dt = now() - t0;
    fprintf(stderr, "ferry %s -> %d in %.2f s: %.*s\n", args, st, dt, (int)strcspn(out, "\n"), out);
    assert_int_equal(st, 2);
    assert_true(dt < 15);
    char want[160];
    snprintf(want, sizeof want, "%s: %s wants ", strcmp(bin, ft_lab_bin()) ? "ferry" : "ferry-lab", opt);
    assert_int_equal(strncmp(out, want, strlen(want)), 0);   /* the reason comes first */
    snprintf(want, sizeof want, "'%s'\n", bad);
    const char *nl = strchr(out, '\n');
    assert_non_null(nl);
    const char *q = strstr(out, want);
    assert_true(q && q < nl + 1);   /* the value, on that same line */
}

static void test_demo_rl(void **state)
{
    (void)state;
    refused("demo rl --rollouts 3x", "--rollouts", "3x");
    assert_non_null(strstr(out, "usage: ferry-lab demo rl"));   /* the usage still follows */
    refused("demo rl --rollouts abc", "--rollouts", "abc");
    refused("demo rl --rollouts 65", "--rollouts", "65");
    refused("demo rl --steps 0", "--steps", "0");
    refused("demo rl --rate inf", "--rate", "inf");
    refused("demo rl --train-ms 5ms", "--train-ms", "5ms");
    refused("demo rl --weights 1K", "--weights", "1K");
    refused("demo rl --stale keep", "--stale", "keep");      /* a choice: the words are named */
    assert_non_null(strstr(out, "wants drop or recompute, not 'keep'"));
    refused("demo rl --seed -1", "--seed", "-1");           /* through the command's callback */
    refused("demo rl --rate 1e7", "--rate", "1e7");         /* a decimal out of its range */
}

static void test_demo(void **state)
{
    (void)state;
    refused("demo --trainers -1", "--trainers", "-1");
    refused("demo --rollouts 99999999999999999999999", "--rollouts", "99999999999999999999999");
    refused("demo --generations 65", "--generations", "65");
    refused("demo --bytes 512K", "--bytes", "512K");
    refused("demo --sparse --density 2x", "--density", "2x");
    refused("demo --sparse --density 0", "--density", "0");
    refused("demo --sparse --ep 2.5", "--ep", "2.5");
    refused("demo engine --size 4X", "--size", "4X");
    assert_non_null(strstr(out, "this is not one: '4X'"));          /* named as not a size */
    refused("demo --bytes 512K", "--bytes", "512K");
    assert_non_null(strstr(out, "at least 1 MiB (this one reads 512 KiB)"));   /* a size, too small */
}

/* Sizes: decimals, units K to P in either case with or without iB or B,
 * read as binary units; what was read is said back when it is out of
 * range (--bytes wants at least 1 MiB), and what is not a size is named. */
static void test_sizes(void **state)
{
    (void)state;
    static const char *const read[][2] = {
        { "0.5M", "reads 512 KiB" }, { "0.5MiB", "reads 512 KiB" }, { "512k", "reads 512 KiB" },
        { "0.25mb", "reads 256 KiB" }, { "1023K", "reads 1023 KiB" },
    };
    for (size_t i = 0; i < sizeof read / sizeof *read; i++) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "demo --bytes %s", read[i][0]);
        refused(cmd, "--bytes", read[i][0]);
        if (!strstr(out, read[i][1]))
            fail_msg("%s: want %s in: %s", cmd, read[i][1], out);
    }
    static const char *const bad[] = { "1.5", "16384P", "1e9", "1.G", "2GX", "1.5.2G" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "demo --bytes %s", bad[i]);
        refused(cmd, "--bytes", bad[i]);
        if (!strstr(out, "this is not one"))
            fail_msg("%s: want 'this is not one' in: %s", cmd, out);
    }
}

static void test_bench(void **state)
{
    (void)state;
    refused("bench exec --reps 0", "--reps", "0");
    refused("bench exec --reps x", "--reps", "x");
    refused("bench exec --threads 65", "--threads", "65");
    refused("bench engine --streams 4q", "--streams", "4q");
    refused("bench engine --block -1", "--block", "-1");
    refused("bench engine --rows ' 8'", "--rows", " 8");
    refused("bench engine --transport rdma", "--transport", "rdma");
    refused("bench engine --transport ucx --tls rc", "--tls", "rc");
    refused("bench engine --transport ucx --block 0", "--block", "0");
    /* --block repeats, each one appended, up to 8 */
    int st = ft_run(out, sizeof out, "timeout 60 %s bench engine --block 1 --block 2 --block 3 --block 4 "
                    "--block 5 --block 6 --block 7 --block 8 --block 9 2>&1", ft_lab_bin());
    assert_int_equal(st, 2);
    assert_int_equal(strncmp(out, "ferry-lab bench engine: at most 8 --block sizes\n", 48), 0);
    refused("bench store --clients 0", "--clients", "0");
    refused("bench store --size 1x", "--size", "1x");
    refused("bench weights --reps +3", "--reps", "+3");
    refused("bench sparse --tile 0x4", "--tile", "0x4");
    refused("bench sparse --tile 16x16x", "--tile", "16x16x");
}

static void test_plan(void **state)
{
    (void)state;
    refused("plan --model qwen3-8b --src fsdp:8 --dst tp:4,dp:2 --runs 5x", "--runs", "5x");
    refused("plan --model qwen3-8b --src fsdp:8 --dst tp:4,dp:2 --dst-rank -1", "--dst-rank", "-1");
    refused("plan --model qwen3-8b --src fsdp:8 --dst tp:4,dp:2 --gpus-per-node 0", "--gpus-per-node",
            "0");
    refused("plan --model qwen3-8b --src fsdp:8 --dst tp:4,dp:2 --nic nangbps", "--nic", "nangbps");
    refused("bench plan --model qwen3-8b --src fsdp:8 --dst tp:4,dp:2 --baseline-tensors 1e3",
            "--baseline-tensors", "1e3");

    /* good values still work */
    int st = ft_run(out, sizeof out,
                    "%s plan --model qwen3-8b --src fsdp:8 --dst tp:4,dp:2 --gpus-per-node 8 --runs 3 "
                    "--dst-rank 1 2>&1", ft_ferry_bin());
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "model.embed_tokens.weight"));
    assert_null(strstr(out, "ferry: "));
}

static void test_master_node_up(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-cli-args-XXXXXX", cmd[256];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "master --dir %s/m --heartbeat-timeout 10x", dir);
    refused(cmd, "--heartbeat-timeout", "10x");
    snprintf(cmd, sizeof cmd, "master --dir %s/m --checkpoint-records 0", dir);
    refused(cmd, "--checkpoint-records", "0");
    refused("node --master 127.0.0.1:1 --heartbeat 60001", "--heartbeat", "60001");
    refused("node --master 127.0.0.1:1 --size 512K", "--size", "512K");
    snprintf(cmd, sizeof cmd, "up --dir %s/u --size 1x", dir);
    refused(cmd, "--size", "1x");
    ft_run(out, sizeof out, "rm -rf '%s'", dir);
}

/* ---- -h/--help and unknown options -------------------------------------------------------- */

/* The commands and the first words of their usage. Each would start
 * processes (a cluster, workers, a benchmark) if it ran. */
static const char *const cmds[][2] = {
    { "demo", "usage: ferry-lab demo " },
    { "demo rl", "usage: ferry-lab demo rl " },
    { "demo --sparse", "usage: ferry-lab demo --sparse " },
    { "demo engine", "usage: ferry-lab demo engine " },
    { "bench", "usage: ferry-lab bench " },
    { "bench engine", "usage: ferry-lab bench engine " },
    { "bench store", "usage: ferry-lab bench store " },
    { "bench weights", "usage: ferry-lab bench weights " },
    { "bench plan", "usage: ferry-lab bench plan " },
    { "bench exec", "usage: ferry-lab bench exec " },
    { "bench sparse", "usage: ferry-lab bench sparse " },
    { "bench cluster", "usage: ferry-lab bench cluster " },
    { "cluster", "usage: ferry-lab cluster " },
    { "cluster up", "usage: ferry-lab cluster up " },
    { "cluster check", "usage: ferry-lab cluster check " },
    { "cluster clean", "usage: ferry-lab cluster clean " },
    { "up", "usage: ferry up " },
    { "down", "usage: ferry down " },
    { "status", "usage: ferry status " },
    { "master", "usage: ferry master " },
    { "node", "usage: ferry node " },
    { "plan", "usage: ferry plan " },
    { "token", "usage: ferry token" },
    { "version", "usage: ferry version" },
};

static char err[1 << 16];

/* `ferry ARGS` (ferry-lab for demo and bench): its stdout in out, its stderr in err, its exit status. */
static int run_split(const char *args, double *secs)
{
    char path[] = "/tmp/ferry-cli-err-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    double t0 = now();
    int st = ft_run(out, sizeof out, "timeout 60 %s %s 2>%s", ft_bin_for(args), args, path);
    *secs = now() - t0;
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(err, 1, sizeof err - 1, f) : 0;
    err[n] = 0;
    if (f)
        fclose(f);
    unlink(path);
    return st;
}

/* -h and --help, also after other options: the usage on stdout, nothing
 * on stderr, exit 0, at once (nothing started: a started demo, cluster or
 * benchmark runs far longer, and prints its banner on stderr first). */
static void test_help(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-cli-help-XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *forms[] = { "--help", "-h", "--json --help" };
        for (size_t k = 0; k < 3; k++) {
            bool json = k == 2;
            if (json && strncmp(cmds[i][0], "demo", 4) && strcmp(cmds[i][0], "status"))
                continue;   /* --json first: only where it is an option */
            char args[256];
            snprintf(args, sizeof args, "%s %s", cmds[i][0], forms[k]);
            if (!strcmp(cmds[i][0], "up") || !strcmp(cmds[i][0], "down") ||
                !strcmp(cmds[i][0], "master"))
                snprintf(args, sizeof args, "%s --dir %s/%s %s", cmds[i][0], dir, cmds[i][0],
                         forms[k]);
            double dt;
            int st = run_split(args, &dt);
            fprintf(stderr, "ferry %s -> %d in %.2f s: %.*s | stderr: %.*s\n", args, st, dt,
                    (int)strcspn(out, "\n"), out, (int)strcspn(err, "\n"), err);
            assert_int_equal(st, 0);
            assert_true(dt < 15);
            assert_int_equal(strncmp(out, cmds[i][1], strlen(cmds[i][1])), 0);
            assert_string_equal(err, "");
        }
    }
    /* nothing was made in the state directories either */
    int st = ft_run(out, sizeof out, "ls -A '%s'", dir);
    assert_int_equal(st, 0);
    assert_string_equal(out, "");
    ft_run(out, sizeof out, "rm -rf '%s'", dir);
    /* and the top level */
    double dt;
    assert_int_equal(run_split("--help", &dt), 0);
    assert_int_equal(strncmp(out, "usage: ferry <command>", 22), 0);
}

/* An option no command knows: exit 2, nothing on stdout, a first line on
 * stderr that names it. */
static void test_unknown_option(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "%s --no-such-option 3", cmds[i][0]);
        double dt;
        int st = run_split(args, &dt);
        fprintf(stderr, "ferry %s -> %d in %.2f s: %.*s\n", args, st, dt,
                (int)strcspn(err, "\n"), err);
        assert_int_equal(st, 2);
        assert_true(dt < 15);
        assert_string_equal(out, "");
        const char *nl = strchr(err, '\n'), *q = strstr(err, "--no-such-option");
        assert_true(q && nl && q < nl);
    }
    /* a value option given last, without its value */
    double dt;
    assert_int_equal(run_split("demo rl --steps", &dt), 2);
    assert_int_equal(strncmp(err, "ferry-lab demo rl: --steps needs a value", 40), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_rl),
        cmocka_unit_test(test_demo),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_bench),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_master_node_up),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_unknown_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
