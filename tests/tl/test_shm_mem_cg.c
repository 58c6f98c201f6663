/* shoal_mem_alloc under a memory limit set on a cgroup above the process's own (a job's limit
 * is often on its slice or scope, "max" below it): more than the limit is SHOAL_ERR_NO_MEMORY,
 * as more than the host's memory is. Only the process's own cgroup was read, so the buffer's
 * pages were reserved until the OOM killer struck. Needs root and a writable memory cgroup
 * (v1, or v2 with the memory controller); skipped otherwise. */
#include "shoal.h"
#include "tests/tap.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CG_LIMIT (256u << 20)

/* Our memory cgroup's directory and its limit file's name; 0 if found. */
static int cg_own(char *dir, size_t len, const char **lim_f)
{
    char line[512];
    FILE *f = fopen("/proc/self/cgroup", "r");
    int found = 0;
    while (f != NULL && !found && fgets(line, sizeof(line), f) != NULL) {
        char *c = strchr(line, ':'), *cg = c != NULL ? strchr(c + 1, ':') : NULL;
        line[strcspn(line, "\n")] = '\0';
        if (cg == NULL) {
            continue;
        }
        if (strncmp(c, ":memory:", 8) == 0) {
            snprintf(dir, len, "/sys/fs/cgroup/memory%s", cg + 1);
            *lim_f = "memory.limit_in_bytes";
            found = 1;
        } else if (strncmp(line, "0::", 3) == 0) {
            snprintf(dir, len, "/sys/fs/cgroup%s", cg + 1);
            *lim_f = "memory.max";
            found = 1;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return found ? 0 : -1;
}

static int cg_write(const char *dir, const char *file, const char *text)
{
    char path[1024];
    FILE *f;
    int bad;
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    bad = fputs(text, f) == EOF;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

int main(void)
{
    char own[512], outer[600], inner[640], limit[32];
    const char *lim_f = NULL;
    int ws = 0;
    pid_t pid;

    tap_plan(1);
    if (cg_own(own, sizeof(own), &lim_f) != 0) {
        tap_skip(1, "no memory cgroup in /proc/self/cgroup");
        return tap_done();
    }
    snprintf(outer, sizeof(outer), "%s/shoal-test-%d", own, (int)getpid());
    snprintf(inner, sizeof(inner), "%s/job", outer);
    snprintf(limit, sizeof(limit), "%u", CG_LIMIT);
    if (mkdir(outer, 0755) != 0) {
        tap_skip(1, "cannot make a memory cgroup here");
        return tap_done();
    }
    if (cg_write(outer, lim_f, limit) != 0 || mkdir(inner, 0755) != 0) {
        rmdir(outer);
        tap_skip(1, "cannot set a memory cgroup's limit here");
        return tap_done();
    }
    pid = fork();
    if (pid == 0) {
        void *p = NULL;
        shoal_status_t small, big;
        if (cg_write(inner, "cgroup.procs", "0") != 0) {
            _exit(3);
        }
        (void)cg_write("/proc/self", "oom_score_adj", "1000"); /* a regression kills this */
        alarm(60);
        small = shoal_mem_alloc(CG_LIMIT / 4, &p);
        if (small == SHOAL_OK) {
            shoal_mem_free(p);
        }
        big = shoal_mem_alloc(2 * (size_t)CG_LIMIT, &p);
        _exit(small != SHOAL_OK ? 4 : big == SHOAL_ERR_NO_MEMORY ? 0 : 1);
    }
    if (pid > 0) {
        waitpid(pid, &ws, 0);
    }
    rmdir(inner);
    rmdir(outer);
    if (pid > 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 3) {
        tap_skip(1, "cannot move a process into a memory cgroup here");
        return tap_done();
    }
    tap_ok(pid > 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
           "under a %u MiB limit on the cgroup above its own: 64 MiB allocated, 512 MiB "
           "refused with SHOAL_ERR_NO_MEMORY (%s %d)", CG_LIMIT >> 20,
           WIFEXITED(ws) ? "exit" : "signal", WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
    return tap_done();
}
