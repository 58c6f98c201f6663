/* Transports in preference order, and the loading of optional transports' libraries at first
 * use (see "libraries loaded at first use" in tl.h). A transport that is not built is not in
 * the list. */
#include "core/core.h"
#include "core/tl.h"

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* Across hosts: ib, then ucx, then tcp, each gated by its query (issue 14). ib's query needs
 * an ACTIVE RDMA port (run on Soft-RoCE in tests/vm); ucx's a device with an ACTIVE port in
 * sysfs before it loads libucp, then an RDMA transport among UCX's own resources (ucx over
 * tcp only is slower than shoal's tcp, which is then chosen). Where the query of one says yes,
 * the ones after it are not queried: their libraries are not loaded. */
static const shoal_tl_entry_t shoal_tl_registry[] = {
    {.ops = &shoal_tl_shm_ops},
#if SHOAL_HAVE_VERBS
    {.ops = &shoal_tl_ib_ops, .lib = &shoal_ib_lib},
#endif
#if SHOAL_HAVE_UCX
    {.ops = &shoal_tl_ucx_ops, .lib = &shoal_ucx_lib},
#endif
    {.ops = &shoal_tl_tcp_ops},
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

/* Appends "; NAME: WHAT" (the first one without "; ") to why. */
static void shoal_tl_why_add(char *why, size_t len, const char *name, const char *what,
                             const char *note)
{
    size_t used;
    if (why == NULL || len == 0) {
        return;
    }
    used = strlen(why);
    if (used + 1 < len) {
        snprintf(why + used, len - used, "%s%s: %s%s%s", used > 0 ? "; " : "", name, what,
                 note != NULL && note[0] != '\0' ? ": " : "", note != NULL ? note : "");
    }
}

/* The lib's note, copied under its lock (present() and auto_ok() write it under the lock, and
 * communicators may be created in several threads at once). */
static const char *shoal_tl_note(shoal_tl_lib_t *lib, char *buf, size_t len)
{
    buf[0] = '\0';
    if (lib != NULL) {
        pthread_mutex_lock(&lib->lock);
        snprintf(buf, len, "%s", lib->note);
        pthread_mutex_unlock(&lib->lock);
    }
    return buf;
}

unsigned shoal_tl_query_table(const shoal_tl_entry_t *tab, size_t n, int forced,
                              unsigned exclude, int *across_p, char *why, size_t len)
{
    unsigned mask = 0;
    int across = -1; /* the first usable transport that reaches other hosts */
    char skipped[400] = "";

    for (size_t i = 0; i < n; i++) {
        const shoal_tl_entry_t *e = &tab[i];
        char note[sizeof(e->lib->note)];
        int ok;
        if ((exclude & (1u << i)) != 0) {
            if ((int)i == forced) {
                shoal_error(INIT, "SHOAL_TRANSPORT=%s, but SHOAL_TRANSPORT_EXCLUDE names it too",
                            e->ops->name);
            }
            shoal_trace(INIT, "transport %s not queried: SHOAL_TRANSPORT_EXCLUDE", e->ops->name);
            if (across < 0 && !e->ops->intra_node_only) {
                shoal_tl_why_add(skipped, sizeof(skipped), e->ops->name,
                                 "excluded (SHOAL_TRANSPORT_EXCLUDE)", NULL);
            }
            continue;
        }
        if (e->lib != NULL && (int)i != forced && (forced >= 0 || across >= 0)) {
            shoal_trace(INIT, "transport %s not queried: its library is loaded only when "
                        "SHOAL_TRANSPORT=%s or no transport before it reaches other hosts",
                        e->ops->name, e->ops->name);
            continue;
        }
        if (e->lib != NULL && (int)i != forced && e->lib->present != NULL &&
            !e->lib->present()) {
            shoal_tl_note(e->lib, note, sizeof(note));
            shoal_trace(INIT, "transport %s not queried: no device here for %s%s%s",
                        e->ops->name, e->lib->what, note[0] != '\0' ? ": " : "", note);
            shoal_tl_why_add(skipped, sizeof(skipped), e->ops->name, "no device", note);
            continue;
        }
        ok = e->ops->query();
        if (ok && e->lib != NULL && (int)i != forced && e->lib->auto_ok != NULL &&
            !e->lib->auto_ok()) {
            shoal_tl_note(e->lib, note, sizeof(note));
            shoal_trace(INIT, "transport %s not chosen without SHOAL_TRANSPORT=%s%s%s",
                        e->ops->name, e->ops->name, note[0] != '\0' ? ": " : "", note);
            if (across < 0 && !e->ops->intra_node_only) {
                shoal_tl_why_add(skipped, sizeof(skipped), e->ops->name, "only when forced",
                                 note);
            }
            continue;
        }
        shoal_tl_note(e->lib, note, sizeof(note));
        if (ok) {
            mask |= 1u << i;
            if (across < 0 && !e->ops->intra_node_only) {
                across = (int)i;
            }
        } else {
            if (across < 0 && !e->ops->intra_node_only) {
                shoal_tl_why_add(skipped, sizeof(skipped), e->ops->name,
                                 e->lib != NULL && e->lib->status != SHOAL_OK ? e->lib->why
                                                                              : "query says no",
                                 note);
            }
            if ((int)i == forced) {
                int nolib = e->lib != NULL && e->lib->status != SHOAL_OK;
                /* the query's reason, where it left one (ib: the port has no usable GID) */
                shoal_error(INIT, "SHOAL_TRANSPORT=%s, but the transport is not usable here%s%s"
                            "%s%s", e->ops->name,
                            nolib ? ": " : " (its query says it cannot run on this machine)",
                            nolib ? e->lib->why : "", !nolib && note[0] != '\0' ? ": " : "",
                            !nolib ? note : "");
            }
        }
    }
    if (across_p != NULL) {
        *across_p = across;
    }
    if (why != NULL && len > 0) {
        char anote[sizeof(tab[0].lib->note)];
        shoal_tl_note(across >= 0 ? tab[across].lib : NULL, anote, sizeof(anote));
        if (forced >= 0) {
            snprintf(why, len, "%s for every peer (SHOAL_TRANSPORT=%s)%s", tab[forced].ops->name,
                     tab[forced].ops->name, (mask & (1u << forced)) ? "" : ", not usable here");
        } else if (across < 0) {
            snprintf(why, len, "none usable (%s)", skipped[0] != '\0' ? skipped : "no transport");
        } else {
            snprintf(why, len, "%s (%s; %s%s)", tab[across].ops->name,
                     anote[0] != '\0' ? anote : "usable here",
                     skipped[0] != '\0' ? "not taken before it: " : "the first in order",
                     skipped);
        }
    }
    return mask;
}

unsigned shoal_tl_exclude_mask(void)
{
    const char *list = shoal_core_config.transport_exclude;
    unsigned mask = 0;
    char name[32];

    while (list != NULL && *list != '\0') {
        size_t k = strcspn(list, ", ");
        if (k > 0) {
            size_t i;
            snprintf(name, sizeof(name), "%.*s", (int)SHOAL_MIN(k, sizeof(name) - 1), list);
            for (i = 0; i < shoal_tl_count(); i++) {
                if (strcmp(shoal_tl_registry[i].ops->name, name) == 0) {
                    mask |= 1u << i;
                    break;
                }
            }
            if (i == shoal_tl_count()) {
                shoal_warn(INIT, "SHOAL_TRANSPORT_EXCLUDE: no transport %s in this build",
                           name);
            }
        }
        list += k + (list[k] != '\0');
    }
    return mask;
}

unsigned shoal_tl_query_mask_why(int forced, char *why, size_t len)
{
    return shoal_tl_query_table(shoal_tl_registry, shoal_tl_count(), forced,
                                shoal_tl_exclude_mask(), NULL, why, len);
}

unsigned shoal_tl_query_mask(int forced)
{
    char why[640];
    unsigned mask = shoal_tl_query_mask_why(forced, why, sizeof(why));
    shoal_info(INIT, "across hosts: %s", why);
    return mask;
}

/* ---- libraries loaded at first use ------------------------------------------------------- */

static const struct {
    int sig;
    const char *name;
    int hup; /* kept by keep_hup_env, not keep_signals_env */
} shoal_tl_lib_signals[] = {
    {.sig = SIGSEGV, .name = "SEGV"},
    {.sig = SIGBUS, .name = "BUS"},
    {.sig = SIGILL, .name = "ILL"},
    {.sig = SIGFPE, .name = "FPE"},
    /* UCX's debug signal (UCX_DEBUG_SIGNO, SIGHUP by default): its handler raises UCX's log
     * level instead of ending the process, so a job whose terminal or ssh session hung up
     * went on running */
    {.sig = SIGHUP, .name = "HUP", .hup = 1},
};
#define SHOAL_TL_LIB_NSIG SHOAL_ARRAY_SIZE(shoal_tl_lib_signals)

/* Puts back the handlers of fatal signals that the library's constructors replaced (UCX's
 * report a crash anywhere in the application as its own), and of SIGHUP. */
static void shoal_tl_lib_restore_signals(shoal_tl_lib_t *lib, const struct sigaction *saved)
{
    char changed[64] = "", kept[64] = "";
    int keep = lib->keep_signals_env != NULL && shoal_cfg_getenv_raw(lib->keep_signals_env) != NULL;
    int keep_hup = lib->keep_hup_env != NULL && shoal_cfg_getenv_raw(lib->keep_hup_env) != NULL;

    for (size_t i = 0; i < SHOAL_TL_LIB_NSIG; i++) {
        struct sigaction now;
        int k = shoal_tl_lib_signals[i].hup ? keep_hup : keep;
        char *list = k ? kept : changed;
        if (sigaction(shoal_tl_lib_signals[i].sig, NULL, &now) != 0 ||
            (now.sa_handler == saved[i].sa_handler && now.sa_flags == saved[i].sa_flags)) {
            continue;
        }
        snprintf(list + strlen(list), sizeof(changed) - strlen(list), " SIG%s",
                 shoal_tl_lib_signals[i].name);
        if (!k) {
            sigaction(shoal_tl_lib_signals[i].sig, &saved[i], NULL);
        }
    }
    if (changed[0] != '\0') {
        shoal_info(INIT, "%s installed handlers of%s: the application's restored", lib->what,
                   changed);
    }
    if (kept[0] != '\0') {
        shoal_info(INIT, "%s installed handlers of%s: kept, as %s is set", lib->what, kept,
                   keep && keep_hup ? "each of their variables"
                   : keep ? lib->keep_signals_env : lib->keep_hup_env);
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
