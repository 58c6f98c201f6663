/* Env-var config table of the tcp transport. */
#include "transports/tcp/tcp.h"

#include <stddef.h>

shoal_tcp_config_t shoal_tcp_config = {
    .family = SHOAL_TCP_FAMILY_ANY,
    .nsocks = 2,
    .min_split = 256 * 1024,
    .hello_timeout_ms = 3000,
};

static const char *const shoal_tcp_family_names[] = {
    [SHOAL_TCP_FAMILY_ANY] = "any",
    [SHOAL_TCP_FAMILY_INET] = "AF_INET",
    [SHOAL_TCP_FAMILY_INET6] = "AF_INET6",
    NULL,
};

static const shoal_cfg_field_t shoal_tcp_cfg_fields[] = {
    {
        .name = "SOCKET_IFNAME",
        .dflt = "",
        .doc = "interfaces to listen on, as in NCCL: prefixes \"eth,ib\", \"^docker\" to "
               "exclude, \"=eth0\" for exact names; empty: the first non-loopback interface "
               "that is up (docker* ones only when there is no other), else lo; IPv4 first "
               "(SHOAL_SOCKET_FAMILY); IPv6 link-local addresses are never used, even on a named "
               "interface",
        .offset = offsetof(shoal_tcp_config_t, ifname),
        .type = SHOAL_CFG_STRING,
    },
    {
        .name = "SOCKET_FAMILY",
        .dflt = "any",
        .doc = "address family of the tcp transport: AF_INET, AF_INET6 or any (IPv4 first)",
        .offset = offsetof(shoal_tcp_config_t, family),
        .type = SHOAL_CFG_ENUM,
        .enum_names = shoal_tcp_family_names,
    },
    {
        .name = "SOCKET_NSOCKS",
        .dflt = "2",
        .doc = "tcp sockets per peer (1..16); large messages are striped across them; both "
               "sides use the smaller of their values",
        .offset = offsetof(shoal_tcp_config_t, nsocks),
        .type = SHOAL_CFG_UINT,
    },
    {
        .name = "TCP_MIN_SPLIT",
        .dflt = "256k",
        .doc = "tcp messages at least this large are striped across all sockets of the peer; "
               "both sides use the larger of their values; unset: twice the socket's initial "
               "receive buffer (SHOAL_TCP_RCVBUF, else the kernel's tcp_rmem default), a power "
               "of two within 64k..4m (SHOAL_TUNE)",
        .offset = offsetof(shoal_tcp_config_t, min_split),
        .type = SHOAL_CFG_SIZE,
        .flags = SHOAL_CFG_F_DERIVED,
    },
    {
        .name = "TCP_SNDBUF",
        .dflt = "0",
        .doc = "SO_SNDBUF of tcp data sockets; 0 keeps the kernel default (autotuning)",
        .offset = offsetof(shoal_tcp_config_t, sndbuf),
        .type = SHOAL_CFG_SIZE,
    },
    {
        .name = "TCP_RCVBUF",
        .dflt = "0",
        .doc = "SO_RCVBUF of tcp data sockets; 0 keeps the kernel default (autotuning)",
        .offset = offsetof(shoal_tcp_config_t, rcvbuf),
        .type = SHOAL_CFG_SIZE,
    },
    {
        .name = "SOCKET_HELLO_TIMEOUT",
        .dflt = "3s",
        .doc = "a connection to a tcp transport listener (or the ib out-of-band listener) must "
               "send its hello within this time, else it is closed (a connector that is closed "
               "early reconnects); the rest of the handshake is bounded by the communicator "
               "timeout (ib: 5 s; a lazy tcp rank that needs the socket: this time too). When "
               "every handshake slot is taken, the oldest connection that has not proved the "
               "job secret is closed. 0 or inf: no limit of its own (the communicator timeout; "
               "ib: 5 s)",
        .offset = offsetof(shoal_tcp_config_t, hello_timeout_ms),
        .type = SHOAL_CFG_TIME,
    },
};

const shoal_cfg_table_t shoal_tcp_cfg_table = {
    .module = "tcp",
    .fields = shoal_tcp_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_tcp_cfg_fields),
    .dst = &shoal_tcp_config,
};
