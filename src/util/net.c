/* Interface-name lists with NCCL's SOCKET_IFNAME semantics. */
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
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
        /* blanks around a name are not part of it: "eth0, ib0" names ib0 (as SHOAL_IB_HCA) */
        size_t n, m;
        spec += strspn(spec, " \t");
        n = m = strcspn(spec, ",");
        while (m > 0 && (spec[m - 1] == ' ' || spec[m - 1] == '\t')) {
            m--;
        }
        if (m > 0) {
            hit = exact ? strlen(ifname) == m && strncmp(ifname, spec, m) == 0
                        : strncmp(ifname, spec, m) == 0;
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

int shoal_accept_stall_note(shoal_accept_stall_t *st, int err)
{
    if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) {
        st->since_ns = 0; /* taken, empty, or a failure of that one connection */
        return 0;
    }
    if (st->since_ns == 0) {
        st->since_ns = shoal_time_ns();
    }
    st->err = err;
    return 1;
}

int shoal_accept_stall_over(const shoal_accept_stall_t *st, uint64_t limit_ns, char *why,
                            size_t size)
{
    struct rlimit rl;
    uint64_t ms;

    if (st->since_ns == 0 || shoal_time_ns() - st->since_ns < limit_ns) {
        return 0;
    }
    ms = (shoal_time_ns() - st->since_ns) / 1000000u;
    if (st->err == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        snprintf(why, size, "accept() has failed for %llu ms: %s: this process has all of its "
                 "%llu file descriptors open (raise it: ulimit -n, LimitNOFILE=)",
                 (unsigned long long)ms, strerror(st->err), (unsigned long long)rl.rlim_cur);
    } else {
        snprintf(why, size, "accept() has failed for %llu ms: %s", (unsigned long long)ms,
                 strerror(st->err));
    }
    return 1;
}
