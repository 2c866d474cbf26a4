/* ferry weight updates: the pieces of publishing a policy generation that
 * every trainer rank computes for itself (docs/weights.md).
 *
 * Built so far: the deterministic byte-balanced choice of one publisher
 * rank per tensor, the rollout dtype conversion (round-to-nearest-even) and
 * the deterministic object keys of a generation. The publisher, the
 * commit/announce protocol, the subscriber and the update executor are the
 * rest of the weight-update work (issue 5) and are not in this header yet. */
#ifndef FERRY_WEIGHTS_H
#define FERRY_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"
#include "ferry/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One publisher rank per tensor, balancing bytes across trainer nodes,
 * then across the ranks of each node. Every rank passes the same tensor
 * sizes in the same order and the same rank -> node map, and gets the same
 * answer: the result depends on nothing else (no hashing of pointers, no
 * randomness, no thread timing).
 *
 * Algorithm (longest-processing-time first): tensors are taken in
 * decreasing size (ties: lower index first); each goes to the node with the
 * fewest bytes so far (ties: lower node id), and inside it to the rank with
 * the fewest bytes (ties: lower rank). The heaviest node carries at most
 * mean + the largest tensor, and in practice within a fraction of a percent
 * of the mean once tensors outnumber nodes many times (docs/weights.md).
 *
 * tensor_bytes[ntensors]; rank_node[nranks] (node ids are any u32; a node
 * with no rank never publishes). publisher[ntensors] receives ranks.
 * FERRY_EINVAL for no ranks or NULL arrays, FERRY_ENOMEM. */
int ferry_weights_assign(const uint64_t *tensor_bytes, size_t ntensors,
                         const uint32_t *rank_node, uint32_t nranks, uint32_t *publisher,
                         ferry_error *err);

/* Convert count elements between "f32", "bf16" and "f16" (any pair; the
 * same dtype copies). Narrowing rounds to nearest, ties to even; values
 * beyond the target's range become infinities; NaNs stay NaNs (quiet, sign
 * kept); f16 subnormals are produced and read exactly. src and dst must not
 * overlap unless equal with equal dtypes. FERRY_EINVAL for another dtype. */
int ferry_convert(const void *src, const char *src_dtype, void *dst, const char *dst_dtype,
                  size_t count);

/* The store key of one object of a generation:
 * "ferry/w/<model>/<generation, 20 digits>/<fragment>". Returns the length
 * (without NUL), or FERRY_EMSGSIZE when it does not fit in cap, FERRY_EINVAL
 * for an empty model name or one holding '/'. */
int ferry_weights_key(const char *model, uint64_t generation, const char *fragment, char *buf,
                      size_t cap);

#ifdef __cplusplus
}
#endif
#endif
