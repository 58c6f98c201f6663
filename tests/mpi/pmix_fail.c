/* LD_PRELOAD'ed into rank 0 by tests/mpi/test_mpirun.sh: a PMIx_Put that fails, as one does
 * where the PMIx server cannot take the data (shoal's rank 0 puts the unique id it publishes).
 * PMIXFAIL_LINGER_S=N: PMIx_Finalize first waits up to N seconds for the file
 * PMIXFAIL_LINGER_UNTIL, so that the rank stays connected to its PMIx server as a program that
 * goes on after the failed init would (a process that ends is reported to the others by the
 * server, which ends their fence at once). */
#include <pmix.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

pmix_status_t PMIx_Put(pmix_scope_t scope, const char key[], pmix_value_t *val)
{
    (void)scope;
    (void)key;
    (void)val;
    return PMIX_ERR_OUT_OF_RESOURCE;
}

pmix_status_t PMIx_Finalize(const pmix_info_t info[], size_t ninfo)
{
    pmix_status_t (*real)(const pmix_info_t[], size_t) =
        (pmix_status_t(*)(const pmix_info_t[], size_t))dlsym(RTLD_NEXT, "PMIx_Finalize");
    const char *s = getenv("PMIXFAIL_LINGER_S"), *until = getenv("PMIXFAIL_LINGER_UNTIL");
    int i, n = s != NULL ? atoi(s) * 10 : 0;

    for (i = 0; i < n && (until == NULL || access(until, F_OK) != 0); i++)
        usleep(100000);
    return real != NULL ? real(info, ninfo) : PMIX_ERR_NOT_SUPPORTED;
}
