/* shoald's configuration file (default /etc/shoal/shoald.conf): lines KEY=VALUE, blanks
 * around both trimmed, '#' comments, the last assignment wins. The fixed keys are a config
 * table (name, default, doc, offset, parser: the library's conventions); tenants are keys
 * tenant.NAME.FIELD. An unknown key, a bad value or an unreadable key file is an error naming
 * the file and line. Keys and tokens are read from files (never the config file itself), kept
 * in memory only and never logged. */
#include "agent/agent.h"
#include "tenant/tenant.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const shoal_cfg_field_t shoald_cfg_fields[] = {
    {.name = "listen", .dflt = "/run/shoal/shoald.sock", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, listen),
     .doc = "UNIX socket where ranks register their metering page (its directory is created "
            "0755); identity comes from SO_PEERCRED, not from the job"},
    {.name = "socket_mode", .dflt = "0666", .type = SHOAL_CFG_UINT /* octal, parsed below */,
     .offset = offsetof(shoald_config_t, socket_mode),
     .doc = "permissions of the socket (octal): 0666 lets any local job register (the "
            "credential decides the tenant); 0660 with socket_group limits it to a group"},
    {.name = "socket_group", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, socket_group),
     .doc = "group that owns the socket (name or gid); empty: the agent's group"},
    {.name = "http", .dflt = "127.0.0.1:9464", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, http),
     .doc = "address of the Prometheus endpoint /metrics (IPv4:port, [IPv6]:port, port 0 "
            "picks a free one; none: no HTTP)"},
    {.name = "minute_seconds", .dflt = "60", .type = SHOAL_CFG_INT,
     .offset = offsetof(shoald_config_t, minute_seconds),
     .doc = "length of a billing minute in seconds, 1..3600 (tests shorten it; "
            "--minute-seconds)"},
    {.name = "ledger_url", .dflt = "sqlite:///var/lib/shoal/ledger.db", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, ledger_url),
     .doc = "billing ledger: sqlite:///path or postgresql://user@host:port/db; none: no "
            "ledger (metrics only)"},
    {.name = "rejoin_grace", .dflt = "3s", .type = SHOAL_CFG_TIME,
     .offset = offsetof(shoald_config_t, rejoin_grace_ms),
     .doc = "after the agent starts, its first billing batch waits this long (ms, s) for "
            "running ranks to register again (the library tries once a second, at its next "
            "call), so that the minutes they lived while no agent ran get a record each; "
            "a rank back later has that time billed in its job's first open minute (logged)"},
    {.name = "rejoin_wait", .dflt = "600s", .type = SHOAL_CFG_TIME,
     .offset = offsetof(shoald_config_t, rejoin_wait_ms),
     .doc = "after the agent starts, a job with a rank whose page the ledger holds open (not "
            "billed to its end) and whose process still runs is not billed until that rank "
            "registers again or exits, for at most this long (ms, s; 0..600s): a rank that "
            "makes no call for minutes then still gets a record per minute; after it, the "
            "job is billed without the rank, whose time is folded if it returns (logged)"},
    {.name = "ledger_key_file", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, ledger_key_file),
     .doc = "file of the ledger's HMAC key (32 raw bytes, mode 0600; shoal-cred keygen makes "
            "one); required with a ledger"},
    {.name = "master_key_file", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, master_key_file),
     .doc = "provider master key (32 raw bytes): tenant keys are derived from it for tenants "
            "without tenant.NAME.key_file"},
    {.name = "provider_token_file", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, provider_token_file),
     .doc = "bearer token (16..127 bytes, a file of mode 0600) that the provider's view "
            "/metrics, every tenant's jobs, asks for; empty: that view is open to whoever "
            "reaches the http address, on loopback every local user (said at start)"},
    {.name = "export_ranks", .dflt = "no", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoald_config_t, export_ranks),
     .doc = "also export per-rank series (label rank); off by default to bound cardinality"},
    {.name = "allow_uncredentialed", .dflt = "no", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoald_config_t, allow_uncredentialed),
     .doc = "accept pages that carry no credential and claim no tenant (metered and billed "
            "as tenant uid=N, N the rank's uid); a page that claims a tenant always needs a "
            "credential"},
    {.name = "abuse_max_refused", .dflt = "10", .type = SHOAL_CFG_UINT,
     .offset = offsetof(shoald_config_t, abuse_max_refused),
     .doc = "a tenant or uid with more refused registrations (auth failures included) in one "
            "minute is flagged: logged and counted in shoal_abuse_flags_total (0: never)"},
    {.name = "reg_timeout", .dflt = "1s", .type = SHOAL_CFG_TIME,
     .offset = offsetof(shoald_config_t, reg_timeout_ms),
     .doc = "a registration message must arrive complete within this (ms, s; 1ms..60s)"},
    {.name = "max_pages", .dflt = "4096", .type = SHOAL_CFG_UINT,
     .offset = offsetof(shoald_config_t, max_pages),
     .doc = "registered pages kept at most (all processes); each holds two file "
            "descriptors, and the agent lowers this at start to what its limit allows "
            "(ulimit -n, LimitNOFILE=), said in its log"},
    {.name = "max_pages_per_uid", .dflt = "1024", .type = SHOAL_CFG_UINT,
     .offset = offsetof(shoald_config_t, max_pages_per_uid),
     .doc = "registered pages kept at most per uid"},
    {.name = "max_pending", .dflt = "64", .type = SHOAL_CFG_UINT,
     .offset = offsetof(shoald_config_t, max_pending),
     .doc = "registrations in progress at most (1..65536); beyond, the oldest is dropped"},
    {.name = "job_retention", .dflt = "3600s", .type = SHOAL_CFG_TIME,
     .offset = offsetof(shoald_config_t, job_retention_s),
     .doc = "a job whose ranks are all gone keeps its series this long (ms, s); a tenant "
            "keeps at most 256 such jobs (a new job drops the one gone longest)"},
    {.name = "ready_file", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, ready_file),
     .doc = "file written once the agent listens: sock=PATH and http=ADDR:PORT lines"},
    {.name = "hostname", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, hostname),
     .doc = "host name in the ledger's records and cursor keys, at most 63 characters (empty: "
            "this host's name; each host's agent needs its own)"},
    {.name = "state_dir", .dflt = "/var/lib/shoal", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, state_dir),
     .doc = "the agent's own files (made 0700 when missing; each agent needs its own: it "
            "holds shoald.lock there, and a second agent on it is refused at its start): "
            "ledger.spool holds the minutes a stop could not write to the ledger (database "
            "down), written by the next agent at its start before anything else"},
    {.name = "qos_rates_dir", .dflt = "/run/shoal/qos", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, qos_rates_dir),
     .doc = "QoS arbiter: the rates pages DIR/TENANT.rate it writes (jobs read theirs with "
            "SHOAL_QOS_RATES=DIR/%t.rate; made 0755); none: no arbiter. The arbiter runs when "
            "there is something to divide: qos_capacity_shm, qos_capacity_net or qos_tc set"},
    {.name = "qos_period", .dflt = "100ms", .type = SHOAL_CFG_TIME,
     .offset = offsetof(shoald_config_t, qos_period_ms),
     .doc = "QoS arbiter: how often the active tenants' shares are computed and published "
            "(ms, s; 1ms..60s); the rates pages' heartbeat is every run and at least "
            "twice a second"},
    {.name = "qos_capacity_shm", .dflt = "0", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoald_config_t, qos_capacity_shm),
     .doc = "payload bytes/s the tenants' same-host traffic (shared memory, loopback) may "
            "carry together, divided by weight (k m g = 1024 powers; measure it with "
            "perf/qos_bench.sh --mode capacity); 0: not divided"},
    {.name = "qos_capacity_net", .dflt = "0", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoald_config_t, qos_capacity_net),
     .doc = "payload bytes/s of the host's NICs, divided by weight by pacing where tc is not "
            "set up (with tc the kernel divides the link); 0: not divided"},
    {.name = "qos_tc", .dflt = "none", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, qos_tc),
     .doc = "shoal-tc.sh to run at start (htb class per tenant on qos_tc_dev) and stop "
            "(removed); none: no tc; needs qos_tc_dev"},
    {.name = "qos_tc_dev", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, qos_tc_dev),
     .doc = "interfaces for qos_tc, comma-separated"},
    {.name = "qos_tc_link_rate", .dflt = "1gbit", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, qos_tc_link_rate),
     .doc = "line rate of the qos_tc_dev interfaces (tc units in any case: bit, kbit, mbit, "
            "gbit, bps = bytes/s; e.g. 1gbit, 100Gbit)"},
    {.name = "qos_spot_cpu", .dflt = "idle", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, qos_spot_cpu),
     .doc = "CPU priority the arbiter gives a spot communicator's process at its "
            "registration, so that its spinning ranks do not take the CPUs from other "
            "tenants' ranks: idle (SCHED_IDLE: it runs on what others leave), nice (nice "
            "19), none (left as it is); needs the same uid or CAP_SYS_NICE (said once)"},
    {.name = "gpu_device_prefix", .dflt = "/dev/nvidia", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoald_config_t, gpu_device_prefix),
     .doc = "GPU device files: at registration and six times a minute the agent counts the "
            "distinct files PREFIX<N> (N a number: not nvidiactl, nvidia-uvm) each rank's "
            "process holds open (/proc/PID/fd, its first 1024 descriptors) and bills the "
            "most of that and the GPUs the rank declares (logged once per job when more); "
            "none: only what the rank declares"},
};
#define SHOALD_CFG_SOCKET_MODE 1 /* index of the socket_mode row */

static const char *const shoald_cfg_tenant_doc[][2] = {
    {"tenant.NAME.key_file", "the tenant's key (32 raw bytes, shoal-cred tenant-key); "
                             "credentials of the tenant must verify with it"},
    {"tenant.NAME.uids", "comma-separated uids the tenant's jobs run as; a rank of another "
                         "uid claiming the tenant is refused (default: any uid)"},
    {"tenant.NAME.class", "billing class of its minutes: reserved (default) or spot (a spot "
                          "credential is always billed spot)"},
    {"tenant.NAME.scrape_token_file", "bearer token for the tenant's own view "
                                      "/metrics?tenant=NAME (without it, no tenant view)"},
    {"tenant.NAME.dscp", "qos_tc: the DSCP (0..63) of the tenant's packets (its class's "
                         "SHOAL_QOS_DSCP) that puts them in its htb class"},
    {"tenant.NAME.tc_mark", "qos_tc: or the fwmark the provider's firewall gives its uids"},
    {"tenant.NAME.tc_weight", "qos_tc: its htb class's share of the link among the reserved "
                              "tenants (default 1; spot tenants get 1% in all)"},
};

void shoald_config_help(FILE *fp)
{
    size_t i;

    fprintf(fp, "# shoald configuration (KEY=VALUE, one per line, # comments)\n");
    fprintf(fp, "%-34s %-34s %s\n", "# key", "default", "meaning");
    for (i = 0; i < SHOAL_ARRAY_SIZE(shoald_cfg_fields); i++)
        fprintf(fp, "%-34s %-34s %s\n", shoald_cfg_fields[i].name,
                shoald_cfg_fields[i].dflt[0] != '\0' ? shoald_cfg_fields[i].dflt : "\"\"",
                shoald_cfg_fields[i].doc);
    for (i = 0; i < SHOAL_ARRAY_SIZE(shoald_cfg_tenant_doc); i++)
        fprintf(fp, "%-34s %-34s %s\n", shoald_cfg_tenant_doc[i][0], "",
                shoald_cfg_tenant_doc[i][1]);
}

shoald_tenant_t *shoald_config_tenant(shoald_config_t *cfg, const char *name)
{
    shoald_tenant_t *t;

    for (t = cfg->tenants; t != NULL; t = t->next) {
        if (strcmp(t->name, name) == 0)
            return t;
    }
    return NULL;
}

/* key: the configuration key that named path (tenant.acme.key_file), said first in an error:
 * the file alone did not tell which line of the configuration to fix. */
static shoal_status_t shoald_file_read(const char *key, const char *path, uint8_t *buf,
                                       size_t max, size_t *len_p, int exact)
{
    char why[512];
    int loose;
    shoal_status_t st;

    st = shoal_secret_file_read(path, buf, exact ? max : 0, max, len_p, &loose, why, sizeof(why));
    if (st != SHOAL_OK) {
        fprintf(stderr, "shoald: %s: %s\n", key, why);
        return st;
    }
    if (loose)
        fprintf(stderr, "shoald: warning: %s: secret file %s may be read by group or others: "
                "chmod 600 it\n", key, path);
    return SHOAL_OK;
}

/* A bearer token: the file, white space cut at both ends, at least 16 bytes. */
static shoal_status_t shoald_token_read(const char *key, const char *path,
                                        char token[SHOALD_TOKEN_MAX], size_t *len_p,
                                        const char *whose)
{
    size_t len;

    if (shoald_file_read(key, path, (uint8_t *)token, SHOALD_TOKEN_MAX - 1, &len, 0) != SHOAL_OK)
        return SHOAL_ERR_INVALID_ARG;
    /* the whole file, white space cut at both ends, as Prometheus reads the same file as
     * its credentials_file (leading white space was kept: a token it never sent) */
    size_t lead = 0;
    while (len > 0 && isspace((unsigned char)token[len - 1]))
        len--;
    while (lead < len && isspace((unsigned char)token[lead]))
        lead++;
    len -= lead;
    memmove(token, token + lead, len);
    shoal_secret_wipe(token + len, SHOALD_TOKEN_MAX - len);
    *len_p = len;
    if (len < 16) {
        fprintf(stderr, "shoald: the scrape token of %s (%s) is shorter than 16 bytes\n", whose,
                path);
        shoal_secret_wipe(token, SHOALD_TOKEN_MAX);
        *len_p = 0;
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

shoal_status_t shoald_key_read(const char *what, const char *path, uint8_t key[SHOALD_KEY_BYTES])
{
    size_t len;

    return shoald_file_read(what, path, key, SHOALD_KEY_BYTES, &len, 1);
}

static int shoald_cfg_uids_parse(shoald_tenant_t *t, const char *v)
{
    const char *p = v;
    char *end;
    unsigned long u;
    uid_t *uids;

    free(t->uids);
    t->uids = NULL;
    t->nuids = 0;
    while (*p != '\0') {
        errno = 0;
        u = strtoul(p, &end, 10);
        if (end == p || errno != 0 || u >= (unsigned long)(uid_t)-1 || !isdigit((unsigned char)*p))
            return -1;
        uids = realloc(t->uids, (t->nuids + 1) * sizeof(*uids));
        if (uids == NULL)
            return -1;
        t->uids = uids;
        t->uids[t->nuids++] = (uid_t)u;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',') {
            p++;
            while (*p == ' ')
                p++;
            if (*p == '\0')
                return -1; /* "1000," names no uid after its comma: a typo, not a list */
        } else if (*p != '\0') {
            return -1;
        }
    }
    return t->nuids > 0 ? 0 : -1;
}

/* tenant.NAME.FIELD=value; -1 with *why set on error. */
static int shoald_cfg_tenant_line(shoald_config_t *cfg, const char *key, const char *value,
                                  const char **why)
{
    const char *name = key + strlen("tenant."), *dot = strrchr(name, '.');
    char tname[SHOALD_NAME_MAX];
    shoald_tenant_t *t;
    const char *field;
    size_t nlen;

    if (dot == NULL || dot == name) {
        *why = "expected tenant.NAME.FIELD";
        return -1;
    }
    nlen = (size_t)(dot - name);
    field = dot + 1;
    if (nlen >= sizeof(tname)) {
        *why = "tenant name too long";
        return -1;
    }
    memcpy(tname, name, nlen);
    tname[nlen] = '\0';
    if (!shoald_name_ok(tname, sizeof(tname))) {
        *why = "tenant name must be printable ASCII without spaces, ';' or '='";
        return -1;
    }
    t = shoald_config_tenant(cfg, tname);
    if (t == NULL) {
        t = calloc(1, sizeof(*t));
        if (t == NULL) {
            *why = "out of memory";
            return -1;
        }
        snprintf(t->name, sizeof(t->name), "%s", tname);
        snprintf(t->class_name, sizeof(t->class_name), "reserved");
        t->tc_weight = 1;
        t->tc_dscp = -1;
        t->tc_mark = -1;
        t->next = cfg->tenants;
        cfg->tenants = t;
    }
    if (strcmp(field, "key_file") == 0) {
        free((void *)t->key_file);
        t->key_file = strdup(value);
    } else if (strcmp(field, "token_file") == 0 || strcmp(field, "scrape_token_file") == 0) {
        free((void *)t->token_file);
        t->token_file = strdup(value);
    } else if (strcmp(field, "uids") == 0) {
        if (shoald_cfg_uids_parse(t, value) != 0) {
            *why = "uids must be a comma-separated list of numeric uids";
            return -1;
        }
    } else if (strcmp(field, "class") == 0) {
        if (strcmp(value, "reserved") != 0 && strcmp(value, "spot") != 0) {
            *why = "class must be reserved or spot";
            return -1;
        }
        snprintf(t->class_name, sizeof(t->class_name), "%s", value);
    } else if (strcmp(field, "dscp") == 0 || strcmp(field, "tc_mark") == 0 ||
               strcmp(field, "tc_weight") == 0) {
        char *end;
        /* decimal, or hex after 0x: base 0 read "010" as octal 8 and refused "08" as out of
         * range, where a DSCP is written in decimal */
        int hex = value[0] == '0' && (value[1] == 'x' || value[1] == 'X');
        long v = strtol(value, &end, hex ? 16 : 10);
        int dscp = field[0] == 'd', mark = field[3] == 'm';

        /* a mark of 0 is every unmarked packet's: that tenant's class would take them all */
        if (end == value || *end != '\0' || v < (dscp ? 0 : 1) ||
            v > (dscp ? 63 : mark ? 0x7fffffffL : 1000000L)) {
            *why = dscp ? "dscp must be 0..63" : mark ? "tc_mark must be a positive integer" :
                   "tc_weight must be 1..1000000";
            return -1;
        }
        if (dscp)
            t->tc_dscp = (int)v;
        else if (mark)
            t->tc_mark = (int)v;
        else
            t->tc_weight = (int)v;
    } else {
        *why = "unknown tenant field (key_file, uids, class, scrape_token_file, dscp, tc_mark, "
               "tc_weight)";
        return -1;
    }
    return 0;
}

static int shoald_cfg_set(shoald_config_t *cfg, const char *key, const char *value,
                          const char **why)
{
    const shoal_cfg_field_t *f;
    char *end;
    unsigned long mode;
    size_t i;

    if (strncmp(key, "tenant.", 7) == 0)
        return shoald_cfg_tenant_line(cfg, key, value, why);
    for (i = 0; i < SHOAL_ARRAY_SIZE(shoald_cfg_fields); i++) {
        f = &shoald_cfg_fields[i];
        if (strcmp(f->name, key) != 0)
            continue;
        if (i == SHOALD_CFG_SOCKET_MODE) {
            errno = 0;
            mode = strtoul(value, &end, 8);
            if (end == value || *end != '\0' || errno != 0 || mode > 0777) {
                *why = "socket_mode must be octal permissions, e.g. 0666";
                return -1;
            }
            cfg->socket_mode = (unsigned)mode;
            return 0;
        }
        if (strcmp(f->name, "qos_spot_cpu") == 0 && strcmp(value, "idle") != 0 &&
            strcmp(value, "nice") != 0 && strcmp(value, "none") != 0) {
            *why = "qos_spot_cpu must be idle, nice or none";
            return -1;
        }
        if (strcmp(f->name, "gpu_device_prefix") == 0 && value[0] != '/' &&
            strcmp(value, "none") != 0) {
            *why = "gpu_device_prefix must be an absolute path prefix (/dev/nvidia) or none";
            return -1;
        }
        if (shoal_cfg_parse_value(f, value, (char *)cfg + f->offset) != 0) {
            *why = "bad value for the key's type";
            return -1;
        }
        return 0;
    }
    *why = "unknown key (shoald --help-config lists them)";
    return -1;
}

static shoal_status_t shoald_cfg_tenants_load(shoald_config_t *cfg)
{
    shoald_tenant_t *t;

    for (t = cfg->tenants; t != NULL; t = t->next) {
        char what[SHOALD_NAME_MAX + 32];
        if (t->key_file != NULL && t->key_file[0] != '\0') {
            snprintf(what, sizeof(what), "tenant.%s.key_file", t->name);
            if (shoald_key_read(what, t->key_file, t->key) != SHOAL_OK)
                return SHOAL_ERR_INVALID_ARG;
            t->have_key = 1;
        } else if (cfg->have_master) {
            if (shoal_tenant_key_derive(cfg->master, sizeof(cfg->master), t->name, t->key) !=
                SHOAL_OK)
                return SHOAL_ERR_INVALID_ARG;
            t->have_key = 1;
        } else {
            fprintf(stderr, "shoald: tenant %s has no key: set tenant.%s.key_file or "
                    "master_key_file\n", t->name, t->name);
            return SHOAL_ERR_INVALID_ARG;
        }
        if (t->token_file != NULL && t->token_file[0] != '\0') {
            char whose[SHOALD_NAME_MAX + 8];
            snprintf(whose, sizeof(whose), "tenant %s", t->name);
            snprintf(what, sizeof(what), "tenant.%s.scrape_token_file", t->name);
            if (shoald_token_read(what, t->token_file, t->token, &t->token_len, whose) !=
                SHOAL_OK)
                return SHOAL_ERR_INVALID_ARG;
        }
    }
    return SHOAL_OK;
}

static void shoald_cfg_trim(char **s_p)
{
    char *s = *s_p;
    size_t len;

    while (isspace((unsigned char)*s))
        s++;
    len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        s[--len] = '\0';
    *s_p = s;
}

static shoal_status_t shoald_cfg_file(shoald_config_t *cfg, const char *path)
{
    char *line = NULL, *p, *eq, *key, *value;
    const char *why = NULL;
    size_t cap = 0;
    int lineno = 0, fd;
    struct stat st;
    FILE *fp;

    /* A regular file only: a directory read as an empty file (the defaults, without a word)
     * and opening a FIFO waited for a writer for ever (O_NONBLOCK: it opens at once) */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "shoald: cannot read config %s: %s\n", path,
                fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return SHOAL_ERR_INVALID_ARG;
    }
    fp = fdopen(fd, "r");
    if (fp == NULL) {
        fprintf(stderr, "shoald: cannot read config %s: %s\n", path, strerror(errno));
        close(fd);
        return SHOAL_ERR_INVALID_ARG;
    }
    while (getline(&line, &cap, fp) >= 0) {
        lineno++;
        p = line;
        shoald_cfg_trim(&p);
        if (*p == '\0' || *p == '#')
            continue;
        eq = strchr(p, '=');
        if (eq == NULL) {
            why = "expected KEY=VALUE";
            break;
        }
        *eq = '\0';
        key = p;
        value = eq + 1;
        shoald_cfg_trim(&key);
        shoald_cfg_trim(&value);
        if (shoald_cfg_set(cfg, key, value, &why) != 0)
            break;
    }
    if (why == NULL && ferror(fp)) { /* a read error is not the end of the file */
        why = strerror(errno);
        lineno++;
    }
    free(line);
    fclose(fp);
    if (why != NULL) {
        fprintf(stderr, "shoald: %s:%d: %s\n", path, lineno, why);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

shoal_status_t shoald_config_load(shoald_config_t *cfg, const char *path)
{
    const char *why = NULL;
    size_t i;

    memset(cfg, 0, sizeof(*cfg));
    for (i = 0; i < SHOAL_ARRAY_SIZE(shoald_cfg_fields); i++) {
        if (shoald_cfg_set(cfg, shoald_cfg_fields[i].name, shoald_cfg_fields[i].dflt, &why) !=
            0) {
            fprintf(stderr, "shoald: bad default of %s\n", shoald_cfg_fields[i].name);
            return SHOAL_ERR_INTERNAL;
        }
    }
    if (path != NULL && shoald_cfg_file(cfg, path) != SHOAL_OK)
        return SHOAL_ERR_INVALID_ARG;
    return SHOAL_OK;
}

/* qos_period's range, and the keys qos_tc needs (an empty value is stored as NULL). */
static shoal_status_t shoald_config_qos_check(const shoald_config_t *cfg)
{
    /* 0, inf and negatives (-1) would make the arbiter's wait 0: a busy loop */
    if (cfg->qos_period_ms < 1 || cfg->qos_period_ms > 60000) {
        fprintf(stderr, "shoald: qos_period must be 1ms..60s\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (cfg->qos_tc == NULL || strcmp(cfg->qos_tc, "none") == 0)
        return SHOAL_OK;
    if (cfg->qos_tc_dev == NULL) {
        fprintf(stderr, "shoald: qos_tc needs qos_tc_dev (the interfaces, comma-separated)\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (cfg->qos_tc_link_rate == NULL) {
        fprintf(stderr, "shoald: qos_tc needs qos_tc_link_rate (a tc rate, e.g. 1gbit)\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

/* After the command line overrides: reads the key and token files. */
shoal_status_t shoald_config_keys(shoald_config_t *cfg)
{
    if (cfg->minute_seconds < 1 || cfg->minute_seconds > 3600) {
        fprintf(stderr, "shoald: minute_seconds must be 1..3600\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (cfg->rejoin_grace_ms < 0 || cfg->rejoin_grace_ms > 600000) {
        fprintf(stderr, "shoald: rejoin_grace must be 0..600s\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (cfg->rejoin_wait_ms < 0 || cfg->rejoin_wait_ms > 600000) {
        fprintf(stderr, "shoald: rejoin_wait must be 0..600s\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    /* 0 refused every registration at once; inf or a negative value (-1) gave none a
     * deadline, so a silent client held its slot until max_pending pushed it out */
    if (cfg->reg_timeout_ms < 1 || cfg->reg_timeout_ms > 60000) {
        fprintf(stderr, "shoald: reg_timeout must be 1ms..60s\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    /* 0 behaved as 1 (the newest registration evicted the one before it) */
    if (cfg->max_pending < 1 || cfg->max_pending > 65536) {
        fprintf(stderr, "shoald: max_pending must be 1..65536\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (shoald_config_qos_check(cfg) != SHOAL_OK)
        return SHOAL_ERR_INVALID_ARG;
    if (cfg->state_dir == NULL || cfg->state_dir[0] == '\0') {
        fprintf(stderr, "shoald: state_dir must name a directory\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    /* a longer one was cut to what the agent keeps: hosts whose names share those characters
     * made one ledger cursor key prefix, and each took the other's open pages for its own */
    if (cfg->hostname != NULL && strlen(cfg->hostname) >= SHOALD_HOSTNAME_MAX) {
        fprintf(stderr, "shoald: hostname must be at most %d characters\n",
                SHOALD_HOSTNAME_MAX - 1);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (cfg->listen == NULL || cfg->listen[0] != '/') {
        fprintf(stderr, "shoald: listen must be an absolute socket path\n");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (cfg->master_key_file != NULL) {
        if (shoald_key_read("master_key_file", cfg->master_key_file, cfg->master) != SHOAL_OK)
            return SHOAL_ERR_INVALID_ARG;
        cfg->have_master = 1;
    }
    if (cfg->ledger_key_file != NULL) {
        if (shoald_key_read("ledger_key_file", cfg->ledger_key_file, cfg->ledger_key) !=
            SHOAL_OK)
            return SHOAL_ERR_INVALID_ARG;
        cfg->have_ledger_key = 1;
    }
    if (cfg->provider_token_file != NULL && cfg->provider_token_file[0] != '\0' &&
        shoald_token_read("provider_token_file", cfg->provider_token_file, cfg->provider_token,
                          &cfg->provider_token_len, "the provider") != SHOAL_OK)
        return SHOAL_ERR_INVALID_ARG;
    if (cfg->ledger_url != NULL && strcmp(cfg->ledger_url, "none") != 0 &&
        !cfg->have_ledger_key) {
        fprintf(stderr, "shoald: a ledger (%s) needs ledger_key_file\n", cfg->ledger_url);
        return SHOAL_ERR_INVALID_ARG;
    }
    return shoald_cfg_tenants_load(cfg);
}

void shoald_config_free(shoald_config_t *cfg)
{
    shoald_tenant_t *t, *next;

    for (t = cfg->tenants; t != NULL; t = next) {
        next = t->next;
        shoal_secret_wipe(t->key, sizeof(t->key));
        shoal_secret_wipe(t->token, sizeof(t->token));
        free((void *)t->key_file);
        free((void *)t->token_file);
        free(t->uids);
        free(t);
    }
    cfg->tenants = NULL;
    shoal_secret_wipe(cfg->master, sizeof(cfg->master));
    shoal_secret_wipe(cfg->ledger_key, sizeof(cfg->ledger_key));
    shoal_secret_wipe(cfg->provider_token, sizeof(cfg->provider_token));
    cfg->provider_token_len = 0;
}
