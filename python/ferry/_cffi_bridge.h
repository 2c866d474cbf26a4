/* The C of ferry._ferry_cffi that cffi cannot express, compiled into the
 * module with the declarations cffi generates from the public headers
 * (python/build_backend/ferry_cdef.py). What lies between the FP_CDEF
 * markers is also given to cffi.FFI.cdef: plain declarations, and
 * FP_PYTHON(prototype) for a function written in Python (cffi's
 * extern "Python+C", defined with @ffi.def_extern()). */
#ifndef FP_CFFI_BRIDGE_H
#define FP_CFFI_BRIDGE_H

#include <stddef.h>

#define FP_PYTHON(decl) decl

/* FP_CDEF begin */
/* C's free, for what the library hands back to be freed with free()
 * (ferry_manifest_to_json's text). */
void free(void *ptr);
/* ---- the library's log lines into logging (_cffi_bridge.c, ferry/_log.py) ----
 * Lines come from any thread, library threads included, often while the
 * thread holding the GIL waits on them (a call that closes a store joins
 * the thread that logs). So the callback never takes the GIL: it queues
 * the line under a plain mutex and asks the interpreter to call
 * fp_log_deliver on the main thread at its next bytecode. */
typedef struct {
    int level;                /* enum ferry_log_level */
    double time;              /* seconds since the epoch, when logged */
    unsigned long thread;     /* pthread_self() of the logging thread */
    char tag[32];
    char msg[2048];
} fp_log_line;
/* Queue the library's lines from now on (ferry_log_set_callback): 0 or
 * FERRY_ENOMEM. */
int fp_log_install(void);
/* Lines go to stderr again; the queued ones stay for fp_log_take. */
void fp_log_uninstall(void);
/* Move up to max queued lines, oldest first, into out; *dropped: the lines
 * dropped since the last call (the queue was full). Returns the count. */
size_t fp_log_take(fp_log_line *out, size_t max, unsigned long long *dropped);
/* Python's: deliver the queued lines (ferry._log). */
FP_PYTHON(void fp_log_deliver(void);)
/* FP_CDEF end */

#endif
