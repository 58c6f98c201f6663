/* Key files of the provider's tools (shoal-cred, shoal-bill, shoald): one reader, so that every
 * tool checks them the same way and wipes what it read when it fails. */
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

shoal_status_t shoal_secret_file_read(const char *path, uint8_t *buf, size_t min, size_t max,
                                      size_t *len_p, int *loose_p, char *why, size_t whylen)
{
    struct stat st;
    size_t n = 0;
    ssize_t ret;
    int fd;

    /* O_NONBLOCK: opening a FIFO without a writer waited for one for ever (shoal-bill
     * --key-file FIFO hung); it opens at once now and is refused below as not a regular file */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return SHOAL_ERR_INVALID_ARG;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size < min ||
        (size_t)st.st_size > max) {
        if (min == max) {
            snprintf(why, whylen, "%s is not a regular file of %zu bytes", path, max);
        } else {
            snprintf(why, whylen, "%s is not a regular file of %zu to %zu bytes", path, min, max);
        }
        close(fd);
        return SHOAL_ERR_INVALID_ARG;
    }
    if ((st.st_mode & 022) != 0) {
        /* as munge refuses its key: anyone who may write it may replace the key with one of
         * their own (and forge what it signs) */
        snprintf(why, whylen, "%s may be written by group or others (mode %04o): chmod 600 it",
                 path, (unsigned)(st.st_mode & 07777));
        close(fd);
        return SHOAL_ERR_PERMISSION;
    }
    if (st.st_uid != 0 && st.st_uid != geteuid()) {
        /* the owner may chmod and rewrite it whatever its mode: another user's key file is
         * one they may replace (a tenant that owns its tenant key mints its own credentials,
         * any job, class or weight), as munge refuses a key it does not own */
        snprintf(why, whylen, "%s belongs to uid %u, neither root nor this user (uid %u): "
                 "chown it", path, (unsigned)st.st_uid, (unsigned)geteuid());
        close(fd);
        return SHOAL_ERR_PERMISSION;
    }
    while (n < (size_t)st.st_size) {
        ret = read(fd, buf + n, (size_t)st.st_size - n);
        if (ret < 0 && errno == EINTR) {
            continue;
        }
        if (ret <= 0) {
            snprintf(why, whylen, "cannot read %s: %s", path,
                     ret < 0 ? strerror(errno) : "short file");
            close(fd);
            shoal_secret_wipe(buf, max);
            return SHOAL_ERR_INVALID_ARG;
        }
        n += (size_t)ret;
    }
    close(fd);
    *len_p = n;
    *loose_p = (st.st_mode & 077) != 0;
    return SHOAL_OK;
}
