/* up.pids of `ferry up --detach` (up.c, docs/store.md): one line per
 * process, "ROLE PID START-TIME HEX(COMMAND LINE)", so that `ferry down`
 * signals a pid only while it is still the process `ferry up` started. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_pids_write(const char *path, const cli_proc *m, const cli_proc *n)
{
    const cli_proc *ps[2] = { m, n };
    const char *roles[2] = { "master", "node" };
    size_t cap = 256 + 2 * (2 * sizeof m->cmd + 64), len = 0;
    char *text = malloc(cap);
    if (!text)
        return -1;
    len += (size_t)snprintf(text, cap, "# ferry up --detach: role pid start-time command-line(hex)\n");
    for (int i = 0; i < 2; i++) {
        len += (size_t)snprintf(text + len, cap - len, "%s %d %llu ", roles[i], ps[i]->pid,
                                ps[i]->start);
        cli_hex((const uint8_t *)ps[i]->cmd, ps[i]->cmdlen, text + len);
        len += 2 * ps[i]->cmdlen;
        text[len++] = '\n';
        text[len] = 0;
    }
    int rc = cli_write_file_atomic(path, text);
    free(text);
    return rc;
}

int cli_pids_read(const char *path, cli_pidrec r[2])
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t cap = 2 * sizeof r[0].p.cmd + 128;
    char *line = malloc(cap);
    int found = 0, legacy_m = 0, legacy_n = 0;
    memset(r, 0, 2 * sizeof *r);
    r[0].role = "master";
    r[1].role = "node";
    while (line && fgets(line, (int)cap, f)) {
        char role[16], *hex = NULL;
        int pid, off = 0;
        unsigned long long start;
        if (sscanf(line, "%d %d", &legacy_m, &legacy_n) == 2 && found == 0) {
            r[0].p.pid = legacy_m;
            r[1].p.pid = legacy_n;
            r[0].legacy = r[1].legacy = true;
            found = 3;
            break;
        }
        if (sscanf(line, "%15s %d %llu %n", role, &pid, &start, &off) != 3)
            continue;
        int k = !strcmp(role, "master") ? 0 : !strcmp(role, "node") ? 1 : -1;
        if (k < 0)
            continue;
        hex = line + off;
        hex[strcspn(hex, "\n")] = 0;
        r[k].p.pid = pid;
        r[k].p.start = start;
        r[k].p.cmdlen = cli_unhex(hex, (uint8_t *)r[k].p.cmd, sizeof r[k].p.cmd);
        found |= 1 << k;
    }
    free(line);
    fclose(f);
    return found == 3 ? 0 : -1;
}


/* Whether a legacy record's pid runs `ferry ROLE` on this directory. */
static bool legacy_ours(const cli_proc *now, const char *role, const char *dir)
{
    char want[4200];
    snprintf(want, sizeof want, "%s/%s", dir, !strcmp(role, "master") ? "master" : "node.ready");
    size_t i = 0, k = 0;
    bool role_ok = false, dir_ok = false;
    while (i < now->cmdlen) {
        const char *arg = now->cmd + i;
        size_t len = strnlen(arg, now->cmdlen - i);
        if (k == 1)
            role_ok = len == strlen(role) && !memcmp(arg, role, len);
        if (len == strlen(want) && !memcmp(arg, want, len))
            dir_ok = true;
        i += len + 1;
        k++;
    }
    return role_ok && dir_ok;
}

int cli_pids_check(const cli_pidrec *r, const char *dir, cli_proc *now)
{
    if (r->p.pid <= 0 || cli_proc_read(r->p.pid, now) < 0)
        return CLI_P_GONE;
    if (r->legacy)
        return legacy_ours(now, r->role, dir) ? CLI_P_OURS : CLI_P_OTHER;
    if (now->start == r->p.start && now->cmdlen == 0)
        return CLI_P_GONE;   /* ours, exited, not reaped yet */
    return cli_proc_same(&r->p, now) ? CLI_P_OURS : CLI_P_OTHER;
}
