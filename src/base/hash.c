/* XXH3 hashing: 64-bit for tables, 128-bit canonical bytes for content ids. */
#include <assert.h>
#include <string.h>

#include <xxhash.h>
/* On x86-64 Debian's shared libxxhash also exports entry points that pick
 * the widest vector unit at run time (AVX-512, AVX2, SSE2); the plain ones
 * are built for the baseline ISA (SSE2): 11-18 GB/s here against 38-49
 * GB/s, on the 332 MB a torch publish checksums every generation. They are
 * referenced weakly and used where they resolve: its static archive has
 * none of them, and a static link takes the plain ones. The digests are
 * the same either way. */
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define FR_XXH_DISPATCH 1
#pragma weak XXH3_64bits_withSeed_dispatch
#pragma weak XXH3_128bits_withSeed_dispatch
#pragma weak XXH3_128bits_update_dispatch
#endif
#endif

#ifdef FR_XXH_DISPATCH
#define XXH_PICK(f) (f##_dispatch ? f##_dispatch : f)
#else
#define XXH_PICK(f) f
#endif

#include "base/base.h"

struct fr_hasher {
    XXH3_state_t *state;
};

/* XXH3 may not accept a NULL pointer even for zero bytes on every version. */
static const void *fr_nonnull(const void *data, size_t len)
{
    return len == 0 ? "" : data;
}

uint64_t fr_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH_PICK(XXH3_64bits_withSeed)(fr_nonnull(data, len), len, seed);
}

/* Big-endian canonical form, so digests compare and print the same on every
 * host. */
static fr_hash128_t fr_hash128_canonical(XXH128_hash_t h)
{
    XXH128_canonical_t c;
    fr_hash128_t out;

    _Static_assert(sizeof(c.digest) == sizeof(out.b), "128-bit digest size");
    XXH128_canonicalFromHash(&c, h);
    memcpy(out.b, c.digest, sizeof(out.b));
    return out;
}

fr_hash128_t fr_hash128(const void *data, size_t len, uint64_t seed)
{
    return fr_hash128_canonical(XXH_PICK(XXH3_128bits_withSeed)(fr_nonnull(data, len), len, seed));
}

fr_hasher *fr_hasher_new(uint64_t seed)
{
    fr_hasher *h = fr_malloc(sizeof(*h));

    if (h == NULL)
        return NULL;
    h->state = XXH3_createState();
    if (h->state == NULL || XXH3_128bits_reset_withSeed(h->state, seed) != XXH_OK) {
        fr_hasher_free(h);
        return NULL;
    }
    return h;
}

void fr_hasher_update(fr_hasher *h, const void *data, size_t len)
{
    if (h == NULL || len == 0)
        return;
    XXH_PICK(XXH3_128bits_update)(h->state, data, len);
}

fr_hash128_t fr_hasher_digest(const fr_hasher *h)
{
    assert(h != NULL);
    return fr_hash128_canonical(XXH3_128bits_digest(h->state));
}

void fr_hasher_free(fr_hasher *h)
{
    if (h == NULL)
        return;
    XXH3_freeState(h->state);
    fr_free(h);
}

void fr_hash128_hex(fr_hash128_t h, char out[33])
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < sizeof(h.b); i++) {
        out[2 * i] = digits[h.b[i] >> 4];
        out[2 * i + 1] = digits[h.b[i] & 0xf];
    }
    out[32] = '\0';
}
