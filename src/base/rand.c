/* Randomness from libsodium (getrandom underneath). */
#include <sodium.h>

#include "base/base.h"

static pthread_once_t fr_sodium_once = PTHREAD_ONCE_INIT;

/* sodium_init is idempotent but not documented as safe to race; once it is.
 * randombytes_buf still works if it fails (it only picks the default
 * implementation), so a failure is logged, not fatal. */
static void fr_sodium_init(void)
{
    if (sodium_init() < 0)
        FR_ERROR("base", "sodium_init failed; using libsodium's default RNG");
}

void fr_random_bytes(void *buf, size_t n)
{
    if (buf == NULL || n == 0)
        return;
    pthread_once(&fr_sodium_once, fr_sodium_init);
    randombytes_buf(buf, n);
}

uint64_t fr_random_u64(void)
{
    uint64_t v;

    /* 0 and 1 are reserved key values elsewhere; redrawing keeps the rest
     * uniform, and a redraw happens with probability 2^-63. */
    do {
        fr_random_bytes(&v, sizeof(v));
    } while (v <= 1);
    return v;
}
