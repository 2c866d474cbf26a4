/* rl layer internals shared by update.c, pull.c, compat.c and the publish files. */
#ifndef FR_RL_INT_H
#define FR_RL_INT_H

#include <stdbool.h>

#include "ferry/exec.h"
#include "ferry/weights.h"
#include "keys.h"   /* a sibling, by its own name (see pull_int.h) */

struct fr_gen;

/* A config's zeroed fields to their defaults (config.c: the values of
 * the *_config_init() calls), once, where an entry point takes the config;
 * what runs after reads every field as it is. */
void fr_rl_publisher_resolve(ferry_publisher_config *c);
void fr_rl_subscriber_resolve(ferry_subscriber_config *c);
struct ferry_compat_config;
void fr_rl_compat_resolve(struct ferry_compat_config *c);
/* Compatibility mode in a group over several nodes cuts a large tensor
 * into blocks of whole rows, each a replica set of its own with its own
 * reader, so that the pushes of one tensor leave from every node's NIC,
 * not all from its reader's (compat.c): the rows of one block of a tensor
 * of `rows` rows of `row_bytes` each; `rows` when it is not cut. A block
 * holds a multiple of FR_COMPAT_BLOCK_ALIGN rows (more than
 * FR_COMPAT_BLOCK when the rows are wide) unless the tensor has fewer
 * rows, so an FP8 tensor's 128-row blocks are never cut. The lab's model
 * cuts with it. */
#define FR_COMPAT_BLOCK (2ull << 20)
#define FR_COMPAT_BLOCK_ALIGN 128u
uint64_t fr_rl_compat_block_rows(uint64_t rows, uint64_t row_bytes);
struct ferry_sample_queue_config;
void fr_rl_sample_queue_resolve(struct ferry_sample_queue_config *c);


/* The announced generation and digest (may be NULL) from the active key
 * alone, without checking that its objects are still there (publish.c
 * and updates, which lease every object anyway; ferry_weights_active does
 * check). 0, FERRY_ENOENT, FERRY_EPROTO, or the store's error. */
int fr_rl_active_read(ferry_store *s, const char *model, uint64_t *generation,
                      uint8_t digest[16], ferry_error *err);
/* The n keys' values in one batched round trip (a group's records after
 * a barrier, a publish's parts): out[k] and results[k] set for every k, as
 * ferry_kv_batch_get says. keys: n strings of FR_KEY_MAX bytes. */
int fr_rl_kv_get_all(ferry_store *s, char (*keys)[FR_KEY_MAX], size_t n, ferry_kv_value *out,
                     int *results);

/* Generation `generation`'s manifest (every object leased), whether or not
 * it is the active one: what a group agreed on (pull_agree.c). */
int fr_rl_prepare_at(ferry_store *s, const char *model, uint64_t generation,
                     ferry_weight_manifest *m, ferry_error *err);
/* The active generation and its manifest (every object leased), unless
 * *generation is already the active one (*current). Sets st->generation
 * (the current one) and st->prepare_s. */
int fr_rl_prepare(ferry_store *s, const char *model, uint64_t *generation,
                  ferry_weight_manifest *m, bool *current, ferry_update_stats *st,
                  ferry_error *err);

/* ---- reading a stored generation through exec (gen_read.c) --------------------------
 *
 * Every consumer reads a generation the same way: its target placement (what
 * it holds) with an exec binding of its memory, planned against the stored
 * placement by the reshard planner, attested, lowered once by
 * ferry_exec_store_lower and run by ferry_exec_store_run. */

/* ferry_store_locate_fn over a generation (ctx: the fr_gen): where a
 * source fragment's packed bytes are. */
int fr_rl_locate(void *g, uint64_t fragment, const char **key, uint64_t *offset);

/* The attestation of plan (g's stored placement -> dst's placement) for
 * g's generation: the source side is an empty binding of the stored
 * placement (store objects, not memory). */
int fr_rl_attest_reads(const struct fr_gen *g, ferry_plan *plan, const ferry_binding *dst,
                       ferry_attested_plan **out, ferry_error *err);

/* The binding of target manifest t, at generation, in worker `worker`:
 * fragment frags[i] (frags NULL: every fragment, i = its id; n ignored)
 * lives in the buffer at addr[i] (laid out as the placement says: strides
 * and storage offset; nbytes[i] bytes there, or NULL / 0: exactly the
 * box's span). The binding's own checks apply (every element inside the
 * buffer: FERRY_ERANGE naming the fragment). */
int fr_rl_bind(ferry_manifest *t, uint64_t generation, uint32_t worker, const uint64_t *frags,
               size_t n, const uint64_t *addr, const uint64_t *nbytes, ferry_binding **out,
               ferry_error *err);

/* Read whole tensor `tensor` of g (row-major into dst, cap bytes) through
 * exec: the tensor's fragment of g->whole_m bound at dst, g->whole
 * attested and lowered for that tensor. No checksum check
 * (fr_gen_verify_tensor). A failure after reads began may leave dst
 * partly written. */
int fr_rl_read_whole(ferry_store *s, struct fr_gen *g, uint32_t tensor, void *dst, size_t cap,
                     ferry_error *err);

/* ---- reader assignment (readers.c) ------------------------------------------------
 *
 * Which worker reads each demanded byte of a source object from the store,
 * and whom it pushes it to. A pure function of its inputs: the objects in
 * the order they are given, each object's demand runs (in any order), the
 * worker -> node map and the options; no pointers, hashing, randomness or
 * timing. Loads carry over from object to object (one handle per plan).
 *
 * Per object: the ends of every run cut the object into elementary ranges
 * (sweep over sorted ends: O(runs log runs + ranges x consumers)); ranges
 * wanted by two or more workers are cut into `chunk`-byte pieces so that
 * the pieces of a wide range get different readers. Each piece gets one
 * reader among its consumers: the one whose choice leaves the lowest
 * NIC load, max(in, out), on the busiest of the nodes it touches (the
 * reader's node takes in the read when the object lives elsewhere and
 * sends out the pushes: once per other node holding a consumer with
 * relay, once per remote consumer run without; every other consumer node
 * takes the pushes in); ties: the lower resulting load of the reader's
 * own node (max(in, out), then in + out), fewer bytes added to NICs (a
 * reader on the object's node reads locally), fewer bytes read so far by
 * the worker, the lower worker id.
 * Then, with relay, one consumer per other node (the one that forwarded
 * the fewest bytes so far, ties: lower worker id) receives the
 * piece (hop 1) and forwards it to the other consumers of its node (hop 2);
 * consumers on the reader's node get it from the reader (hop 1). Without
 * relay every consumer gets it from the reader (hop 1). A worker whose two
 * runs cover the same bytes gets a push from itself (a local copy). */

#define FR_RD_NO_NODE UINT32_MAX   /* an object not on any node of the map */

/* One demand run: bytes [off, off+len) of the object, wanted by worker. */
typedef struct fr_rd_demand {
    uint32_t worker;
    uint64_t off, len;
} fr_rd_demand;

/* One piece: read once by demand run `reader` (an index into the object's
 * demand array); its pushes are pushes[push .. push+npush). */
typedef struct fr_rd_range {
    uint64_t off, len;
    uint32_t reader;
    uint32_t npush;
    size_t push;
} fr_rd_range;

/* A push of the piece into demand run `to`, from demand run `from` (the
 * reader's run, or on hop 2 the run of the node's delegate). */
typedef struct fr_rd_push {
    uint32_t from, to;
    uint32_t hop;           /* 1: from the reader; 2: forwarded inside a node */
} fr_rd_push;

/* Per node, bytes through its NIC (cross-node only) and inside it. */
typedef struct fr_rd_load {
    uint64_t read_in;       /* store reads by its workers of objects on other nodes */
    uint64_t push_in;       /* pushes received from other nodes */
    uint64_t push_out;      /* pushes sent to other nodes */
    uint64_t serve_out;     /* its objects read by workers on other nodes */
    uint64_t intra;         /* pushes between (or inside) workers of the node */
} fr_rd_load;

typedef struct fr_rd_summary {
    uint64_t store_read;          /* bytes read from the store: each demanded byte once */
    uint64_t pushed_cross, pushed_intra;
    uint64_t max_in, max_out;     /* NIC in = read_in + push_in; out = push_out + serve_out */
    double mean_in, mean_out;     /* over all nnodes nodes */
    uint32_t max_in_node, max_out_node;
    uint64_t ranges, pushes;
} fr_rd_summary;

typedef struct fr_rd_config {
    uint32_t nworkers;
    const uint32_t *worker_node;  /* nworkers entries, each < nnodes */
    uint32_t nnodes;
    uint64_t chunk;               /* piece size of shared ranges; 0: never cut */
    bool relay;                   /* one cross-node push per node, then forwarded */
} fr_rd_config;

typedef struct fr_readers fr_readers;

/* The config's arrays are copied. FERRY_EINVAL, FERRY_ENOMEM. */
int fr_readers_open(const fr_rd_config *cfg, fr_readers **out);
void fr_readers_close(fr_readers *r);
/* Assign one object of `size` bytes living on node src_node (< nnodes or
 * FR_RD_NO_NODE) wanted by d[0..n) (runs of length 0 are ignored; runs may
 * overlap, also runs of one worker). *ranges / *pushes point into the
 * handle, valid until the next call; ranges are in offset order, a range's
 * pushes in (hop, node, worker) order. FERRY_EINVAL for a worker out of
 * range or a run past the end, FERRY_ENOMEM. */
int fr_readers_object(fr_readers *r, uint32_t src_node, uint64_t size, const fr_rd_demand *d,
                      size_t n, const fr_rd_range **ranges, size_t *nranges,
                      const fr_rd_push **pushes, size_t *npushes);
/* Loads of nodes 0..nnodes-1 so far (borrowed) and their summary; per
 * worker, the bytes it read and forwarded so far. */
const fr_rd_load *fr_readers_loads(const fr_readers *r);
const uint64_t *fr_readers_wread(const fr_readers *r);
const uint64_t *fr_readers_wfwd(const fr_readers *r);
/* Loads to start from (those of an assignment made before, for objects
 * assigned apart: compatibility mode's batches), as if its objects had
 * been assigned first. */
typedef struct fr_rd_seed {
    const fr_rd_load *load;       /* nnodes */
    const uint64_t *wread, *wfwd; /* nworkers */
} fr_rd_seed;
void fr_readers_seed(fr_readers *r, const fr_rd_seed *s);
void fr_readers_summary(const fr_readers *r, fr_rd_summary *out);

/* pull.c: whether the subscriber's last update reused the plan of the one
 * before (same demands, tensor sizes and nodes: no reader assignment). */
bool fr_subscriber_plan_reused(const ferry_subscriber *sub);

#endif
