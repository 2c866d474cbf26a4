/* ferry — the data plane of RL post-training. Include this for everything. */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H
#include "ferry/common.h"
#include "ferry/engine.h"
#include "ferry/store.h"
#include "ferry/reshard.h"
#include "ferry/exec.h"
#include "ferry/samples.h"
#include "ferry/sparse.h"
#include "ferry/weights.h"
#include "ferry/weights_compat.h"
#endif
