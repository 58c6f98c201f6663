/*
 * The CUDA layer where CUDA cannot run (this test's home: build machines without a GPU or
 * driver): libshoal is built with CUDA, yet host collectives work, no CUDA library is loaded
 * for them, a stream or the stub driver gives SHOAL_ERR_UNSUPPORTED with a reason, groups of
 * host calls work. Two ranks (fork). On a machine with a working GPU the driver-absence
 * checks are skipped; the rest still runs.
 */
#include "cuda/cuda_int.h"
#include "tests/tap.h"

#include <dlfcn.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STUB_LIBCUDA "/usr/local/cuda/lib64/stubs/libcuda.so"

/* Child mode "stub": the toolkit's stub driver loads but cuInit fails. Exit 0 if handled:
 * the function table is cleared too (its pointers pointed into the closed library). */
static int stub_mode(void)
{
    static const shoal_cuda_drv_t zero;
    shoal_status_t st = shoal_cuda_drv_load();
    const char *why = shoal_cuda_drv_reason();
    int cleared = memcmp(&shoal_cuda_drv, &zero, sizeof(zero)) == 0;
    printf("# stub driver: %s (%s), table %s\n", shoal_status_name(st), why,
           cleared ? "cleared" : "still set");
    return st == SHOAL_ERR_UNSUPPORTED && strstr(why, "cuInit failed") != NULL && cleared ? 0
                                                                                            : 1;
}

/* Child mode "stubhost": the process has mapped the stub driver itself (as a framework
 * loads libcuda on a machine without a GPU) and runs host collectives only: they work, and
 * nothing is logged about CUDA, which the job never asked for (stderr is checked by the
 * parent). Exit 0 if the call worked. */
static int stubhost_mode(void)
{
    shoal_uid_t uid;
    shoal_comm_t comm;
    int32_t in[4] = {1, 2, 3, 4}, out[4] = {0};
    if (dlopen(STUB_LIBCUDA, RTLD_NOW) == NULL || shoal_get_unique_id(&uid) != SHOAL_OK ||
        shoal_comm_init(&comm, 1, 0, &uid, NULL) != SHOAL_OK) {
        return 1;
    }
    shoal_status_t st = shoal_allreduce(in, out, 4, SHOAL_INT32, SHOAL_SUM, comm, NULL);
    shoal_comm_destroy(comm);
    return st == SHOAL_OK && out[3] == 4 ? 0 : 1;
}

/* One rank: host AllReduce (plain, in a group, non-blocking), a stream call. Returns a bit
 * mask of failed checks. */
static int rank_body(int rank, const shoal_uid_t *uid, int driver_ok)
{
    shoal_comm_t comm;
    int32_t in[1000], out[1000];
    int bad = 0;
    shoal_request_t req;

    if (shoal_comm_init(&comm, 2, rank, uid, NULL) != SHOAL_OK) {
        return 1;
    }
    for (int i = 0; i < 1000; i++) {
        in[i] = i + rank;
    }
    bad |= (shoal_allreduce(in, out, 1000, SHOAL_INT32, SHOAL_SUM, comm, NULL) != SHOAL_OK) << 1;
    for (int i = 0; i < 1000; i++) {
        bad |= (out[i] != 2 * i + 1) << 2;
    }
    bad |= (shoal_group_start() != SHOAL_OK) << 3;
    bad |= (shoal_allreduce(in, out, 1000, SHOAL_INT32, SHOAL_MAX, comm, NULL) != SHOAL_OK) << 3;
    bad |= (shoal_group_end() != SHOAL_OK) << 3;
    bad |= (out[10] != 11) << 3;
    bad |= (shoal_iallreduce(in, out, 1000, SHOAL_INT32, SHOAL_MIN, comm, &req) != SHOAL_OK ||
            shoal_wait(&req) != SHOAL_OK || out[10] != 10) << 4;
    if (!driver_ok) {
        bad |= (shoal_allreduce(in, out, 1000, SHOAL_INT32, SHOAL_SUM, comm, (void *)1) !=
                SHOAL_ERR_UNSUPPORTED) << 5;
        bad |= (shoal_barrier(comm, (void *)1) != SHOAL_ERR_UNSUPPORTED) << 5;
        /* the communicator is still fine for host calls */
        bad |= (shoal_allreduce(in, out, 1000, SHOAL_INT32, SHOAL_SUM, comm, NULL) != SHOAL_OK ||
                out[999] != 1999) << 6;
    }
    bad |= (shoal_comm_destroy(comm) != SHOAL_OK) << 7;
    return bad;
}

int main(int argc, char **argv)
{
    shoal_uid_t uid;
    pid_t pid;
    int status = 0, bad0, driver_ok;
    const unsigned char *fb = shoal_cuda_fatbin;

    if (argc > 1 && strcmp(argv[1], "stub") == 0) {
        return stub_mode();
    }
    if (argc > 1 && strcmp(argv[1], "stubhost") == 0) {
        return stubhost_mode();
    }
    tap_ok(shoal_cuda_fatbin_size > 4096 && fb[0] == 0x50 && fb[1] == 0xed && fb[2] == 0x55 &&
               fb[3] == 0xba, "the kernels' fatbin is embedded (%zu bytes, fatbin magic)",
           shoal_cuda_fatbin_size);
    tap_ok(!shoal_cuda_drv_present(), "no CUDA library is loaded before a device call");
    driver_ok = shoal_cuda_drv_load() == SHOAL_OK;
    tap_diag("CUDA driver: %s", shoal_cuda_drv_reason());

    /* Fork before the unique id exists: its root thread must not be running at fork time
     * (a child of a threaded process may inherit a lock held by another thread, e.g. the
     * sanitizer allocator's). The child gets the id through a pipe. */
    int fds[2];
    if (pipe(fds) != 0) {
        tap_bail("pipe: %s", strerror(errno));
    }
    pid = fork();
    if (pid == 0) {
        alarm(120);
        close(fds[1]);
        if (read(fds[0], &uid, sizeof(uid)) != (ssize_t)sizeof(uid)) {
            _exit(99);
        }
        _exit(rank_body(1, &uid, driver_ok));
    }
    close(fds[0]);
    alarm(150);
    tap_ok(shoal_get_unique_id(&uid) == SHOAL_OK, "unique id");
    if (write(fds[1], &uid, sizeof(uid)) != (ssize_t)sizeof(uid)) {
        tap_bail("write: %s", strerror(errno));
    }
    close(fds[1]);
    bad0 = rank_body(0, &uid, driver_ok);
    waitpid(pid, &status, 0);
    tap_is_int(bad0, 0, "rank 0: host collectives, group of host calls, iallreduce");
    tap_ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1: the same (status %d)", status);
    if (driver_ok) {
        tap_skip(3, "a CUDA driver works here (the GPU tests cover it)");
    } else {
        tap_ok((bad0 & (3 << 5)) == 0, "a stream without a driver is SHOAL_ERR_UNSUPPORTED and "
               "host calls still work after it");
        if (access(STUB_LIBCUDA, R_OK) == 0) {
            char cmd[4200];
            snprintf(cmd, sizeof(cmd), "SHOAL_CUDA_LIBCUDA=%s /proc/%d/exe stub", STUB_LIBCUDA,
                     (int)getpid());
            tap_is_int(system(cmd), 0, "the stub driver (cuInit fails): unsupported, reason "
                       "given, function table cleared");
            char log[64] = "/tmp/test_cuda_nodriver.XXXXXX", line[512];
            int fd = mkstemp(log), quiet = 1;
            snprintf(cmd, sizeof(cmd), "SHOAL_CUDA_LIBCUDA=%s /proc/%d/exe stubhost 2>%s",
                     STUB_LIBCUDA, (int)getpid(), log);
            int rc = fd >= 0 ? system(cmd) : -1;
            FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
            while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
                quiet &= strstr(line, "[CUDA]") == NULL;
                if (strstr(line, "[CUDA]") != NULL) {
                    tap_diag("stubhost: %s", line);
                }
            }
            if (f != NULL) {
                fclose(f);
            }
            unlink(log);
            tap_ok(rc == 0 && quiet, "host calls where the process mapped a driver that cannot "
                   "run: they work and log nothing about CUDA (exit %d)", rc);
        } else {
            tap_skip(2, "no stub libcuda at " STUB_LIBCUDA);
        }
    }
    tap_is_int(shoal_group_end(), SHOAL_ERR_INVALID_ARG, "shoal_group_end without a start");
    return tap_done();
}
