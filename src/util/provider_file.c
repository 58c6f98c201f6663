/* Files the provider's side (the node agent, a preStop hook) leaves for jobs to obey: whether
 * another local user could have made or changed one. */
#include "util/util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
     * above). */
    if (realpath(dir, real) == NULL) {
        return "its directory cannot be resolved";
    }
    for (char *p = strrchr(real, '/'); p != NULL; p = strrchr(real, '/')) {
        int top = p == real;
        p[top] = '\0'; /* the parent: "/" kept whole */
        if (stat(real, &dsb) != 0) {
            return "a directory above it cannot be read";
        }
        if ((dsb.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (dsb.st_mode & S_ISVTX) == 0) {
            return "others may write to a directory above it (no sticky bit), and move its "
                   "directory away";
        }
        if (top) {
            break;
        }
    }
    return NULL;
}
