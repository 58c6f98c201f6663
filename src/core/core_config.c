/* SHOAL_* variables of the core. */
#include "core/core.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

shoal_core_config_t shoal_core_config;

static const char *const shoal_core_boot_binds[] = {"auto", "loopback", "any", NULL};
static const char *const shoal_core_boot_exchanges[] = {"ring", "root", NULL};
static const char *const shoal_core_connects[] = {"auto", "eager", "lazy", NULL};

static const shoal_cfg_field_t shoal_core_cfg_fields[] = {
    {.name = "TIMEOUT_MS", .dflt = "300s", .type = SHOAL_CFG_TIME,
     .offset = offsetof(shoal_core_config_t, timeout_ms),
     .doc = "deadline of every wait (bootstrap, connect, each collective); a dead or stuck "
            "peer becomes an error after this long; inf = never"},
    {.name = "TRANSPORT", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_core_config_t, transport),
     .doc = "force one transport for every peer (shm, tcp, ucx, ib); empty = shm on the same "
            "host; across hosts the first of ib, ucx, tcp whose query says yes on every rank of "
            "the pair: ib where an RDMA port is ACTIVE (RoCE: with a GID of "
            "SHOAL_IB_ADDR_FAMILY), ucx where UCX reaches other hosts over an RDMA transport "
            "(rc, dc, ud; not when it has only tcp), else tcp (shoal_info -b prints the choice "
            "and why)"},
    {.name = "TRANSPORT_EXCLUDE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_core_config_t, transport_exclude),
     .doc = "transports never used nor queried (their libraries not loaded), comma-separated "
            "(e.g. ib to try ucx over the RDMA device); the automatic choice takes the next one "
            "in order; a transport both forced by SHOAL_TRANSPORT and excluded is an error"},
    {.name = "SPIN_COUNT", .dflt = "2000", .type = SHOAL_CFG_UINT,
     .offset = offsetof(shoal_core_config_t, spin_count),
     .doc = "idle polls (each followed by sched_yield) before a waiter sleeps"},
    {.name = "SPIN_PAUSE", .dflt = "1024", .type = SHOAL_CFG_UINT,
     .offset = offsetof(shoal_core_config_t, spin_pause),
     .doc = "idle polls with a CPU pause (no system call) before a waiter starts yielding; "
            "0 when another rank of the host may run on this rank's CPU (bound to the same CPU, or "
            "the host's ranks outnumber the CPUs). A yield on a machine loaded by other work "
            "hands the CPU away for a time slice: with 8, a 2-rank 8 B AllReduce over ucx took "
            "14-69 us (median 52) under load, 0.8-1.0 us with 1024, as Open MPI's pure polling"},
    {.name = "SPIN_ADAPT", .dflt = "1", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_core_config_t, spin_adapt),
     .doc = "1: a wait spins at most 200 us before it sleeps, and only 20 us while at least a "
            "quarter of the communicator's recent waits past 20 us went on past 200 us (bulk "
            "transfers over a slow link: polls are system calls over tcp, and take CPU from "
            "the processes with work to do); waits under 20 us are unchanged; only "
            "communicators that use a transport across hosts (tcp, ucx, ib): shared memory "
            "keeps its full spin; 0: the full spin of SHOAL_SPIN_PAUSE and SHOAL_SPIN_COUNT "
            "polls"},
    {.name = "UID", .dflt = "", .type = SHOAL_CFG_STRING, .flags = SHOAL_CFG_F_SECRET,
     .offset = offsetof(shoal_core_config_t, uid),
     .doc = "unique id (256 hex characters) for shoal_comm_init_env; set by shoalrun"},
    {.name = "RANK", .dflt = "-1", .type = SHOAL_CFG_INT,
     .offset = offsetof(shoal_core_config_t, rank),
     .doc = "this process's rank for shoal_comm_init_env; -1 = from OMPI/PMI/Slurm variables "
            "(set alone, it must equal theirs)"},
    {.name = "NRANKS", .dflt = "-1", .type = SHOAL_CFG_INT,
     .offset = offsetof(shoal_core_config_t, nranks),
     .doc = "number of ranks for shoal_comm_init_env; -1 = from OMPI/PMI/Slurm variables "
            "(set alone, it must equal theirs)"},
    {.name = "ROOT", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_core_config_t, root),
     .doc = "host:port of the rendezvous root when SHOAL_UID is not set (rank 0 listens there)"},
    {.name = "SECRET", .dflt = "", .type = SHOAL_CFG_STRING, .flags = SHOAL_CFG_F_SECRET,
     .offset = offsetof(shoal_core_config_t, secret),
     .doc = "job secret (64 hex characters) that authenticates ranks joining through "
            "SHOAL_ROOT; must be the same on every rank"},
    {.name = "BOOT_BIND", .dflt = "auto", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_core_boot_binds, .offset = offsetof(shoal_core_config_t, boot_bind),
     .doc = "where a rendezvous root listens: auto (the address it publishes, chosen by "
            "SHOAL_SOCKET_IFNAME; loopback for a split whose ranks share one host), loopback "
            "(set by shoalrun: one host), any (every interface); SHOAL_ROOT binds its address (every interface with any)"},
    {.name = "BOOT_EXCHANGE", .dflt = "ring", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_core_boot_exchanges,
     .offset = offsetof(shoal_core_config_t, boot_exchange),
     .doc = "how the bootstrap's address records travel: ring (the root tells each rank its "
            "ring neighbours' listeners, O(n) bytes at the root; the ranks pass the records on "
            "over authenticated rank-to-rank links, n-1 steps), root (every record to the root, "
            "which sends every rank the whole table: O(n^2) bytes at the root); every rank of a "
            "job must use the same"},
    {.name = "CONNECT", .dflt = "auto", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_core_connects, .offset = offsetof(shoal_core_config_t, connect),
     .doc = "when channels to peers are connected: eager (all at init, n-1 handshakes per "
            "rank), lazy (a channel at its first send or receive, or when the peer connects; "
            "tcp, shm, ucx and ib; ib through rdma_cm, SHOAL_IB_USE_RDMACM=1, stays eager), "
            "auto (lazy from SHOAL_CONNECT_LAZY_RANKS ranks on)"},
    {.name = "CONNECT_LAZY_RANKS", .dflt = "32", .type = SHOAL_CFG_INT,
     .offset = offsetof(shoal_core_config_t, connect_lazy_ranks),
     .doc = "SHOAL_CONNECT=auto connects lazily in communicators of at least this many ranks"},
};

const shoal_cfg_table_t shoal_core_cfg_table = {
    .module = "core",
    .fields = shoal_core_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_core_cfg_fields),
    .dst = &shoal_core_config,
};

/* A launcher's rank or size: a whole decimal number from 0 to INT_MAX; -1 otherwise. */
static int shoal_core_launcher_int(const char *s)
{
    char *end = NULL;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0 || v > INT_MAX) {
        return -1;
    }
    return (int)v;
}

/* The launchers' (rank, size) variables, in the order they are looked for. */
static const char *const shoal_core_launcher_pairs[][2] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMIX_RANK", "PMIX_SIZE"},
    {"PMI_RANK", "PMI_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
};
/* A task of a Slurm step: its step's size, which SLURM_NTASKS is not always. */
static const char *const shoal_core_slurm_step_pair[2] = {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS"};

/* Rank and size from the launcher's own variables (Open MPI, PMI/PMIx, Slurm). These are not
 * SHOAL_* knobs: read through the config module's raw lookup rather than a table. Returns the
 * names of the pair read (rank, size), for messages; NULL (outputs untouched) when none is set.
 * A pair that is not a rank below a size (atoi took "abc" for rank 0 and "2junk" for 2, so a
 * process could act as another rank, or the job's root) is logged here, and both outputs are
 * then -1. */
const char *const *shoal_core_launcher_env(int *rank_p, int *nranks_p)
{
    const char *const(*pairs)[2] = shoal_core_launcher_pairs;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_core_launcher_pairs); i++) {
        const char *const *pair = pairs[i];
        if (strcmp(pair[0], "SLURM_PROCID") == 0 &&
            shoal_cfg_getenv_raw("SLURM_STEP_NUM_TASKS") != NULL) {
            /* SLURM_NTASKS is the allocation's where srun runs with --preserve-env (as Slurm's
             * interactive step does): srun -n 2 in an allocation of 4 gave each task
             * SLURM_NTASKS=4, and its 2 ranks waited SHOAL_TIMEOUT_MS for 2 that never came.
             * slurmstepd sets the step's own size in every task. */
            pair = shoal_core_slurm_step_pair;
        }
        const char *r = shoal_cfg_getenv_raw(pair[0]);
        const char *n = shoal_cfg_getenv_raw(pair[1]);
        if (r != NULL && n != NULL) {
            *rank_p = shoal_core_launcher_int(r);
            *nranks_p = shoal_core_launcher_int(n);
            if (*rank_p < 0 || *nranks_p <= 0 || *rank_p >= *nranks_p) {
                shoal_error(INIT, "shoal_comm_init_env: the launcher's %s='%s' and %s='%s' are "
                            "not a rank and a size (whole numbers, 0 <= rank < size)",
                            pair[0], r, pair[1], n);
                *rank_p = -1;
                *nranks_p = -1;
            } else if (strcmp(pair[0], "SLURM_PROCID") == 0 && *nranks_p > 1 &&
                       shoal_cfg_getenv_raw("SLURM_STEP_ID") == NULL) {
                /* Slurm's batch script has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but
                 * is no task of a step: a program started there without srun took itself for
                 * rank 0 of SLURM_NTASKS and waited SHOAL_TIMEOUT_MS (with SHOAL_ROOT) for
                 * ranks nobody started, then blamed the root. */
                shoal_error(INIT, "shoal_comm_init_env: SLURM_PROCID=%s and %s=%s but no "
                            "SLURM_STEP_ID: this is Slurm's batch script, not a task of srun; "
                            "start the %s ranks with srun (srun --mpi=pmix -n %s ...)", r,
                            pair[1], n, n, n);
                *rank_p = -1;
                *nranks_p = -1;
            }
            return pair;
        }
    }
    return NULL;
}

/* The first launcher pair of which only one variable is set (SLURM_PROCID without
 * SLURM_NTASKS): a pair shoal_core_launcher_env skips, named when no other pair gives a rank
 * and size. Returns 0 when there is none. */
int shoal_core_launcher_partial(const char **set_p, const char **unset_p)
{
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_core_launcher_pairs); i++) {
        int r = shoal_cfg_getenv_raw(shoal_core_launcher_pairs[i][0]) != NULL;
        int n = shoal_cfg_getenv_raw(shoal_core_launcher_pairs[i][1]) != NULL;
        if (r != n) {
            *set_p = shoal_core_launcher_pairs[i][r ? 0 : 1];
            *unset_p = shoal_core_launcher_pairs[i][r ? 1 : 0];
            return 1;
        }
    }
    return 0;
}
