/* Files the provider's side (the node agent, a preStop hook) leaves for jobs to obey: whether
 * another local user could have made or changed one. */
#include "util/util.h"

#include <limits.h>
#include <string.h>
#include <sys/stat.h>

const char *shoal_provider_file_untrusted(const char *path, const struct stat *sb)
{
    struct stat dsb;
    char dir[PATH_MAX];
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
    return NULL;
}
