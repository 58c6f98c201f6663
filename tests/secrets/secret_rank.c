/*
 * One rank of run_secrets.sh: joins through shoal_comm_init_env (SHOAL_UID from shoalrun, or
 * SHOAL_ROOT + SHOAL_SECRET), runs an allreduce, then looks for the secrets where they must
 * no longer be: its environment, /proc/self/environ, and the environment of a child it
 * starts (system() and fork + exec, as a data-loader worker would be started).
 *
 * usage: secret_rank OUTDIR. Writes OUTDIR/rank.R (key=value lines), OUTDIR/values.R (the
 * values it was handed, for the script to search the logs) and OUTDIR/child.R.env. Exit 0
 * when the collective was right, whatever the secret checks found (the script judges them).
 */
#include <shoal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *sr_dup(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}

/* 1 if /proc/self/environ holds needle, or "NAME=" with a value still there. */
static int sr_procenv_has(const char *name_eq, const char *needle)
{
    FILE *fp = fopen("/proc/self/environ", "r");
    static char buf[1 << 20];
    size_t len, nl = strlen(name_eq);
    int found = 0;

    if (fp == NULL)
        return -1;
    len = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[len] = '\0';
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1) {
        if (strncmp(buf + i, name_eq, nl) == 0 && buf[i + nl] != '\0')
            found = 1;
    }
    if (needle != NULL && needle[0] != '\0' && memmem(buf, len, needle, strlen(needle)) != NULL)
        found = 1;
    return found;
}

int main(int argc, char **argv)
{
    char *uid = sr_dup(getenv("SHOAL_UID")), *secret = sr_dup(getenv("SHOAL_SECRET"));
    char path[1024], cmd[2048];
    float in[256], out[256];
    shoal_comm_t comm = NULL;
    shoal_status_t st;
    int rank = -1, nranks = 0, ok = 1;
    FILE *fp;
    pid_t pid;

    if (argc != 2) {
        fprintf(stderr, "usage: secret_rank OUTDIR\n");
        return 2;
    }
    st = shoal_comm_init_env(&comm, NULL);
    if (st != SHOAL_OK) {
        fprintf(stderr, "secret_rank: init failed: %s\n", shoal_strerror(st));
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);
    for (int i = 0; i < 256; i++)
        in[i] = (float)(rank + i);
    st = shoal_allreduce(in, out, 256, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
    for (int i = 0; i < 256 && st == SHOAL_OK; i++)
        ok &= out[i] == (float)(nranks * (nranks - 1) / 2 + nranks * i);

    /* A child started with system(), and one with fork + exec. */
    snprintf(cmd, sizeof(cmd), "env > '%s/child.%d.env'", argv[1], rank);
    if (system(cmd) != 0)
        ok = 0;
    snprintf(path, sizeof(path), "%s/exec.%d.env", argv[1], rank);
    pid = fork();
    if (pid == 0) {
        if (freopen(path, "w", stdout) != NULL)
            execlp("env", "env", (char *)NULL);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);

    snprintf(path, sizeof(path), "%s/rank.%d", argv[1], rank);
    fp = fopen(path, "w");
    if (fp != NULL) {
        fprintf(fp, "allreduce=%s\n", st == SHOAL_OK && ok ? "ok" : "wrong");
        fprintf(fp, "had_uid=%d\nhad_secret=%d\n", uid != NULL, secret != NULL);
        fprintf(fp, "getenv_uid=%d\ngetenv_secret=%d\n", getenv("SHOAL_UID") != NULL,
                getenv("SHOAL_SECRET") != NULL);
        fprintf(fp, "procenv_uid=%d\nprocenv_secret=%d\n", sr_procenv_has("SHOAL_UID=", uid),
                sr_procenv_has("SHOAL_SECRET=", secret));
        fclose(fp);
    }
    snprintf(path, sizeof(path), "%s/values.%d", argv[1], rank);
    fp = fopen(path, "w");
    if (fp != NULL) {
        if (uid != NULL)
            fprintf(fp, "%s\n", uid);
        if (secret != NULL)
            fprintf(fp, "%s\n", secret);
        fclose(fp);
    }
    st = shoal_comm_destroy(comm);
    free(uid);
    free(secret);
    return st == SHOAL_OK && ok ? 0 : 1;
}
