/* Unit tests of shoald's pieces that the shell tests cannot reach: Prometheus label escaping
 * (a newline cannot come from a checked name), names, the config file parser (values, tenant
 * fields, errors), the exposition of jobs with no ranks and the tenant filter, and the
 * per-process entries of a job dropped once their process is gone, and the minute loop with
 * a slow or absent database: a slow commit not counted as failed, a minute held while the
 * ledger could not be opened not billed over, a stop that waits for a slow commit. */
#include "agent/agent.h"
#include "qos/pace_page.h"
#include "tests/tap.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int conf_load(const char *text, shoald_config_t *cfg)
{
    char path[] = "/tmp/test_agent_unit.XXXXXX";
    int fd = mkstemp(path), ret;
    FILE *fp;

    if (fd < 0)
        return -2;
    fp = fdopen(fd, "w");
    fputs(text, fp);
    fclose(fp);
    ret = shoald_config_load(cfg, path) == SHOAL_OK ? 0 : -1;
    unlink(path);
    return ret;
}

static void test_escape(void)
{
    shoald_text_t t = {0};

    shoald_text_label(&t, "a\"b\\c\nd");
    tap_is_str(t.buf, "\"a\\\"b\\\\c\\nd\"", "label values: quote, backslash, newline escaped");
    free(t.buf);
    memset(&t, 0, sizeof(t));
    shoald_text_label(&t, "");
    tap_is_str(t.buf, "\"\"", "an empty label value");
    free(t.buf);
}

static void test_names(void)
{
    char longname[SHOALD_NAME_MAX];

    memset(longname, 'x', sizeof(longname));
    tap_ok(shoald_name_ok("acme", SHOALD_NAME_MAX), "a plain name is fine");
    tap_ok(shoald_name_ok("we\"ird\\job", SHOALD_NAME_MAX), "quote and backslash are allowed");
    tap_ok(!shoald_name_ok("", SHOALD_NAME_MAX), "an empty name is refused");
    tap_ok(!shoald_name_ok("a b", SHOALD_NAME_MAX), "a space is refused");
    tap_ok(!shoald_name_ok("a\nb", SHOALD_NAME_MAX), "a newline is refused");
    tap_ok(!shoald_name_ok("a;b", SHOALD_NAME_MAX), "a semicolon is refused");
    tap_ok(!shoald_name_ok(longname, sizeof(longname)), "a name without its NUL is refused");
}

static void test_config(void)
{
    shoald_config_t cfg;
    shoald_tenant_t *t;

    tap_is_int(conf_load("", &cfg), 0, "an empty file gives the defaults");
    tap_is_str(cfg.listen, "/run/shoal/shoald.sock", "default socket");
    tap_is_str(cfg.http, "127.0.0.1:9464", "default http address: loopback, port 9464");
    tap_is_int(cfg.minute_seconds, 60, "default minute");
    tap_is_str(cfg.ledger_url, "sqlite:///var/lib/shoal/ledger.db", "default ledger");
    tap_is_int(cfg.socket_mode, 0666, "default socket mode 0666");
    shoald_config_free(&cfg);

    tap_is_int(conf_load("# a comment\n  minute_seconds = 5 \nsocket_mode=0660\n"
                         "tenant.acme.uids=1000, 1001\ntenant.acme.class=spot\n"
                         "export_ranks=yes\nreg_timeout=250ms\n", &cfg), 0,
               "values, blanks and comments parse");
    t = shoald_config_tenant(&cfg, "acme");
    tap_ok(t != NULL && t->nuids == 2 && t->uids[0] == 1000 && t->uids[1] == 1001,
           "tenant uids parse");
    tap_ok(t != NULL && strcmp(t->class_name, "spot") == 0, "tenant class parses");
    tap_ok(cfg.minute_seconds == 5 && cfg.socket_mode == 0660 && cfg.export_ranks == 1 &&
           cfg.reg_timeout_ms == 250, "fixed keys parse");
    shoald_config_free(&cfg);

    tap_is_int(conf_load("minute_seconds=5\nnope=1\n", &cfg), -1, "an unknown key fails");
    shoald_config_free(&cfg);
    tap_is_int(conf_load("minute_seconds=five\n", &cfg), -1, "a bad integer fails");
    shoald_config_free(&cfg);
    tap_is_int(conf_load("tenant.acme.uids=1000,x\n", &cfg), -1, "a bad uid list fails");
    shoald_config_free(&cfg);
    tap_is_int(conf_load("tenant.acme.uids=1000, \n", &cfg), -1,
               "a uid list ending in a comma fails");
    shoald_config_free(&cfg);
    tap_ok(conf_load("tenant.a.dscp=010\ntenant.b.dscp=08\ntenant.c.dscp=0x2e\n", &cfg) == 0 &&
               shoald_config_tenant(&cfg, "a")->tc_dscp == 10 &&
               shoald_config_tenant(&cfg, "b")->tc_dscp == 8 &&
               shoald_config_tenant(&cfg, "c")->tc_dscp == 46,
           "a DSCP is decimal (010 is 10, 08 is 8), or hex after 0x");
    shoald_config_free(&cfg);
    tap_is_int(conf_load("tenant.a b.class=spot\n", &cfg), -1, "a bad tenant name fails");
    shoald_config_free(&cfg);
    tap_is_int(conf_load("tenant.acme.color=red\n", &cfg), -1, "an unknown tenant field fails");
    shoald_config_free(&cfg);
    tap_is_int(conf_load("socket_mode=999\n", &cfg), -1, "a socket mode that is not octal fails");
    shoald_config_free(&cfg);
    tap_is_int(conf_load("just text\n", &cfg), -1, "a line without '=' fails");
    shoald_config_free(&cfg);
    /* the agent kept 63 characters of it: hosts whose names share those made one cursor key */
    tap_ok(conf_load("ledger_url=none\nhostname=node-with-a-long-name-0123456789abcdef-"
                     "0123456789abcdef-host-17-rack-4\n", &cfg) == 0 &&
           shoald_config_keys(&cfg) == SHOAL_ERR_INVALID_ARG,
           "a hostname longer than the agent keeps (63 characters) fails");
    shoald_config_free(&cfg);
}

/* shoald_config_load(path) in a child given 5 s: its exit status (0 loaded, 1 refused), or
 * -1 when it did not end by itself (a wait without end). */
static int conf_load_path(const char *path)
{
    shoald_config_t cfg;
    int status;
    pid_t pid = fork();

    if (pid == 0) {
        alarm(5);
        _exit(shoald_config_load(&cfg, path) == SHOAL_OK ? 0 : 1);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

/* A configuration that is not a regular file: a directory (shoald -c /etc/shoal/) read as an
 * empty file, so the agent started on the defaults without a word; a FIFO without a writer
 * had the agent wait for one for ever, before its first log line. Both are errors now. */
static void test_config_not_file(void)
{
    char dir[] = "/tmp/test_agent_unit.XXXXXX", fifo[sizeof(dir) + 8];

    if (mkdtemp(dir) == NULL) {
        tap_skip(2, "mkdtemp failed");
        return;
    }
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    tap_is_int(conf_load_path(dir), 1, "a directory given as the config file is an error");
    tap_is_int(mkfifo(fifo, 0600) == 0 ? conf_load_path(fifo) : 1, 1,
               "a FIFO given as the config file is an error, at once");
    unlink(fifo);
    rmdir(dir);
}

static void test_render(void)
{
    shoald_config_t cfg;
    shoald_job_t ja = {0}, jb = {0};
    shoald_text_t t = {0};
    shoald_t a = {0};

    conf_load("", &cfg);
    a.cfg = &cfg;
    snprintf(ja.tenant, sizeof(ja.tenant), "acme");
    snprintf(ja.job, sizeof(ja.job), "train");
    ja.gone[SHOALD_CTR_OPS] = 42;
    ja.gone[SHOALD_CTR_SENT + SHOAL_METER_TL_TCP * SHOAL_METER_NLOC + 1] = 1000;
    snprintf(jb.tenant, sizeof(jb.tenant), "beta");
    snprintf(jb.job, sizeof(jb.job), "secret-project");
    ja.next = &jb;
    a.jobs = &ja;
    shoald_prom_render(&a, NULL, &t);
    tap_ok(t.buf != NULL && strstr(t.buf, "shoal_collective_ops_total{tenant=\"acme\","
                                   "shoal_job=\"train\",collective=\"allreduce\"} 42\n") != NULL,
           "a gone rank's counters are exported");
    tap_ok(t.buf != NULL && strstr(t.buf, "# TYPE shoal_payload_bytes_total counter\n") != NULL,
           "counters are typed counter");
    tap_ok(t.buf != NULL && strstr(t.buf, "secret-project") != NULL &&
           strstr(t.buf, "shoal_registrations_refused_total{reason=\"tenant_mismatch\"} 0") !=
           NULL, "the provider's view has every tenant and the agent's series");
    free(t.buf);
    memset(&t, 0, sizeof(t));
    shoald_prom_render(&a, "acme", &t);
    tap_ok(t.buf != NULL && strstr(t.buf, "secret-project") == NULL &&
           strstr(t.buf, "beta") == NULL && strstr(t.buf, "shoal_registrations") == NULL &&
           strstr(t.buf, "shoal_job=\"train\"") != NULL,
           "acme's view has neither beta's job nor the agent's series");
    free(t.buf);
    shoald_config_free(&cfg);
}

/* A cursor an agent stored before the cuda_ipc transport (4 transports, SHOALD_CUR_NCOUNTERS_V1
 * entries) or before the nccl one (5, SHOALD_CUR_NCOUNTERS_V2) is read back with every entry
 * in its place; the entries of the transports it lacked start at 0. And the cuda_ipc and nccl
 * bytes are exported as transports cuda_ipc and nccl, same host only. */
static void test_old_cursor(int ntl_old, const char *before, int check_prom)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", url[128];
    const uint8_t key[SHOALD_KEY_BYTES] = {1};
    shoal_ledger_t *l = NULL;
    shoal_ledger_cursor_t c = {0};
    shoald_config_t cfg;
    shoald_page_t p = {0};
    shoald_t a = {0};
    shoald_job_t j = {0};
    shoald_text_t t = {0};
    const char *url0;
    const int nv1 = ntl_old * SHOAL_METER_NLOC, ipc = SHOAL_METER_TL_CUDA_IPC;
    const int nccl = SHOAL_METER_TL_NCCL;
    int ok = 1;

    if (mkdtemp(dir) == NULL) {
        tap_bail("mkdtemp failed");
    }
    snprintf(url, sizeof(url), "sqlite://%s/ledger.db", dir);
    tap_ok(shoal_ledger_open(url, key, sizeof(key), &l) == SHOAL_OK, "a sqlite ledger opens");
    snprintf(c.key, sizeof(c.key), "host/1/2/0");
    c.ncounters = SHOALD_CUR_NCOUNTERS_NTL(ntl_old);
    for (int i = 0; i < c.ncounters; i++) {
        c.counters[i] = 1000 + (uint64_t)i;
    }
    ok = l != NULL && shoal_ledger_commit(l, NULL, 0, &c, 1) == SHOAL_OK;
    shoal_ledger_close(l);
    conf_load("", &cfg);
    url0 = cfg.ledger_url;
    cfg.ledger_url = url;
    a.cfg = &cfg;
    /* the agent's own ledger (its thread) */
    shoald_minute_init(&a);
    snprintf(p.key, sizeof(p.key), "%s", c.key);
    if (ok) {
        shoald_page_cursor(&a, &p);
    }
    shoald_minute_fini(&a);
    ok = ok && p.cursor_known;
    for (int i = 0; i < SHOAL_METER_NCOLL + nv1 && ok; i++) {
        ok = p.billed[i] == 1000 + (uint64_t)i; /* ops, then the old transports' sent */
    }
    for (int i = 0; i < nv1 && ok; i++) {
        ok = p.billed[SHOALD_CTR_RECV + i] == 1000 + (uint64_t)(SHOAL_METER_NCOLL + nv1 + i);
    }
    for (int tl = ntl_old; tl < SHOALD_NTL; tl++) {
        for (int l2 = 0; l2 < SHOAL_METER_NLOC && ok; l2++) {
            ok = p.billed[SHOALD_CTR_SENT + tl * SHOAL_METER_NLOC + l2] == 0 &&
                 p.billed[SHOALD_CTR_RECV + tl * SHOAL_METER_NLOC + l2] == 0;
        }
    }
    ok = ok && p.billed[SHOALD_CTR_COLL_NS] == 1000 + (uint64_t)(SHOAL_METER_NCOLL + 2 * nv1) &&
         p.billed[SHOALD_CTR_ABORTS] == 1000 + (uint64_t)(SHOAL_METER_NCOLL + 2 * nv1 + 3) &&
         p.billed[SHOALD_CUR_BILLED_NS] == 1000 + (uint64_t)(c.ncounters - 1);
    tap_ok(ok, "a cursor written before %s resumes with every counter in its place", before);
    snprintf(url, sizeof(url), "rm -rf '%s'", dir);
    if (system(url) != 0) {
        tap_diag("could not remove %s", dir);
    }

    cfg.ledger_url = url0;
    if (!check_prom) {
        shoald_config_free(&cfg);
        return;
    }
    snprintf(j.tenant, sizeof(j.tenant), "acme");
    snprintf(j.job, sizeof(j.job), "train");
    j.gone[SHOALD_CTR_SENT + ipc * SHOAL_METER_NLOC + SHOAL_METER_SAME_HOST] = 4096;
    j.gone[SHOALD_CTR_RECV + nccl * SHOAL_METER_NLOC + SHOAL_METER_SAME_HOST] = 1800042;
    a.jobs = &j;
    a.ledger = NULL;
    shoald_prom_render(&a, NULL, &t);
    tap_ok(t.buf != NULL && strstr(t.buf, "shoal_payload_bytes_total{tenant=\"acme\",shoal_job="
                                   "\"train\",transport=\"cuda_ipc\",locality=\"same_host\","
                                   "direction=\"sent\"} 4096\n") != NULL &&
           strstr(t.buf, "transport=\"cuda_ipc\",locality=\"other_host\"") == NULL,
           "cuda_ipc bytes are exported as transport cuda_ipc, same host only");
    tap_ok(t.buf != NULL && strstr(t.buf, "shoal_payload_bytes_total{tenant=\"acme\",shoal_job="
                                   "\"train\",transport=\"nccl\",locality=\"same_host\","
                                   "direction=\"received\"} 1800042\n") != NULL &&
           strstr(t.buf, "shoal_payload_bytes_total{tenant=\"acme\",shoal_job=\"train\","
                         "transport=\"nccl\",locality=\"same_host\",direction=\"sent\"} 0\n")
               != NULL &&
           strstr(t.buf, "transport=\"nccl\",locality=\"other_host\"") == NULL,
           "nccl (delegate) bytes are exported as transport nccl, same host only");
    free(t.buf);
    shoald_config_free(&cfg);
}

/* A job that always has a live rank kept an entry per process that ever registered in it:
 * the collect drops a gone process's entry (its signals stay in the exported sums) and keeps
 * a live one's. */
static void test_procs_gone(void)
{
    shoald_config_t cfg;
    shoald_job_t j = {0};
    shoald_proc_t *dead = calloc(1, sizeof(*dead)), *live = calloc(1, sizeof(*live));
    shoald_text_t t = {0};
    shoald_t a = {0};
    pid_t pid = fork();

    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0); /* a pid that runs nothing now */
    conf_load("", &cfg);
    a.cfg = &cfg;
    snprintf(j.tenant, sizeof(j.tenant), "acme");
    snprintf(j.job, sizeof(j.job), "svc");
    dead->pid = pid;
    dead->v[SHOALD_ABUSE_AUTH_FAILED] = 3;
    live->pid = getpid();
    live->start_ns = shoald_proc_start_ns(getpid());
    live->v[SHOALD_ABUSE_AUTH_FAILED] = 1;
    live->next = dead;
    j.procs = live;
    a.jobs = &j;
    shoald_pages_collect(&a);
    tap_ok(a.jobs == &j && j.procs == live && live->next == NULL,
           "a gone process's entry is dropped, a live one's kept");
    shoald_prom_render(&a, NULL, &t);
    tap_ok(t.buf != NULL && strstr(t.buf, "shoal_join_auth_failures_total{tenant=\"acme\","
                                   "shoal_job=\"svc\"} 4\n") != NULL,
           "the dropped process's signals stay in the job's sum");
    free(t.buf);
    free(live);
    shoald_config_free(&cfg);
}

/* Every communicator of a process declares the process's GPUs: two pages of one process with
 * 2 GPUs each, living [1 s, 11 s) and [5 s, 21 s), are 2 x 20 GPU-seconds (2 x 26 were
 * exported), and stay so once the collect folds them into the job's gone pages. */
static void test_gpu_once(void)
{
    static const char *const series =
        "shoal_allocated_gpu_seconds_total{tenant=\"acme\",shoal_job=\"gpu\"} ";
    shoald_config_t cfg;
    shoald_job_t *j = calloc(1, sizeof(*j));
    shoald_proc_t *pr = calloc(1, sizeof(*pr));
    shoald_page_t *pg[2] = {calloc(1, sizeof(shoald_page_t)), calloc(1, sizeof(shoald_page_t))};
    const uint64_t life[2][2] = {{1000000000ull, 11000000000ull},
                                 {5000000000ull, 21000000000ull}};
    shoald_text_t t = {0};
    shoald_t a = {0};
    const char *v;
    char val[32];
    pid_t pid = fork();

    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0); /* a pid that runs nothing now */
    conf_load("", &cfg);
    a.cfg = &cfg;
    snprintf(j->tenant, sizeof(j->tenant), "acme");
    snprintf(j->job, sizeof(j->job), "gpu");
    j->last_minute = -1;
    pr->pid = pid;
    pr->npages = 2;
    j->procs = pr;
    for (int i = 0; i < 2; i++) {
        pg[i]->job = j;
        pg[i]->map = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ, MAP_SHARED | MAP_ANONYMOUS,
                          -1, 0);
        pg[i]->conn_fd = pg[i]->pidfd = -1;
        pg[i]->pid = pid;
        pg[i]->ngpus = 2;
        pg[i]->proc = pr;
        pg[i]->final = 1;
        pg[i]->cursor_known = 1;
        pg[i]->created_ns = life[i][0];
        pg[i]->end_ns = life[i][1];
        pg[i]->billed[SHOALD_CUR_BILLED_NS] = life[i][1]; /* billed to its end */
    }
    pg[0]->next = pg[1];
    j->pages = pg[0];
    a.jobs = j;
    a.npages = 2;
    shoald_prom_render(&a, NULL, &t);
    v = t.buf != NULL ? strstr(t.buf, series) : NULL;
    snprintf(val, sizeof(val), "(none)");
    if (v != NULL)
        sscanf(v + strlen(series), "%31s", val);
    tap_is_str(val, "40.000", "one process's two pages: its 2 GPUs x 20 s, counted once");
    free(t.buf);
    memset(&t, 0, sizeof(t));
    shoald_pages_collect(&a);
    shoald_prom_render(&a, NULL, &t);
    v = t.buf != NULL ? strstr(t.buf, series) : NULL;
    snprintf(val, sizeof(val), "(none)");
    if (v != NULL)
        sscanf(v + strlen(series), "%31s", val);
    tap_ok(a.jobs == j && j->pages == NULL && a.npages == 0, "both pages are collected");
    tap_is_str(val, "40.000", "the job's GPU-seconds stay 40 once they are gone");
    free(t.buf);
    shoald_pages_free(&a);
    shoald_config_free(&cfg);
}

static int span_all(const shoald_page_t *q, void *arg, uint64_t *s, uint64_t *e)
{
    (void)arg;
    *s = q->created_ns;
    *e = q->created_ns + 10000000000ull; /* 10 s */
    return 1;
}

/* The agent's own view of a rank's GPUs (billing trusted the job's SHOAL_METER_GPUS or
 * CUDA_VISIBLE_DEVICES: a job that declared none paid no GPU-seconds): the distinct device
 * files PREFIX<N> a process holds open, not nvidiactl or nvidia-uvm; a gone process (its
 * /proc/PID/fd unreadable) keeps what it declared; the minute bills the most of both, the
 * exported series what the rank declares. */
static void test_gpus_observed(void)
{
    static const char *const names[] = {"nvidia0", "nvidia1", "nvidia2", "nvidiactl",
                                        "nvidia-uvm", "nvidia1x"};
    char dir[] = "/tmp/test_agent_gpus.XXXXXX", path[256], prefix[128];
    int fds[7], nfd = 0, i, okc = 1;
    shoald_config_t cfg;
    shoald_job_t j = {0};
    shoald_proc_t me = {0}, dead = {0};
    shoald_page_t pme = {0}, pdead = {0};
    shoald_t a = {0};
    pid_t pid = fork();

    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0); /* a pid that runs nothing now */
    if (mkdtemp(dir) == NULL) {
        tap_skip(9, "mkdtemp failed");
        return;
    }
    for (i = 0; i < (int)SHOAL_ARRAY_SIZE(names); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        fds[nfd] = open(path, O_RDWR | O_CREAT, 0600);
        okc = okc && fds[nfd] >= 0;
        nfd++;
    }
    snprintf(path, sizeof(path), "%s/nvidia0", dir);
    fds[nfd++] = open(path, O_RDONLY); /* the same GPU twice */
    close(fds[2]);                      /* nvidia2 exists but is not held */
    fds[2] = -1;
    snprintf(prefix, sizeof(prefix), "%s/nvidia", dir);
    tap_is_int(okc ? shoald_proc_gpus_open(getpid(), prefix) : -2, 2,
               "nvidia0 (twice) and nvidia1 are 2 GPUs; nvidiactl, nvidia-uvm, nvidia1x none");
    tap_is_int(shoald_proc_gpus_open(pid, prefix), -1, "a gone process: -1");
    tap_is_int(conf_load("gpu_device_prefix=dev/nvidia\n", &cfg), -1,
               "a gpu_device_prefix that is not absolute fails");
    shoald_config_free(&cfg);
    snprintf(path, sizeof(path), "gpu_device_prefix=%s\n", prefix);
    conf_load(path, &cfg);
    a.cfg = &cfg;
    snprintf(j.tenant, sizeof(j.tenant), "acme");
    snprintf(j.job, sizeof(j.job), "gpus");
    j.last_minute = -1;
    me.pid = getpid();
    me.start_ns = shoald_proc_start_ns(getpid());
    dead.pid = pid;
    me.next = &dead;
    j.procs = &me;
    pme.job = pdead.job = &j;
    pme.proc = &me;
    pme.pid = getpid();
    pme.ngpus = 0; /* declares none, holds 2 */
    pdead.proc = &dead;
    pdead.pid = pid;
    pdead.ngpus = 1; /* declares 1, gone */
    pme.created_ns = pdead.created_ns = 1000000000ull;
    pme.next = &pdead;
    j.pages = &pme;
    a.jobs = &j;
    shoald_gpus_sample(&a, NULL);
    tap_ok(me.gpus_seen == 2 && dead.gpus_seen == 0, "a sample sees 2 GPUs held, none of the "
           "gone process (seen %d, %d)", (int)me.gpus_seen, (int)dead.gpus_seen);
    tap_ok(shoald_proc_billed_gpu_seconds(&pme, span_all, NULL) == 20.0 &&
           shoald_proc_gpu_seconds(&pme, span_all, NULL) == 0.0,
           "declared none, holds 2: billed 2 x 10 s (the exported series: declared, 0)");
    tap_ok(shoald_proc_billed_gpu_seconds(&pdead, span_all, NULL) == 10.0,
           "a gone process keeps its declared 1 GPU: 10 GPU-seconds");
    for (i = 0; i < nfd; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
    }
    shoald_gpus_sample(&a, NULL);
    tap_ok(me.gpus_seen == 2 && me.gpus_last == 0, "GPUs closed within the minute: the "
           "minute still bills the most it saw");
    shoald_gpus_minute_done(&a);
    tap_ok(shoald_proc_billed_gpu_seconds(&pme, span_all, NULL) == 0.0,
           "the next minute starts at the last sample (none)");
    pme.ngpus = 2;
    snprintf(path, sizeof(path), "%s/nvidia0", dir);
    fds[0] = open(path, O_RDONLY);
    shoald_gpus_sample(&a, &pme);
    tap_ok(shoald_proc_billed_gpu_seconds(&pme, span_all, NULL) == 20.0,
           "declared 2, holds 1: billed 2");
    close(fds[0]);
    for (i = 0; i < (int)SHOAL_ARRAY_SIZE(names); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    shoald_config_free(&cfg);
}

/* Sampled only at the registration and the minute's end, GPUs a rank opened after its
 * registration and closed before the minute ended were never seen: the agent's loop samples
 * six times a minute (shoald_gpus_tick); gpu_device_prefix=none samples nothing. */
static void test_gpus_tick(void)
{
    char dir[] = "/tmp/test_agent_gpus.XXXXXX", path[256], conf[256];
    shoald_config_t cfg;
    shoald_job_t j = {0};
    shoald_proc_t me = {0};
    shoald_page_t pme = {0};
    shoald_t a = {0};
    int fds[2], w;

    if (mkdtemp(dir) == NULL) {
        tap_skip(3, "mkdtemp failed");
        return;
    }
    snprintf(conf, sizeof(conf), "minute_seconds=1\ngpu_device_prefix=%s/nvidia\n", dir);
    conf_load(conf, &cfg);
    a.cfg = &cfg;
    snprintf(j.tenant, sizeof(j.tenant), "acme");
    snprintf(j.job, sizeof(j.job), "tick");
    me.pid = getpid();
    me.start_ns = shoald_proc_start_ns(getpid());
    j.procs = &me;
    pme.job = &j;
    pme.proc = &me;
    pme.pid = getpid();
    pme.created_ns = 1000000000ull;
    j.pages = &pme;
    a.jobs = &j;
    shoald_gpus_tick(&a); /* the first: none held */
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/nvidia%d", dir, i);
        fds[i] = open(path, O_RDWR | O_CREAT, 0600);
    }
    w = shoald_gpus_wait_ms(&a);
    tap_ok(w > 0 && w <= 1000 / 6 + 1, "the next sample within a sixth of the minute (%d ms)", w);
    usleep(200000);
    shoald_gpus_tick(&a);
    for (int i = 0; i < 2; i++) {
        close(fds[i]);
        snprintf(path, sizeof(path), "%s/nvidia%d", dir, i);
        unlink(path);
    }
    rmdir(dir);
    tap_ok(me.gpus_seen == 2, "2 GPUs held between the registration and the minute's end are "
           "seen (%d)", (int)me.gpus_seen);
    shoald_config_free(&cfg);
    conf_load("gpu_device_prefix=none\n", &cfg);
    tap_is_int(shoald_gpus_wait_ms(&a), -1, "gpu_device_prefix=none: no samples");
    shoald_config_free(&cfg);
}

/* A tenant keeps at most 256 jobs without ranks, dropping the one gone longest (job_retention's
 * doc). The collect dropped the one made first instead (the last in the list): a long job that
 * had just ended among a tenant's 256 short ones lost its series at once, while jobs gone for
 * an hour stayed. 257 empty jobs: the first made ended 1 s ago, one in the middle 100 s ago. */
static void test_trim_gone_longest(void)
{
    const uint64_t now = shoal_time_ns();
    shoald_job_t *jobs[257], *j;
    shoald_config_t cfg;
    shoald_t a = {0};
    int first_kept = 0, middle_kept = 0, n = 0;

    conf_load("", &cfg);
    a.cfg = &cfg;
    for (int i = 0; i < 257; i++) { /* jobs[0] made first: last in the list */
        jobs[i] = calloc(1, sizeof(*jobs[i]));
        if (jobs[i] == NULL)
            tap_bail("out of memory");
        snprintf(jobs[i]->tenant, sizeof(jobs[i]->tenant), "acme");
        snprintf(jobs[i]->job, sizeof(jobs[i]->job), "sweep-%d", i);
        jobs[i]->last_minute = -1;
        jobs[i]->empty_since_ns = now - 10000000000ull;
        jobs[i]->next = a.jobs;
        a.jobs = jobs[i];
    }
    jobs[0]->empty_since_ns = now - 1000000000ull;
    jobs[100]->empty_since_ns = now - 100000000000ull;
    shoald_pages_collect(&a);
    for (j = a.jobs; j != NULL; j = j->next) {
        n++;
        first_kept += j == jobs[0];
        middle_kept += j == jobs[100];
    }
    tap_ok(n == 256 && first_kept && !middle_kept, "257 jobs without ranks: the one gone longest "
           "is dropped, not the one made first (%d kept, first %d, gone longest %d)", n,
           first_kept, middle_kept);
    shoald_pages_free(&a);
    shoald_config_free(&cfg);
}

/* An agent of the minute loop alone (minutes of 2 s) whose ledger is url and state_dir dir
 * (never the host's own spool); *url0 keeps cfg's own, for minute_cleanup. */
static void minute_agent(shoald_t *a, shoald_config_t *cfg, const char *url, const char *dir,
                         const char **url0)
{
    char text[256];

    snprintf(text, sizeof(text), "minute_seconds=2\nstate_dir=%s\n", dir);
    conf_load(text, cfg);
    *url0 = cfg->ledger_url;
    cfg->ledger_url = url;
    a->cfg = cfg;
    snprintf(a->host_key, sizeof(a->host_key), "unit");
    shoald_minute_init(a); /* opens (creates) the ledger where it can */
    a->rejoin_until_ns = 0;
}

/* Job name of tenant acme, whose rank failed: a minute's record without pages. */
static shoald_job_t *minute_job(const char *name)
{
    shoald_job_t *j = calloc(1, sizeof(*j));

    if (j == NULL)
        tap_bail("out of memory");
    snprintf(j->tenant, sizeof(j->tenant), "acme");
    snprintf(j->job, sizeof(j->job), "%s", name);
    snprintf(j->class_name, sizeof(j->class_name), "reserved");
    j->last_minute = -1;
    j->failed_platform = 1;
    return j;
}

/* Removes dir; cfg gets its own ledger url back and is freed. */
static void minute_cleanup(const char *dir, shoald_config_t *cfg, const char *url0)
{
    char cmd[160];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", dir);
    cfg->ledger_url = url0;
    shoald_config_free(cfg);
}

/* A job's minutes are billed in its class (reserved, or spot for a spot credential). A job
 * kept without ranks (job_retention) kept the class of its first run: the same job name run
 * again within the hour with another class (spot, then reserved) was billed in the old one.
 * A page that registers into a job without ranks and with nothing left to bill sets it. */
static void test_job_class_rerun(void)
{
    shoal_meter_page_t snap;
    shoald_config_t cfg;
    shoald_job_t *j = minute_job("rerun");
    shoald_page_t *p = NULL;
    shoald_t a = {0};
    void *map = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1,
                     0);

    if (map == MAP_FAILED)
        tap_bail("mmap failed");
    conf_load("ledger_url=none\n", &cfg);
    a.cfg = &cfg;
    snprintf(j->class_name, sizeof(j->class_name), "spot"); /* its first run, gone */
    j->failed_platform = 0;
    j->empty_since_ns = shoal_time_ns();
    a.jobs = j;
    memset(&snap, 0, sizeof(snap));
    snprintf(snap.tenant, sizeof(snap.tenant), "acme");
    snprintf(snap.job, sizeof(snap.job), "rerun");
    snap.nranks = 1;
    snap.created_unix_ns = shoald_unix_ns();
    tap_ok(shoald_page_add(&a, &snap, map, -1, -1, getpid(), getuid(), getgid(), "reserved",
                           &p) == SHOAL_OK && p->job == j && strcmp(j->class_name, "reserved") == 0,
           "the job's name run again as reserved after a spot run is billed reserved (%s)",
           j->class_name);
    shoald_pages_free(&a);
    shoald_config_free(&cfg);
}

/* A commit that takes longer than the loop waits for it (here: another connection holds the
 * SQLite write lock for 400 ms) is slow, not failed: it was counted in
 * shoal_ledger_commit_failures_total, at each retry while it ran. The minute is written once
 * the database answers, and no failure is counted. */
static void test_slow_commit(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", url[128], path[128];
    shoald_config_t cfg;
    shoal_ledger_t *l = NULL;
    sqlite3 *db = NULL;
    shoald_t a = {0};
    const char *url0;
    uint64_t until;
    int locked;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(url, sizeof(url), "sqlite://%s/ledger.db", dir);
    snprintf(path, sizeof(path), "%s/ledger.db", dir);
    minute_agent(&a, &cfg, url, dir, &url0);
    a.jobs = minute_job("slow");
    locked = sqlite3_open(path, &db) == SQLITE_OK &&
             sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK;
    a.next_boundary = 0;
    shoald_minute_tick(&a); /* the commit waits for the lock, the loop for 100 ms */
    tap_ok(locked && a.ledger != NULL && a.npending == 1,
           "with the write lock held elsewhere, the minute's commit is still waiting");
    usleep(400000);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db);
    until = shoal_deadline_ns(5000);
    while (a.npending > 0 && !shoal_deadline_passed(until)) {
        usleep(20000);
        shoald_ledger_retry(&a);
    }
    tap_ok(a.npending == 0 && a.ledger_commits == 1 && a.ledger_failures == 0,
           "a slow commit is written and not counted as a failure (%u pending, %llu commits, "
           "%llu failures)", a.npending, (unsigned long long)a.ledger_commits,
           (unsigned long long)a.ledger_failures);
    shoald_minute_fini(&a);
    shoald_pages_free(&a);
    tap_ok(shoal_ledger_open_reader(url, NULL, 0, &l) == SHOAL_OK &&
               shoal_ledger_last_minute(l, "acme", "slow", "unit") >= 0,
           "the slow minute is in the ledger");
    shoal_ledger_close(l);
    minute_cleanup(dir, &cfg, url0);
}

static int held_minutes_cb(const shoal_ledger_record_t *rec, void *arg)
{
    int64_t *m = arg; /* count, distinct (they come by seq), max */

    m[0]++;
    m[2] = rec->minute > m[2] ? rec->minute : m[2];
    return 0;
}

/* The agent starts while the database cannot be opened, and a rank of a job fails: the
 * minute's record (the failure) is held in memory. When the ledger opens at the next minute,
 * the job's last minute was read from the ledger, which does not have the held one yet: the
 * job's running rank was billed again from its start, over the held minute, that commit was
 * refused as a duplicate and every record of it moved after the held one, into the future
 * (a minute's records then came after the minute's end). */
static void test_held_minute(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", url[160], sub[128];
    shoald_config_t cfg;
    shoald_job_t *j = minute_job("held");
    shoald_page_t *p = calloc(1, sizeof(*p));
    shoal_ledger_t *l = NULL;
    int64_t m[3] = {0, 0, -1}, now_s, boundary, last;
    shoald_t a = {0};
    const char *url0;
    uint64_t until;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(sub, sizeof(sub), "%s/db", dir);
    snprintf(url, sizeof(url), "sqlite://%s/ledger.db", sub); /* its directory is not there */
    minute_agent(&a, &cfg, url, dir, &url0);
    now_s = (int64_t)(shoald_unix_ns() / 1000000000ull);
    p->job = j;
    p->map = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    p->conn_fd = p->pidfd = -1;
    p->ngpus = 1;
    p->final = 1;
    p->created_ns = (uint64_t)(now_s - 7) * 1000000000ull;
    p->end_ns = (uint64_t)(now_s + 100) * 1000000000ull; /* it ends later: not read */
    snprintf(p->key, sizeof(p->key), "unit:1:held:0:%llu", (unsigned long long)p->created_ns);
    j->pages = p;
    a.jobs = j;
    a.npages = 1;
    a.next_boundary = 0;
    shoald_minute_tick(&a); /* the failure's minute, held: no ledger */
    boundary = a.next_boundary;
    tap_ok(a.ledger == NULL && a.npending == 1 && !p->cursor_known,
           "without a ledger, the minute of a rank's failure is held in memory");
    /* the database is there now (made here, so the agent's open is quick) */
    mkdir(sub, 0700);
    if (shoal_ledger_open(url, cfg.ledger_key, sizeof(cfg.ledger_key), &l) == SHOAL_OK)
        shoal_ledger_close(l);
    l = NULL;
    while ((int64_t)(shoald_unix_ns() / 1000000000ull) < boundary)
        usleep(20000);
    a.ledger_next_try_ns = 0; /* the boundary's tick opens it, as a retry could have later */
    shoald_minute_tick(&a);
    last = a.next_boundary - 2 * 2; /* the minute that tick billed */
    until = shoal_deadline_ns(5000);
    while (a.npending > 0 && !shoal_deadline_passed(until)) {
        usleep(20000);
        a.ledger_next_try_ns = a.ledger_next_try_ns != 0 ? 1 : 0;
        shoald_ledger_retry(&a);
    }
    tap_ok(a.ledger != NULL && a.npending == 0 && a.ledger_records >= 2,
           "the ledger opens at the next minute and takes the held minute and the new ones");
    shoald_minute_fini(&a);
    shoald_pages_free(&a);
    if (shoal_ledger_open_reader(url, NULL, 0, &l) == SHOAL_OK)
        shoal_ledger_each(l, INT64_MIN, INT64_MAX, "acme", "held", held_minutes_cb, m);
    shoal_ledger_close(l);
    tap_ok(m[0] >= 2 && m[2] <= last,
           "no record of the job is moved past the minute billed last (%lld records, the last "
           "at %lld, billed up to %lld)", (long long)m[0], (long long)m[2], (long long)last);
    minute_cleanup(dir, &cfg, url0);
}

static void *unlock_later(void *arg)
{
    sqlite3 *db = arg;

    usleep(400000);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db);
    return NULL;
}

/* The agent stops while a minute's commit waits for a slow database (the write lock held
 * elsewhere for 400 ms): the stop gave it 100 ms, then left the ledger's thread detached, to
 * be killed by the exit with the commit unwritten (the last minutes of ranks that ended, and
 * their failures, were lost: no cursor brings them back) or to run on beside the exit's
 * handlers. The stop waits for it, within a bound. */
static void test_slow_stop(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", url[128], path[128];
    shoald_config_t cfg;
    shoal_ledger_t *l = NULL;
    sqlite3 *db = NULL;
    shoald_t a = {0};
    pthread_t th;
    const char *url0;
    int locked, started = 0;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(url, sizeof(url), "sqlite://%s/ledger.db", dir);
    snprintf(path, sizeof(path), "%s/ledger.db", dir);
    minute_agent(&a, &cfg, url, dir, &url0);
    a.jobs = minute_job("stop");
    locked = sqlite3_open(path, &db) == SQLITE_OK &&
             sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK;
    a.next_boundary = 0;
    shoald_minute_tick(&a);
    if (locked)
        started = pthread_create(&th, NULL, unlock_later, db) == 0;
    tap_ok(started && a.npending == 1, "a minute's commit waits for the database at the stop");
    shoald_minute_fini(&a); /* the stop */
    shoald_pages_free(&a);
    tap_ok(shoal_ledger_open_reader(url, NULL, 0, &l) == SHOAL_OK &&
               shoal_ledger_last_minute(l, "acme", "stop", "unit") >= 0,
           "the stop waited for the slow commit: the minute and its failure are in the ledger");
    shoal_ledger_close(l);
    if (started)
        pthread_join(th, NULL);
    minute_cleanup(dir, &cfg, url0);
}

static int spool_minutes_cb(const shoal_ledger_record_t *rec, void *arg)
{
    int64_t *m = arg; /* records, failures */

    m[0]++;
    m[1] += (int64_t)rec->failed_platform;
    return 0;
}

/* The agent stops while the database is down (its directory is not there): the minute of a
 * rank's failure, held in memory, was dropped, though the log said that the next agent bills
 * it (no cursor holds a failure, nor the last minutes of a rank that ended). It goes to the
 * spool, STATE_DIR/ledger.spool (mode 0600), which the next agent writes at its start, once. */
static void test_stop_spool(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", url[160], sub[128], spool[160];
    shoald_config_t cfg, cfg2;
    shoal_ledger_t *l = NULL;
    int64_t m[2] = {0, 0};
    shoald_t a = {0}, b = {0};
    const char *url0, *url1;
    struct stat sb;
    unsigned held;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(sub, sizeof(sub), "%s/db", dir);
    snprintf(url, sizeof(url), "sqlite://%s/ledger.db", sub); /* its directory is not there */
    snprintf(spool, sizeof(spool), "%s/ledger.spool", dir);
    minute_agent(&a, &cfg, url, dir, &url0);
    a.jobs = minute_job("spool");
    a.next_boundary = 0;
    shoald_minute_tick(&a); /* the failure's minute, held: no ledger */
    held = a.npending;
    shoald_minute_fini(&a); /* the stop, the database still down */
    shoald_pages_free(&a);
    tap_ok(held == 1 && stat(spool, &sb) == 0 && S_ISREG(sb.st_mode) &&
               (sb.st_mode & 07777) == 0600 && sb.st_uid == geteuid(),
           "stopped with the database down: the held minute is in the spool, mode 0600");
    mkdir(sub, 0700); /* the database is back */
    minute_agent(&b, &cfg2, url, dir, &url1); /* opens the ledger: the spool first */
    tap_ok(b.ledger != NULL && b.nspooled == 0 && b.ledger_records == 1 &&
               stat(spool, &sb) != 0 && errno == ENOENT,
           "the next agent writes the spooled minute at its start and removes the spool");
    shoald_minute_fini(&b);
    shoald_pages_free(&b);
    if (shoal_ledger_open_reader(url, NULL, 0, &l) == SHOAL_OK)
        shoal_ledger_each(l, INT64_MIN, INT64_MAX, "acme", "spool", spool_minutes_cb, m);
    shoal_ledger_close(l);
    tap_ok(m[0] == 1 && m[1] == 1, "the ledger has the minute once, with its failure (%lld "
           "records, %lld failures)", (long long)m[0], (long long)m[1]);
    cfg2.ledger_url = url1;
    shoald_config_free(&cfg2);
    minute_cleanup(dir, &cfg, url0);
}

static int shift_minutes_cb(const shoal_ledger_record_t *rec, void *arg)
{
    char *buf = arg; /* "MINUTE:OPS " per record of host unit, by seq */
    size_t len = strlen(buf);

    if (strcmp(rec->host, "unit") == 0)
        snprintf(buf + len, 256 - len, "%lld:%llu ", (long long)(rec->minute - 1000000000),
                 (unsigned long long)rec->ops);
    return 0;
}

/* A batch of three minutes of a job (4, 6 and 8 s after T; the minutes an agent missed get
 * a record each) meets a ledger where another writer with the same host name holds minute 6:
 * only that record moves, after the job's others (to 10). Every record at or before the
 * stored minute was moved, one minute each (4 to 8, 6 to 10, 8 to 12): the job's time of
 * minutes nobody held billed minutes later than it ran. (The batch comes from a spool here;
 * the held batches of a running agent take the same path.) */
static void test_shift_taken_only(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", url[160], got[256] = "";
    shoald_config_t cfg, cfg2;
    shoal_ledger_record_t recs[3], other;
    shoald_batch_t b = {0};
    shoal_ledger_t *l = NULL;
    shoald_t a0 = {0}, a = {0};
    const char *url0;
    int saved, stored = 0;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(url, sizeof(url), "sqlite://%s/ledger.db", dir);
    snprintf(got, sizeof(got), "state_dir=%s\nminute_seconds=2\n", dir);
    conf_load(got, &cfg);
    got[0] = '\0';
    memset(recs, 0, sizeof(recs));
    for (int i = 0; i < 3; i++) {
        snprintf(recs[i].tenant, sizeof(recs[i].tenant), "acme");
        snprintf(recs[i].job, sizeof(recs[i].job), "shift");
        snprintf(recs[i].qos_class, sizeof(recs[i].qos_class), "reserved");
        snprintf(recs[i].host, sizeof(recs[i].host), "unit");
        recs[i].minute = 1000000000 + 4 + 2 * i;
        recs[i].gpu_seconds = 2.0;
        recs[i].ops = (uint64_t)(i + 1);
    }
    other = recs[1];
    other.ops = 99;
    b.minute = recs[2].minute;
    b.recs = recs;
    b.nrecs = 3;
    a0.cfg = &cfg;
    snprintf(a0.host_key, sizeof(a0.host_key), "unit");
    saved = shoald_spool_save(&a0, &b, NULL) == SHOAL_OK;
    if (shoal_ledger_open(url, cfg.ledger_key, sizeof(cfg.ledger_key), &l) == SHOAL_OK)
        stored = shoal_ledger_commit(l, &other, 1, NULL, 0) == SHOAL_OK;
    shoal_ledger_close(l);
    l = NULL;
    minute_agent(&a, &cfg2, url, dir, &url0); /* writes the spool at its start */
    tap_ok(saved && stored && a.ledger != NULL && a.nspooled == 0,
           "a spooled batch that meets another writer's minute is written");
    shoald_minute_fini(&a);
    shoald_pages_free(&a);
    if (shoal_ledger_open_reader(url, NULL, 0, &l) == SHOAL_OK)
        shoal_ledger_each(l, INT64_MIN, INT64_MAX, "acme", "shift", shift_minutes_cb, got);
    shoal_ledger_close(l);
    tap_is_str(got, "6:99 4:1 10:2 8:3 ",
               "only the record whose minute was taken moves (after the job's others)");
    shoald_config_free(&cfg);
    minute_cleanup(dir, &cfg2, url0);
}

/* A host name of more than 32 characters (host key: 23 of them, '~' and a hash): a page that
 * resumed from its cursor under the older key (the name's first 32 characters) deletes that
 * cursor in the batch of its next minute. Spooled at a stop with the database down, that batch
 * was refused whole at the next start ("a cursor of another host"), put aside and never
 * billed: the minute was lost. */
static void test_spool_legacy_key(void)
{
    static const char host[] = "gpu-node-0042.rack-17.zone-b.example.internal";
    char dir[] = "/tmp/agent_unit.XXXXXX", url[160], text[256];
    shoald_config_t cfg, cfg2;
    shoal_ledger_record_t rec;
    shoal_ledger_cursor_t curs[2];
    shoald_batch_t b = {0};
    shoald_t a0 = {0}, a = {0};
    int saved;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(url, sizeof(url), "sqlite://%s/ledger.db", dir);
    snprintf(text, sizeof(text), "state_dir=%s\nminute_seconds=2\n", dir);
    conf_load(text, &cfg);
    a0.cfg = &cfg;
    snprintf(a0.hostname, sizeof(a0.hostname), "%s", host);
    shoald_host_key(&a0);
    memset(&rec, 0, sizeof(rec));
    snprintf(rec.tenant, sizeof(rec.tenant), "acme");
    snprintf(rec.job, sizeof(rec.job), "legacy");
    snprintf(rec.qos_class, sizeof(rec.qos_class), "reserved");
    snprintf(rec.host, sizeof(rec.host), "%s", a0.host_key);
    rec.minute = 1000000000;
    rec.gpu_seconds = 2.0;
    rec.ops = 7;
    memset(curs, 0, sizeof(curs));
    snprintf(curs[0].key, sizeof(curs[0].key), "%s:4242:1:0:7", a0.host_key);
    snprintf(curs[0].tenant, sizeof(curs[0].tenant), "acme");
    snprintf(curs[0].job, sizeof(curs[0].job), "legacy");
    curs[0].ncounters = 1;
    curs[0].counters[0] = 7;
    snprintf(curs[1].key, sizeof(curs[1].key), "%.32s:4242:1:0:7", host);
    curs[1].ncounters = -1;
    b.minute = rec.minute;
    b.recs = &rec;
    b.nrecs = 1;
    b.curs = curs;
    b.ncurs = 2;
    saved = shoald_spool_save(&a0, &b, NULL) == SHOAL_OK;
    conf_load(text, &cfg2);
    a.cfg = &cfg2;
    cfg2.ledger_url = url;
    snprintf(a.hostname, sizeof(a.hostname), "%s", host);
    shoald_host_key(&a);
    shoald_minute_init(&a); /* loads the spool, writes it to the ledger */
    tap_ok(saved && a.ledger != NULL && a.nspooled == 0 && a.ledger_records == 1,
           "a spooled batch that deletes a cursor under its older key (host name of %zu "
           "characters) is written at the next start (%llu records)", strlen(host),
           (unsigned long long)a.ledger_records);
    shoald_minute_fini(&a);
    shoald_pages_free(&a);
    cfg2.ledger_url = NULL;
    shoald_config_free(&cfg2);
    minute_cleanup(dir, &cfg, cfg.ledger_url);
}

/* The agent's rates page for a tenant whose name starts with '.' (the library's %t takes it):
 * none was made, so such a tenant ran unpaced while it took a share from the others. */
static void test_qos_dot_tenant(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", conf[256], path[300];
    const char *names[2] = {".x", "acme"};
    shoald_config_t cfg;
    shoald_t a = {0};
    int made = 0;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(conf, sizeof(conf), "qos_rates_dir=%s/qos\nqos_capacity_shm=100m\n", dir);
    conf_load(conf, &cfg);
    a.cfg = &cfg;
    if (shoald_qos_start(&a) != SHOAL_OK || a.qos == NULL)
        tap_bail("no QoS arbiter");
    for (int i = 0; i < 2; i++) {
        shoald_job_t *j = minute_job(names[i]);
        shoald_page_t *p = calloc(1, sizeof(*p));
        p->map = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p->map == MAP_FAILED)
            tap_bail("mmap failed");
        snprintf(j->tenant, sizeof(j->tenant), "%s", names[i]);
        p->job = j;
        shoald_qos_page_register(&a, p, (const shoal_meter_page_t *)p->map, 0, 0);
        snprintf(path, sizeof(path), "%s/qos/%s.rate", dir, names[i]);
        made += access(path, R_OK) == 0;
        munmap((void *)p->map, SHOAL_METER_PAGE_BYTES);
        free(p);
        free(j);
    }
    shoald_qos_stop(&a);
    tap_ok(made == 2, "the agent makes a rates page for tenants '.x' and 'acme' (%d of 2)", made);
    snprintf(path, sizeof(path), "rm -rf '%s'", dir);
    if (system(path) != 0)
        tap_diag("could not remove %s", dir);
    shoald_config_free(&cfg);
}

/* qos_tc with more than 64 tenants that name a classifier: tc got classes for 64, while the
 * shares were divided among all of them (each class got less of the link, part of it went to
 * no class), and nothing said so. A stand-in for shoal-tc.sh records its arguments. */
static void test_qos_tc_many(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", script[300], args[300], line[256];
    char *conf = malloc(70 * 64 + 1024);
    shoald_config_t cfg;
    shoald_t a = {0};
    tap_log_t lg;
    FILE *f;
    int logged, warned, nargs = 0, rate_ok = 0;

    if (conf == NULL || mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(script, sizeof(script), "%s/tc.sh", dir);
    snprintf(args, sizeof(args), "%s/args", dir);
    f = fopen(script, "w");
    if (f == NULL)
        tap_bail("cannot write %s", script);
    fprintf(f, "#!/bin/sh\n[ \"$1\" = setup ] && printf '%%s\\n' \"$@\" > '%s'\nexit 0\n", args);
    fclose(f);
    chmod(script, 0700);
    int off = snprintf(conf, 1024, "qos_rates_dir=%s/qos\nqos_tc=%s\nqos_tc_dev=lo\n"
                       "qos_tc_link_rate=1gbit\n", dir, script);
    for (int i = 0; i < 70; i++)
        off += snprintf(conf + off, 64, "tenant.t%d.dscp=%d\n", i, 10 + i % 40);
    logged = tap_log_begin(&lg) == 0;
    conf_load(conf, &cfg);
    a.cfg = &cfg;
    (void)shoald_qos_start(&a);
    tap_log_end(&lg);
    warned = logged ? tap_log_count(&lg, "70 tenants name a classifier, tc takes 64", NULL) : -1;
    tap_log_close(&lg);
    f = fopen(args, "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        nargs++;
        /* 97% of 1 Gbit/s by weight among the 64 classes, not 70 */
        rate_ok += strstr(line, ",rate=15156250bit,") != NULL;
    }
    if (f != NULL)
        fclose(f);
    shoald_qos_stop(&a);
    tap_ok(warned == 1 && nargs == 3 + 64 && rate_ok == 64,
           "70 tenants with a classifier: tc gets 64 classes, each 97%% / 64 of the link, and "
           "a warning names the 6 left out (%d warnings, %d arguments, %d rates right)", warned,
           nargs, rate_ok);
    snprintf(line, sizeof(line), "rm -rf '%s'", dir);
    if (system(line) != 0)
        tap_diag("could not remove %s", dir);
    shoald_config_free(&cfg);
    free(conf);
}

/* ---- the QoS arbiter's pages (src/agent/agent_qos.c) ---- */

/* A QoS arbiter with rates pages in DIR/qos: cfg from conf (qos_rates_dir added), with the
 * capacities given when not 0 (values a config file cannot hold); a filled. */
static void qos_begin(char *dir, const char *conf, size_t shm, size_t net, shoald_config_t *cfg,
                      shoald_t *a)
{
    char text[512];

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(text, sizeof(text), "qos_rates_dir=%s/qos\n%s", dir, conf);
    if (conf_load(text, cfg) != 0)
        tap_bail("bad configuration %s", text);
    if (shm != 0)
        cfg->qos_capacity_shm = shm;
    if (net != 0)
        cfg->qos_capacity_net = net;
    memset(a, 0, sizeof(*a));
    a->cfg = cfg;
    if (shoald_qos_start(a) != SHOAL_OK || a->qos == NULL)
        tap_bail("no QoS arbiter");
}

static void qos_end(char *dir, shoald_config_t *cfg, shoald_t *a)
{
    char cmd[160];

    shoald_qos_stop(a);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", dir);
    shoald_config_free(cfg);
}

/* A live page of tenant's job (not in a->jobs), pid and pidfd given. */
static shoald_page_t *qos_page(const char *tenant, pid_t pid, int pidfd)
{
    shoald_page_t *p = calloc(1, sizeof(*p));

    if (p == NULL)
        tap_bail("out of memory");
    p->map = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p->map == MAP_FAILED)
        tap_bail("mmap failed");
    p->job = minute_job("train");
    snprintf(p->job->tenant, sizeof(p->job->tenant), "%s", tenant);
    p->pid = pid;
    p->pidfd = pidfd;
    return p;
}

static void qos_page_free(shoald_page_t *p)
{
    munmap((void *)p->map, SHOAL_METER_PAGE_BYTES);
    free(p->job);
    free(p->proc);
    free(p);
}

/* The rate DIR/qos/TENANT.rate holds; 0 when there is no such page. */
static uint64_t qos_rate(const char *dir, const char *tenant)
{
    char path[300];
    uint64_t rate = 0;
    int fd;

    snprintf(path, sizeof(path), "%s/qos/%s.rate", dir, tenant);
    fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    if (pread(fd, &rate, sizeof(rate), offsetof(shoal_qos_rates_page_t, rate)) !=
        (ssize_t)sizeof(rate))
        rate = 0;
    close(fd);
    return rate;
}

/* qos_capacity_shm near 2^64 (a "no limit worth the name" figure): the cast of the share to
 * uint64_t was undefined, on x86 0, and the tenant's page said 1 B/s. */
static void test_qos_rate_huge(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX";
    shoald_config_t cfg;
    shoald_t a;
    shoald_page_t *p;
    uint64_t rate;

    qos_begin(dir, "", SIZE_MAX, SIZE_MAX, &cfg, &a);
    p = qos_page("acme", getpid(), -1);
    shoald_qos_page_register(&a, p, (const shoal_meter_page_t *)p->map, 0, 0);
    rate = qos_rate(dir, "acme");
    tap_ok(rate == UINT64_MAX, "qos_capacity_shm=qos_capacity_net=2^64-1: the tenant's rate "
           "saturates (rate %llu)", (unsigned long long)rate);
    qos_page_free(p);
    qos_end(dir, &cfg, &a);
}

/* Only qos_capacity_net set: an arriving tenant got no division (it was done only when
 * qos_capacity_shm was set), its page said 0 (unlimited) until the next run. */
static void test_qos_arrive_net(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX";
    shoald_config_t cfg;
    shoald_t a;
    shoald_page_t *p;
    uint64_t rate;

    qos_begin(dir, "qos_capacity_net=100m\nqos_period=60s\n", 0, 0, &cfg, &a);
    p = qos_page("acme", getpid(), -1);
    shoald_qos_page_register(&a, p, (const shoal_meter_page_t *)p->map, 0, 0);
    rate = qos_rate(dir, "acme");
    tap_ok(rate == 100ull << 20, "qos_capacity_net=100m only: an arriving tenant's page holds "
           "its share at once (rate %llu)", (unsigned long long)rate);
    qos_page_free(p);
    qos_end(dir, &cfg, &a);
}

/* A page whose counters a hostile rank made huge: the sum over transports wrapped (a small
 * figure, and the next reading's difference a huge 'used'). */
static void test_qos_bytes_wrap(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX";
    shoald_config_t cfg;
    shoald_t a;
    shoald_page_t *p;

    qos_begin(dir, "qos_capacity_shm=100m\n", 0, 0, &cfg, &a);
    p = qos_page("acme", getpid(), -1);
    for (int tl = 0; tl < 2; tl++) {
        p->ctr[SHOALD_CTR_SENT + tl * SHOAL_METER_NLOC + SHOAL_METER_SAME_HOST] =
            UINT64_MAX / 2 + 1;
    }
    shoald_qos_page_register(&a, p, (const shoal_meter_page_t *)p->map, 0, 0);
    tap_ok(p->qos_prev[0] == UINT64_MAX, "two transports' counters of 2^63 each: the bytes "
           "sent saturate (%llu)", (unsigned long long)p->qos_prev[0]);
    qos_page_free(p);
    qos_end(dir, &cfg, &a);
}

/* The rates directory gone when a tenant arrived (removed, disk full): its page was never
 * made again, the tenant ran unpaced for as long as the agent ran. */
static void test_qos_page_retry(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", qdir[64], cmd[128];
    shoald_config_t cfg;
    shoald_t a;
    shoald_page_t *p, *p2;
    tap_log_t lg;
    uint64_t rate;

    qos_begin(dir, "qos_capacity_shm=100m\n", 0, 0, &cfg, &a);
    snprintf(qdir, sizeof(qdir), "%s/qos", dir);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", qdir);
    if (system(cmd) != 0)
        tap_bail("cannot remove %s", qdir);
    p = qos_page("acme", getpid(), -1);
    tap_log_begin(&lg); /* the warning that the page cannot be made */
    shoald_qos_page_register(&a, p, (const shoal_meter_page_t *)p->map, 0, 0);
    tap_log_end(&lg);
    tap_log_close(&lg);
    if (mkdir(qdir, 0755) != 0)
        tap_bail("cannot make %s", qdir);
    p2 = qos_page("acme", getpid(), -1);
    p2->comm_id = 1;
    shoald_qos_page_register(&a, p2, (const shoal_meter_page_t *)p2->map, 0, 0);
    rate = qos_rate(dir, "acme");
    tap_ok(rate == 100ull << 20, "a rates page that could not be made is made when the tenant "
           "registers again (rate %llu)", (unsigned long long)rate);
    qos_page_free(p);
    qos_page_free(p2);
    qos_end(dir, &cfg, &a);
}

/* qos_spot_cpu: the spot page's process is gone and its pid runs another process (pid reuse,
 * possibly another tenant's): that process was set to nice 19. Here the page's pidfd is an
 * exited child's, its pid a live child's; then no pidfd and a start time that is not the
 * live child's. */
static void test_qos_spot_gone(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX";
    shoald_config_t cfg;
    shoald_t a;
    shoald_page_t *p;
    pid_t dead, live;
    int pidfd, st, n0, n1 = -100, n2 = -100;

    dead = fork();
    if (dead == 0)
        _exit(0);
    pidfd = (int)syscall(SYS_pidfd_open, dead, 0);
    waitpid(dead, &st, 0);
    live = fork();
    if (live == 0) {
        pause();
        _exit(0);
    }
    if (dead < 0 || live < 0)
        tap_bail("fork failed");
    n0 = getpriority(PRIO_PROCESS, (id_t)live);
    qos_begin(dir, "qos_capacity_shm=100m\nqos_spot_cpu=nice\n", 0, 0, &cfg, &a);
    if (pidfd >= 0) {
        p = qos_page("acme", live, pidfd);
        shoald_qos_page_register(&a, p, (const shoal_meter_page_t *)p->map, 3, 1);
        n1 = getpriority(PRIO_PROCESS, (id_t)live);
        qos_page_free(p);
        close(pidfd);
    } else {
        n1 = n0; /* no pidfds here */
    }
    p = qos_page("acme", live, -1);
    p->comm_id = 1;
    p->proc = calloc(1, sizeof(*p->proc));
    if (p->proc == NULL)
        tap_bail("out of memory");
    p->proc->pid = live;
    p->proc->start_ns = shoald_proc_start_ns(live) + 1;
    shoald_qos_page_register(&a, p, (const shoal_meter_page_t *)p->map, 3, 1);
    n2 = getpriority(PRIO_PROCESS, (id_t)live);
    qos_page_free(p);
    qos_end(dir, &cfg, &a);
    kill(live, SIGKILL);
    waitpid(live, &st, 0);
    tap_ok(n1 == n0 && n2 == n0, "qos_spot_cpu=nice: a spot page whose process is gone leaves "
           "the pid's new process alone (nice %d, after the pidfd %d, the start time %d)", n0,
           n1, n2);
}

/* A tenant whose rates page cannot be made (here a directory in the way of its temporary
 * file) runs unpaced: it still took its weight's share from the others, a tenant alone with
 * it was held at half the capacity. */
static void test_qos_no_page_share(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", tmp[128];
    const char *names[2] = {"acme", "bad"};
    shoald_page_t *p[2];
    shoald_config_t cfg;
    shoald_t a;
    tap_log_t lg;
    uint64_t rate;

    qos_begin(dir, "qos_capacity_shm=100m\nqos_period=1ms\n", 0, 0, &cfg, &a);
    snprintf(tmp, sizeof(tmp), "%s/qos/.bad.rate.tmp", dir);
    if (mkdir(tmp, 0755) != 0)
        tap_bail("cannot make %s", tmp);
    tap_log_begin(&lg); /* the warning that bad's page cannot be made */
    for (int i = 0; i < 2; i++) {
        p[i] = qos_page(names[i], getpid(), -1);
        p[i]->job->pages = p[i];
        p[i]->job->next = a.jobs;
        a.jobs = p[i]->job;
        shoald_qos_page_register(&a, p[i], (const shoal_meter_page_t *)p[i]->map, 0, 0);
    }
    tap_log_end(&lg);
    tap_log_close(&lg);
    /* both send all they can for a period: acme arriving, bad measured greedy */
    for (int i = 0; i < 2; i++)
        p[i]->ctr[SHOALD_CTR_SENT + SHOAL_METER_SAME_HOST] += 100ull << 20;
    usleep(5000);
    shoald_qos_tick(&a);
    rate = qos_rate(dir, "acme");
    tap_ok(rate == 100ull << 20, "a tenant without a rates page (unpaced) takes no share from "
           "the others (acme's rate %llu of %llu)", (unsigned long long)rate, 100ull << 20);
    a.jobs = NULL;
    for (int i = 0; i < 2; i++) {
        p[i]->job->pages = NULL;
        qos_page_free(p[i]);
    }
    qos_end(dir, &cfg, &a);
}

/* An agent run with ledger_url=none over a state_dir that holds a spool (minutes an agent
 * with a ledger could not write at its stop) never reads it: those minutes are billed by no
 * one, and it said nothing. It says so at its start, and leaves the spool for an agent with
 * the ledger. */
static void test_spool_no_ledger(void)
{
    char dir[] = "/tmp/agent_unit.XXXXXX", spool[160], logp[200], buf[8192];
    shoald_config_t cfg;
    shoald_t a = {0};
    const char *url0;
    struct stat sb;
    ssize_t len;
    int fd, logfd, saved;

    if (mkdtemp(dir) == NULL)
        tap_bail("mkdtemp failed");
    snprintf(spool, sizeof(spool), "%s/ledger.spool", dir);
    snprintf(logp, sizeof(logp), "%s/warn.log", dir);
    fd = open(spool, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || write(fd, "SHOALSP1", 8) != 8)
        tap_bail("cannot write %s", spool);
    close(fd);
    logfd = open(logp, O_RDWR | O_CREAT | O_TRUNC, 0600);
    saved = dup(2);
    if (logfd < 0 || saved < 0 || dup2(logfd, 2) < 0)
        tap_bail("redirecting stderr to %s", logp);
    minute_agent(&a, &cfg, NULL, dir, &url0); /* ledger_url=none */
    shoald_minute_fini(&a);
    dup2(saved, 2);
    close(saved);
    len = pread(logfd, buf, sizeof(buf) - 1, 0);
    close(logfd);
    buf[len > 0 ? len : 0] = '\0';
    tap_ok(strstr(buf, spool) != NULL && strstr(buf, "not billed") != NULL &&
               stat(spool, &sb) == 0,
           "an agent without a ledger says that the spool's minutes are not billed, and "
           "leaves it (log: %.200s)", buf);
    minute_cleanup(dir, &cfg, url0);
}

int main(void)
{
    tap_plan(83);
    test_escape();
    test_names();
    test_config();
    test_config_not_file();
    test_render();
    test_old_cursor(SHOAL_METER_NTL, "cuda_ipc", 0);
    test_old_cursor(SHOAL_METER_NTL + 1, "nccl", 1);
    test_procs_gone();
    test_gpu_once();
    test_gpus_observed();
    test_gpus_tick();
    test_trim_gone_longest();
    test_job_class_rerun();
    test_slow_commit();
    test_held_minute();
    test_slow_stop();
    test_stop_spool();
    test_shift_taken_only();
    test_spool_legacy_key();
    test_spool_no_ledger();
    test_qos_dot_tenant();
    test_qos_tc_many();
    test_qos_rate_huge();
    test_qos_arrive_net();
    test_qos_bytes_wrap();
    test_qos_page_retry();
    test_qos_spot_gone();
    test_qos_no_page_share();
    return tap_done();
}
