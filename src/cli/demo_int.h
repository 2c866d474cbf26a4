/* The weight-update demo's shared pieces (demo_weights.c, demo_roles.c). */
#ifndef FERRY_DEMO_INT_H
#define FERRY_DEMO_INT_H

#include <stdint.h>

#include "ferry/ferry.h"

typedef struct demo_tensor {
    char name[160];
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t bytes;              /* bf16 */
} demo_tensor;

/* The real tensor shapes of a preset, in order, as many as fit in budget. */
typedef struct demo_model { demo_tensor *t; size_t n; uint64_t bytes; } demo_model;
int demo_model_build(const char *preset, uint64_t budget, demo_model *dm);
void demo_model_free(demo_model *dm);

/* Child processes: `ferry _demo_trainer|_demo_rollout MASTER RANK WORLD MODEL BUDGET -`. */
int demo_trainer_main(int argc, char **argv);
int demo_rollout_main(int argc, char **argv);

#endif
