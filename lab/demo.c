/* `ferry-lab demo`: the engine between two processes. A target process
 * registers memory; this process writes a pattern into it with one-sided
 * WRITEs, tells it with a notification that follows the writes, reads it
 * all back with one-sided READs and checks every byte — over shm and over
 * tcp. `ferry-lab demo engine`; `ferry-lab demo` is the weight-update demo. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"
#include "cli_opts.h"

#define DEMO_BLOCK (4u << 20)

typedef struct demo_row {
    const char *transport;
    uint64_t bytes;
    double write_gbps, read_gbps;
    bool verified;
    const char *error;
} demo_row;

static void fill(uint8_t *p, uint64_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* Move `total` bytes as 4 MiB ops, several tickets in flight. */
static int move(ferry_engine *e, const ferry_remote_region *rr, enum ferry_opcode op, uint8_t *buf,
                uint64_t total, bool notify, const char *label, double *gbps)
{
    enum { PER = 16 };
    uint64_t nops = total / DEMO_BLOCK, nt = (nops + PER - 1) / PER;
    ferry_ticket **t = calloc(nt, sizeof *t);
    ferry_op ops[PER + 1];
    double t0 = cli_now();
    int rc = 0;
    for (uint64_t k = 0; k < nt && rc == 0; k++) {
        size_t n = 0;
        for (uint64_t i = k * PER; i < nops && n < PER; i++, n++)
            ops[n] = (ferry_op){.opcode = op, .local = buf + i * DEMO_BLOCK, .len = DEMO_BLOCK, .peer = rr->peer,
                                .remote_addr = rr->addr + i * DEMO_BLOCK, .key = rr->key};
        if (notify)   /* delivered only after this batch's writes are visible */
            ops[n++] = (ferry_op){.opcode = FERRY_OP_NOTIFY, .peer = rr->peer, .tag = 1, .value = k};
        rc = ferry_submit(e, ops, n, 0, &t[k], NULL);
    }
    for (uint64_t k = 0; k < nt; k++) {
        if (!t[k])
            continue;
        int st = ferry_ticket_wait(t[k], FERRY_DEFAULT_TIMEOUT_MS);
        if (st != FERRY_TICKET_COMPLETED && rc == 0)
            rc = ferry_ticket_error(t[k], NULL) ? ferry_ticket_error(t[k], NULL) : FERRY_EIO;
        ferry_ticket_free(t[k]);
        cli_progress(label, (double)(k + 1) / (double)nt);
    }
    *gbps = (double)total / (cli_now() - t0) / 1e9;
    free(t);
    return rc;
}

static void run_one(const char *self, const char *transport, uint64_t total, demo_row *row)
{
    *row = (demo_row){.transport = transport, .bytes = total};
    ferry_engine_config cfg;
    ferry_engine *e = NULL;
    cli_target tgt = {0};
    void *a = NULL, *b = NULL;
    ferry_region *ra, *rb;
    ferry_remote_region rr;
    int rc = ferry_engine_config_init(&cfg);
    snprintf(cfg.transport, sizeof cfg.transport, "%s", transport);
    if (rc == 0)
        rc = ferry_engine_open(&cfg, &e, NULL);
    if (rc == 0)
        rc = ferry_mem_alloc(e, total, &a, NULL);
    if (rc == 0)
        rc = ferry_mem_alloc(e, total, &b, NULL);
    if (rc == 0)
        rc = ferry_region_register(e, a, total, 0, FERRY_MEM_HOST, &ra, NULL);
    if (rc == 0)
        rc = ferry_region_register(e, b, total, 0, FERRY_MEM_HOST, &rb, NULL);
    if (rc == 0)
        rc = cli_target_start(&tgt, self, total, NULL);
    if (rc == 0)
        rc = ferry_region_import(e, tgt.desc, tgt.desc_len, &rr, NULL);
    if (rc == 0) {
        fill(a, total, 42);
        char label[48];
        snprintf(label, sizeof label, "%s: one-sided WRITE", transport);
        rc = move(e, &rr, FERRY_OP_WRITE, a, total, true, label, &row->write_gbps);
    }
    uint64_t nt = (total / DEMO_BLOCK + 15) / 16;
    if (rc == 0 && cli_target_cmd(&tgt, NULL, 0, "waitnotify 1 %llu", (unsigned long long)nt) < 0)
        rc = FERRY_ETIMEDOUT;
    if (rc == 0) {
        char label[48];
        snprintf(label, sizeof label, "%s: one-sided READ", transport);
        rc = move(e, &rr, FERRY_OP_READ, b, total, false, label, &row->read_gbps);
    }
    cli_progress_done();
    row->verified = rc == 0 && memcmp(a, b, total) == 0;
    row->error = rc < 0 ? ferry_strerror(rc) : NULL;
    cli_target_stop(&tgt);
    ferry_engine_close(e);
}

typedef struct engine_opts {
    uint64_t total;
    bool json;
} engine_opts;

static const cli_opt engine_table[] = {
    CLI_SIZE(engine_opts, total, "size", "SIZE", 1, 1ull << 40, "bytes moved each way per transport (default 256M)"),
    CLI_FLAG(engine_opts, json, "json", "one JSON object on stdout (default: a table)"),
};

static const cli_cmd engine_cmd = {
    .name = "demo engine",
    .about = "A target process registers SIZE bytes; this process writes them with one-sided\n"
             "WRITEs and reads them back with READs over shm and over tcp, checking every byte.",
    .opts = engine_table,
    .nopts = sizeof engine_table / sizeof engine_table[0],
};

int cmd_demo_engine(int argc, char **argv, const char *self)
{
    engine_opts o = { .total = 256ull << 20 };
    int pr = cli_parse(&engine_cmd, argc, argv, &o, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &engine_cmd);
    uint64_t total = (o.total + DEMO_BLOCK - 1) / DEMO_BLOCK * DEMO_BLOCK;
    bool json = o.json;
    if (!getenv("FERRY_TOKEN") && !getenv("FERRY_TOKEN_FILE")) {
        char tok[65];
        ferry_token_generate(tok);
        setenv("FERRY_TOKEN", tok, 1);
    }
    if (!json)
        fprintf(stderr, "ferry-lab demo: a target process registers %llu MiB; this process writes it with one-sided\n"
                        "WRITEs (a notification follows each batch), reads it back with READs, checks every byte.\n",
                (unsigned long long)(total >> 20));
    demo_row rows[2];
    run_one(self, "shm", total, &rows[0]);
    run_one(self, "tcp", total, &rows[1]);
    bool ok = rows[0].verified && rows[1].verified;
    if (json) {
        printf("{\"ok\":%s,\"runs\":[", ok ? "true" : "false");
        for (int i = 0; i < 2; i++)
            printf("%s{\"transport\":\"%s\",\"bytes\":%llu,\"write_gbps\":%.3f,\"read_gbps\":%.3f,\"verified\":%s}",
                   i ? "," : "", rows[i].transport, (unsigned long long)rows[i].bytes, rows[i].write_gbps,
                   rows[i].read_gbps, rows[i].verified ? "true" : "false");
        printf("]}\n");
    } else {
        printf("\n%-10s %10s %12s %12s  %s\n", "transport", "bytes", "write GB/s", "read GB/s", "every byte");
        for (int i = 0; i < 2; i++) {
            char sz[32];
            printf("%-10s %10s %12.2f %12.2f  %s%s\n", rows[i].transport, cli_fmt_size(rows[i].bytes, sz, sizeof sz),
                   rows[i].write_gbps, rows[i].read_gbps, rows[i].verified ? "verified" : "MISMATCH",
                   rows[i].error ? rows[i].error : "");
        }
        printf("\n%s\n", ok ? "demo ok" : "demo FAILED");
    }
    return ok ? 0 : 1;
}
