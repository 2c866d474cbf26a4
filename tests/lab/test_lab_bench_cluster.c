/* `ferry-lab bench cluster` on a 4-host lab (issue 29 item 8; docs/lab.md,
 * "The cluster benchmark"): 2 trainer ranks on 2 hosts, 4 rollout workers
 * (TP2 x DP2) on 2 hosts, a small model, one generation moved by every
 * strategy. Checked: every strategy's bytes arrive intact (the benchmark
 * compares every element in every worker and fails otherwise), and every
 * host's measured link bytes, each way, agree with the model's; nothing of
 * the lab is left; --plot draws one panel per strategy. Never a time:
 * the timed cases are the benchmark's.
 * Needs root (network namespaces); otherwise it skips and says why. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "util/ftlab.h"
#include "util/testutil.h"
#include "util/ftstore.h"

#define DEADLINE_MS (600 * 1000)   /* a backstop far above the run under load */
/* What the kernel counts beyond the model's payload: each packet's headers
 * (one per GSO packet on veth), the acknowledgements of the other way's
 * data, and the master's and the group's metadata (host 0 holds the
 * master). A link's measured bytes may differ from the model's by this
 * share of the model's bytes plus this many bytes. */
#define REL_SLACK 0.03
#define ABS_SLACK (512u << 10)

static char tmp[256];



/* --plot's SVG: one panel per strategy, in order, each captioned with its
 * strategy (gnuplot names a multiplot's curves gnuplot_plot_<curve><panel>,
 * panels a, b, c, ...). */
static void check_plot(const char *svg, const char *const *names, size_t n)
{
    FILE *f = fopen(svg, "r");
    assert_non_null(f);
    static char text[1 << 21];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    assert_non_null(strstr(text, "<svg"));
    const char *at = text;
    for (size_t k = 0; k < n; k++) {
        char title[64], panel[32];
        snprintf(title, sizeof title, "strategy %s: ", names[k]);
        const char *t = strstr(at, title);
        if (!t)
            fail_msg("the plot has no panel for %s (after the one before)", names[k]);
        assert_null(strstr(t + 1, title));   /* one panel each */
        at = t;
        snprintf(panel, sizeof panel, "gnuplot_plot_1%c\"", (char)('a' + k));
        assert_non_null(strstr(text, panel));
    }
    char extra[32];
    snprintf(extra, sizeof extra, "gnuplot_plot_1%c\"", (char)('a' + n));
    assert_null(strstr(text, extra));
    fprintf(stderr, "plot: %zu bytes, %zu panels\n", len, n);
}

static void test_four_hosts_bytes_against_model(void **state)
{
    (void)state;
    ft_lab_need_root();
    char out[300], err[300], svg[300];
    snprintf(out, sizeof out, "%s/out.json", tmp);
    snprintf(err, sizeof err, "%s/err.log", tmp);
    snprintf(svg, sizeof svg, "%s/links.svg", tmp);
    pid_t p = fork();
    if (p == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fo, 1), dup2(fe, 2);
        const char *argv[] = { "ferry-lab", "bench", "cluster", "--trainers", "2", "--trainer-hosts", "2",
                               "--rollouts", "4", "--dp", "2", "--rollout-hosts", "2", "--bytes", "24M",
                               "--rate", "200mbit", "--check-seconds", "0.3", "--json", "--plot", svg,
                               NULL };
        execv(ft_lab_bin(), (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    if (ft_wait_status(p, DEADLINE_MS, &st) < 0)
        fail_msg("bench cluster (pid %d) did not exit", (int)p);
    char cmd[400], log[1 << 14];
    snprintf(cmd, sizeof cmd, "tail -c 4000 '%s'", err);
    ft_run(log, sizeof log, "%s", cmd);
    fprintf(stderr, "%s", log);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    json_error_t je;
    json_t *j = json_load_file(out, 0, &je);
    if (!j)
        fail_msg("no JSON on stdout: %s", je.text);
    assert_true(json_is_true(json_object_get(j, "verified")));
    static const char *const strategies[] = { "direct", "compat", "naive", "p2p", "bcast" };
    const json_t *links = json_object_get(j, "links");
    for (size_t s = 0; s < sizeof strategies / sizeof *strategies; s++) {
        const json_t *l = json_object_get(links, strategies[s]);
        assert_int_equal(json_array_size(l), 4);
        size_t i;
        const json_t *h;
        json_array_foreach(l, i, h) {
            static const char *const dir[2][2] = { { "up", "model_up" }, { "down", "model_down" } };
            for (int d = 0; d < 2; d++) {
                double m = json_number_value(json_object_get(h, dir[d][0]));
                double e = json_number_value(json_object_get(h, dir[d][1]));
                fprintf(stderr, "%-6s host %zu %-4s measured %12.0f model %12.0f\n", strategies[s], i,
                        dir[d][0], m, e);
                if (fabs(m - e) > REL_SLACK * e + ABS_SLACK)
                    fail_msg("%s: host %zu %s: %.0f bytes measured, %.0f modelled", strategies[s], i,
                             dir[d][0], m, e);
            }
        }
        char key[64];
        snprintf(key, sizeof key, "%s_model_s", strategies[s]);
        assert_true(json_number_value(json_object_get(j, key)) > 0);
    }
    json_decref(j);
    check_plot(svg, strategies, sizeof strategies / sizeof *strategies);
    assert_int_equal(ft_lab_leftovers(p, NULL), 0);
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/ferry-test-benchcl-XXXXXX");
    if (!mkdtemp(tmp))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_four_hosts_bytes_against_model),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
