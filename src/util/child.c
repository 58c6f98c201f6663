/* A helper program run by a tool (gnuplot for shoal-bill's and the placement simulator's
 * plots): fork and exec, never a shell (a quote in a user's directory name must not become a
 * command), and waited for under a deadline, as every wait. */
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* What the child could not do before the program ran: which step, and its errno. Sent over a
 * pipe closed on exec, so that the parent tells a directory it could not enter from a program
 * it could not run (both were exit status 127: "not installed?" for a missing directory). */
typedef struct {
    int step; /* 1: chdir, 2: exec */
    int err;
} shoal_child_fail_t;

static void shoal_child_exec(char *const argv[], const char *dir, int quiet, int fd)
{
    shoal_child_fail_t f = {.step = 1};
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC); /* dup2 clears it on 1 and 2 */

    if (null >= 0) {
        dup2(null, STDOUT_FILENO);
        if (quiet)
            dup2(null, STDERR_FILENO);
    }
    if (dir == NULL || chdir(dir) == 0) {
        execvp(argv[0], argv);
        f.step = 2;
    }
    f.err = errno;
    (void)!write(fd, &f, sizeof(f));
    _exit(127);
}

int shoal_child_run(char *const argv[], const char *dir, int quiet, int timeout_ms,
                    volatile sig_atomic_t *pid_p, char *why, size_t whylen)
{
    uint64_t deadline = shoal_deadline_ns(timeout_ms);
    shoal_child_fail_t f = {0};
    pid_t pid;
    int wst = 0, pfd[2];

    /* O_NONBLOCK: the read below, after the child's exit, must not wait for a copy of the
     * write end that another fork (without exec) of this process may hold */
    if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(why, whylen, "pipe failed: %s", strerror(errno));
        return -1;
    }
    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork failed: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        close(pfd[0]);
        shoal_child_exec(argv, dir, quiet, pfd[1]);
    }
    close(pfd[1]);
    if (pid_p != NULL)
        *pid_p = pid;
    for (;;) {
        pid_t r = waitpid(pid, &wst, WNOHANG);

        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            snprintf(why, whylen, "waitpid(%s) failed: %s", argv[0], strerror(errno));
            wst = -1;
            break;
        }
        if (shoal_deadline_passed(deadline)) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            snprintf(why, whylen, "%s did not finish in %g s; killed", argv[0],
                     timeout_ms / 1000.0);
            wst = -1;
            break;
        }
        shoal_sleep_us(10000);
    }
    if (pid_p != NULL)
        *pid_p = 0;
    /* The child has exited: the pipe holds its failure, or is at its end (the exec closed it). */
    if (wst != -1 && read(pfd[0], &f, sizeof(f)) != (ssize_t)sizeof(f))
        f.step = 0;
    close(pfd[0]);
    if (wst == -1)
        return -1;
    if (f.step == 1) {
        snprintf(why, whylen, "cannot run %s in %s: %s", argv[0], dir, strerror(f.err));
        return -1;
    }
    if (f.step == 2) {
        snprintf(why, whylen, "cannot run %s: %s%s", argv[0], strerror(f.err),
                 f.err == ENOENT ? " (not installed?)" : "");
        return -1;
    }
    if (WIFEXITED(wst) && WEXITSTATUS(wst) != 0) {
        snprintf(why, whylen, "%s failed (exit status %d)", argv[0], WEXITSTATUS(wst));
        return -1;
    }
    if (WIFSIGNALED(wst)) {
        snprintf(why, whylen, "%s died of signal %d", argv[0], WTERMSIG(wst));
        return -1;
    }
    return 0;
}
