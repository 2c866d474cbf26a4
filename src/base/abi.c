/*
 * The public structs' sizes, pinned: a struct a caller allocates keeps its
 * size for the life of a SONAME (docs/design.md, "Growth"). A field added to
 * a struct takes room from its reserved tail, and the size below stays; a
 * change that moves a size fails this file's build, and is an incompatible
 * change: the version's minor (while the major is 0) and the SONAME go up,
 * and these figures are written again. LP64 (x86-64, aarch64) figures.
 */
#include "ferry/ferry.h"

#if defined(__LP64__)
#define PIN(type, bytes) \
    _Static_assert(sizeof(type) == (bytes), #type " changed size: an ABI break (docs/design.md, \"Growth\")")
PIN(ferry_engine_config, 568);
PIN(ferry_remote_region, 40);
PIN(ferry_mapping, 24);
PIN(ferry_op, 88);
PIN(ferry_pending_info, 32);
PIN(ferry_engine_stats, 192);
PIN(ferry_binding_entry, 440);
PIN(ferry_peer_map, 16);
PIN(ferry_exec_limits, 16);
PIN(ferry_lower_args, 120);
PIN(ferry_batch_list, 40);
PIN(ferry_guard, 32);
PIN(ferry_exec_config, 160);
PIN(ferry_exec_result, 136);
PIN(ferry_stream_config, 96);
PIN(ferry_store_read, 72);
PIN(ferry_store_reads, 48);
PIN(ferry_store_exec_config, 96);
PIN(ferry_error, 516);
PIN(ferry_fp8_options, 64);
PIN(ferry_tensor_desc, 88);
PIN(ferry_fragment, 240);
PIN(ferry_split, 216);
PIN(ferry_packed, 24);
PIN(ferry_model_tensor, 104);
PIN(ferry_layout, 28);
PIN(ferry_quant_rules, 160);
PIN(ferry_tensor_quant, 120);
PIN(ferry_plan_options, 88);
PIN(ferry_plan_stats, 192);
PIN(ferry_region, 176);
PIN(ferry_run, 272);
PIN(ferry_plan_filter, 24);
PIN(ferry_rollout_session, 2352);
PIN(ferry_update_session, 232);
PIN(ferry_policy_version, 168);
PIN(ferry_sample_queue_config, 304);
PIN(ferry_sample_data, 56);
PIN(ferry_sample, 2800);
PIN(ferry_sample_stats, 184);
PIN(ferry_kvcache_stats, 96);
PIN(ferry_sparse_placement, 24);
PIN(ferry_sparse_desc, 416);
PIN(ferry_sparse_index, 952);
PIN(ferry_sparse_target, 344);
PIN(ferry_sparse_range, 24);
PIN(ferry_sparse_read, 24);
PIN(ferry_sparse_pair, 24);
PIN(ferry_sparse_plan_stats, 144);
PIN(ferry_sparse_plan, 192);
PIN(ferry_sparse_result, 336);
PIN(ferry_sparse_stats, 240);
PIN(ferry_sparse_view, 160);
PIN(ferry_sparse_reader_config, 80);
PIN(ferry_store_config, 784);
PIN(ferry_replicate_config, 96);
PIN(ferry_replica_info, 32);
PIN(ferry_object_desc, 336);
PIN(ferry_range, 32);
PIN(ferry_strided_range, 56);
PIN(ferry_member, 168);
PIN(ferry_kv_value, 40);
PIN(ferry_kv_event, 40);
PIN(ferry_qrecord, 32);
PIN(ferry_master_config, 4536);
PIN(ferry_node_config, 840);
PIN(ferry_weight_tensor, 128);
PIN(ferry_publisher_config, 248);
PIN(ferry_publish_stats, 184);
PIN(ferry_shard_data, 16);
PIN(ferry_weight_entry, 808);
PIN(ferry_weight_manifest, 96);
PIN(ferry_weights_status, 104);
PIN(ferry_param_shard, 256);
PIN(ferry_update_stats, 280);
PIN(ferry_subscriber_config, 360);
PIN(ferry_update_node, 56);
PIN(ferry_standby_view, 32);
PIN(ferry_sparse_announce_stats, 112);
PIN(ferry_sparse_link, 32);
PIN(ferry_sparse_chain, 40);
PIN(ferry_sparse_update_config, 200);
PIN(ferry_sparse_update_stats, 384);
PIN(ferry_delta_config, 80);
PIN(ferry_delta_stats, 384);
PIN(ferry_compat_config, 296);
PIN(ferry_compat_stats, 272);
#endif
typedef int fr_abi_pinned;   /* a translation unit is never empty */
