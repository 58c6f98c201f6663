/* The library's configuration files (SHOAL_TOPO_FILE, SHOAL_TUNING_FILE, SHOAL_RING_HOSTS_FILE):
 * one reader, so that each is read whole or refused with the reason, the same way. */
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int shoal_text_file_read(const char *path, size_t max, char **text_p, size_t *len_p, char *why,
                         size_t whylen)
{
    return shoal_text_file_read_st(path, max, text_p, len_p, NULL, why, whylen);
}

int shoal_text_file_read_st(const char *path, size_t max, char **text_p, size_t *len_p,
                            struct stat *st_p, char *why, size_t whylen)
{
    struct stat st;
    char *buf;
    size_t n = 0;
    int fd, err;

    *text_p = NULL;
    /* O_NONBLOCK: a FIFO at the path (anyone may leave one in a directory others write to)
     * held shoal_comm_init in open() until a writer came, for ever; it opens at once now and
     * is refused below. A regular file ignores the flag. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        err = errno;
        snprintf(why, whylen, "cannot open: %s", strerror(err));
        return err;
    }
    if (fstat(fd, &st) != 0) {
        err = errno;
        snprintf(why, whylen, "cannot stat: %s", strerror(err));
        close(fd);
        return err;
    }
    if (!S_ISREG(st.st_mode)) {
        /* a directory opened, read nothing, and passed as an empty file */
        snprintf(why, whylen, "is not a regular file%s",
                 S_ISDIR(st.st_mode) ? " (a directory)" : S_ISFIFO(st.st_mode) ? " (a FIFO)" : "");
        close(fd);
        return S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    }
    buf = malloc(max + 1);
    if (buf == NULL) {
        close(fd);
        snprintf(why, whylen, "cannot allocate %zu bytes to read it", max + 1);
        return ENOMEM;
    }
    /* Up to one byte past the limit, whatever st_size said (a file that grows while it is
     * read, a /proc file of size 0): cut at the limit, its last line was parsed half. */
    while (n <= max) {
        ssize_t ret = read(fd, buf + n, max + 1 - n);
        if (ret < 0 && errno == EINTR) {
            continue;
        }
        if (ret < 0) {
            err = errno;
            snprintf(why, whylen, "cannot read: %s", strerror(err));
            close(fd);
            free(buf);
            return err;
        }
        if (ret == 0) {
            break;
        }
        n += (size_t)ret;
    }
    close(fd);
    if (n > max) {
        snprintf(why, whylen, "is larger than %zu bytes", max);
        free(buf);
        return EFBIG;
    }
    buf[n] = '\0';
    *text_p = buf;
    if (st_p != NULL) {
        *st_p = st;
    }
    if (len_p != NULL) {
        *len_p = n;
    }
    return 0;
}
