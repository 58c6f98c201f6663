/*
 * Where a rendezvous root listens (finding 6): SHOAL_BOOT_BIND=loopback (shoalrun) publishes
 * and binds 127.0.0.1 only; auto binds the address it publishes, not every interface;
 * shoal_boot_pick_addr follows SHOAL_SOCKET_IFNAME. A connection to the root's port on
 * another local address must be refused. TAP on stdout.
 */
#include "core/core.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 if a TCP connection to ip:port (network order) is accepted. */
static int tb_reachable(in_addr_t ip, in_port_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = port, .sin_addr.s_addr = ip};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
    if (fd < 0) {
        return 0;
    }
    ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* A local IPv4 address that is up and not loopback, or 0. */
static in_addr_t tb_other_addr(char *ifname, size_t len)
{
    struct ifaddrs *ifs, *it;
    in_addr_t ip = 0;
    if (getifaddrs(&ifs) != 0) {
        return 0;
    }
    for (it = ifs; it != NULL && ip == 0; it = it->ifa_next) {
        if (it->ifa_addr != NULL && it->ifa_addr->sa_family == AF_INET &&
            (it->ifa_flags & IFF_UP) != 0 && (it->ifa_flags & IFF_LOOPBACK) == 0) {
            ip = ((struct sockaddr_in *)it->ifa_addr)->sin_addr.s_addr;
            snprintf(ifname, len, "%s", it->ifa_name);
        }
    }
    freeifaddrs(ifs);
    return ip;
}

static void tb_root(int mode, shoal_boot_uid_t *u)
{
    shoal_uid_t uid;
    shoal_core_config.boot_bind = mode; /* the row is parsed once per process */
    if (shoal_get_unique_id(&uid) != SHOAL_OK || shoal_boot_uid_decode(&uid, u) != SHOAL_OK) {
        tap_bail("shoal_get_unique_id failed");
    }
}

int main(void)
{
    shoal_boot_uid_t u;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&u.root;
    struct sockaddr_storage ss;
    socklen_t len;
    char ifname[IF_NAMESIZE + 1] = "", spec[IF_NAMESIZE + 2];
    in_addr_t other, lo = htonl(INADDR_LOOPBACK);

    unsetenv("SHOAL_SOCKET_IFNAME");
    setenv("SHOAL_TIMEOUT_MS", "3000", 1);
    setenv("SHOAL_DEBUG", "NONE", 1);
    shoal_config_global_init();
    other = tb_other_addr(ifname, sizeof(ifname));

    tb_root(SHOAL_BOOT_BIND_LOOPBACK, &u);
    tap_ok(s4->sin_family == AF_INET && s4->sin_addr.s_addr == lo,
           "SHOAL_BOOT_BIND=loopback publishes 127.0.0.1");
    tap_ok(tb_reachable(lo, s4->sin_port), "the root answers on loopback");
    if (other != 0) {
        tap_ok(!tb_reachable(other, s4->sin_port),
               "the root does not answer on %s, another interface", ifname);
    } else {
        tap_skip(1, "no interface but loopback is up");
    }

    if (other != 0) {
        tb_root(SHOAL_BOOT_BIND_AUTO, &u);
        tap_ok(s4->sin_addr.s_addr != lo && tb_reachable(s4->sin_addr.s_addr, s4->sin_port),
               "SHOAL_BOOT_BIND=auto publishes and answers on a non-loopback address");
        tap_ok(!tb_reachable(lo, s4->sin_port),
               "an auto root does not answer on loopback: it binds the address it publishes");
        tb_root(SHOAL_BOOT_BIND_ANY, &u);
        tap_ok(tb_reachable(lo, s4->sin_port) && tb_reachable(other, s4->sin_port),
               "SHOAL_BOOT_BIND=any answers on every interface");
    } else {
        tap_skip(3, "no interface but loopback is up");
    }

    setenv("SHOAL_SOCKET_IFNAME", "lo", 1);
    tap_ok(shoal_boot_pick_addr(&ss, &len) == SHOAL_OK && ss.ss_family == AF_INET &&
               ((struct sockaddr_in *)&ss)->sin_addr.s_addr == lo,
           "SHOAL_SOCKET_IFNAME=lo: the published address is loopback's");
    if (other != 0) {
        snprintf(spec, sizeof(spec), "=%s", ifname);
        setenv("SHOAL_SOCKET_IFNAME", spec, 1);
        tap_ok(shoal_boot_pick_addr(&ss, &len) == SHOAL_OK &&
                   ((struct sockaddr_in *)&ss)->sin_addr.s_addr == other,
               "SHOAL_SOCKET_IFNAME=%s: that interface's address", spec);
        setenv("SHOAL_SOCKET_IFNAME", "^lo", 1);
        tap_ok(shoal_boot_pick_addr(&ss, &len) == SHOAL_OK &&
                   ((struct sockaddr_in *)&ss)->sin_addr.s_addr != lo,
               "SHOAL_SOCKET_IFNAME=^lo: not loopback");
    } else {
        tap_skip(2, "no interface but loopback is up");
    }
    setenv("SHOAL_SOCKET_IFNAME", "=no-such-if0", 1);
    tap_is_int(shoal_boot_pick_addr(&ss, &len), SHOAL_ERR_TRANSPORT,
               "SHOAL_SOCKET_IFNAME naming no interface is an error, not a silent loopback");
    return tap_done();
}
