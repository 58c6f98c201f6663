/* Files the provider's side (the node agent, a preStop hook) leaves for jobs to obey: whether
 * another local user could have made or changed one. */
#include "util/util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *shoal_provider_file_untrusted(const char *path, const struct stat *sb)
{
    struct stat dsb;
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t len = slash == NULL || slash == path ? 1 : (size_t)(slash - path);

    if ((sb->st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        return "it is writable by group or others";
    }
    if (len >= sizeof(dir)) {
        return "its directory's name is too long";
    }
    memcpy(dir, slash == NULL ? "." : path, len);
    dir[len] = '\0';
    if (stat(dir, &dsb) != 0) {
        return "its directory cannot be read";
    }
    if ((dsb.st_mode & (S_IWGRP | S_IWOTH)) != 0 && sb->st_uid != 0 &&
        sb->st_uid != dsb.st_uid) {
        return "others may write to its directory, and it belongs to neither root nor the "
               "directory's owner";
    }
    /* The directories above: one that others may write to, without the sticky bit, lets them
     * move the directory below it away and put one of their own in its place, holding a file
     * of theirs (/shared/jobs/stop with /shared mode 0777: both theirs passed the checks
     * above). With the sticky bit (/tmp), the directory below must be root's, that directory's
     * owner's or this process's user's: anyone may make /tmp/stops before the provider does,
     * and a stop file of theirs in it stopped another user's job. */
    if (realpath(dir, real) == NULL) {
        return "its directory cannot be resolved";
    }
    for (char *p = strrchr(real, '/'); p != NULL; p = strrchr(real, '/')) {
        int top = p == real;
        uid_t below = dsb.st_uid;
        p[top] = '\0'; /* the parent: "/" kept whole */
        if (stat(real, &dsb) != 0) {
            return "a directory above it cannot be read";
        }
        if ((dsb.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (dsb.st_mode & S_ISVTX) == 0) {
            return "others may write to a directory above it (no sticky bit), and move its "
                   "directory away";
        }
        if ((dsb.st_mode & (S_IWGRP | S_IWOTH)) != 0 && below != 0 && below != dsb.st_uid &&
            below != geteuid()) {
            return "a directory on its path belongs to another user (neither root, nor the "
                   "owner of the directory above it, which others may write to, nor this "
                   "process's user): anyone could have made it";
        }
        if (top) {
            break;
        }
    }
    return NULL;
}

int shoal_provider_name_ok(const char *name)
{
    return strchr(name, '/') == NULL && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

shoal_status_t shoal_provider_path_expand(const char *pattern, const char *tenant,
                                          const char *job, char *buf, size_t len, char *why,
                                          size_t whylen)
{
    char uid_tenant[32];
    size_t n = 0;

    /* A job without tenant is "uid=N" (its effective uid), as the node agent meters, bills and
     * paces it: "default" was also a name a real tenant could have. */
    snprintf(uid_tenant, sizeof(uid_tenant), "uid=%u", (unsigned)geteuid());
    for (const char *p = pattern; *p != '\0'; p++) {
        const char *ins = NULL;
        size_t k = 1;
        if (p[0] == '%' && (p[1] == 't' || p[1] == 'j' || p[1] == '%')) {
            ins = p[1] == 't' ? tenant : p[1] == 'j' ? job : "%";
            ins = ins[0] != '\0' ? ins : p[1] == 't' ? uid_tenant : "default";
            k = strlen(ins);
            /* A name is one path component: a tenant or job name may hold '/' and may be
             * "..", and "/run/shoal/stop/%t.%j" then named a file anywhere ("../../tmp/x"),
             * which whoever can write there could use to stop the job (or, as a rates page,
             * to hold it back or let it run unarbitrated). */
            if (p[1] != '%' && !shoal_provider_name_ok(ins)) {
                snprintf(why, whylen, "the %s name '%s' is not a file name (a '/', or '.' or "
                         "'..')", p[1] == 't' ? "tenant" : "job", ins);
                return SHOAL_ERR_INVALID_ARG;
            }
        }
        if (n + k + 1 > len) {
            snprintf(why, whylen, "too long once expanded");
            return SHOAL_ERR_INVALID_ARG;
        }
        memcpy(buf + n, ins != NULL ? ins : p, k);
        n += k;
        p += ins != NULL;
    }
    buf[n] = '\0';
    return SHOAL_OK;
}
