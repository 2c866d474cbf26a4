/* UCX loaded at run time (ucx_sym.h). */
#define FR_UCX_SYM_IMPL
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/transport/ucx_sym.h"

fr_ucx_api fr_ucx;

static int load_rc;
static char load_why[300];   /* why it failed, for every later caller too */

static void load(void)
{
    /* RTLD_LOCAL: UCX's names stay out of the process's global scope, where
     * they could meet another copy of UCX (a framework that links its own). */
    const char *lib = getenv("FERRY_UCX_LIBRARY");
    if (!lib || !*lib)
        lib = FR_UCX_LIBRARY;
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_why, sizeof load_why, "cannot load %s, which the ucx transport needs (install UCX: "
                 "libucx0): %s", lib, dlerror());
        load_rc = FERRY_ENOTSUP;
        return;
    }
    fr_ucx_api api;
    /* dlsym on the handle searches libucp and what it depends on (libucs). */
#define FR_UCX_RESOLVE(f)                                                                   \
    {                                                                                       \
        void *sym = dlsym(h, #f);                                                           \
        if (!sym) {                                                                         \
            snprintf(load_why, sizeof load_why, "%s has no %s (a UCX older than this build's)", \
                     lib, #f);                                                              \
            load_rc = FERRY_ENOTSUP;                                                        \
            return;                                                                         \
        }                                                                                   \
        memcpy(&api.f, &sym, sizeof sym); /* ISO C has no cast from void * to a function */ \
    }
    FR_UCX_FUNCS(FR_UCX_RESOLVE)
#undef FR_UCX_RESOLVE
    fr_ucx = api;
    FR_DEBUG("ucx", "loaded %s", lib);
}

int fr_ucx_load(ferry_error *err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, load);
    return load_rc < 0 ? fr_fail(err, load_rc, "%s", load_why) : 0;
}
