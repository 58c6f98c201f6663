/* Wire header codec and validation; unique-id codec; a failed request's sentence (chan.c). */
#include "core/boot.h"
#include "core/core.h"
#include "core/wire.h"
#include "tests/tap.h"

#include <arpa/inet.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static shoal_wire_hdr_t test_wire_hdr(void)
{
    return (shoal_wire_hdr_t){.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                              .type = SHOAL_WIRE_DATA, .comm_id = 0xdeadbeef, .seq = 7,
                              .step = 3, .chunk = 11, .length = 0x123456789aULL};
}

static void test_wire_roundtrip(void)
{
    shoal_wire_hdr_t h = test_wire_hdr(), g;
    uint8_t buf[SHOAL_WIRE_HDR_BYTES];
    char why[128];

    shoal_wire_encode(&h, buf);
    tap_is_int(buf[0], 'S', "magic encodes little-endian 'S'");
    tap_is_int(buf[24], 0x9a, "length low byte first");
    shoal_wire_decode(buf, &g);
    tap_ok(memcmp(&h, &g, sizeof(h)) == 0, "decode(encode(h)) == h");
    tap_is_int(shoal_wire_check(&h, &g, why, sizeof(why)), SHOAL_OK, "matching header accepted");
}

static void test_wire_rejects(void)
{
    struct {
        const char *what;
        size_t off;      /* byte to corrupt */
        uint8_t val;
        shoal_status_t want;
    } cases[] = {
        {"bad magic", 0, 0x00, SHOAL_ERR_PROTOCOL},
        {"bad version", 4, 0x7f, SHOAL_ERR_PROTOCOL},
        {"other communicator", 8, 0x01, SHOAL_ERR_PROTOCOL},
        {"wrong sequence", 12, 0x08, SHOAL_ERR_PROTOCOL},
        {"wrong step", 16, 0x04, SHOAL_ERR_PROTOCOL},
        {"wrong chunk", 20, 0x0c, SHOAL_ERR_PROTOCOL},
        {"wrong length", 24, 0x9b, SHOAL_ERR_PROTOCOL},
        {"absurd length", 31, 0xff, SHOAL_ERR_PROTOCOL},
        {"unknown type", 6, 0x09, SHOAL_ERR_PROTOCOL},
    };
    shoal_wire_hdr_t h = test_wire_hdr(), g;
    uint8_t buf[SHOAL_WIRE_HDR_BYTES];
    char why[160]; /* the shm transport's; tcp and ucx have 192 */

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(cases); i++) {
        shoal_wire_encode(&h, buf);
        buf[cases[i].off] = cases[i].val;
        shoal_wire_decode(buf, &g);
        why[0] = '\0';
        tap_is_int(shoal_wire_check(&h, &g, why, sizeof(why)), cases[i].want, "%s rejected (%s)",
                   cases[i].what, why);
    }
    /* A message of an earlier call (one the ranks' differing arguments left unreceived: a
     * broadcast whose ranks named different roots) and one of another length say what the
     * likely cause is; they read as the failure of the peer alone. A later sequence number
     * is no leftover; sequence numbers wrap. */
    g = h;
    g.seq = h.seq - 1;
    tap_ok(shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
               strstr(why, "of an earlier call (seq 6, step 3, chunk 11)") != NULL &&
               strstr(why, "different roots or counts?") != NULL,
           "a message of an earlier call says so: %s", why);
    g.seq = h.seq + 1;
    tap_ok(shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
               strstr(why, "earlier") == NULL, "a later one does not: %s", why);
    {
        shoal_wire_hdr_t h0 = h;
        h0.seq = 0;
        g.seq = 0xffffffffu;
        tap_ok(shoal_wire_check(&h0, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
                   strstr(why, "of an earlier call") != NULL, "across the wrap too: %s", why);
    }
    g = h;
    g.length = h.length + 4;
    tap_ok(shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
               strstr(why, "different counts or dtypes") != NULL,
           "another length names counts and dtypes: %s", why);
    /* An abort notice from the same communicator names the culprit. */
    g = h;
    g.type = SHOAL_WIRE_ABORT;
    g.chunk = 5;
    g.length = 0;
    tap_is_int(shoal_wire_check(&h, &g, why, sizeof(why)), SHOAL_ERR_PEER_FAILED,
               "abort notice -> peer failed");
    tap_ok(strstr(why, "rank 5") != NULL, "abort notice names the culprit: %s", why);
    tap_is_int(shoal_wire_culprit(&g), 5, "the culprit decodes as data");
    g.chunk = 0x80000000u;
    tap_is_int(shoal_wire_culprit(&g), -1, "a culprit past INT32_MAX is none");
    tap_is_int(shoal_wire_culprit(&h), -1, "a data header blames nobody");
    /* Random bytes are never accepted. */
    srand(1);
    int accepted = 0;
    for (int i = 0; i < 100000; i++) {
        for (int j = 0; j < SHOAL_WIRE_HDR_BYTES; j++) {
            buf[j] = (uint8_t)rand();
        }
        shoal_wire_decode(buf, &g);
        accepted += shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_OK;
    }
    tap_is_int(accepted, 0, "100000 random headers: none accepted");
}

static void test_uid(void)
{
    shoal_boot_uid_t u, v;
    shoal_uid_t uid;
    char hex[2 * SHOAL_UID_BYTES + 1];
    struct sockaddr_in *s4 = (struct sockaddr_in *)&u.root;

    memset(&u, 0, sizeof(u));
    s4->sin_family = AF_INET;
    s4->sin_port = htons(4242);
    s4->sin_addr.s_addr = htonl(0x7f000001);
    u.root_len = sizeof(*s4);
    for (int i = 0; i < SHOAL_SECRET_BYTES; i++) {
        u.secret[i] = (uint8_t)(i * 7 + 1);
    }
    shoal_boot_uid_encode(&u, &uid);
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_OK, "uid decodes");
    tap_ok(memcmp(&u.root, &v.root, sizeof(*s4)) == 0 && memcmp(u.secret, v.secret, 32) == 0,
           "uid round trip keeps address and secret");
    for (int i = 0; i < SHOAL_UID_BYTES; i++) {
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)uid.internal[i]);
    }
    memset(&uid, 0, sizeof(uid));
    tap_is_int(shoal_boot_uid_from_hex(hex, &uid), SHOAL_OK, "hex uid parses");
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_OK, "hex uid decodes");
    hex[10] = 'z';
    tap_is_int(shoal_boot_uid_from_hex(hex, &uid), SHOAL_ERR_INVALID_ARG, "non-hex rejected");
    tap_is_int(shoal_boot_uid_from_hex("abcd", &uid), SHOAL_ERR_INVALID_ARG, "short hex rejected");
    memset(&uid, 0x5a, sizeof(uid));
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_ERR_INVALID_ARG, "garbage uid rejected");
}

/* ---- a failed request as the channels word it (core/chan.c) ---- */

static int test_chan_culprit = -2;

static shoal_status_t test_chan_isend_auth(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    (void)ep;
    snprintf(req->errbuf, req->errlen, "rank 0: no proof from peer 1 within 1000 ms, only "
             "proofs under another key claiming its rank");
    req->status = SHOAL_ERR_AUTH;
    req->culprit = -1;
    req->done = 1;
    return SHOAL_OK;
}

static shoal_status_t test_chan_irecv_auth(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    (void)ep;
    snprintf(req->errbuf, req->errlen, "peer 1 (hostb) failed to prove the job secret");
    req->culprit = -1;
    return SHOAL_ERR_AUTH;
}

static int test_chan_progress(shoal_tl_ctx_t *ctx)
{
    (void)ctx;
    return 0;
}

static void test_chan_fail(shoal_tl_ctx_t *ctx, int culprit, shoal_status_t status)
{
    (void)ctx;
    (void)status;
    test_chan_culprit = culprit;
}

/* A transport's SHOAL_ERR_AUTH without a culprit (a lazy connection whose other end could not
 * prove the key: a process posing as the peer, or another job's) is not a failure of the
 * peer: "peer 1 (hostb) failed: ..." said it was, on the request's wait and at its post. */
static void test_chan_auth(void)
{
    static shoal_tl_ops_t ops = {.name = "fake", .isend = test_chan_isend_auth,
                                 .irecv = test_chan_irecv_auth,
                                 .progress = test_chan_progress, .fail = test_chan_fail};
    struct shoal_comm *comm = calloc(1, sizeof(*comm));
    shoal_peer_info_t peers[2] = {{.host_id = 1, .host = "hosta"},
                                  {.host_id = 2, .rank = 1, .host = "hostb"}};
    shoal_chan_t chans[2];
    uint64_t x = 0;
    shoal_status_t st;

    memset(chans, 0, sizeof(chans));
    comm->nranks = 2;
    comm->peers = peers;
    comm->chans = chans;
    comm->ntls = 1;
    comm->tls[0] = (shoal_tl_inst_t){.ops = &ops, .ctx = (shoal_tl_ctx_t *)comm, .npeers = 1};
    chans[1].tl = &comm->tls[0];
    comm->timeout_ms = 1000;
    comm->spin_count = 4;
    comm->abort_efd = -1;
    pthread_mutex_init(&comm->err_lock, NULL);

    st = shoal_chan_sendrecv(comm, 1, &x, -1, NULL, sizeof(x), 0, 0);
    tap_is_int(st, SHOAL_ERR_AUTH, "a send that fails authentication: SHOAL_ERR_AUTH");
    tap_ok(strstr(comm->last_error, "(hostb) failed:") == NULL &&
           strstr(comm->last_error, "peer 1 (hostb) failed authentication") != NULL,
           "its sentence says the connection to the peer failed authentication, not that the "
           "peer failed: %s", comm->last_error);
    tap_is_int(test_chan_culprit, 1, "the peers are told the failure is about rank 1");

    comm->fatal = SHOAL_OK;
    comm->tl_err[0] = '\0';
    test_chan_culprit = -2;
    st = shoal_chan_sendrecv(comm, -1, NULL, 1, &x, sizeof(x), 0, 0);
    tap_is_int(st, SHOAL_ERR_AUTH, "a receive refused at its post for authentication: "
               "SHOAL_ERR_AUTH");
    tap_ok(strstr(comm->last_error, "(hostb) failed:") == NULL &&
           strstr(comm->last_error, "failed authentication") != NULL,
           "its sentence says so too: %s", comm->last_error);
    tap_is_int(test_chan_culprit, 1, "the peers are told the failure is about rank 1");
    pthread_mutex_destroy(&comm->err_lock);
    free(comm);
}

int main(void)
{
    shoal_config_global_init();
    test_wire_roundtrip();
    test_wire_rejects();
    test_uid();
    test_chan_auth();
    return tap_done();
}
