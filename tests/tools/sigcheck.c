/* A rank that checks what loading and using libshoal did to the process (run by
 * test_plugin_load.sh under shoalrun): which optional libraries are mapped, and whether the
 * fatal-signal and SIGHUP handlers are still the application's own. Linked against
 * libshoal.so like any application. Prints one line per rank:
 *   sigcheck rank R: ucs=N ucp=N uct=N ibverbs=N handlers=same|CHANGED(...) ucs_handler=N
 * and exits 0 when the init and an AllReduce of 1024 floats worked and were correct. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <shoal.h>

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#define SIGCHECK_N 1024

/* SIGHUP: UCX's debug signal, its handler kept the process alive after a hang-up */
static const int sigcheck_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGHUP};
#define SIGCHECK_NSIG (sizeof(sigcheck_signals) / sizeof(sigcheck_signals[0]))

static int sigcheck_mapped(const char *lib)
{
    char line[4096];
    int found = 0;
    FILE *fp = fopen("/proc/self/maps", "r");

    if (fp == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        const char *slash = strrchr(line, '/');
        if (slash != NULL && strncmp(slash + 1, lib, strlen(lib)) == 0 &&
            slash[1 + strlen(lib)] == '.') {
            found = 1;
        }
    }
    fclose(fp);
    return found;
}

static void *sigcheck_handler(int sig)
{
    struct sigaction sa;

    if (sigaction(sig, NULL, &sa) != 0) {
        return (void *)-1;
    }
    return (sa.sa_flags & SA_SIGINFO) != 0 ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
}

/* 1 if the handler's code lies in libucs (UCX's error handler). */
static int sigcheck_in_ucs(void *fn)
{
    Dl_info info;

    if (fn == (void *)SIG_DFL || fn == (void *)SIG_IGN || dladdr(fn, &info) == 0 ||
        info.dli_fname == NULL) {
        return 0;
    }
    return strstr(info.dli_fname, "libucs") != NULL;
}

int main(void)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t comm = NULL;
    void *before[SIGCHECK_NSIG];
    char changed[256] = "";
    float data[SIGCHECK_N];
    int rank = -1, nranks = 0, wrong = 0, ucs_handler = 0;
    shoal_status_t st;

    /* What the process had when main started (constructors of loaded libraries have run):
     * without a sanitizer that is SIG_DFL, as the application installed nothing. */
    for (size_t i = 0; i < SIGCHECK_NSIG; i++) {
        before[i] = sigcheck_handler(sigcheck_signals[i]);
#if !defined(__SANITIZE_ADDRESS__)
        if (before[i] != (void *)SIG_DFL) {
            snprintf(changed + strlen(changed), sizeof(changed) - strlen(changed), "%s%s at start",
                     changed[0] != '\0' ? "," : "", strsignal(sigcheck_signals[i]));
        }
#endif
    }
    st = shoal_comm_init_env(&comm, &cfg);
    if (st != SHOAL_OK) {
        fprintf(stderr, "sigcheck: shoal_comm_init_env: %s\n", shoal_strerror(st));
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);
    for (int i = 0; i < SIGCHECK_N; i++) {
        data[i] = (float)(rank + i % 5);
    }
    st = shoal_allreduce(data, data, SIGCHECK_N, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
    if (st != SHOAL_OK) {
        fprintf(stderr, "sigcheck: rank %d: shoal_allreduce: %s (%s)\n", rank, shoal_strerror(st),
                shoal_comm_last_error(comm) != NULL ? shoal_comm_last_error(comm) : "");
        shoal_comm_abort(comm);
        shoal_comm_destroy(comm);
        return 1;
    }
    for (int i = 0; i < SIGCHECK_N; i++) {
        wrong += data[i] != (float)(nranks * (nranks - 1) / 2 + nranks * (i % 5));
    }
    for (size_t i = 0; i < SIGCHECK_NSIG; i++) {
        void *now = sigcheck_handler(sigcheck_signals[i]);
        ucs_handler |= sigcheck_in_ucs(before[i]) | sigcheck_in_ucs(now);
        if (now != before[i]) {
            snprintf(changed + strlen(changed), sizeof(changed) - strlen(changed), "%s%s",
                     changed[0] != '\0' ? "," : "", strsignal(sigcheck_signals[i]));
        }
    }
    printf("sigcheck rank %d: ucs=%d ucp=%d uct=%d ibverbs=%d handlers=%s%s%s ucs_handler=%d "
           "allreduce=%s\n",
           rank, sigcheck_mapped("libucs"), sigcheck_mapped("libucp"), sigcheck_mapped("libuct"),
           sigcheck_mapped("libibverbs"), changed[0] != '\0' ? "CHANGED(" : "same",
           changed, changed[0] != '\0' ? ")" : "", ucs_handler, wrong == 0 ? "correct" : "WRONG");
    fflush(stdout);
    shoal_comm_destroy(comm);
    return wrong == 0 ? 0 : 1;
}
