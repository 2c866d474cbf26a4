/* `ferry-lab demo`: the main job. A local cluster (a master and a node, unless
 * FERRY_MASTER points at one), trainer processes that publish policy
 * generations of a model with real tensor shapes, and rollout processes
 * that take every generation in parameter-direct form (their own TP shard
 * of every tensor, straight into their parameter buffers) and in
 * compatibility form (every full tensor, checksum-verified, as a
 * load_weights loader would get it; the group update: each tensor read from
 * the store once, by its leader, and written to the other rollouts). Every parameter byte is checked
 * against values computed independently in each process. `ferry-lab demo
 * engine` runs the engine demo. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lab.h"
#include "demo.h"



typedef struct gen_row {
    double publish_s, direct_s, compat_s, publish8_s, fp8_s;
    uint64_t direct_read, compat_read, bad, pushed, fp8_stored, fp8_read, fp8_pushed;
    bool ok;
    char error[256];
    json_t *publish, *update;   /* counters: merged over trainers, over rollouts */
    json_t *compat;             /* the compatibility update's, merged over rollouts */
} gen_row;

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

/* The per-phase table of the direct updates and their counters. */
static void print_phases(const gen_row *rows, unsigned ng, uint64_t model_bytes)
{
    printf("\ndirect update phases (slowest worker, s) and counters (the group's plan):\n");
    printf("%-4s %8s %8s %8s %8s %8s %8s %8s %8s %7s %10s %10s %10s %s\n", "gen", "prepare",
           "exchange", "plan", "read", "push", "forward", "barrier", "apply", "batches",
           "store read", "cross", "intra", "NIC in max/mean");
    for (unsigned g = 0; g < ng; g++) {
        const json_t *u = rows[g].update;
        if (!u)
            continue;
        char r1[32], r2[32], r3[32];
        printf("%-4u %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %7.0f %10s %10s %10s %15.2fx\n",
               g + 1, num(u, "prepare_s"), num(u, "exchange_s"), num(u, "plan_s"), num(u, "read_s"),
               num(u, "push_s"), num(u, "forward_s"), num(u, "barrier_s"), num(u, "apply_s"),
               num(u, "batches"), cli_fmt_size((uint64_t)num(u, "group_bytes_read"), r1, sizeof r1),
               cli_fmt_size((uint64_t)num(u, "pushed_cross"), r2, sizeof r2),
               cli_fmt_size((uint64_t)num(u, "pushed_intra"), r3, sizeof r3),
               num(u, "nic_max_ratio_in"));
    }
    const json_t *u = rows[ng - 1].update, *p = rows[ng - 1].publish;
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(u, "nodes"), i, n) {
        char a[32], b[32], c[32], d[32];
        printf("node %.0f (%.0f workers): store read %s, pushed in %s, out %s, intra %s\n",
               num(n, "node"), num(n, "workers"),
               cli_fmt_size((uint64_t)num(n, "store_read"), a, sizeof a),
               cli_fmt_size((uint64_t)num(n, "pushed_in"), b, sizeof b),
               cli_fmt_size((uint64_t)num(n, "pushed_out"), c, sizeof c),
               cli_fmt_size((uint64_t)num(n, "pushed_intra"), d, sizeof d));
    }
    if (p)
        printf("publish (slowest rank, s): convert %.3f, store %.3f, barrier %.3f, commit %.3f; "
               "cross-node bytes %.0f of %llu\n", num(p, "convert_s"), num(p, "store_s"),
               num(p, "barrier_s"), num(p, "commit_s"), num(p, "cross_node_bytes"),
               (unsigned long long)model_bytes);
}

static const cli_opt demo_table[] = {
    DEMO_OPT_ROWS("generations", 64, "weight generations published, 1-64 (default 3)",
                  "the model's tensors up to this many bf16 bytes (default 2G)"),
    CLI_FLAG(demo_opts, fp8, "fp8", "also an FP8 rollout group: the same shards quantized once by the\n"
             "trainers (f8e4m3, 128 x 128 blocks), FP8 weights and scales on the rollouts\n"
             "(half again the store's memory, and the rollouts' FP8 copies)"),
};

static const cli_cmd demo_cmd = {
    .name = "demo",
    .about = "Trainer processes publish weight generations of a model with its real tensor shapes;\n"
             "rollout processes take each one parameter-direct and whole, checking every byte.\n"
             "A private master and node are started unless FERRY_MASTER names a running one.",
    .opts = demo_table,
    .nopts = sizeof demo_table / sizeof demo_table[0],
    .footer = "The other demos: ferry-lab demo engine, ferry-lab demo rl, ferry-lab demo --sparse\n"
              "(each with --help).\n",
};

int cmd_demo(int argc, char **argv, const char *self)
{
    if (argc >= 2 && !strcmp(argv[1], "engine"))
        return cmd_demo_engine(argc - 1, argv + 1, self);
    if (argc >= 2 && !strcmp(argv[1], "rl"))
        return cmd_demo_rl(argc - 1, argv + 1);
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--sparse"))   /* a form of its own, wherever the flag is */
            return cmd_demo_sparse(argc, argv);
    demo_opts o;
    int pr = demo_parse(&demo_cmd, argc, argv, 3, 2ull << 30, &o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &demo_cmd);
    demo_model dm;
    if (demo_model_build(o.model, o.bytes, &dm) < 0) {
        fprintf(stderr, "ferry-lab demo: unknown model preset %s (ferry plan --models)\n", o.model);
        return 2;
    }
    int rc = 1;
    gen_row rows[64] = {{0}};   /* before any goto: the counters are freed at out */
    demo_group grp;
    char cdir[64] = "";
    if (demo_counters_open(cdir, sizeof cdir) < 0)
        cdir[0] = 0;
    if (o.cold)
        setenv("FERRY_DEMO_COLD", "1", 1);
    else
        unsetenv("FERRY_DEMO_COLD");
    char sz[32];
    double w0 = cli_now();
    if (!o.json)
        fprintf(stderr, "ferry-lab demo: starting a master, a node and %u processes%s\n",
                o.trainers + o.rollouts, o.cold ? " (--cold: no warm-up)"
                : "; each first touches the store's memory it will use (the documented warm-up, "
                  "docs/weights.md \"Warm memory\")");
    /* with --fp8 the store holds the FP8 model's generations too: about half the bytes */
    if (demo_group_start(&grp, o.model, o.bytes, dm.bytes + (o.fp8 ? dm.bytes / 2 : 0), o.trainers,
                         o.rollouts, o.dp, "ferry-lab demo") < 0)
        goto out;
    if (!o.json && !o.cold)
        fprintf(stderr, "ferry-lab demo: warm-up done: %s touched, the slowest process in %.1f s "
                "(%.1f s to start them all)\n", cli_fmt_size(grp.warm_bytes, sz, sizeof sz),
                grp.warm_s, cli_now() - w0);
    child *tr = grp.tr, *ro = grp.ro;
    if (!o.json)
        fprintf(stderr, "ferry-lab demo: %u trainers publish %u generations of %s (%zu tensors with "
                "its real shapes, %s bf16) through the store at %s;\n%u rollout workers (TP%u x DP%u) "
                "take each one parameter-direct, single-pull (every byte read from the store once, "
                "pushed to its replicas),\nand whole (compatibility: each tensor read once by its leader, "
                "the others of its machine loading it from the leader's staging), checking every byte.\n",
                o.trainers, o.count, o.model, dm.n, cli_fmt_size(dm.bytes, sz, sizeof sz),
                grp.addr, o.rollouts, o.rollouts / o.dp, o.dp);
    unsigned ng = o.count > 64 ? 64 : o.count;
    bool all_ok = true;
    for (unsigned g = 1; g <= ng; g++) {
        gen_row *row = &rows[g - 1];
        char cmd[64];
        uint64_t a, b;
        snprintf(cmd, sizeof cmd, "publish %u", g);
        if (!o.json)
            cli_progress("publish", (double)(g - 1) / ng);
        row->ok = demo_round(tr, o.trainers, cmd, &row->publish_s, &a, &b, NULL, row->error,
                            sizeof row->error);
        if (row->ok && cdir[0])
            row->publish = demo_counters_collect(cdir, "trainer", o.trainers);
        snprintf(cmd, sizeof cmd, "direct %u", g);
        if (row->ok && !o.json)
            cli_progress("direct update", (g - 0.66) / ng);
        row->ok = row->ok && demo_round(ro, o.rollouts, cmd, &row->direct_s, &row->direct_read,
                                       &row->bad, &row->pushed, row->error, sizeof row->error);
        if (row->ok && cdir[0])
            row->update = demo_counters_collect(cdir, "rollout", o.rollouts);
        snprintf(cmd, sizeof cmd, "compat %u", g);
        if (row->ok && !o.json)
            cli_progress("compat update", (g - 0.33) / ng);
        row->ok = row->ok && demo_round(ro, o.rollouts, cmd, &row->compat_s, &row->compat_read,
                                       &b, NULL, row->error, sizeof row->error);
        if (row->ok && cdir[0])
            row->compat = demo_counters_collect(cdir, "compat", o.rollouts);
        row->bad += b;
        if (o.fp8) {   /* the FP8 group: the same shards quantized once by the trainers */
            snprintf(cmd, sizeof cmd, "publish8 %u", g);
            row->ok = row->ok && demo_round(tr, o.trainers, cmd, &row->publish8_s, &row->fp8_stored, &a,
                                            NULL, row->error, sizeof row->error);
            snprintf(cmd, sizeof cmd, "fp8 %u", g);
            row->ok = row->ok && demo_round(ro, o.rollouts, cmd, &row->fp8_s, &row->fp8_read, &b,
                                            &row->fp8_pushed, row->error, sizeof row->error);
            row->bad += b;
        }
        row->ok = row->ok && row->bad == 0;
        all_ok = all_ok && row->ok;
    }
    if (!o.json)
        cli_progress_done();
    if (o.json) {
        printf("{\"ok\":%s,\"model\":\"%s\",\"tensors\":%zu,\"bytes\":%llu,\"trainers\":%u,"
               "\"rollouts\":%u,\"dp\":%u,\"generations\":[", all_ok ? "true" : "false",
               o.model, dm.n, (unsigned long long)dm.bytes, o.trainers, o.rollouts, o.dp);
        for (unsigned g = 0; g < ng; g++) {
            json_t *c = json_object();
            json_object_set(c, "publish", rows[g].publish ? rows[g].publish : json_null());
            json_object_set(c, "update", rows[g].update ? rows[g].update : json_null());
            json_object_set(c, "compat", rows[g].compat ? rows[g].compat : json_null());
            char *cj = json_dumps(c, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
            char f8[400] = "";
            if (o.fp8)
                snprintf(f8, sizeof f8, ",\"fp8_publish_s\":%.4f,\"fp8_s\":%.4f,\"fp8_stored_bytes\":%llu,"
                         "\"fp8_store_bytes\":%llu,\"fp8_pushed_bytes\":%llu,\"fp8_bytes_ratio\":%.3f",
                         rows[g].publish8_s, rows[g].fp8_s, (unsigned long long)rows[g].fp8_stored,
                         (unsigned long long)rows[g].fp8_read, (unsigned long long)rows[g].fp8_pushed,
                         rows[g].direct_read ? (double)rows[g].fp8_read / (double)rows[g].direct_read : 0);
            printf("%s{\"generation\":%u,\"publish_s\":%.4f,\"direct_s\":%.4f,"
                   "\"direct_store_bytes\":%llu,\"direct_read_ratio\":%.3f,\"direct_pushed_bytes\":%llu,"
                   "\"compat_s\":%.4f,"
                   "\"compat_store_bytes\":%llu,\"compat_read_ratio\":%.3f%s,\"wrong_bytes\":%llu,"
                   "\"ok\":%s,\"counters\":%s}",
                   g ? "," : "", g + 1, rows[g].publish_s, rows[g].direct_s,
                   (unsigned long long)rows[g].direct_read,
                   (double)rows[g].direct_read / (double)dm.bytes,
                   (unsigned long long)rows[g].pushed, rows[g].compat_s,
                   (unsigned long long)rows[g].compat_read,
                   (double)rows[g].compat_read / (double)dm.bytes, f8, (unsigned long long)rows[g].bad,
                   rows[g].ok ? "true" : "false", cj ? cj : "null");
            free(cj);
            json_decref(c);
        }
        printf("]}\n");
    } else {
        printf("%-4s %10s %8s %9s %12s %12s %9s %12s", "gen", "publish s", "GB/s", "direct s",
               "store read", "pushed", "compat s", "store read");
        if (o.fp8)
            printf(" %11s %7s %12s", "FP8 pub s", "FP8 s", "FP8 read");
        printf(" %s\n", "every byte");
        for (unsigned g = 0; g < ng; g++) {
            char r1[32], r2[32], r3[32], r4[32];
            printf("%-4u %10.3f %8.2f %9.3f %12s %12s %9.3f %12s", g + 1, rows[g].publish_s,
                   rows[g].publish_s > 0 ? (double)dm.bytes / rows[g].publish_s / 1e9 : 0,
                   rows[g].direct_s, cli_fmt_size(rows[g].direct_read, r1, sizeof r1),
                   cli_fmt_size(rows[g].pushed, r3, sizeof r3),
                   rows[g].compat_s, cli_fmt_size(rows[g].compat_read, r2, sizeof r2));
            if (o.fp8)
                printf(" %11.3f %7.3f %12s", rows[g].publish8_s, rows[g].fp8_s,
                       cli_fmt_size(rows[g].fp8_read, r4, sizeof r4));
            printf(" %s\n", rows[g].ok ? "verified" : rows[g].error[0] ? rows[g].error : "WRONG");
        }
        printf("direct: the group read %.2fx the published bytes from the store (each byte once; "
               "a worker-reads-its-own baseline reads %ux); compat: the group read %.2fx (each "
               "tensor once, by its leader, the others loading it through a view of its staging; every worker reading "
               "every tensor reads %ux).\n", (double)rows[0].direct_read / (double)dm.bytes, o.dp,
               (double)rows[0].compat_read / (double)dm.bytes, o.rollouts);
        printf("(gen: the generation; publish s: every trainer storing its shards and the "
               "announcement, GB/s: the model's bytes / publish s; direct s: the parameter-direct "
               "update, slowest rollout; store read: bytes the group read from the store; pushed: "
               "bytes a reader wrote into its replica's parameters; compat s: every full tensor "
               "to every rollout; every byte: each rollout checked every element)\n");
        if (o.fp8)
            printf("(--fp8: the same shards published again with the default FP8 rules (f8e4m3, 128 x "
                   "128 blocks, quantized once by the trainers) into a group of the same rollouts holding "
                   "FP8 weights and their scales; FP8 pub s the publish, FP8 s its update, FP8 read its "
                   "store reads, %.2fx the bf16 group's; every FP8 byte and scale checked against the base "
                   "layer's quantization of the shard)\n",
                   rows[0].direct_read ? (double)rows[0].fp8_read / (double)rows[0].direct_read : 0);
        if (rows[ng - 1].update)
            print_phases(rows, ng, dm.bytes);
        printf("%s\n", all_ok ? "demo ok" : "demo FAILED");
    }
    rc = all_ok ? 0 : 1;
out:
    demo_group_stop(&grp);
    demo_model_free(&dm);
    for (unsigned g = 0; g < 64; g++) {
        json_decref(rows[g].publish);
        json_decref(rows[g].update);
        json_decref(rows[g].compat);
    }
    if (cdir[0])
        demo_counters_close(cdir);
    return rc;
}
