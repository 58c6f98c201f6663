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

int shoal_child_run(char *const argv[], const char *dir, int quiet, int timeout_ms,
                    volatile sig_atomic_t *pid_p, char *why, size_t whylen)
{
    uint64_t deadline = shoal_deadline_ns(timeout_ms);
    pid_t pid;
    int wst = 0;

    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork failed: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);

        if (null >= 0) {
            dup2(null, STDOUT_FILENO);
            if (quiet)
                dup2(null, STDERR_FILENO);
        }
        if (dir == NULL || chdir(dir) == 0)
            execvp(argv[0], argv);
        _exit(127);
    }
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
    if (wst == -1)
        return -1;
    if (WIFEXITED(wst) && WEXITSTATUS(wst) == 127) {
        snprintf(why, whylen, "cannot run %s (not installed?)", argv[0]);
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
