/*
 * shoalrun: the local launcher. Starts N ranks of a program on this host with the SHOAL_*
 * variables that shoal_comm_init_env() reads, tags their output with "[rank] ", forwards
 * signals, enforces a timeout, kills the survivors when one rank fails, and returns the worst
 * exit status.
 *
 *   shoalrun -n N [-x VAR=VALUE]... [--timeout SEC] [--grace SEC] [--no-prefix] [--] prog args...
 *
 * Process model: every rank is the leader of its own process group (so that killing a rank
 * kills whatever it started), dies with shoalrun (PR_SET_PDEATHSIG), and gets stdin from
 * /dev/null, except rank 0 which inherits shoalrun's stdin when that is not a terminal.
 * The rendezvous root started by shoal_get_unique_id() lives in this process until it exits.
 *
 * One thread, one poll() loop over a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT,
 * SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT), the ranks' output pipes and, while output waits for
 * them, shoalrun's stdout and stderr; it sleeps until something happens or the next
 * deadline, and never in a write.
 */
#include <shoal.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHOALRUN_MAX_RANKS      1024
#define SHOALRUN_SIGNAL_GRACE_S 3.0   /* after a forwarded signal, before SIGKILL */
#define SHOALRUN_SIGNAL_REPEAT_S 1.0  /* a second signal sooner than this is the same one */
#define SHOALRUN_TIMEOUT_TERM_S 1.0   /* after the timeout's SIGTERM, before SIGKILL */
#define SHOALRUN_DRAIN_S        1.0   /* output still open after all ranks exited */
#define SHOALRUN_LINE_MIN       4096
#define SHOALRUN_LINE_MAX       (1024 * 1024) /* longer lines are split */
#define SHOALRUN_PEND_MAX       (1024 * 1024) /* queued output: above it, ranks' pipes wait */
#define SHOALRUN_EXIT_USAGE     2
#define SHOALRUN_EXIT_TIMEOUT   124
#define SHOALRUN_EXIT_NOEXEC    127

extern char **environ;

typedef struct {
    int fd;         /* read end of the rank's pipe, -1 once closed */
    int out_fd;     /* where its lines go: 1 or 2 */
    char *buf;      /* bytes of the current, unfinished line(s) */
    size_t len;
    size_t cap;
} shoalrun_stream_t;

typedef struct {
    pid_t pid;
    int running;
    int zombie;     /* exited and not yet reaped: its pid, so its group's number, stays ours */
    int code;       /* exit status, 128 + signal for a signal death */
    int killed;     /* SIGKILLed by shoalrun: does not count towards the exit status */
    shoalrun_stream_t out;
    shoalrun_stream_t err;
} shoalrun_rank_t;

/* Output waiting for shoalrun's stdout or stderr to take it. */
typedef struct {
    char *buf;
    size_t len;
    size_t cap;
} shoalrun_pend_t;

typedef struct {
    int nranks;
    int prefix;
    double timeout_s;   /* <= 0: none */
    double grace_s;
    int bind;           /* SHOALRUN_BIND_* */
    const char **xvars; /* -x arguments */
    int nxvars;
    char **argv;        /* the program and its arguments */
} shoalrun_opts_t;

typedef struct {
    shoalrun_opts_t opts;
    shoalrun_rank_t *ranks;
    char *path;          /* resolved program */
    char ***envs;        /* per rank: NULL-terminated environment */
    size_t *env_owned;   /* per rank: entries from this index on are ours to free */
    int sigfd;
    sigset_t orig_mask;
    pid_t self;
    int stdin_inherit;   /* rank 0 keeps stdin */
    struct rlimit nofile0; /* RLIMIT_NOFILE as given: the ranks get it back */
    int nofile_raised;   /* shoalrun raised its own soft limit */
    int cpus[CPU_SETSIZE]; /* CPUs to pin ranks to (--bind-to), in order */
    int ncpus;           /* 0: ranks are not pinned */
    int nrunning;
    int child_exited;    /* a SIGCHLD since the ranks were last looked at */
    int nopen;           /* open streams */
    double timeout_at;   /* 0: none */
    double kill_at;      /* SIGKILL deadline, 0: none */
    double drain_until;  /* stop waiting for output, 0: none */
    int timed_out;
    int signo;           /* first forwarded signal */
    double signal_at;    /* when it came */
    int failed;          /* a rank failed: survivors are on grace */
    int sink_dead[3];    /* writes to fd 1/2 failed: drop output */
    shoalrun_pend_t pend[3]; /* output for fd 1/2 that its reader has not taken yet */
    int sink_fd[3];      /* where output for fd 1/2 goes: 1 for both when they are one file */
    char *scratch;       /* formatted output */
    size_t scratch_cap;
} shoalrun_job_t;

static double shoalrun_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void shoalrun_usage(FILE *f)
{
    fprintf(f,
            "usage: shoalrun -n N [options] [--] program [args...]\n"
            "Start N ranks of program on this host (shoal's local launcher).\n"
            "\n"
            "  -n, --np N          number of ranks (1..%d), required\n"
            "  -x VAR=VALUE        set VAR for every rank (repeatable, the last of a name wins;\n"
            "                      -x VAR passes VAR on)\n"
            "  -p, --prefix        tag each output line with \"[rank] \" (default)\n"
            "      --no-prefix     let ranks write straight to shoalrun's stdout/stderr\n"
            "      --timeout SEC   kill every rank after SEC seconds, exit %d\n"
            "      --grace SEC     after a rank fails, wait SEC seconds for the others to\n"
            "                      exit on their own before killing them (default 10)\n"
            "      --bind-to W     auto (default): pin rank i to the i-th allowed CPU when the\n"
            "                      ranks fit (as mpirun), else none; core: always pin; none\n"
            "  -h, --help          this help\n"
            "\n"
            "Each rank gets SHOAL_UID, SHOAL_RANK, SHOAL_NRANKS, SHOAL_LOCAL_RANK and\n"
            "SHOAL_LOCAL_SIZE. Each rank leads a process group, killed when the job ends.\n"
            "SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every rank, which is\n"
            "killed if still running %g s later; SIGUSR1 and SIGUSR2 are only forwarded;\n"
            "SIGTSTP (^Z) stops the ranks, then shoalrun, and SIGCONT resumes them. The exit\n"
            "status is the worst of the ranks' (128+N for a rank killed by signal N),\n"
            "%d on timeout, %d if program cannot be run.\n",
            SHOALRUN_MAX_RANKS, SHOALRUN_EXIT_TIMEOUT, SHOALRUN_SIGNAL_GRACE_S,
            SHOALRUN_EXIT_TIMEOUT,
            SHOALRUN_EXIT_NOEXEC);
}

static int shoalrun_parse_seconds(const char *s, const char *what, double *out_p)
{
    char *end = NULL;
    double v;

    errno = 0;
    v = strtod(s, &end);
    /* !(in range) and not (out of range): NaN compares false both ways */
    if (errno != 0 || end == s || *end != '\0' || !(v >= 0 && v <= 1e9)) {
        fprintf(stderr, "shoalrun: invalid --%s '%s' (seconds, 0..1e9)\n", what, s);
        return -1;
    }
    *out_p = v;
    return 0;
}

static int shoalrun_parse_np(const char *s, int *out_p)
{
    char *end = NULL;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 1 || v > SHOALRUN_MAX_RANKS) {
        fprintf(stderr, "shoalrun: invalid rank count '%s' (1..%d)\n", s, SHOALRUN_MAX_RANKS);
        return -1;
    }
    *out_p = (int)v;
    return 0;
}

enum { SHOALRUN_OPT_NO_PREFIX = 256, SHOALRUN_OPT_TIMEOUT, SHOALRUN_OPT_GRACE, SHOALRUN_OPT_BIND };
enum { SHOALRUN_BIND_AUTO = 0, SHOALRUN_BIND_CORE, SHOALRUN_BIND_NONE };

static int shoalrun_parse_bind(const char *s, int *out_p)
{
    if (strcmp(s, "auto") == 0) {
        *out_p = SHOALRUN_BIND_AUTO;
    } else if (strcmp(s, "core") == 0) {
        *out_p = SHOALRUN_BIND_CORE;
    } else if (strcmp(s, "none") == 0) {
        *out_p = SHOALRUN_BIND_NONE;
    } else {
        fprintf(stderr, "shoalrun: invalid --bind-to '%s' (core, none or auto)\n", s);
        return -1;
    }
    return 0;
}

/* The variables shoalrun sets for each rank. */
static const char *const shoalrun_env_ours[] = {"SHOAL_UID", "SHOAL_RANK", "SHOAL_NRANKS",
                                                "SHOAL_LOCAL_RANK", "SHOAL_LOCAL_SIZE"};

/* Is the name of entry ("VAR" or "VAR=VALUE") one of shoalrun_env_ours? */
static int shoalrun_env_is_ours(const char *entry)
{
    size_t n = strcspn(entry, "=");

    for (size_t i = 0; i < sizeof(shoalrun_env_ours) / sizeof(shoalrun_env_ours[0]); i++) {
        if (strlen(shoalrun_env_ours[i]) == n && strncmp(entry, shoalrun_env_ours[i], n) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Returns 0 to run, 1 for --help, -1 on a usage error. */
static int shoalrun_opts_parse(shoalrun_opts_t *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {.name = "np", .has_arg = required_argument, .val = 'n'},
        {.name = "prefix", .has_arg = no_argument, .val = 'p'},
        {.name = "no-prefix", .has_arg = no_argument, .val = SHOALRUN_OPT_NO_PREFIX},
        {.name = "timeout", .has_arg = required_argument, .val = SHOALRUN_OPT_TIMEOUT},
        {.name = "grace", .has_arg = required_argument, .val = SHOALRUN_OPT_GRACE},
        {.name = "bind-to", .has_arg = required_argument, .val = SHOALRUN_OPT_BIND},
        {.name = "help", .has_arg = no_argument, .val = 'h'},
        {0},
    };
    int c;

    *o = (shoalrun_opts_t){.nranks = 0, .prefix = 1, .timeout_s = 0, .grace_s = 10.0,
                           .bind = SHOALRUN_BIND_AUTO};
    o->xvars = calloc((size_t)argc, sizeof(*o->xvars));
    if (o->xvars == NULL) {
        fprintf(stderr, "shoalrun: out of memory\n");
        return -1;
    }
    while ((c = getopt_long(argc, argv, "+n:px:h", longopts, NULL)) != -1) {
        int bad = 0;

        switch (c) {
        case 'n': bad = shoalrun_parse_np(optarg, &o->nranks); break;
        case 'p': o->prefix = 1; break;
        case SHOALRUN_OPT_NO_PREFIX: o->prefix = 0; break;
        case SHOALRUN_OPT_TIMEOUT: bad = shoalrun_parse_seconds(optarg, "timeout", &o->timeout_s);
            break;
        case SHOALRUN_OPT_GRACE: bad = shoalrun_parse_seconds(optarg, "grace", &o->grace_s); break;
        case SHOALRUN_OPT_BIND: bad = shoalrun_parse_bind(optarg, &o->bind); break;
        case 'x':
            if (optarg[0] == '\0' || optarg[0] == '=') {
                fprintf(stderr, "shoalrun: invalid -x '%s' (VAR=VALUE expected)\n", optarg);
                bad = -1;
            } else if (shoalrun_env_is_ours(optarg)) {
                /* it went into the environment next to shoalrun's own entry: C's getenv took
                 * the first, Python and sh the last, so ranks disagreed on their rank */
                fprintf(stderr, "shoalrun: -x %.*s: shoalrun sets it for every rank itself\n",
                        (int)strcspn(optarg, "="), optarg);
                bad = -1;
            }
            o->xvars[o->nxvars++] = optarg;
            break;
        case 'h': return 1;
        default: bad = -1; break;
        }
        if (bad != 0) {
            return -1;
        }
    }
    if (o->nranks == 0) {
        fprintf(stderr, "shoalrun: -n N is required\n");
        return -1;
    }
    if (optind >= argc) {
        fprintf(stderr, "shoalrun: no program given\n");
        return -1;
    }
    o->argv = &argv[optind];
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Environment and program path, built before any fork: the rendezvous root may run threads,
 * so a child may only call async-signal-safe functions between fork() and execve().
 */

static int shoalrun_env_name_is(const char *entry, const char *name, size_t name_len)
{
    return strncmp(entry, name, name_len) == 0 && entry[name_len] == '=';
}

/* The value -x VAR=VALUE (or -x VAR: the current value) sets, or NULL. */
static const char *shoalrun_xvar_lookup(const shoalrun_opts_t *o, const char *name)
{
    size_t n = strlen(name);
    const char *val = NULL;

    for (int i = 0; i < o->nxvars; i++) {
        if (shoalrun_env_name_is(o->xvars[i], name, n)) {
            val = o->xvars[i] + n + 1;
        }
    }
    return val;
}

static int shoalrun_env_overridden(const shoalrun_opts_t *o, const char *entry)
{
    size_t n = strcspn(entry, "=");

    if (shoalrun_env_is_ours(entry)) {
        return 1;
    }
    for (int i = 0; i < o->nxvars; i++) {
        if (strncmp(o->xvars[i], entry, n) == 0 &&
            (o->xvars[i][n] == '=' || o->xvars[i][n] == '\0')) {
            return 1;
        }
    }
    return 0;
}

static char *shoalrun_strdupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *shoalrun_strdupf(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;

    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0) {
        s = NULL;
    }
    va_end(ap);
    return s;
}

/* A copy of the environment taken before the first library call: the library removes the
 * secret variables it reads (SHOAL_SECRET, ...) from its process's environment, and the ranks
 * must still get what the user gave shoalrun. Wiped and freed at exit. */
static char **shoalrun_env0;

static int shoalrun_env_snapshot(void)
{
    size_t n = 0;

    while (environ[n] != NULL) {
        n++;
    }
    shoalrun_env0 = calloc(n + 1, sizeof(*shoalrun_env0));
    if (shoalrun_env0 == NULL) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        shoalrun_env0[i] = strdup(environ[i]);
        if (shoalrun_env0[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

static void shoalrun_env_snapshot_free(void)
{
    for (size_t i = 0; shoalrun_env0 != NULL && shoalrun_env0[i] != NULL; i++) {
        explicit_bzero(shoalrun_env0[i], strlen(shoalrun_env0[i]));
        free(shoalrun_env0[i]);
    }
    free(shoalrun_env0);
    shoalrun_env0 = NULL;
}

/* getenv on the snapshot. */
static const char *shoalrun_env0_get(const char *name)
{
    size_t n = strlen(name);

    for (size_t i = 0; shoalrun_env0[i] != NULL; i++) {
        if (strncmp(shoalrun_env0[i], name, n) == 0 && shoalrun_env0[i][n] == '=') {
            return shoalrun_env0[i] + n + 1;
        }
    }
    return NULL;
}

/* The environment (its snapshot) minus what we set, then the -x variables and the SHOAL_*
 * ones; entries from *owned_p on are allocated. */
static char **shoalrun_env_build(const shoalrun_opts_t *o, const char *uid_hex, int rank,
                                 size_t *owned_p)
{
    char **const environ0 = shoalrun_env0;
    size_t nenv = 0, k = 0;
    char **env;

    while (environ0[nenv] != NULL) {
        nenv++;
    }
    env = calloc(nenv + (size_t)o->nxvars + 6, sizeof(*env));
    if (env == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < nenv; i++) {
        if (!shoalrun_env_overridden(o, environ0[i])) {
            env[k++] = environ0[i];
        }
    }
    *owned_p = k;
    for (int i = 0; i < o->nxvars; i++) {
        size_t n = strcspn(o->xvars[i], "=");
        int later = 0;
        /* the last -x of a name wins, as with mpirun; both went into the environment, and
         * C's getenv read the first, Python and sh the last */
        for (int j = i + 1; j < o->nxvars && !later; j++) {
            later = strncmp(o->xvars[j], o->xvars[i], n) == 0 &&
                    (o->xvars[j][n] == '=' || o->xvars[j][n] == '\0');
        }
        if (later) {
            continue;
        }
        if (strchr(o->xvars[i], '=') != NULL) {
            env[k++] = strdup(o->xvars[i]);
        } else if (shoalrun_env0_get(o->xvars[i]) != NULL) {
            env[k++] = shoalrun_strdupf("%s=%s", o->xvars[i], shoalrun_env0_get(o->xvars[i]));
        }
    }
    env[k++] = shoalrun_strdupf("SHOAL_UID=%s", uid_hex);
    env[k++] = shoalrun_strdupf("SHOAL_RANK=%d", rank);
    env[k++] = shoalrun_strdupf("SHOAL_NRANKS=%d", o->nranks);
    env[k++] = shoalrun_strdupf("SHOAL_LOCAL_RANK=%d", rank);
    env[k++] = shoalrun_strdupf("SHOAL_LOCAL_SIZE=%d", o->nranks);
    for (size_t i = *owned_p; i < k; i++) {
        if (env[i] == NULL) {
            return NULL; /* leaked: the launcher is about to exit */
        }
    }
    return env;
}

static int shoalrun_is_executable(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Like execvp's search, with PATH from -x PATH=... if given. */
static char *shoalrun_path_resolve(const shoalrun_opts_t *o, const char *prog)
{
    const char *path = shoalrun_xvar_lookup(o, "PATH");
    const char *p;

    if (strchr(prog, '/') != NULL) {
        return shoalrun_is_executable(prog) ? strdup(prog) : NULL;
    }
    if (path == NULL) {
        path = getenv("PATH");
    }
    if (path == NULL) {
        path = "/usr/local/bin:/usr/bin:/bin";
    }
    for (p = path; ; p += strcspn(p, ":") + 1) {
        size_t n = strcspn(p, ":");
        char *cand = n == 0 ? shoalrun_strdupf("./%s", prog) /* empty entry: the cwd */
                            : shoalrun_strdupf("%.*s/%s", (int)n, p, prog);

        if (cand != NULL && shoalrun_is_executable(cand)) {
            return cand;
        }
        free(cand);
        if (p[n] == '\0') {
            return NULL;
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * Starting the ranks
 */

/* Why execve failed, in words the user can act on; strerror is not async-signal-safe. */
static const char *shoalrun_exec_why(int err)
{
    switch (err) {
    case ENOEXEC: return "not an executable format (a script needs a #! line)";
    case ENOENT: return "no such file, or its #! interpreter or loader is missing";
    case EACCES: return "permission denied (not executable, or a noexec mount)";
    case ETXTBSY: return "the file is open for writing";
    case E2BIG: return "arguments and environment too long";
    case ENOMEM: return "out of memory";
    case ELIBBAD: return "its #! interpreter or loader is corrupt";
    default: return "see execve(2)";
    }
}

static void shoalrun_child_fail(const char *what, const char *why)
{
    static const char msg[] = "shoalrun: rank setup failed: ";

    (void)!write(2, msg, sizeof(msg) - 1);
    (void)!write(2, what, strlen(what));
    if (why != NULL) {
        (void)!write(2, ": ", 2);
        (void)!write(2, why, strlen(why));
    }
    (void)!write(2, "\n", 1);
    _exit(SHOALRUN_EXIT_NOEXEC);
}

/* Runs in the child between fork() and execve(): async-signal-safe calls only. */
/* --bind-to core|auto pins ranks one per allowed CPU (auto, the default: only when they fit).
 * Unpinned ranks forked from one CPU often stay together on it (measured: 2.5-15 us per 8 B
 * AllReduce instead of 0.35-0.5 in 3 of 4 runs on a 2-vCPU VM), so pin, as mpirun does. */
static void shoalrun_plan_binding(shoalrun_job_t *job)
{
    cpu_set_t set;
    int n = 0;

    job->ncpus = 0;
    if (job->opts.bind == SHOALRUN_BIND_NONE || sched_getaffinity(0, sizeof(set), &set) != 0) {
        return;
    }
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &set)) {
            job->cpus[n++] = c;
        }
    }
    if (n == 0 || (job->opts.bind == SHOALRUN_BIND_AUTO && job->opts.nranks > n)) {
        return;
    }
    job->ncpus = n;
}

/* shoalrun holds two pipes per rank and its root a connection per rank: -n 1024 needs some
 * 3100 descriptors, and under the usual soft limit of 1024 a job of more than ~500 ranks
 * failed at "pipe failed: Too many open files" (the help says 1..1024). The soft limit is
 * raised towards the hard one for shoalrun only: the ranks get the limit it was given (a
 * program using select() relies on 1024). */
static void shoalrun_fd_limit(shoalrun_job_t *job)
{
    rlim_t need = 3 * (rlim_t)job->opts.nranks + 64;
    struct rlimit up;

    if (getrlimit(RLIMIT_NOFILE, &job->nofile0) != 0 || job->nofile0.rlim_cur == RLIM_INFINITY ||
        job->nofile0.rlim_cur >= need) {
        return;
    }
    up = job->nofile0;
    up.rlim_cur = up.rlim_max != RLIM_INFINITY && up.rlim_max < need ? up.rlim_max : need;
    job->nofile_raised = up.rlim_cur > job->nofile0.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0;
}

static void shoalrun_child_exec(shoalrun_job_t *job, int rank, int out_w, int err_w)
{
    struct sigaction dfl = {.sa_handler = SIG_DFL};

    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != job->self) {
        _exit(SHOALRUN_EXIT_NOEXEC); /* shoalrun is already gone */
    }
    sigaction(SIGPIPE, &dfl, NULL);
    sigprocmask(SIG_SETMASK, &job->orig_mask, NULL);
    if (job->ncpus > 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(job->cpus[rank % job->ncpus], &one);
        (void)sched_setaffinity(0, sizeof(one), &one); /* best effort: run unpinned otherwise */
    }
    if (rank != 0 || !job->stdin_inherit) {
        int fd = open("/dev/null", O_RDONLY);

        if (fd < 0 || dup2(fd, 0) < 0) {
            shoalrun_child_fail("cannot open /dev/null", NULL);
        }
        if (fd != 0) {
            close(fd);
        }
    }
    if (out_w >= 0 && (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)) {
        shoalrun_child_fail("dup2 failed", NULL);
    }
    if (job->nofile_raised) {
        /* last: the other ranks' pipes, closed by execve, are open until then (open() of
         * /dev/null under the lower limit failed with EMFILE); a raw syscall, as prctl */
        (void)setrlimit(RLIMIT_NOFILE, &job->nofile0);
    }
    execve(job->path, job->opts.argv, job->envs[rank]);
    shoalrun_child_fail(job->path, shoalrun_exec_why(errno));
}

static void shoalrun_stream_init(shoalrun_stream_t *s, int fd, int out_fd)
{
    *s = (shoalrun_stream_t){.fd = fd, .out_fd = out_fd};
}

static void shoalrun_close_pair(int p[2])
{
    for (int i = 0; i < 2; i++) {
        if (p[i] >= 0) {
            close(p[i]);
            p[i] = -1;
        }
    }
}

static int shoalrun_rank_start(shoalrun_job_t *job, int rank)
{
    shoalrun_rank_t *r = &job->ranks[rank];
    int outp[2] = {-1, -1}, errp[2] = {-1, -1};
    pid_t pid;

    if (job->opts.prefix && (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0)) {
        fprintf(stderr, "shoalrun: pipe failed: %s\n", strerror(errno));
        shoalrun_close_pair(outp);
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "shoalrun: fork failed: %s\n", strerror(errno));
        shoalrun_close_pair(outp);
        shoalrun_close_pair(errp);
        return -1;
    }
    if (pid == 0) {
        shoalrun_child_exec(job, rank, outp[1], errp[1]);
    }
    setpgid(pid, pid); /* also done by the child: whichever runs first */
    *r = (shoalrun_rank_t){.pid = pid, .running = 1};
    shoalrun_stream_init(&r->out, outp[0], 1);
    shoalrun_stream_init(&r->err, errp[0], 2);
    if (job->opts.prefix) {
        close(outp[1]);
        close(errp[1]);
        fcntl(outp[0], F_SETFL, O_NONBLOCK);
        fcntl(errp[0], F_SETFL, O_NONBLOCK);
        job->nopen += 2;
    }
    job->nrunning++;
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Output: whole lines, each with its rank's prefix
 */

/* Writes what fd takes now, without blocking, and returns how much that was. fd is the
 * user's (blocking, its open file description maybe shared with the shell: not ours to make
 * non-blocking), so it is written only when poll says it has room, at most PIPE_BUF bytes at
 * a time (what a pipe with room takes whole). A blocking write to a reader that stopped
 * reading (a stuck consumer of `shoalrun ... | prog`, a terminal paused with Ctrl-S) held
 * shoalrun in write(): its --timeout never fired and SIGINT/SIGTERM were not acted on. */
static size_t shoalrun_sink_try(shoalrun_job_t *job, int fd, const char *buf, size_t len)
{
    size_t done = 0;

    while (done < len && !job->sink_dead[fd]) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        size_t chunk = len - done < PIPE_BUF ? len - done : PIPE_BUF;
        ssize_t n;
        int r = poll(&p, 1, 0);

        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 || (p.revents & (POLLERR | POLLNVAL)) != 0) {
            job->sink_dead[fd] = 1;
            break;
        }
        if ((p.revents & (POLLOUT | POLLHUP)) == 0) {
            break; /* no room: the rest waits in job->pend */
        }
        n = write(fd, buf + done, chunk);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno == EAGAIN) {
            break;
        }
        if (n <= 0) {
            job->sink_dead[fd] = 1; /* EPIPE and friends: drop the rest */
            break;
        }
        done += (size_t)n;
    }
    return done;
}

/* Writes buf now as far as fd takes it, and queues the rest for the loop (POLLOUT). */
static void shoalrun_sink_write(shoalrun_job_t *job, int fd, const char *buf, size_t len)
{
    shoalrun_pend_t *q;

    fd = job->sink_fd[fd];
    q = &job->pend[fd];

    if (q->len == 0) {
        size_t n = shoalrun_sink_try(job, fd, buf, len);

        buf += n;
        len -= n;
    }
    if (len == 0 || job->sink_dead[fd]) {
        return;
    }
    if (q->cap - q->len < len) {
        size_t cap = 2 * q->cap > q->len + len ? 2 * q->cap : q->len + len;
        char *b = realloc(q->buf, cap);

        if (b == NULL) {
            return; /* no memory: this piece is lost, not the launcher */
        }
        q->buf = b;
        q->cap = cap;
    }
    memcpy(q->buf + q->len, buf, len);
    q->len += len;
}

/* Writes queued output as far as fd takes it now. */
static void shoalrun_sink_flush(shoalrun_job_t *job, int fd)
{
    shoalrun_pend_t *q = &job->pend[fd];
    size_t n = shoalrun_sink_try(job, fd, q->buf, q->len);

    memmove(q->buf, q->buf + n, q->len - n);
    q->len -= n;
    if (job->sink_dead[fd]) {
        q->len = 0;
    }
}

/* stdout and stderr that are one pipe, terminal or file (2>&1) get one queue, fd 1's: two
 * queues flushed apart would cut one's lines with the other's when the reader lags. */
static void shoalrun_sink_setup(shoalrun_job_t *job)
{
    struct stat a, b;

    job->sink_fd[1] = 1;
    job->sink_fd[2] = 2;
    if (fstat(1, &a) == 0 && fstat(2, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        job->sink_fd[2] = 1;
    }
}

/* shoalrun's own lines while ranks run: through stderr's queue, in order with the ranks'
 * lines, and never blocking the loop. */
static void shoalrun_note(shoalrun_job_t *job, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void shoalrun_note(shoalrun_job_t *job, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n > 0) {
        shoalrun_sink_write(job, 2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
    }
}

static int shoalrun_scratch_reserve(shoalrun_job_t *job, size_t need)
{
    char *p;

    if (need <= job->scratch_cap) {
        return 0;
    }
    p = realloc(job->scratch, need);
    if (p == NULL) {
        return -1;
    }
    job->scratch = p;
    job->scratch_cap = need;
    return 0;
}

/* Emits buf[0, len) (whole lines; a final '\n' is added if missing) with prefixes. */
static void shoalrun_emit(shoalrun_job_t *job, int rank, int fd, const char *buf, size_t len)
{
    char prefix[32];
    int plen = snprintf(prefix, sizeof(prefix), "[%d] ", rank);
    size_t nlines = 1, k = 0;

    for (size_t i = 0; i < len; i++) {
        nlines += buf[i] == '\n';
    }
    if (shoalrun_scratch_reserve(job, len + nlines * (size_t)plen + 1) != 0) {
        shoalrun_sink_write(job, fd, buf, len); /* no memory: unprefixed beats lost */
        return;
    }
    /* one prefix per line, the empty ones too: a loop while i < len dropped an empty last
     * line (a lone "\n" from the pipe gave len 0, and "a\n\n" lost its second line) */
    for (size_t l = 0, i = 0; l < nlines; l++) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl != NULL ? (size_t)(nl - buf) : len;

        memcpy(job->scratch + k, prefix, (size_t)plen);
        k += (size_t)plen;
        memcpy(job->scratch + k, buf + i, end - i);
        k += end - i;
        job->scratch[k++] = '\n';
        i = end + 1;
    }
    shoalrun_sink_write(job, fd, job->scratch, k);
}

static void shoalrun_stream_close(shoalrun_job_t *job, int rank, shoalrun_stream_t *s)
{
    if (s->len > 0) {
        shoalrun_emit(job, rank, s->out_fd, s->buf, s->len);
    }
    close(s->fd);
    free(s->buf);
    *s = (shoalrun_stream_t){.fd = -1, .out_fd = s->out_fd};
    job->nopen--;
}

/* Reads what the pipe holds, prints the complete lines, keeps the rest. */
static void shoalrun_stream_read(shoalrun_job_t *job, int rank, shoalrun_stream_t *s)
{
    for (;;) {
        ssize_t n;
        char *last;

        if (s->cap - s->len < SHOALRUN_LINE_MIN && s->cap < SHOALRUN_LINE_MAX) {
            size_t cap = s->cap == 0 ? 2 * SHOALRUN_LINE_MIN : 2 * s->cap;
            char *p = realloc(s->buf, cap);

            if (p != NULL) {
                s->buf = p;
                s->cap = cap;
            }
        }
        if (s->len == s->cap) { /* a line longer than SHOALRUN_LINE_MAX: split it */
            shoalrun_emit(job, rank, s->out_fd, s->buf, s->len);
            s->len = 0;
            continue;
        }
        n = read(s->fd, s->buf + s->len, s->cap - s->len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno == EAGAIN) {
            return;
        }
        if (n <= 0) {
            shoalrun_stream_close(job, rank, s);
            return;
        }
        s->len += (size_t)n;
        last = memrchr(s->buf, '\n', s->len);
        if (last != NULL) {
            size_t done = (size_t)(last - s->buf) + 1;

            shoalrun_emit(job, rank, s->out_fd, s->buf, done - 1);
            memmove(s->buf, s->buf + done, s->len - done);
            s->len -= done;
        }
        if (job->pend[job->sink_fd[s->out_fd]].len >= SHOALRUN_PEND_MAX) {
            return; /* the rest when the reader has taken some (shoalrun_loop) */
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * Signals, deaths and deadlines
 */

static void shoalrun_signal_rank(shoalrun_rank_t *r, int sig)
{
    if (kill(-r->pid, sig) != 0) {
        kill(r->pid, sig); /* its group is not set up yet */
    }
}

static void shoalrun_signal_all(shoalrun_job_t *job, int sig)
{
    for (int i = 0; i < job->opts.nranks; i++) {
        shoalrun_rank_t *r = &job->ranks[i];

        if (r->running) {
            shoalrun_signal_rank(r, sig);
        } else if (sig == SIGKILL && r->pid > 0 && (r->out.fd >= 0 || r->err.fd >= 0)) {
            kill(-r->pid, SIGKILL); /* what it started still holds its output open */
        }
    }
}

static void shoalrun_kill_deadline(shoalrun_job_t *job, double at)
{
    if (job->kill_at == 0 || at < job->kill_at) {
        job->kill_at = at;
    }
}

static void shoalrun_rank_report(shoalrun_job_t *job, int rank, int st)
{
    shoalrun_rank_t *r = &job->ranks[rank];

    if (WIFSIGNALED(st)) {
        r->code = 128 + WTERMSIG(st);
        if (r->killed) {
            return;
        }
        shoalrun_note(job, "shoalrun: rank %d (pid %d) killed by signal %d (%s)\n", rank,
                      (int)r->pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
    } else {
        r->code = WEXITSTATUS(st);
        if (r->code == 0) {
            return;
        }
        shoalrun_note(job, "shoalrun: rank %d (pid %d) exited with status %d\n", rank,
                      (int)r->pid, r->code);
    }
    if (!job->failed && job->nrunning > 0 && job->signo == 0 && !job->timed_out) {
        job->failed = 1;
        shoalrun_note(job,
                      "shoalrun: waiting up to %g s for the %d other running rank(s) to exit\n",
                      job->opts.grace_s, job->nrunning);
        shoalrun_kill_deadline(job, shoalrun_now() + job->opts.grace_s);
    }
}

/* A rank's exit is read and its status taken, but the rank is not reaped (WNOWAIT): a zombie
 * keeps its pid, and with it the number of the process group it leads, from being given to
 * another process. What the rank started in its group may outlive it, and shoalrun signals that
 * group until the job's end (shoalrun_kill_leftovers reaps the ranks after the last kill). A
 * rank reaped at its exit freed the number: after a pid wraparound, kill(-pid) at the end could
 * reach a stranger's process group, as root anyone's. */
static void shoalrun_reap(shoalrun_job_t *job)
{
    for (int i = 0; i < job->opts.nranks; i++) {
        shoalrun_rank_t *r = &job->ranks[i];
        siginfo_t si;
        int st;

        if (!r->running) {
            continue;
        }
        memset(&si, 0, sizeof(si));
        if (waitid(P_PID, (id_t)r->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
            si.si_pid != r->pid) {
            continue; /* running (or, ECHILD, not ours: cannot happen) */
        }
        st = si.si_code == CLD_EXITED ? W_EXITCODE(si.si_status & 0xff, 0)
             : si.si_code == CLD_DUMPED ? si.si_status | WCOREFLAG
                                        : si.si_status;
        r->running = 0;
        r->zombie = 1;
        job->nrunning--;
        shoalrun_rank_report(job, i, st);
    }
}

static void shoalrun_on_signal(shoalrun_job_t *job, int sig)
{
    if (sig == SIGCHLD) {
        job->child_exited = 1; /* looked at by the loop */
        return;
    }
    if (sig == SIGUSR1 || sig == SIGUSR2) {
        /* A request to the job (Slurm's --signal=USR1@120 before the time limit: checkpoint
         * and stop), as mpirun passes them on; left to its default action it killed
         * shoalrun, the ranks by PR_SET_PDEATHSIG, and left what they started running. */
        for (int i = 0; i < job->opts.nranks; i++) {
            if (job->ranks[i].running) {
                shoalrun_signal_rank(&job->ranks[i], sig);
            }
        }
        return;
    }
    if (sig == SIGTSTP) {
        /* ^Z reaches shoalrun's process group only (each rank leads its own): the ranks
         * stop first, then shoalrun, as a shell expects of a job; a blocked SIGTSTP does not
         * stop us, SIGSTOP does. Left alone, shoalrun stopped and the ranks ran on. */
        shoalrun_signal_all(job, SIGTSTP);
        raise(SIGSTOP);
        return;
    }
    if (sig == SIGCONT) {
        shoalrun_signal_all(job, SIGCONT); /* fg or bg: the ranks go on with us */
        return;
    }
    if (job->signo != 0) {
        if (shoalrun_now() - job->signal_at < SHOALRUN_SIGNAL_REPEAT_S) {
            return; /* the same event twice (e.g. sent to us and to our process group) */
        }
        shoalrun_note(job, "shoalrun: %s again, killing all ranks\n", strsignal(sig));
        shoalrun_kill_deadline(job, shoalrun_now());
        return;
    }
    job->signo = sig;
    job->signal_at = shoalrun_now();
    shoalrun_note(job, "shoalrun: %s, forwarding it to %d rank(s)\n", strsignal(sig),
                  job->nrunning);
    shoalrun_signal_all(job, sig);
    shoalrun_kill_deadline(job, shoalrun_now() + SHOALRUN_SIGNAL_GRACE_S);
}

static void shoalrun_read_signals(shoalrun_job_t *job)
{
    struct signalfd_siginfo si[16];
    ssize_t n;

    while ((n = read(job->sigfd, si, sizeof(si))) > 0) {
        for (size_t i = 0; i < (size_t)n / sizeof(si[0]); i++) {
            shoalrun_on_signal(job, (int)si[i].ssi_signo);
        }
    }
}

static void shoalrun_check_deadlines(shoalrun_job_t *job, double now)
{
    if (job->timeout_at != 0 && now >= job->timeout_at && !job->timed_out) {
        job->timed_out = 1;
        shoalrun_note(job, "shoalrun: timeout after %g s, killing %d running rank(s)\n",
                      job->opts.timeout_s, job->nrunning);
        shoalrun_signal_all(job, SIGTERM);
        shoalrun_kill_deadline(job, now + SHOALRUN_TIMEOUT_TERM_S);
    }
    if (job->kill_at != 0 && now >= job->kill_at) {
        job->kill_at = 0;
        for (int i = 0; i < job->opts.nranks; i++) {
            job->ranks[i].killed |= job->ranks[i].running;
        }
        if (job->nrunning > 0) {
            shoalrun_note(job, "shoalrun: killing %d remaining rank(s)\n", job->nrunning);
        }
        shoalrun_signal_all(job, SIGKILL);
    }
    /* The drain is for what a rank started and left holding its pipes; its clock runs only
     * while the pipes are read. With SHOALRUN_PEND_MAX queued for a reader that lags they are
     * not, and closing them when it ran out dropped what the ranks wrote last (lines lost
     * under `shoalrun ... | slow reader`, exit 0). Told to stop, it runs: what the reader does
     * not take is dropped. */
    if (job->nrunning == 0 && job->nopen > 0 &&
        (job->drain_until == 0 ||
         (job->signo == 0 && !job->timed_out &&
          (job->pend[1].len >= SHOALRUN_PEND_MAX || job->pend[2].len >= SHOALRUN_PEND_MAX)))) {
        job->drain_until = now + SHOALRUN_DRAIN_S;
    }
    if (job->drain_until != 0 && now >= job->drain_until) {
        for (int i = 0; i < job->opts.nranks; i++) {
            if (job->ranks[i].out.fd >= 0) {
                shoalrun_stream_close(job, i, &job->ranks[i].out);
            }
            if (job->ranks[i].err.fd >= 0) {
                shoalrun_stream_close(job, i, &job->ranks[i].err);
            }
        }
    }
}

/* poll() timeout to the nearest deadline, -1 for none. */
static int shoalrun_poll_timeout(const shoalrun_job_t *job, double now)
{
    double at = 0;
    const double cands[] = {job->timed_out ? 0 : job->timeout_at, job->kill_at,
                            job->drain_until};

    for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
        if (cands[i] != 0 && (at == 0 || cands[i] < at)) {
            at = cands[i];
        }
    }
    if (at == 0) {
        return -1;
    }
    if (at <= now) {
        return 0;
    }
    /* a deadline days away (--timeout takes up to 1e9 s) overflowed int: capped, the loop
     * comes back and asks again */
    return (at - now) * 1000.0 >= 3600e3 ? 3600 * 1000 : (int)((at - now) * 1000.0) + 1;
}

/* Output still queued for shoalrun's stdout or stderr. */
static int shoalrun_pending(const shoalrun_job_t *job)
{
    return job->pend[1].len > 0 || job->pend[2].len > 0;
}

static void shoalrun_loop(shoalrun_job_t *job, struct pollfd *pfd, shoalrun_stream_t **smap,
                          int *rmap)
{
    while (job->nrunning > 0 || job->nopen > 0 || shoalrun_pending(job)) {
        int n = 0, nready;

        if (job->nrunning == 0 && job->nopen == 0 && (job->signo != 0 || job->timed_out)) {
            break; /* over, and told to stop: the output its reader does not take is dropped */
        }
        pfd[n++] = (struct pollfd){.fd = job->sigfd, .events = POLLIN};
        for (int fd = 1; fd <= 2; fd++) {
            if (job->pend[fd].len > 0) {
                smap[n] = NULL; /* a sink: rmap holds its fd */
                rmap[n] = fd;
                pfd[n++] = (struct pollfd){.fd = fd, .events = POLLOUT};
            }
        }
        for (int i = 0; i < job->opts.nranks; i++) {
            shoalrun_stream_t *ss[2] = {&job->ranks[i].out, &job->ranks[i].err};

            for (int j = 0; j < 2; j++) {
                /* a reader that lags: the ranks' pipes fill and the ranks wait for it */
                if (ss[j]->fd >= 0 &&
                    job->pend[job->sink_fd[ss[j]->out_fd]].len < SHOALRUN_PEND_MAX) {
                    smap[n] = ss[j];
                    rmap[n] = i;
                    pfd[n++] = (struct pollfd){.fd = ss[j]->fd, .events = POLLIN};
                }
            }
        }
        nready = poll(pfd, (nfds_t)n, shoalrun_poll_timeout(job, shoalrun_now()));
        if (nready < 0 && errno != EINTR) {
            shoalrun_note(job, "shoalrun: poll failed: %s\n", strerror(errno));
            shoalrun_kill_deadline(job, shoalrun_now());
        }
        if (pfd[0].revents != 0) {
            shoalrun_read_signals(job);
        }
        /* after each SIGCHLD, and at each quiet wake-up as well (one per rank: not per line) */
        if (job->child_exited || nready == 0) {
            job->child_exited = 0;
            shoalrun_reap(job);
        }
        for (int k = 1; k < n; k++) {
            if (pfd[k].revents == 0) {
                continue;
            }
            if (smap[k] == NULL) {
                shoalrun_sink_flush(job, rmap[k]);
            } else if (smap[k]->fd >= 0) {
                shoalrun_stream_read(job, rmap[k], smap[k]);
            }
        }
        shoalrun_check_deadlines(job, shoalrun_now());
    }
}

/* The last lines (shoalrun's own, after the loop): up to SHOALRUN_DRAIN_S for the reader to
 * take them, unless the job was stopped. */
static void shoalrun_sink_drain(shoalrun_job_t *job)
{
    double until = shoalrun_now() + SHOALRUN_DRAIN_S;

    while (shoalrun_pending(job) && job->signo == 0 && !job->timed_out &&
           shoalrun_now() < until) {
        struct pollfd p[2];
        int n = 0;

        for (int fd = 1; fd <= 2; fd++) {
            if (job->pend[fd].len > 0) {
                p[n++] = (struct pollfd){.fd = fd, .events = POLLOUT};
            }
        }
        (void)poll(p, (nfds_t)n, 100);
        shoalrun_sink_flush(job, 1);
        shoalrun_sink_flush(job, 2);
    }
}

/* Marks in live[i] the exited ranks whose process group holds a process that is not a zombie
 * (the rank itself is one until reaped), from one pass over /proc. -1 if /proc cannot be read. */
static int shoalrun_live_groups(const shoalrun_job_t *job, char *live)
{
    DIR *d = opendir("/proc");
    struct dirent *e;

    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        char path[64], buf[512], *p;
        long pgrp;
        ssize_t len;
        int fd;

        if (e->d_name[0] < '1' || e->d_name[0] > '9') {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/%.20s/stat", e->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            continue; /* gone meanwhile */
        }
        len = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (len <= 0) {
            continue;
        }
        buf[len] = '\0';
        /* "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses */
        p = strrchr(buf, ')');
        if (p == NULL || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X' ||
            sscanf(p + 3, "%*d %ld", &pgrp) != 1) {
            continue;
        }
        for (int i = 0; i < job->opts.nranks; i++) {
            if (job->ranks[i].zombie && (long)job->ranks[i].pid == pgrp) {
                live[i] = 1;
            }
        }
    }
    closedir(d);
    return 0;
}

/* The job is over: what a rank started in its process group and left running (a background
 * child) went on after shoalrun, orphaned; it is killed now, as the job's end. The group's
 * number is still ours (its leader, the rank, is an unreaped zombie: shoalrun_reap), so the
 * kill reaches no other group; then the ranks are reaped. */
static void shoalrun_kill_leftovers(shoalrun_job_t *job)
{
    char *live = calloc((size_t)job->opts.nranks, 1);
    int known = live != NULL && shoalrun_live_groups(job, live) == 0;

    for (int i = 0; i < job->opts.nranks; i++) {
        shoalrun_rank_t *r = &job->ranks[i];

        if (!r->zombie) {
            continue; /* not started, or still running after the last kill (reaped by init) */
        }
        if (known && live[i]) {
            shoalrun_note(job, "shoalrun: rank %d exited, leaving processes of its group running: "
                          "killing them\n", i);
        }
        kill(-r->pid, SIGKILL); /* without /proc, blindly: the number is the job's */
        (void)waitpid(r->pid, NULL, 0);
        r->zombie = 0;
    }
    free(live);
}

static int shoalrun_exit_code(const shoalrun_job_t *job)
{
    int worst = 0;

    if (job->timed_out) {
        return SHOALRUN_EXIT_TIMEOUT;
    }
    for (int i = 0; i < job->opts.nranks; i++) {
        if (!job->ranks[i].killed && job->ranks[i].code > worst) {
            worst = job->ranks[i].code;
        }
    }
    if (job->signo != 0 && worst < 128 + job->signo) {
        worst = 128 + job->signo;
    }
    if (worst == 0 && job->failed) {
        worst = 1; /* a rank could not be started */
    }
    return worst;
}

/* ---------------------------------------------------------------------------------------
 * Setup
 */

static void shoalrun_uid_hex(const shoal_uid_t *uid, char *hex)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < SHOAL_UID_BYTES; i++) {
        unsigned char b = (unsigned char)uid->internal[i];

        hex[2 * i] = digits[b >> 4];
        hex[2 * i + 1] = digits[b & 0xf];
    }
    hex[2 * SHOAL_UID_BYTES] = '\0';
}

/* Blocks the signals we wait for, before any thread exists, so that only the signalfd
 * sees them. */
static int shoalrun_signals_setup(shoalrun_job_t *job)
{
    sigset_t set;
    struct sigaction ign = {.sa_handler = SIG_IGN}, dfl = {.sa_handler = SIG_DFL};

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT); /* ^\: it killed shoalrun, and the ranks only by PDEATHSIG */
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGTSTP);
    sigaddset(&set, SIGCONT);
    if (sigprocmask(SIG_BLOCK, &set, &job->orig_mask) != 0) {
        fprintf(stderr, "shoalrun: sigprocmask failed: %s\n", strerror(errno));
        return -1;
    }
    sigaction(SIGPIPE, &ign, NULL);
    /* SIGCHLD ignored, as a parent may pass it through exec, has the kernel reap the ranks
     * itself: waitpid never saw them, and shoalrun waited for them forever (past --timeout,
     * and SIGTERM only). The ranks inherit the default too. */
    sigaction(SIGCHLD, &dfl, NULL);
    job->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (job->sigfd < 0) {
        fprintf(stderr, "shoalrun: signalfd failed: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

static int shoalrun_job_prepare(shoalrun_job_t *job)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    shoal_uid_t uid;
    shoal_status_t status;

    job->path = shoalrun_path_resolve(&job->opts, job->opts.argv[0]);
    if (job->path == NULL) {
        fprintf(stderr, "shoalrun: %s: command not found or not executable\n",
                job->opts.argv[0]);
        return SHOALRUN_EXIT_NOEXEC;
    }
    if (shoalrun_signals_setup(job) != 0) {
        return 1;
    }
    /* Every rank runs on this host: the root listens on loopback only, unless the user asked
     * otherwise. Only this process's value (the ranks' environment is the snapshot); their
     * own roots, of split communicators, pick loopback by themselves when every member is on
     * one host (SHOAL_BOOT_BIND=auto). */
    setenv("SHOAL_BOOT_BIND", "loopback", 0);
    /* The root waits as long as the ranks live (their own SHOAL_TIMEOUT_MS bounds their
     * joins, shoalrun's life the root's): with the user's, it gave up SHOAL_TIMEOUT_MS (300 s)
     * after shoalrun started when no rank had joined yet, so ranks that set up longer before
     * their init could not form the job, and every job whose ranks never join through it
     * (torch's rendezvous) logged "root: no progress ... giving up". Only this process's
     * value: the ranks' environment is the snapshot. */
    setenv("SHOAL_TIMEOUT_MS", "inf", 1);
    status = shoal_get_unique_id(&uid);
    if (status != SHOAL_OK) {
        fprintf(stderr, "shoalrun: shoal_get_unique_id failed: %s\n", shoal_strerror(status));
        return 1;
    }
    shoalrun_uid_hex(&uid, hex);
    job->ranks = calloc((size_t)job->opts.nranks, sizeof(*job->ranks));
    job->envs = calloc((size_t)job->opts.nranks, sizeof(*job->envs));
    job->env_owned = calloc((size_t)job->opts.nranks, sizeof(*job->env_owned));
    if (job->ranks == NULL || job->envs == NULL || job->env_owned == NULL) {
        fprintf(stderr, "shoalrun: out of memory\n");
        return 1;
    }
    for (int i = 0; i < job->opts.nranks; i++) {
        /* Not started (yet): no pid, no pipes. calloc's zeros were fd 0 and pid 0, so when a
         * rank could not be started the loop polled and read shoalrun's stdin for the ranks
         * after it, and the final SIGKILL of "what it started" was kill(-0): shoalrun's own
         * process group, the shell or script that ran it included. */
        shoalrun_stream_init(&job->ranks[i].out, -1, 1);
        shoalrun_stream_init(&job->ranks[i].err, -1, 2);
    }
    for (int i = 0; i < job->opts.nranks; i++) {
        job->envs[i] = shoalrun_env_build(&job->opts, hex, i, &job->env_owned[i]);
        if (job->envs[i] == NULL) {
            fprintf(stderr, "shoalrun: out of memory\n");
            return 1;
        }
    }
    explicit_bzero(hex, sizeof(hex));
    explicit_bzero(&uid, sizeof(uid));
    job->self = getpid();
    job->stdin_inherit = !isatty(0);
    shoalrun_sink_setup(job);
    shoalrun_plan_binding(job);
    shoalrun_fd_limit(job);
    return 0;
}

static int shoalrun_job_run(shoalrun_job_t *job)
{
    size_t nfds = 3 + 2 * (size_t)job->opts.nranks; /* signals, stdout, stderr, the ranks' */
    struct pollfd *pfd = calloc(nfds, sizeof(*pfd));
    shoalrun_stream_t **smap = calloc(nfds, sizeof(*smap));
    int *rmap = calloc(nfds, sizeof(*rmap));

    if (pfd == NULL || smap == NULL || rmap == NULL) {
        fprintf(stderr, "shoalrun: out of memory\n");
        return 1;
    }
    if (job->opts.timeout_s > 0) {
        job->timeout_at = shoalrun_now() + job->opts.timeout_s;
    }
    for (int i = 0; i < job->opts.nranks; i++) {
        if (shoalrun_rank_start(job, i) != 0) {
            job->failed = 1;
            shoalrun_kill_deadline(job, shoalrun_now());
            break;
        }
    }
    shoalrun_loop(job, pfd, smap, rmap);
    shoalrun_kill_leftovers(job);
    shoalrun_sink_drain(job);
    free(pfd);
    free(smap);
    free(rmap);
    return shoalrun_exit_code(job);
}

static void shoalrun_job_free(shoalrun_job_t *job)
{
    for (int i = 0; job->envs != NULL && i < job->opts.nranks; i++) {
        for (size_t k = job->env_owned[i]; job->envs[i] != NULL && job->envs[i][k] != NULL; k++) {
            if (strncmp(job->envs[i][k], "SHOAL_UID=", 10) == 0) {
                /* Holds the job secret; explicit_bzero cannot be optimised away. */
                explicit_bzero(job->envs[i][k], strlen(job->envs[i][k]));
            }
            free(job->envs[i][k]);
        }
        free(job->envs[i]);
    }
    free(job->envs);
    free(job->env_owned);
    free(job->ranks);
    free(job->path);
    free(job->scratch);
    free(job->pend[1].buf);
    free(job->pend[2].buf);
    free(job->opts.xvars);
    shoalrun_env_snapshot_free();
    if (job->sigfd >= 0) {
        close(job->sigfd);
    }
}

/* fds 0-2 that the caller closed (shoalrun ... >&-) are /dev/null here: the signalfd took the
 * number 1, the ranks' output was queued for it and polled for room it never had, and the job
 * never ended; a closed stdin gave rank 0 the signalfd, closed by execve. */
static void shoalrun_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY); /* the lowest: fd */

            if (nfd >= 0 && nfd != fd) {
                close(nfd);
            }
        }
    }
}

int main(int argc, char **argv)
{
    shoalrun_job_t job = {.sigfd = -1, .sink_fd = {0, 1, 2}};
    int rc;

    shoalrun_std_fds();
    if (shoalrun_env_snapshot() != 0) {
        fprintf(stderr, "shoalrun: out of memory\n");
        return 1;
    }
    rc = shoalrun_opts_parse(&job.opts, argc, argv);
    if (rc != 0) {
        shoalrun_usage(rc > 0 ? stdout : stderr);
        free(job.opts.xvars);
        shoalrun_env_snapshot_free();
        return rc > 0 ? 0 : SHOALRUN_EXIT_USAGE;
    }
    rc = shoalrun_job_prepare(&job);
    if (rc == 0) {
        rc = shoalrun_job_run(&job);
    }
    shoalrun_job_free(&job);
    return rc;
}
