/* reshard layer internals, shared by the files of src/reshard/. */
#ifndef FR_RESHARD_INT_H
#define FR_RESHARD_INT_H

#include <stdatomic.h>

#include "base/base.h"
#include "ferry/reshard.h"

#define FR_MAXD FERRY_MAX_DIMS
#define FR_NAME_MAX 4096                 /* tensor names and object keys */
#define FR_MAX_EXPLICIT (1ull << 24)     /* fragments added one by one, per manifest */
#define FR_MAX_GROUPS (1ull << 26)       /* splits + fragments, per manifest */

/* ---- errors ------------------------------------------------------------ */
/* Fill err (may be NULL) and return code. */
/* "[a,b,c]" into buf. */
const char *fr_fmt_dims(char *buf, size_t cap, const uint64_t *v, uint32_t n);

/* ---- string -> index map (open addressing) ----------------------------- */
typedef const char *(*fr_strmap_key_fn)(const void *ctx, uint32_t idx);
typedef struct fr_strmap {
    uint32_t *slot;     /* idx + 1; 0 = empty */
    size_t cap, n;
} fr_strmap;
void fr_strmap_free(fr_strmap *m);
/* Index of key, or -1. */
int64_t fr_strmap_find(const fr_strmap *m, const char *key, fr_strmap_key_fn fn, const void *ctx);
int fr_strmap_insert(fr_strmap *m, const char *key, uint32_t idx, fr_strmap_key_fn fn, const void *ctx);

/* ---- manifests --------------------------------------------------------- */
typedef struct fr_tensor {
    char *name;
    char dtype[FERRY_DTYPE_MAX];
    uint32_t itemsize, ndim;
    uint64_t shape[FR_MAXD];
    uint64_t elems;
    /* block quantization (ferry_manifest_quantize): enum ferry_quant_role,
     * the partner tensor, the blocks, the scale format and the FP8 type */
    uint32_t qrole, qpartner;
    uint32_t qblock[2];
    uint32_t qformat;
    char qdtype[FERRY_DTYPE_MAX];
    char qfrom[FERRY_DTYPE_MAX];   /* a quantized weight's dtype before */
    uint32_t qcut;                 /* a source layout: shards may cut blocks, each block's
                                    * scale is held with the block's first element */
} fr_tensor;

/* A group: a regular grid of pieces over one box (a single fragment is a
 * 1-piece grid), `replicas` copies. Per-dim values live in the manifest's
 * pool at `pool`: off[n], ext[n], chunk[n], parts[n], rstride[n] and, when
 * has_strides, strides[n]. parts are the non-empty pieces; dims with one
 * part store chunk = ext and rstride = 0 (canonical). */
typedef struct fr_group {
    uint64_t first_id;        /* fragment id of copy 0, piece 0 */
    uint64_t ncells;          /* non-empty pieces per copy */
    uint64_t pool;
    uint64_t storage_offset;  /* elements */
    uint64_t object_offset;   /* bytes */
    uint32_t tensor;
    uint32_t rank;            /* rank of copy 0, piece 0 */
    uint32_t replicas, replica_stride, replica;
    int32_t object;           /* interned key, -1 unbound */
    uint8_t ndim, has_strides, is_split;
} fr_group;

#define G_OFF(m, g)     ((m)->pool + (g)->pool)
#define G_EXT(m, g)     ((m)->pool + (g)->pool + (g)->ndim)
#define G_CHUNK(m, g)   ((m)->pool + (g)->pool + 2 * (g)->ndim)
#define G_PARTS(m, g)   ((m)->pool + (g)->pool + 3 * (g)->ndim)
#define G_RSTRIDE(m, g) ((m)->pool + (g)->pool + 4 * (g)->ndim)
#define G_STRIDES(m, g) ((m)->pool + (g)->pool + 5 * (g)->ndim)

struct ferry_manifest {
    atomic_int refs;
    uint32_t nranks;
    uint32_t *nodes;
    uint32_t gpus_per_node;   /* 0 when nodes were given explicitly */
    fr_tensor *tensors;
    size_t ntensors, tcap;
    fr_strmap tnames;
    fr_group *groups;
    size_t ngroups, gcap;
    uint64_t *pool;
    size_t npool, pcap;
    char **objects;
    size_t nobjects, ocap;
    fr_strmap onames;
    uint64_t nfrags, nexplicit;
    bool frozen;
    bool digest_valid;
    uint8_t digest[16];
    /* built by fr_manifest_freeze: the groups of each tensor */
    uint32_t *tg_start;       /* ntensors + 1 */
    uint32_t *tg_list;        /* ngroups */
};

/* Freeze: no more additions; build per-tensor group lists. Idempotent.
 * Thaw undoes it (only for a manifest no plan holds). */
int fr_manifest_freeze(ferry_manifest *m);
void fr_manifest_thaw(ferry_manifest *m);
void fr_manifest_ref(ferry_manifest *m);
/* Group holding fragment id (id < nfrags). */
size_t fr_manifest_group_of(const ferry_manifest *m, uint64_t id);
/* Piece `lin` (row-major over parts) of group g: its multi-index, box and
 * rank of copy k. */
void fr_group_piece(const ferry_manifest *m, const fr_group *g, uint64_t lin, uint64_t *idx,
                    uint64_t *off, uint64_t *shape);
uint32_t fr_group_rank(const ferry_manifest *m, const fr_group *g, const uint64_t *idx, uint32_t k);
/* Highest rank any piece of any copy of g is on. */
uint32_t fr_group_max_rank(const ferry_manifest *m, const fr_group *g);
/* "fragment 17 (rank 3, replica 0, offset [..], shape [..])" */
const char *fr_frag_desc(const ferry_manifest *m, const fr_group *g, uint32_t k, uint64_t lin,
                         char *buf, size_t cap);
static inline uint32_t fr_node_of(const ferry_manifest *m, uint32_t rank)
{
    return m->nodes[rank];
}

/* ---- block quantization (quant.c) -------------------------------------- */
/* The rules of a quantization, resolved: what the JSON form records. */
typedef struct fr_quant_spec {
    const char *dtype, *include, *exclude, *scale_name;
    uint32_t block[2];
    uint32_t format;
    bool cut;      /* a source (trainer) layout: shards may cut blocks
                    * (ferry_manifest_quantize_source) */
} fr_quant_spec;
/* ferry_manifest_quantize with the tensors to quantize and their scale
 * tensors' names given by names[i] (one per tensor of m; NULL: not
 * quantized) rather than by the spec's name rules (include, exclude and
 * scale_name unused); the rest of the spec is checked as the rules are. */
int fr_manifest_quantize(const ferry_manifest *m, const fr_quant_spec *q,
                         const char *const *names, ferry_manifest **out, ferry_error *err);
/* The spec a quantized manifest was made with (its first quantized
 * weight's); false when m has none. */
bool fr_manifest_quant_spec(const ferry_manifest *m, fr_quant_spec *q);
/* Mark the tensors of t named as the quantized tensors of src (weights
 * and scales) quantized the same way, without deriving fragments: the
 * scale fragments are what the caller bound (a rollout binds the scale
 * tensor as a tensor of its own). With check, t's fragments of a weight
 * must hold whole blocks (ferry_manifest_quantize's sentence otherwise);
 * without, they are not looked at (the read pieces of a subscriber, rows
 * of shards checked before). Resets t's digest. */
int fr_manifest_quant_like(ferry_manifest *t, const ferry_manifest *src, bool check,
                           ferry_error *err);
/* Whether source tensor s and target tensor t (same name) are stored the
 * same way; a failure names the tensor and says what differs. */
int fr_quant_agree(const fr_tensor *s, const fr_tensor *t, ferry_error *err);

/* ---- digests ----------------------------------------------------------- */
int fr_topology_pair_digest(const ferry_manifest *a, const ferry_manifest *b, uint8_t out[16]);

/* ---- plans ------------------------------------------------------------- */
/* Source groups with identical geometry form one class: copies of the
 * same boxes. Members are group indices sorted by replica number. */
typedef struct fr_class {
    uint32_t rep;             /* representative group */
    uint32_t first_member, nmembers;
    uint64_t copies;          /* sum of members' replicas */
    uint32_t min_rank, max_rank;
} fr_class;

typedef struct fr_pair {
    uint32_t tgroup, sclass;
    uint64_t nregions;
} fr_pair;

typedef struct fr_ptensor {
    uint32_t src_tensor;
    size_t first_pair, npairs;
} fr_ptensor;

struct ferry_plan {
    atomic_int refs;
    ferry_manifest *src, *dst;
    fr_ptensor *tensors;      /* per target tensor */
    fr_pair *pairs;
    size_t npairs, pcap;
    fr_class *classes;
    size_t nclasses, ccap;
    uint32_t *members;
    size_t nmembers, mcap;
    ferry_plan_stats stats;
};

void fr_plan_ref(ferry_plan *p);
/* Count runs by walking the plan (used when coalescing can merge regions). */
int fr_plan_count_runs(const ferry_plan *p, uint64_t *out);
/* Check a finished plan against limits. */
int fr_plan_check_limits(const ferry_plan *p, const ferry_plan_options *o, ferry_error *err);
void fr_plan_options_resolve(const ferry_plan_options *in, ferry_plan_options *out);

#endif
