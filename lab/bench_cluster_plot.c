/* `ferry-lab bench cluster --plot FILE.svg` (issue 29 item 6; docs/lab.md,
 * "The picture of the links"): while each strategy runs, a thread inside
 * the switch namespace reads every host's port counters every 100 ms;
 * afterwards gnuplot draws one panel per strategy — each host's bytes in
 * and out per 100 ms as Mbit/s, its link rate, and the modelled bound and
 * the strategy's own model as vertical lines. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lab.h"
#include "bench_cluster.h"

#define SAMPLE_NS (100ull * 1000 * 1000)   /* the picture's resolution: 100 ms */

int bc_parse_ports(char *buf, unsigned hosts, double *up, double *down)
{
    unsigned found = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned i;
        int off = 0;
        while (*line == ' ')
            line++;
        unsigned long long v[9];
        if (sscanf(line, "p%u:%n", &i, &off) != 1 || off == 0 || i >= hosts ||
            sscanf(line + off, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) != 9)
            continue;
        up[i] = (double)v[0];     /* the port receives what the host sends */
        down[i] = (double)v[8];   /* and sends what it receives */
        found++;
    }
    return found == hosts ? 0 : -1;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One sample of every port into s (cumulative bytes); -1 when the
 * counters cannot be read. */
static int sample(bc_sampler *sp)
{
    bc_series *s = sp->s;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *t = realloc(s->t, cap * sizeof *t);
        bc_hostv *up = t ? realloc(s->up, cap * sizeof *up) : NULL;
        if (t)
            s->t = t;
        if (up)
            s->up = up;
        bc_hostv *down = up ? realloc(s->down, cap * sizeof *down) : NULL;
        if (!down)
            return -1;
        s->down = down;
        s->cap = cap;
    }
    FILE *f = fopen("/proc/thread-self/net/dev", "r");   /* this thread's namespace: the switch's */
    char buf[8192];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    if (bc_parse_ports(buf, s->hosts, s->up[s->n].v, s->down[s->n].v) < 0)
        return -1;
    s->t[s->n++] = (double)(mono_ns() - sp->t0) / 1e9;
    return 0;
}

static void *sampler_main(void *arg)
{
    bc_sampler *sp = arg;
    char ns[64];
    snprintf(ns, sizeof ns, "%s-sw", sp->L->prefix);
    if (lab_enter(ns) < 0) {   /* this thread only: setns of a network namespace is per thread */
        sp->failed = true;
        return NULL;
    }
    for (uint64_t k = 1; !sp->stop; k++) {
        if (sample(sp) < 0) {
            sp->failed = true;
            return NULL;
        }
        uint64_t due = sp->t0 + k * SAMPLE_NS;
        struct timespec ts = { (time_t)(due / 1000000000ull), (long)(due % 1000000000ull) };
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
    }
    if (sample(sp) < 0)   /* the end of the strategy */
        sp->failed = true;
    return NULL;
}

int bc_sampler_start(bc_sampler *sp, const lab *L, bc_series *s)
{
    memset(sp, 0, sizeof *sp);
    sp->L = L;
    sp->s = s;
    s->hosts = L->hosts;
    sp->t0 = mono_ns();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);   /* signals stay the main thread's */
    sp->on = pthread_create(&sp->th, NULL, sampler_main, sp) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return sp->on ? 0 : -1;
}

int bc_sampler_stop(bc_sampler *sp)
{
    if (!sp->on)
        return -1;
    sp->stop = 1;
    pthread_join(sp->th, NULL);
    sp->on = false;
    return sp->failed || sp->s->n < 2 ? -1 : 0;
}

void bc_series_free(bc_series *s)
{
    free(s->t);
    free(s->up);
    free(s->down);
    memset(s, 0, sizeof *s);
}

/* Every strategy's samples as gnuplot index blocks: t, then each host's
 * in and out over the interval before it, Mbit/s. */
static int write_data(const char *path, const bc_series *s, unsigned ns)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (unsigned k = 0; k < ns; k++) {
        fprintf(f, "# strategy %u\n", k);
        for (size_t i = 1; i < s[k].n; i++) {
            double dt = s[k].t[i] - s[k].t[i - 1];
            fprintf(f, "%.3f", s[k].t[i]);
            for (unsigned h = 0; h < s[k].hosts; h++)
                fprintf(f, " %.3f %.3f", dt > 0 ? (s[k].down[i].v[h] - s[k].down[i - 1].v[h]) * 8 / dt / 1e6 : 0,
                        dt > 0 ? (s[k].up[i].v[h] - s[k].up[i - 1].v[h]) * 8 / dt / 1e6 : 0);
            fprintf(f, "\n");
        }
        fprintf(f, "\n\n");
    }
    return fclose(f) == 0 ? 0 : -1;
}

static int write_script(const char *path, const char *data, const char *svg, const bc_topo *t,
                        const bc_plot_panel *p, unsigned ns)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    unsigned H = bc_hosts(t);
    double top = 0;
    for (unsigned h = 0; h < H; h++)
        top = (double)t->rate[h] / 1e6 > top ? (double)t->rate[h] / 1e6 : top;
    fprintf(f, "set terminal svg size 1100,%u dynamic font 'sans,10'\n", 60 + 300 * ns);
    fprintf(f, "set output '%s'\n", svg);
    fprintf(f, "set multiplot layout %u,1 title \"ferry-lab bench cluster: each host's link per 100 ms "
               "(in: solid, out: dashed), Mbit/s\"\n", ns);
    fprintf(f, "set xlabel 'seconds'\nset ylabel 'Mbit/s'\nset key outside right\n");
    fprintf(f, "set yrange [0:%.3f]\nset xrange [0:*]\n", top * 1.15);
    for (unsigned k = 0; k < ns; k++) {
        fprintf(f, "set title 'strategy %s: %.2f s (its model %.2f s, the bound %.2f s)'\n", p[k].name,
                p[k].time_s, p[k].model_s, p[k].bound_s);
        fprintf(f, "unset arrow\nunset label\n");
        fprintf(f, "set arrow from %.3f, graph 0 to %.3f, graph 1 nohead dt 2 lw 2 lc 'black'\n",
                p[k].bound_s, p[k].bound_s);
        fprintf(f, "set label 'bound' at %.3f, graph 0.95 right offset -0.5,0\n", p[k].bound_s);
        fprintf(f, "set arrow from %.3f, graph 0 to %.3f, graph 1 nohead dt 3 lc 'gray40'\n", p[k].model_s,
                p[k].model_s);
        fprintf(f, "set label 'model' at %.3f, graph 0.85 left offset 0.5,0\n", p[k].model_s);
        fprintf(f, "plot ");
        for (unsigned h = 0; h < H; h++)
            fprintf(f, "'%s' index %u using 1:%u with lines lc %u dt 1 title 'h%u in (%s)', "
                       "'%s' index %u using 1:%u with lines lc %u dt 2 title 'h%u out', ",
                    data, k, 2 + 2 * h, h + 1, h, h < t->TH ? "trainer" : "rollout", data, k, 3 + 2 * h,
                    h + 1, h);
        /* each distinct link rate, once */
        for (unsigned h = 0, first = 1; h < H; h++) {
            bool seen = false;
            for (unsigned j = 0; j < h; j++)
                seen |= t->rate[j] == t->rate[h];
            if (seen)
                continue;
            fprintf(f, "%s%.3f with lines lc 'black' lw 2 title 'link rate %.0f Mbit/s'", first ? "" : ", ",
                    (double)t->rate[h] / 1e6, (double)t->rate[h] / 1e6);
            first = 0;
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    return fclose(f) == 0 ? 0 : -1;
}

int bc_plot_write(const char *svg, const char *dir, const bc_topo *t, const bc_series *s,
                  const bc_plot_panel *p, unsigned ns, char *err, size_t cap)
{
    char data[512], script[512];
    snprintf(data, sizeof data, "%s/links.dat", dir);
    snprintf(script, sizeof script, "%s/links.gp", dir);
    if (write_data(data, s, ns) < 0 || write_script(script, data, svg, t, p, ns) < 0) {
        snprintf(err, cap, "--plot: cannot write the plot's data in %s", dir);
        return -1;
    }
    int st = lab_sh("gnuplot '%s' 2>'%s/gnuplot.log'", script, dir);
    if (st == 127) {
        snprintf(err, cap, "--plot: gnuplot not found (scripts/deps.sh installs gnuplot-nox)");
        return -1;
    }
    if (st != 0) {
        char log[600] = "";
        FILE *f = NULL;
        snprintf(data, sizeof data, "%s/gnuplot.log", dir);
        if ((f = fopen(data, "r"))) {
            size_t n = fread(log, 1, sizeof log - 1, f);
            log[n] = 0;
            log[strcspn(log, "\n")] = 0;
            fclose(f);
        }
        snprintf(err, cap, "--plot: gnuplot failed (status %d): %.300s", st, log);
        return -1;
    }
    return 0;
}
