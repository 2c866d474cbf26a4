/* libFuzzer target: the sparse object's "meta" member decoder
 * (src/sparse/sparse_int.h), which reads bytes that come from the store.
 * Any input must give 0 or FERRY_EPROTO, never a crash or a leak; a meta
 * that decodes must encode and decode again to the same descriptor and the
 * same canonical text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sparse/sparse_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ferry_sparse_desc d, d2;
    ferry_error err = {0};
    int rc = fr_sparse_meta_decode((const char *)data, size, &d, &err);
    if (rc != 0) {
        if (rc != FERRY_EPROTO || !err.msg[0])
            abort();
        return 0;
    }
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (fr_sparse_meta_encode(&d, &a, &na) != 0 || fr_sparse_meta_decode(a, na, &d2, &err) != 0)
        abort();
    if (memcmp(&d, &d2, sizeof d) != 0)
        abort();
    if (fr_sparse_meta_encode(&d2, &b, &nb) != 0 || na != nb || memcmp(a, b, na) != 0)
        abort();
    char key[600];
    if (fr_sparse_key(&d, key, sizeof key) <= 0)
        abort();
    free(a);
    free(b);
    return 0;
}
