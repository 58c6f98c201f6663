/* libshoal unloaded after it used the ucx transport: it redirects UCX's log messages to its
 * own log with a handler on UCX's handler stack, and libucp stays loaded after libshoal's
 * dlclose (never dlclosed; another user of UCX in the process may hold it too). The handler
 * must be gone with libshoal: UCX's next message called it in unmapped code (SIGSEGV). Also:
 * communicators created and destroyed again do not stack more handlers. */
#include "tests/tap.h"

#include <dlfcn.h>
#include <shoal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

/* Under LeakSanitizer (--enable-sanitizers): libshoal's process-wide configuration, read once
 * (pthread_once, src/util/config.c), is not freed when libshoal is unloaded; LeakSanitizer
 * reports it at exit without symbols (the module is gone), under libc's __pthread_once_slow.
 * That is not what this test is about (UCX's log handler). */
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:__pthread_once_slow\n";
}

typedef shoal_status_t (*uid_fn_t)(shoal_uid_t *);
typedef shoal_status_t (*init_fn_t)(shoal_comm_t *, int, int, const shoal_uid_t *,
                                     const shoal_config_t *);
typedef shoal_status_t (*destroy_fn_t)(shoal_comm_t);
typedef unsigned (*num_fn_t)(void);

/* One single-rank communicator over ucx, created and destroyed. */
static shoal_status_t comm_cycle(void *h)
{
    uid_fn_t uid_fn = (uid_fn_t)dlsym(h, "shoal_get_unique_id");
    init_fn_t init_fn = (init_fn_t)dlsym(h, "shoal_comm_init");
    destroy_fn_t destroy_fn = (destroy_fn_t)dlsym(h, "shoal_comm_destroy");
    shoal_uid_t uid;
    shoal_comm_t comm;
    shoal_status_t st;

    if (uid_fn == NULL || init_fn == NULL || destroy_fn == NULL) {
        return SHOAL_ERR_INTERNAL;
    }
    st = uid_fn(&uid);
    if (st == SHOAL_OK) {
        st = init_fn(&comm, 1, 0, &uid, NULL);
    }
    if (st == SHOAL_OK) {
        st = destroy_fn(comm);
    }
    return st;
}

/* In a child (stdout, where UCX's own handler prints, to /dev/null): a UCX user of the process
 * makes UCX log a warning and an error (a transport that does not exist); 1 if it survived. */
static int ucx_logs_safely(void *ucp)
{
    __typeof__(ucp_config_read) *config_read =
        (__typeof__(ucp_config_read) *)dlsym(ucp, "ucp_config_read");
    __typeof__(ucp_init_version) *init_version =
        (__typeof__(ucp_init_version) *)dlsym(ucp, "ucp_init_version");
    int wst = 0;
    pid_t pid;

    if (config_read == NULL || init_version == NULL) {
        tap_diag("libucp lacks ucp_config_read or ucp_init_version");
        return 0;
    }
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
        ucp_config_t *cfg;
        ucp_context_h uctx;
        if (freopen("/dev/null", "w", stdout) == NULL) {
            _exit(3);
        }
        setenv("UCX_TLS", "nosuchtl", 1);
        if (config_read(NULL, NULL, &cfg) != UCS_OK) {
            _exit(2);
        }
        (void)init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &uctx);
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, &wst, 0) != pid) {
        return 0;
    }
    if (WIFSIGNALED(wst)) {
        tap_diag("the UCX user died of signal %d", WTERMSIG(wst));
    }
    return WIFEXITED(wst) && WEXITSTATUS(wst) == 0;
}

int main(void)
{
    const char *top = getenv("top_builddir");
    char path[4096];
    void *h, *ucs, *ucp;
    num_fn_t num;
    unsigned with_shoal, again;
    shoal_status_t st;

    snprintf(path, sizeof(path), "%s/.libs/libshoal.so", top != NULL ? top : ".");
    setenv("SHOAL_TRANSPORT", "ucx", 1);
    unsetenv("UCX_LOG_FILE"); /* set, libshoal leaves UCX's messages to UCX */
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        tap_skip_all("no shared libshoal to load");
    }
    tap_plan(5);
    st = comm_cycle(h);
    tap_is_int(st, SHOAL_OK, "a 1-rank communicator over ucx");
    ucs = dlopen("libucs.so.0", RTLD_NOW | RTLD_NOLOAD);
    ucp = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
    num = ucs != NULL ? (num_fn_t)dlsym(ucs, "ucs_log_num_handlers") : NULL;
    if (ucs == NULL || ucp == NULL || num == NULL) {
        tap_bail("libshoal did not load libucp/libucs (%s)", path);
    }
    with_shoal = num();
    st = comm_cycle(h);
    again = num();
    tap_ok(st == SHOAL_OK && again == with_shoal,
           "a second communicator: status %d, %u UCX log handlers (%u after the first)",
           (int)st, again, with_shoal);
    tap_is_int(dlclose(h), 0, "dlclose(libshoal)");
    tap_is_int(num(), with_shoal - 1, "libshoal's UCX log handler went with it");
    tap_ok(ucx_logs_safely(ucp), "UCX logs after libshoal's unload without calling into it");
    return tap_done();
}
