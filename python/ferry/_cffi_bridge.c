/* The C of the cffi binding that cffi cannot express (_cffi_bridge.h): the
 * queue between the library's logging threads and Python's logging. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

#include "ferry/ferry.h"
#include "_cffi_bridge.h"

#define LOG_QUEUE_MAX 4096   /* lines kept while Python is busy; more are counted and dropped */

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static fp_log_line *q_lines;     /* ring of LOG_QUEUE_MAX */
static size_t q_head, q_len;
static unsigned long long q_dropped;
static atomic_int q_scheduled;   /* a pending call is queued */

static int deliver_pending(void *arg)
{
    (void)arg;
    atomic_store(&q_scheduled, 0);
    fp_log_deliver();   /* cffi reports what it raises; the interrupted code goes on */
    return 0;
}

static void log_cb(void *arg, enum ferry_log_level level, const char *tag, const char *msg)
{
    (void)arg;
    struct timeval tv;
    int expect = 0;
    gettimeofday(&tv, NULL);
    pthread_mutex_lock(&q_lock);
    if (q_len == LOG_QUEUE_MAX) {
        q_dropped++;
    } else {
        fp_log_line *l = &q_lines[(q_head + q_len) % LOG_QUEUE_MAX];
        l->level = (int)level;
        l->time = (double)tv.tv_sec + tv.tv_usec / 1e6;
        l->thread = (unsigned long)pthread_self();
        snprintf(l->tag, sizeof l->tag, "%s", tag);
        snprintf(l->msg, sizeof l->msg, "%s", msg);
        q_len++;
    }
    pthread_mutex_unlock(&q_lock);
    /* Py_AddPendingCall needs no GIL; a full interpreter queue: the next line retries */
    if (atomic_compare_exchange_strong(&q_scheduled, &expect, 1) && Py_AddPendingCall(deliver_pending, NULL) < 0)
        atomic_store(&q_scheduled, 0);
}

static void fork_prepare(void)
{
    pthread_mutex_lock(&q_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&q_lock);
}

static void fork_child(void)
{
    /* the child has one thread: the lock is reset; the queued lines are the parent's to deliver */
    pthread_mutex_init(&q_lock, NULL);
    q_head = q_len = 0;
    q_dropped = 0;
    atomic_store(&q_scheduled, 0);
}

int fp_log_install(void)
{
    if (!q_lines) {
        q_lines = calloc(LOG_QUEUE_MAX, sizeof *q_lines);
        if (!q_lines)
            return FERRY_ENOMEM;
        pthread_atfork(fork_prepare, fork_parent, fork_child);
    }
    ferry_log_set_callback(log_cb, NULL);
    return 0;
}

void fp_log_uninstall(void)
{
    ferry_log_set_callback(NULL, NULL);
}

size_t fp_log_take(fp_log_line *out, size_t max, unsigned long long *dropped)
{
    size_t n = 0;
    pthread_mutex_lock(&q_lock);
    while (n < max && q_len > 0) {
        out[n++] = q_lines[q_head];
        q_head = (q_head + 1) % LOG_QUEUE_MAX;
        q_len--;
    }
    *dropped = q_dropped;
    q_dropped = 0;
    pthread_mutex_unlock(&q_lock);
    return n;
}
