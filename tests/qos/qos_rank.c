/* One rank of a tcp job (SHOAL_TRANSPORT=tcp under shoalrun): after an AllReduce, every data
 * socket of the communicator (comm->chans[p].ep->fds[]) must carry the marks of the class:
 *   qos_rank PRIO TOS RATE   (-1: the option must be left at the kernel's default 0; RATE 0:
 *                             no cap, i.e. SO_MAX_PACING_RATE unlimited)
 * and shoal_comm_stats reports the class's marks. Prints one line per socket; exit 0 when all
 * match. */
#include "core/core.h"
#include "transports/tcp/tcp.h"

#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int check_fd(int rank, int peer, int fd, int prio, int tos, long long rate)
{
    int p = -1, t = -1, family = 0;
    uint64_t r = 0;
    socklen_t l = sizeof(p);
    int ok;

    getsockopt(fd, SOL_SOCKET, SO_PRIORITY, &p, &l);
    l = sizeof(family);
    getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &l);
    l = sizeof(t);
    if (family == AF_INET6) {
        getsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &t, &l);
    } else {
        getsockopt(fd, IPPROTO_IP, IP_TOS, &t, &l);
    }
    l = sizeof(r);
    getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &r, &l);
    if (l == 4) {
        r = (uint32_t)r == UINT32_MAX ? UINT64_MAX : (uint32_t)r;
    }
    ok = p == (prio < 0 ? 0 : prio) && t == (tos < 0 ? 0 : tos) &&
         (rate == 0 ? (r == UINT64_MAX || r == UINT32_MAX) : r == (uint64_t)rate);
    printf("rank %d: peer %d fd %d: SO_PRIORITY %d IP_TOS 0x%x SO_MAX_PACING_RATE %" PRIu64
           " %s\n", rank, peer, fd, p, t, r, ok ? "ok" : "MISMATCH");
    return ok;
}

int main(int argc, char **argv)
{
    shoal_comm_t comm;
    shoal_stats_t s = SHOAL_STATS_INIT;
    int32_t v = 1;
    int bad = 0, nsock = 0, prio, tos;
    long long rate;

    if (argc != 4) {
        fprintf(stderr, "usage: qos_rank PRIO TOS RATE\n");
        return 2;
    }
    prio = atoi(argv[1]);
    tos = atoi(argv[2]);
    rate = atoll(argv[3]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (shoal_comm_init_env(&comm, NULL) != SHOAL_OK ||
        shoal_allreduce(&v, &v, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL) != SHOAL_OK) {
        printf("rank ?: init or allreduce failed\n");
        return 1;
    }
    for (int p = 0; p < comm->nranks; p++) {
        shoal_ep_t *ep = comm->chans[p].ep;
        if (p == comm->rank || ep == NULL || strcmp(comm->chans[p].tl->ops->name, "tcp") != 0) {
            continue;
        }
        for (int i = 0; i < ep->nsocks; i++) {
            nsock++;
            bad += !check_fd(comm->rank, p, ep->fds[i], prio, tos, rate);
        }
    }
    if (nsock == 0) {
        printf("rank %d: no tcp data socket\n", comm->rank);
        bad++;
    }
    if (shoal_comm_stats(comm, &s) != SHOAL_OK || s.qos_priority != prio ||
        s.qos_dscp != (tos < 0 ? -1 : tos >> 2)) {
        printf("rank %d: shoal_comm_stats: class %d weight %d priority %d dscp %d MISMATCH\n",
               comm->rank, s.qos_class, s.qos_weight, s.qos_priority, s.qos_dscp);
        bad++;
    }
    shoal_comm_destroy(comm);
    return bad != 0;
}
