/* Interface-name lists with NCCL's SOCKET_IFNAME semantics. */
#include "util/util.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

int shoal_ifname_match(const char *spec, const char *ifname)
{
    int exclude = 0, exact = 0, hit = 0;
    if (*spec == '^') {
        exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        exact = 1;
        spec++;
    }
    while (*spec != '\0' && !hit) {
        size_t n = strcspn(spec, ",");
        if (n > 0) {
            hit = exact ? strlen(ifname) == n && strncmp(ifname, spec, n) == 0
                        : strncmp(ifname, spec, n) == 0;
        }
        spec += n;
        if (*spec == ',') {
            spec++;
        }
    }
    return exclude ? !hit : hit;
}

int shoal_sock_step(int fd, uint8_t *buf, size_t *off, size_t len, int sending)
{
    while (*off < len) {
        ssize_t r = sending ? send(fd, buf + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, buf + *off, len - *off, MSG_DONTWAIT);
        if (r > 0) {
            *off += (size_t)r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            if (r == 0) {
                errno = 0;
            }
            return -1;
        }
    }
    return 1;
}
