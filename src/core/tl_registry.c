/* Transports in preference order, and the loading of optional transports' libraries at first
 * use (see "libraries loaded at first use" in tl.h). A transport that is not built is not in
 * the list. */
#include "core/tl.h"

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const shoal_tl_ops_t *ops;
    shoal_tl_lib_t *lib;          /* loaded at first use, or NULL */
} shoal_tl_entry_t;

static const shoal_tl_entry_t shoal_tl_registry[] = {
    {.ops = &shoal_tl_shm_ops},
#if SHOAL_HAVE_VERBS
    /* ahead of tcp across hosts where its query() finds an ACTIVE RDMA port (run on
     * Soft-RoCE in tests/vm); elsewhere the query fails and tcp is chosen as before */
    {.ops = &shoal_tl_ib_ops, .lib = &shoal_ib_lib},
#endif
    {.ops = &shoal_tl_tcp_ops},
#if SHOAL_HAVE_UCX
    /* after tcp: used when forced with SHOAL_TRANSPORT=ucx */
    {.ops = &shoal_tl_ucx_ops, .lib = &shoal_ucx_lib},
#endif
};

size_t shoal_tl_count(void)
{
    return SHOAL_ARRAY_SIZE(shoal_tl_registry);
}

const shoal_tl_ops_t *shoal_tl_get(size_t i)
{
    return i < shoal_tl_count() ? shoal_tl_registry[i].ops : NULL;
}

shoal_tl_lib_t *shoal_tl_lib(size_t i)
{
    return i < shoal_tl_count() ? shoal_tl_registry[i].lib : NULL;
}

const shoal_tl_ops_t *shoal_tl_find(const char *name)
{
    for (size_t i = 0; i < shoal_tl_count(); i++) {
        if (strcmp(shoal_tl_registry[i].ops->name, name) == 0) {
            return shoal_tl_registry[i].ops;
        }
    }
    return NULL;
}

unsigned shoal_tl_query_mask(int forced)
{
    unsigned mask = 0;
    int reach_hosts = 0; /* a transport before this one can reach other hosts */

    for (size_t i = 0; i < shoal_tl_count(); i++) {
        const shoal_tl_entry_t *e = &shoal_tl_registry[i];
        if (e->lib != NULL && (int)i != forced && (forced >= 0 || reach_hosts)) {
            shoal_trace(INIT, "transport %s not queried: its library is loaded only when "
                        "SHOAL_TRANSPORT=%s or no other transport reaches other hosts",
                        e->ops->name, e->ops->name);
            continue;
        }
        if (e->lib != NULL && (int)i != forced && e->lib->present != NULL &&
            !e->lib->present()) {
            shoal_trace(INIT, "transport %s not queried: no device here for %s", e->ops->name,
                        e->lib->what);
            continue;
        }
        if (e->ops->query()) {
            mask |= 1u << i;
            reach_hosts |= !e->ops->intra_node_only;
        } else if ((int)i == forced) {
            int nolib = e->lib != NULL && e->lib->status != SHOAL_OK;
            shoal_error(INIT, "SHOAL_TRANSPORT=%s, but the transport is not usable here%s%s",
                        e->ops->name, nolib ? ": " : " (its query says it cannot run on this machine)",
                        nolib ? e->lib->why : "");
        }
    }
    return mask;
}

/* ---- libraries loaded at first use ------------------------------------------------------- */

static const struct {
    int sig;
    const char *name;
} shoal_tl_lib_signals[] = {
    {.sig = SIGSEGV, .name = "SEGV"},
    {.sig = SIGBUS, .name = "BUS"},
    {.sig = SIGILL, .name = "ILL"},
    {.sig = SIGFPE, .name = "FPE"},
};
#define SHOAL_TL_LIB_NSIG SHOAL_ARRAY_SIZE(shoal_tl_lib_signals)

/* Puts back the handlers of fatal signals that the library's constructors replaced (UCX's
 * report a crash anywhere in the application as its own). */
static void shoal_tl_lib_restore_signals(shoal_tl_lib_t *lib, const struct sigaction *saved)
{
    char changed[64] = "";
    int keep = lib->keep_signals_env != NULL && shoal_cfg_getenv_raw(lib->keep_signals_env) != NULL;

    for (size_t i = 0; i < SHOAL_TL_LIB_NSIG; i++) {
        struct sigaction now;
        if (sigaction(shoal_tl_lib_signals[i].sig, NULL, &now) != 0 ||
            (now.sa_handler == saved[i].sa_handler && now.sa_flags == saved[i].sa_flags)) {
            continue;
        }
        snprintf(changed + strlen(changed), sizeof(changed) - strlen(changed), " SIG%s",
                 shoal_tl_lib_signals[i].name);
        if (!keep) {
            sigaction(shoal_tl_lib_signals[i].sig, &saved[i], NULL);
        }
    }
    if (changed[0] != '\0') {
        shoal_info(INIT, "%s installed handlers of%s: %s%s%s", lib->what, changed,
                   keep ? "kept, as " : "the application's restored",
                   keep ? lib->keep_signals_env : "", keep ? " is set" : "");
    }
}

static void *shoal_tl_lib_open(shoal_tl_lib_t *lib, char *path, size_t len)
{
    const char *name = *lib->path_p;
    void *h;

    if (name == NULL || name[0] == '\0') {
        name = lib->dflt;
    }
    snprintf(path, len, "%s", name);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL && strchr(name, '/') == NULL && lib->fallback_dir[0] != '\0') {
        snprintf(path, len, "%s/%s", lib->fallback_dir, name);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (h == NULL) {
        snprintf(lib->why, sizeof(lib->why), "cannot load %s: %s", name, dlerror());
    }
    return h;
}

static shoal_status_t shoal_tl_lib_load_locked(shoal_tl_lib_t *lib)
{
    struct sigaction saved[SHOAL_TL_LIB_NSIG];
    struct link_map *lm = NULL;
    char path[400];

    for (size_t i = 0; i < SHOAL_TL_LIB_NSIG; i++) {
        sigaction(shoal_tl_lib_signals[i].sig, NULL, &saved[i]);
    }
    lib->handle = shoal_tl_lib_open(lib, path, sizeof(path));
    if (lib->handle == NULL) {
        return SHOAL_ERR_UNSUPPORTED;
    }
    shoal_tl_lib_restore_signals(lib, saved);
    for (size_t i = 0; i < lib->nsyms; i++) {
        *lib->syms[i].slot = dlsym(lib->handle, lib->syms[i].name);
        if (*lib->syms[i].slot == NULL) {
            snprintf(lib->why, sizeof(lib->why), "%s (%s) lacks %s: too old?", path, lib->what,
                     lib->syms[i].name);
            for (size_t k = 0; k <= i; k++) {
                *lib->syms[k].slot = NULL;
            }
            /* never dlclose: its destructors might undo what the restore above put back */
            return SHOAL_ERR_UNSUPPORTED;
        }
    }
    if (dlinfo(lib->handle, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_name != NULL &&
        lm->l_name[0] != '\0') {
        snprintf(path, sizeof(path), "%s", lm->l_name);
    }
    snprintf(lib->why, sizeof(lib->why), "loaded from %s", path);
    return SHOAL_OK;
}

shoal_status_t shoal_tl_lib_load(shoal_tl_lib_t *lib)
{
    shoal_status_t st;

    shoal_config_global_init(); /* the library's path is a config value */
    pthread_mutex_lock(&lib->lock);
    if (!lib->tried) {
        lib->tried = 1;
        lib->status = shoal_tl_lib_load_locked(lib);
        if (lib->status == SHOAL_OK) {
            shoal_info(INIT, "%s %s", lib->what, lib->why);
        } else {
            shoal_info(INIT, "%s unavailable: %s", lib->what, lib->why);
        }
    }
    st = lib->status;
    pthread_mutex_unlock(&lib->lock);
    return st;
}
