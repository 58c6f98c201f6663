/* QoS classes (src/qos): the effective class and weight (a credential's, which a variable may
 * only lower; without one at most SHOAL_QOS_CLASS_MAX / SHOAL_QOS_WEIGHT_MAX), the per-class
 * lists and the marks each class maps to on TCP, IB and UCX. */
#include "qos/qos.h"
#include "tenant/tenant.h"
#include "tests/tap.h"
#if SHOAL_HAVE_VERBS
#include "transports/ib/ib.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Resolves the identity in a child with these variables (NULL: unset); class/weight out. */
static int resolve_in_child(const char *cred, const char *cls, const char *weight,
                            const char *cls_max, int cfg_class, int *class_p, int *weight_p)
{
    int fds[2], st = 0, out[3] = {-1, -1, -1};
    pid_t pid;

    if (pipe(fds) != 0 || (pid = fork()) < 0) {
        return -1;
    }
    if (pid == 0) {
        shoal_config_t cfg = SHOAL_CONFIG_INIT;
        shoal_tenant_id_t id;
        int r[3];
        close(fds[0]);
        setenv("SHOAL_DEBUG", "NONE", 1);
        unsetenv("SHOAL_CREDENTIAL_FILE");
        cred != NULL ? setenv("SHOAL_CREDENTIAL", cred, 1) : unsetenv("SHOAL_CREDENTIAL");
        cls != NULL ? setenv("SHOAL_QOS_CLASS", cls, 1) : unsetenv("SHOAL_QOS_CLASS");
        weight != NULL ? setenv("SHOAL_QOS_WEIGHT", weight, 1) : unsetenv("SHOAL_QOS_WEIGHT");
        cls_max != NULL ? setenv("SHOAL_QOS_CLASS_MAX", cls_max, 1)
                        : unsetenv("SHOAL_QOS_CLASS_MAX");
        cfg.qos_class = cfg_class;
        r[0] = shoal_tenant_id_current(&cfg, &id);
        r[1] = id.qos_class;
        r[2] = id.qos_weight;
        if (write(fds[1], r, sizeof(r)) != (ssize_t)sizeof(r)) {
            _exit(2);
        }
        _exit(0);
    }
    close(fds[1]);
    if (read(fds[0], out, sizeof(out)) != (ssize_t)sizeof(out)) {
        out[0] = -1;
    }
    close(fds[0]);
    waitpid(pid, &st, 0);
    *class_p = out[1];
    *weight_p = out[2];
    return out[0];
}

static void make_cred(int qos_class, int weight, char *buf, size_t len)
{
    uint8_t master[32], key[SHOAL_HMAC_BYTES];
    shoal_tenant_cred_t c;

    memset(master, 7, sizeof(master));
    memset(&c, 0, sizeof(c));
    snprintf(c.id.tenant, sizeof(c.id.tenant), "acme");
    snprintf(c.id.job, sizeof(c.id.job), "train");
    c.id.epoch = 1;
    c.id.qos_class = qos_class;
    c.id.qos_weight = weight;
    if (shoal_tenant_key_derive(master, sizeof(master), "acme", key) != SHOAL_OK ||
        shoal_tenant_cred_sign(&c, key) != SHOAL_OK ||
        shoal_tenant_cred_format(&c, buf, len) != SHOAL_OK) {
        buf[0] = '\0';
    }
}

static void test_effective(void)
{
    char cg[SHOAL_TENANT_CRED_TEXT_MAX], cb[SHOAL_TENANT_CRED_TEXT_MAX];
    int c, w;

    make_cred(SHOAL_QOS_GUARANTEED, 4, cg, sizeof(cg));
    make_cred(SHOAL_QOS_BURSTABLE, 2, cb, sizeof(cb));
    tap_ok(cg[0] != '\0' && cb[0] != '\0', "signed test credentials");

    /* Without a credential: at most the ceiling (default burstable), weight at most 1. */
    tap_is_int(resolve_in_child(NULL, NULL, NULL, NULL, 0, &c, &w), SHOAL_OK, "no cred: ok");
    tap_is_int(c, SHOAL_QOS_DEFAULT, "no cred, nothing set: default class");
    tap_is_int(resolve_in_child(NULL, "guaranteed", "5", NULL, 0, &c, &w), SHOAL_OK, "ok");
    tap_is_int(c, SHOAL_QOS_BURSTABLE, "no cred: SHOAL_QOS_CLASS=guaranteed lowered to burstable");
    tap_is_int(w, 1, "no cred: SHOAL_QOS_WEIGHT=5 lowered to SHOAL_QOS_WEIGHT_MAX 1");
    resolve_in_child(NULL, NULL, NULL, NULL, SHOAL_QOS_GUARANTEED, &c, &w);
    tap_is_int(c, SHOAL_QOS_BURSTABLE, "no cred: shoal_config_t.qos_class guaranteed lowered too");
    resolve_in_child(NULL, "spot", NULL, NULL, 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_SPOT, "no cred: spot (lower) is granted");
    resolve_in_child(NULL, "burstable", NULL, "spot", 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_SPOT, "no cred: SHOAL_QOS_CLASS_MAX=spot caps burstable");
    resolve_in_child(NULL, "guaranteed", NULL, "guaranteed", 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_GUARANTEED, "no cred: a provider ceiling of guaranteed allows it");
    /* SHOAL_QOS_CLASS_MAX=default, as its doc says: nothing is marked above best effort, a job
     * may still lower itself to spot */
    resolve_in_child(NULL, "burstable", NULL, "default", 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_DEFAULT, "no cred: SHOAL_QOS_CLASS_MAX=default lowers burstable to "
               "default");
    resolve_in_child(NULL, "spot", NULL, "default", 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_SPOT, "no cred: SHOAL_QOS_CLASS_MAX=default still grants spot");

    /* With a credential: the credential's, a variable may only lower (the ceiling is moot). */
    tap_is_int(resolve_in_child(cg, NULL, NULL, NULL, 0, &c, &w), SHOAL_OK, "cred: ok");
    tap_is_int(c, SHOAL_QOS_GUARANTEED, "cred guaranteed, nothing set: guaranteed");
    tap_is_int(w, 4, "cred weight 4");
    resolve_in_child(cg, "spot", "2", NULL, 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_SPOT, "cred guaranteed, SHOAL_QOS_CLASS=spot: lowered to spot");
    tap_is_int(w, 2, "cred weight 4, SHOAL_QOS_WEIGHT=2: lowered to 2");
    resolve_in_child(cb, "guaranteed", "9", NULL, 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_BURSTABLE, "cred burstable, SHOAL_QOS_CLASS=guaranteed: stays burstable");
    tap_is_int(w, 2, "cred weight 2, SHOAL_QOS_WEIGHT=9: stays 2");
    resolve_in_child(cb, NULL, NULL, "spot", 0, &c, &w);
    tap_is_int(c, SHOAL_QOS_BURSTABLE, "cred burstable: SHOAL_QOS_CLASS_MAX does not apply");

    /* A negative SHOAL_QOS_WEIGHT was taken as unset: the credential's whole weight (4). */
    int rc = resolve_in_child(cg, NULL, "-2", NULL, 0, &c, &w);
    tap_is_int(rc, SHOAL_ERR_INVALID_ARG, "cred weight 4, SHOAL_QOS_WEIGHT=-2: "
               "SHOAL_ERR_INVALID_ARG, not the credential's weight (got weight %d)",
               rc == SHOAL_OK ? w : -1);
    tap_is_int(resolve_in_child(NULL, NULL, "-2", NULL, 0, &c, &w), SHOAL_ERR_INVALID_ARG,
               "no cred, SHOAL_QOS_WEIGHT=-2: SHOAL_ERR_INVALID_ARG");
}

static void test_lists(void)
{
    int v[SHOAL_QOS_NCLASSES] = {-1, -1, -1, -1};

    tap_is_int(shoal_qos_list_parse("guaranteed=AF41,burstable=af21,spot=CS1,default=EF", 63, 1,
                                    v), SHOAL_OK, "DSCP names parse");
    tap_ok(v[0] == 46 && v[1] == 34 && v[2] == 18 && v[3] == 8, "EF 46, AF41 34, AF21 18, CS1 8");
    tap_is_int(shoal_qos_list_parse("spot=none,burstable=10", 63, 1, v), SHOAL_OK, "none");
    tap_ok(v[3] == -1 && v[2] == 10 && v[1] == 34, "none = -1, unlisted classes unchanged");
    tap_is_int(shoal_qos_list_parse("", 63, 1, v), SHOAL_OK, "empty list: nothing changes");
    tap_ok(shoal_qos_list_parse("spot=64", 63, 1, v) != SHOAL_OK, "DSCP 64 refused");
    tap_ok(shoal_qos_list_parse("spot=AF41", 15, 0, v) != SHOAL_OK, "names only for DSCP");
    tap_ok(shoal_qos_list_parse("gold=1", 15, 0, v) != SHOAL_OK, "unknown class refused");
    tap_ok(shoal_qos_list_parse("spot", 15, 0, v) != SHOAL_OK, "no '=' refused");
    tap_ok(shoal_qos_list_parse("spot=1x", 15, 0, v) != SHOAL_OK, "trailing junk refused");
    tap_ok(v[2] == 10, "a refused list leaves the values unchanged");
}

static void test_marks(void)
{
    shoal_qos_class_config_t cfg = {.dscp = "", .priority = "", .ib_tc = "", .ib_sl = ""};
    shoal_qos_marks_t m;

    shoal_qos_marks_resolve(SHOAL_QOS_DEFAULT, NULL, 0, 0, &m);
    tap_ok(m.dscp == -1 && m.priority == -1 && m.ib_tc == -1 && m.ib_sl == -1,
           "default class marks nothing");
    shoal_qos_marks_resolve(SHOAL_QOS_GUARANTEED, NULL, 0, 0, &m);
    tap_ok(m.dscp == 34 && m.priority == 6 && m.ib_tc == 136 && m.ib_sl == -1,
           "guaranteed: AF41, SO_PRIORITY 6, IB TC 136 (DSCP << 2), SL unset (got %d %d %d %d)",
           m.dscp, m.priority, m.ib_tc, m.ib_sl);
    shoal_qos_marks_resolve(SHOAL_QOS_BURSTABLE, NULL, 0, 0, &m);
    tap_ok(m.dscp == 18 && m.priority == 4 && m.ib_tc == 72, "burstable: AF21, 4, TC 72");
    shoal_qos_marks_resolve(SHOAL_QOS_SPOT, NULL, 0, 0, &m);
    tap_ok(m.dscp == 8 && m.priority == 1 && m.ib_tc == 32, "spot: CS1, 1 (filler), TC 32");
    cfg.ib_tc = "guaranteed=106";
    cfg.ib_sl = "guaranteed=3,spot=1";
    cfg.dscp = "spot=none";
    shoal_qos_marks_resolve(SHOAL_QOS_GUARANTEED, &cfg, 0, 0, &m);
    tap_ok(m.ib_tc == 106 && m.ib_sl == 3, "SHOAL_QOS_IB_TC / _IB_SL lists apply");
    shoal_qos_marks_resolve(SHOAL_QOS_SPOT, &cfg, 0, 0, &m);
    tap_ok(m.dscp == -1 && m.ib_tc == -1 && m.ib_sl == 1, "spot=none: no DSCP, no derived TC");
    shoal_qos_marks_resolve(SHOAL_QOS_GUARANTEED, &cfg, 1, 1, &m);
    tap_ok(m.ib_tc == -1 && m.ib_sl == -1 && m.dscp == 34,
           "explicit SHOAL_IB_TC / SHOAL_IB_SL win over the class");
    cfg.priority = "burstable=99";
    tap_ok(shoal_qos_marks_resolve(SHOAL_QOS_BURSTABLE, &cfg, 0, 0, &m) != SHOAL_OK,
           "a malformed list is an error");
}

static void test_ib_pick(void)
{
#if SHOAL_HAVE_VERBS
    shoal_ib_qos_t q;
    shoal_ib_qos_pick(5, 2, -1, -1, 0, &q);
    tap_ok(q.tc == 5 && q.sl == 2 && q.rate_kbps == 0, "ib: no class: SHOAL_IB_TC/SL, no limit");
    shoal_ib_qos_pick(5, 2, 136, 4, 125000000, &q);
    tap_ok(q.tc == 136 && q.sl == 4 && q.rate_kbps == 1000000,
           "ib: the class's TC and SL; 125 MB/s = 1,000,000 kbps (got %u)", q.rate_kbps);
    shoal_ib_qos_pick(0, 0, 300, 16, 10, &q);
    tap_ok(q.tc == 0 && q.sl == 0 && q.rate_kbps == 1, "ib: out of range ignored, >= 1 kbps");
#else
    tap_skip(3, "built without verbs");
#endif
}

/* SHOAL_QOS_CLASS_MAX=spot: a job that asked for no class was told "QoS class default asked for
 * without a credential" (default ranks above spot), a warning about nothing it did. */
static void test_uncred_quiet(void)
{
    shoal_qos_class_config_t qc = {.class_max = SHOAL_QOS_SPOT, .weight_max = 1};
    int lvl = shoal_log_level_cur, logged, quiet, loud, c = -1, w = -1, c2 = -1, w2 = -1;
    unsigned mask = shoal_log_subsys_mask;
    tap_log_t lg;

    shoal_log_level_cur = SHOAL_LOG_WARN;
    shoal_log_subsys_mask = ~0u;
    logged = tap_log_begin(&lg) == 0;
    shoal_qos_uncredentialed(SHOAL_QOS_DEFAULT, 1, &qc, &c, &w);
    tap_log_end(&lg);
    quiet = logged ? tap_log_count(&lg, "asked for without a credential", NULL) : -1;
    tap_log_close(&lg);
    logged = tap_log_begin(&lg) == 0;
    shoal_qos_uncredentialed(SHOAL_QOS_BURSTABLE, 1, &qc, &c2, &w2);
    tap_log_end(&lg);
    loud = logged ? tap_log_count(&lg, "class burstable asked for without a credential", NULL)
                  : -1;
    tap_log_close(&lg);
    shoal_log_level_cur = lvl;
    shoal_log_subsys_mask = mask;
    tap_ok(c == SHOAL_QOS_SPOT && c2 == SHOAL_QOS_SPOT && quiet == 0 && loud == 1,
           "SHOAL_QOS_CLASS_MAX=spot: nothing asked for is spot without a warning, burstable "
           "asked for is warned about (class %d and %d, %d and %d warnings)", c, c2, quiet, loud);
}

/* shoal_config_t's QoS fields: outside their range an error, not silently the default. */
static void test_requested(void)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    int c = -1, w = -1;
    cfg.qos_class = SHOAL_QOS_GUARANTEED;
    cfg.qos_weight = 3;
    tap_ok(shoal_qos_requested(&cfg, &c, &w) == SHOAL_OK && c == SHOAL_QOS_GUARANTEED && w == 3,
           "config fields: the class and weight asked for");
    cfg.qos_class = 99;
    tap_is_int(shoal_qos_requested(&cfg, &c, &w), SHOAL_ERR_INVALID_ARG,
               "qos_class 99 (not a shoal_qos_class_t): SHOAL_ERR_INVALID_ARG");
    cfg.qos_class = -3;
    tap_is_int(shoal_qos_requested(&cfg, &c, &w), SHOAL_ERR_INVALID_ARG, "qos_class -3: too");
    cfg.qos_class = SHOAL_QOS_DEFAULT;
    cfg.qos_weight = -4;
    tap_is_int(shoal_qos_requested(&cfg, &c, &w), SHOAL_ERR_INVALID_ARG,
               "qos_weight -4: SHOAL_ERR_INVALID_ARG");
}

int main(void)
{
    setenv("SHOAL_DEBUG", "NONE", 1);
    test_effective();
    test_lists();
    test_marks();
    test_ib_pick();
    test_uncred_quiet();
    test_requested(); /* last: it loads the configuration, which test_effective sets up */
    return tap_done();
}
