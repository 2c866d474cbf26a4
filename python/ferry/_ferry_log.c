/* _ferry: the library's log lines into Python's logging.
 *
 * Lines come from any thread, library threads included, often while the
 * thread holding the GIL waits on them (a call that closes a store joins
 * the thread that logs). So the callback never takes the GIL: it appends
 * the line to a bounded queue under a plain mutex and asks the interpreter
 * (Py_AddPendingCall) to run the flush on the main thread at its next
 * bytecode; the flush hands the lines to ferry._log.emit, which makes the
 * logging records. A flush also runs on log_flush() and at exit. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/time.h>

#include "_ferry.h"

#define LOG_QUEUE_MAX 4096   /* lines kept while Python is busy; more are counted and dropped */
#define LOG_TAG_MAX 32
#define LOG_MSG_MAX 2048

typedef struct {
    int level;
    double time;                 /* seconds since the epoch, when logged */
    unsigned long thread;        /* pthread_self() of the logging thread */
    char tag[LOG_TAG_MAX];
    char msg[LOG_MSG_MAX];
} log_line;

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static log_line *q_lines;        /* ring of LOG_QUEUE_MAX */
static size_t q_head, q_len;
static unsigned long long q_dropped;
static atomic_int q_scheduled;   /* a pending call is queued */
static PyObject *emit_fn;        /* ferry._log.emit; GIL-protected */

static int flush_pending(void *arg);

static void schedule_flush(void)
{
    int expect = 0;
    if (atomic_compare_exchange_strong(&q_scheduled, &expect, 1) && Py_AddPendingCall(flush_pending, NULL) < 0)
        atomic_store(&q_scheduled, 0);   /* the interpreter's queue is full: the next line retries */
}

static void log_cb(void *arg, enum ferry_log_level level, const char *tag, const char *msg)
{
    (void)arg;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    pthread_mutex_lock(&q_lock);
    if (!q_lines || q_len == LOG_QUEUE_MAX) {
        q_dropped++;
    } else {
        log_line *l = &q_lines[(q_head + q_len) % LOG_QUEUE_MAX];
        l->level = (int)level;
        l->time = (double)tv.tv_sec + tv.tv_usec / 1e6;
        l->thread = (unsigned long)pthread_self();
        snprintf(l->tag, sizeof l->tag, "%s", tag);
        snprintf(l->msg, sizeof l->msg, "%s", msg);
        q_len++;
    }
    pthread_mutex_unlock(&q_lock);
    schedule_flush();
}

/* Hand every queued line to emit_fn as [(level, tag, msg, time, thread)],
 * plus a note of the dropped ones. Needs the GIL. 0 or -1. */
static int flush_now(void)
{
    atomic_store(&q_scheduled, 0);
    for (;;) {
        log_line batch[16];
        size_t n = 0;
        unsigned long long dropped;
        pthread_mutex_lock(&q_lock);
        while (n < 16 && q_len > 0) {
            batch[n++] = q_lines[q_head];
            q_head = (q_head + 1) % LOG_QUEUE_MAX;
            q_len--;
        }
        dropped = q_dropped;
        q_dropped = 0;
        pthread_mutex_unlock(&q_lock);
        if (n == 0 && dropped == 0)
            return 0;
        if (!emit_fn)
            continue;   /* not installed: lines are discarded */
        PyObject *l = PyList_New(0);
        for (size_t i = 0; l && i < n; i++) {
            PyObject *t = Py_BuildValue("(iNNdk)", batch[i].level, fp_str_of(batch[i].tag), fp_str_of(batch[i].msg),
                                        batch[i].time, batch[i].thread);
            if (!t || PyList_Append(l, t) < 0)
                Py_CLEAR(l);
            Py_XDECREF(t);
        }
        if (l && dropped) {
            char msg[128];
            snprintf(msg, sizeof msg, "%llu log lines were dropped: Python did not take them fast enough",
                     dropped);
            PyObject *t = Py_BuildValue("(issdk)", (int)FERRY_LOG_WARN, "log", msg, 0.0, 0UL);
            if (!t || PyList_Append(l, t) < 0)
                Py_CLEAR(l);
            Py_XDECREF(t);
        }
        if (!l)
            return -1;
        PyObject *r = PyObject_CallOneArg(emit_fn, l);
        Py_DECREF(l);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
}

static int flush_pending(void *arg)
{
    (void)arg;
    if (flush_now() < 0)
        PyErr_WriteUnraisable(NULL);   /* a failing handler must not break the code it interrupted */
    return 0;
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
    /* the child has one thread: the lock is reset; the queued lines are the
     * parent's to deliver */
    pthread_mutex_init(&q_lock, NULL);
    q_head = q_len = 0;
    q_dropped = 0;
    atomic_store(&q_scheduled, 0);
}

/* _log_install(emit): lines go to emit from now on. */
static PyObject *log_install(PyObject *self, PyObject *emit)
{
    (void)self;
    if (!PyCallable_Check(emit)) {
        PyErr_SetString(PyExc_TypeError, "_log_install: emit must be callable");
        return NULL;
    }
    static int forked_handlers;
    if (!q_lines) {
        q_lines = PyMem_RawCalloc(LOG_QUEUE_MAX, sizeof *q_lines);
        if (!q_lines)
            return PyErr_NoMemory();
    }
    if (!forked_handlers) {
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        forked_handlers = 1;
    }
    Py_XSETREF(emit_fn, Py_NewRef(emit));
    ferry_log_set_callback(log_cb, NULL);
    Py_RETURN_NONE;
}

/* _log_uninstall(): flush, then lines go to stderr again (at exit). */
static PyObject *log_uninstall(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    ferry_log_set_callback(NULL, NULL);
    int rc = flush_now();
    Py_CLEAR(emit_fn);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *log_flush(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    if (flush_now() < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *log_set_level(PyObject *self, PyObject *arg)
{
    (void)self;
    long l = PyLong_AsLong(arg);
    if (l == -1 && PyErr_Occurred())
        return NULL;
    if (l < FERRY_LOG_DEBUG || l > FERRY_LOG_OFF) {
        PyErr_Format(PyExc_ValueError, "log level %ld is not in %d..%d", l, FERRY_LOG_DEBUG, FERRY_LOG_OFF);
        return NULL;
    }
    ferry_log_set_level((enum ferry_log_level)l);
    Py_RETURN_NONE;
}

static PyObject *log_get_level(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(ferry_log_get_level());
}

static PyMethodDef log_functions[] = {
    {"_log_install", (PyCFunction)log_install, METH_O, "_log_install($module, emit, /)\n--\n\n"
     "_log_install(emit): send the library's log lines to emit"},
    {"_log_uninstall", (PyCFunction)log_uninstall, METH_NOARGS, "_log_uninstall($module, /)\n--\n\n"
     "_log_uninstall(): log to stderr again"},
    {"log_flush", (PyCFunction)log_flush, METH_NOARGS, "log_flush($module, /)\n--\n\n"
     "log_flush(): deliver the queued log lines now"},
    {"_log_set_level", (PyCFunction)log_set_level, METH_O, "_log_set_level($module, n, /)\n--\n\n"
     "_log_set_level(n): the library's threshold (0..4)"},
    {"_log_get_level", (PyCFunction)log_get_level, METH_NOARGS, "_log_get_level($module, /)\n--\n\n"
     "_log_get_level() -> the threshold (0..4)"},
    {NULL, NULL, 0, NULL},
};

int fp_log_init(PyObject *m)
{
    return PyModule_AddFunctions(m, log_functions);
}
