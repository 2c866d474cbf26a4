/* libFuzzer target over the master's request path: the input is the byte
 * stream one connection sent after its handshake, fed through the master's
 * per-connection frame parser and dispatcher (fr_master_feed) into a real
 * metadata core and log (a temp directory, no fsync), fresh for every
 * input. The first input byte picks the mode, the rest is the stream:
 *
 *   bit 0  the connection's role: 0 client, 1 node (may MOUNT)
 *   bit 1  the harness writes the magic, version and a correct check into
 *          every frame header it can delimit, and trims the last frame's
 *          length to the bytes left (a check is a hash the fuzzer cannot
 *          forge; without this it would rarely get past the header)
 *
 * The master must never crash, leak or hit a fatal error: only the log's
 * I/O may make it give up, and the log is a local temp directory. */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/base.h"
#include "store/master.h"
#include "wire/wire.h"

#define FR_FUZZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

/* Every input starts from an empty master over an empty directory, so a
 * finding reproduces from its input alone and nothing carries over to look
 * like a leak. The directory is made once and emptied after each input. */
static char g_dir[64], g_state[96];

static void empty_state(void)
{
    DIR *d = opendir(g_state);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", g_state, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(g_state);
}

static void cleanup(void)
{
    empty_state();
    rmdir(g_dir);
}

static void init(void)
{
    ferry_log_set_level(FERRY_LOG_OFF);
    snprintf(g_dir, sizeof g_dir, "/tmp/ferry-fuzz-master-XXXXXX");
    FR_FUZZ_CHECK(mkdtemp(g_dir) != NULL);
    snprintf(g_state, sizeof g_state, "%s/state", g_dir);
    atexit(cleanup);
}

static void put_le(uint8_t *p, uint64_t v, size_t k)
{
    for (size_t i = 0; i < k; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

/* Make every header the stream delimits valid (see mode bit 1). */
static void fix_frames(uint8_t *b, size_t n)
{
    size_t pos = 0;
    while (pos + FR_WIRE_HDR_LEN <= n) {
        uint8_t *h = b + pos;
        put_le(h, FR_WIRE_MAGIC, 4);
        put_le(h + 4, FR_WIRE_VERSION, 2);
        uint32_t len = (uint32_t)h[16] | (uint32_t)h[17] << 8 | (uint32_t)h[18] << 16 |
                       (uint32_t)h[19] << 24;
        size_t left = n - pos - FR_WIRE_HDR_LEN;
        if (len > left)
            len = (uint32_t)left;
        put_le(h + 16, len, 4);
        put_le(h + 20, (uint32_t)XXH3_64bits(h, 20), 4);
        pos += FR_WIRE_HDR_LEN + len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_dir[0] == 0)
        init();
    if (size < 1)
        return 0;
    fr_master *m = NULL;
    if (fr_master_open_mem(g_state, &m) < 0) {
        /* Someone cleaned /tmp under us: that is not a finding. */
        (void)mkdir(g_dir, 0700);
        FR_FUZZ_CHECK(fr_master_open_mem(g_state, &m) == 0);
    }
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1);
    FR_FUZZ_CHECK(buf != NULL);
    memcpy(buf, data + 1, n);
    if (mode & 2)
        fix_frames(buf, n);
    uint16_t role = (mode & 1) ? FR_ROLE_STORE_NODE : FR_ROLE_STORE_CLIENT;
    int rc = fr_master_feed(m, role, buf, n);
    FR_FUZZ_CHECK(rc >= 0);
    free(buf);
    fr_master_close(m);
    empty_state();
    return 0;
}
