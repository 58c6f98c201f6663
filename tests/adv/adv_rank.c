/*
 * adv_rank: one real rank for the adversarial join suite (adv_join). It joins through
 * shoal_comm_init_env (SHOAL_UID or SHOAL_ROOT + SHOAL_SECRET, SHOAL_RANK, SHOAL_NRANKS,
 * SHOAL_TENANT/JOB/EPOCH from the environment), runs an AllReduce and checks it, and prints
 * one line on stdout:  RESULT <status name> <milliseconds in init> <1 if the sum was right>.
 *
 *   adv_rank init     join, AllReduce, destroy
 *   adv_rank mkuid    make the unique id (shoal_get_unique_id), print it as "UID <hex>", then
 *                     join with it as rank 0 of SHOAL_NRANKS (shoal_comm_init), as a
 *                     framework's rank 0 does that hands the id to its ranks through a store
 *                     (ADV_INIT_TIMEOUT_MS: its cfg.timeout_ms)
 *   adv_rank split    join, split (one color), AllReduce on the child, destroy both. With
 *                     ADV_HOOK_FD set, the child's root address is written there as one
 *                     line "family port hexaddr" and the leader waits before telling the
 *                     members, so that a stranger can try the child's root: until
 *                     ADV_HOOK_GO_FD (a pipe's read end) reads or reaches its end, at most
 *                     ADV_HOOK_MS; without ADV_HOOK_GO_FD, ADV_HOOK_MS (default 1500).
 */
#include "core/boot.h"

#include <shoal.h>

#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double adv_rank_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void adv_rank_hook(const shoal_boot_uid_t *u)
{
    const char *fd_s = getenv("ADV_HOOK_FD"), *ms_s = getenv("ADV_HOOK_MS");
    const char *go_s = getenv("ADV_HOOK_GO_FD");
    int ms = ms_s != NULL ? atoi(ms_s) : 1500;
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)&u->root;
    char line[64];
    int n;

    if (fd_s == NULL || u->root.ss_family != AF_INET) {
        return;
    }
    n = snprintf(line, sizeof(line), "%u %u %08x\n", (unsigned)AF_INET,
                 (unsigned)ntohs(s4->sin_port), (unsigned)ntohl(s4->sin_addr.s_addr));
    (void)!write(atoi(fd_s), line, (size_t)n);
    if (go_s != NULL) {
        /* Held until the test has tried the root (whose thread runs): a fixed hold ran out
         * on a loaded machine before the test's second try, which then met a child already
         * formed. */
        struct pollfd pfd = {.fd = atoi(go_s), .events = POLLIN};
        (void)poll(&pfd, 1, ms);
        return;
    }
    usleep((useconds_t)ms * 1000u);
}

static int adv_rank_allreduce(shoal_comm_t comm)
{
    int rank = 0, size = 0;
    int64_t in, out = -1;
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &size);
    in = rank + 1;
    if (shoal_allreduce(&in, &out, 1, SHOAL_INT64, SHOAL_SUM, comm, NULL) != SHOAL_OK) {
        return 0;
    }
    return out == (int64_t)size * (size + 1) / 2;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "init";
    shoal_comm_t comm = NULL, child = NULL;
    shoal_status_t st;
    double t0 = adv_rank_now_ms(), ms;
    int ok = 0;

    alarm(30);
    if (strcmp(mode, "split") == 0) {
        shoal_boot_root_started_hook = adv_rank_hook;
    }
    if (strcmp(mode, "mkuid") == 0) {
        shoal_uid_t uid;
        const char *n = getenv("SHOAL_NRANKS");
        st = shoal_get_unique_id(&uid);
        if (st == SHOAL_OK) {
            printf("UID ");
            for (size_t i = 0; i < sizeof(uid.internal); i++) {
                printf("%02x", (unsigned)(uint8_t)uid.internal[i]);
            }
            printf("\n");
            fflush(stdout);
            /* ADV_INIT_TIMEOUT_MS: rank 0's cfg.timeout_ms (the id's root waits as long) */
            const char *tmo = getenv("ADV_INIT_TIMEOUT_MS");
            shoal_config_t cfg = SHOAL_CONFIG_INIT;
            cfg.timeout_ms = tmo != NULL ? atoi(tmo) : 0;
            st = shoal_comm_init(&comm, n != NULL ? atoi(n) : 1, 0, &uid, &cfg);
        }
    } else {
        st = shoal_comm_init_env(&comm, NULL);
    }
    ms = adv_rank_now_ms() - t0;
    if (st == SHOAL_OK && strcmp(mode, "split") == 0) {
        st = shoal_comm_split(comm, 0, 0, &child);
        if (st == SHOAL_OK) {
            ok = adv_rank_allreduce(child) && adv_rank_allreduce(comm);
            shoal_comm_destroy(child);
        }
    } else if (st == SHOAL_OK) {
        ok = adv_rank_allreduce(comm);
    }
    if (comm != NULL) {
        shoal_comm_destroy(comm);
    }
    printf("RESULT %s %.0f %d\n", shoal_status_name(st), ms, ok);
    fflush(stdout);
    return st == SHOAL_OK && ok ? 0 : 1;
}
