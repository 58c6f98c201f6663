/* Whether the ucx transport is chosen across hosts (issue 14). The registry orders ib, ucx,
 * tcp across hosts; ucx goes ahead of tcp only where UCX would carry the data over RDMA: UCX
 * over tcp is slower than shoal's tcp, and loading libucp costs every process its
 * constructors. So, in that order:
 *   present(): a device with an ACTIVE port in sysfs, without loading anything (a host with no
 *              RDMA device: tcp, and libucp stays out of the process);
 *   query():   libucp loads;
 *   auto_ok(): UCX's own resources (libuct: components, memory domains, their transports)
 *              hold a network transport other than tcp that UCX_TLS and UCX_NET_DEVICES allow.
 * SHOAL_TRANSPORT=ucx skips present() and auto_ok(): ucx over whatever UCX has. */
#include "transports/ucx/ucx.h"
#include "transports/ucx/ucx_query.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uct/api/uct.h>

/* ---- UCX_TLS and UCX_NET_DEVICES --------------------------------------------------------- */

/* Whether the UCX_TLS entry tok (n bytes, ":aux" already removed) names transport tl. */
static int shoal_ucx_tls_names(const char *tok, size_t n, const char *tl)
{
    size_t tll = strlen(tl);
    if ((n == 3 && memcmp(tok, "all", 3) == 0) || (n == 2 && memcmp(tok, "ib", 2) == 0)) {
        return 1; /* every transport; every verbs one (all this is asked about) */
    }
    if (n == tll && memcmp(tok, tl, n) == 0) {
        return 1;
    }
    if (n == 4 && memcmp(tok, "mlx5", 4) == 0) {
        return tll > 5 && strcmp(tl + tll - 5, "_mlx5") == 0;
    }
    if (n > 2 && tok[n - 2] == '_' && (tok[n - 1] == 'v' || tok[n - 1] == 'x')) {
        /* rc_v: rc_verbs, rc_x: rc_mlx5 */
        const char *suffix = tok[n - 1] == 'v' ? "_verbs" : "_mlx5";
        return tll == n - 2 + strlen(suffix) && memcmp(tl, tok, n - 2) == 0 &&
               strcmp(tl + n - 2, suffix) == 0;
    }
    /* rc: rc_verbs and rc_mlx5; ud: ud_verbs, ud_mlx5; dc: dc_mlx5 */
    return tll > n && memcmp(tl, tok, n) == 0 && tl[n] == '_';
}

int shoal_ucx_tls_allows(const char *tls, const char *tl)
{
    int negate, named = 0;

    if (tls == NULL || tls[0] == '\0') {
        return 1;
    }
    negate = tls[0] == '^';
    tls += negate;
    while (*tls != '\0') {
        size_t k = strcspn(tls, ","), n = k;
        const char *colon = memchr(tls, ':', k);
        int aux = 0;
        if (colon != NULL) {
            n = (size_t)(colon - tls);
            aux = k - n == 4 && memcmp(colon, ":aux", 4) == 0;
        }
        if (!aux || negate) {
            named |= shoal_ucx_tls_names(tls, n, tl);
        }
        tls += k + (tls[k] != '\0');
    }
    return negate ? !named : named;
}

int shoal_ucx_dev_allowed(const char *devs, const char *dev)
{
    size_t dl = strlen(dev);

    if (devs == NULL || devs[0] == '\0' || strcmp(devs, "all") == 0) {
        return 1;
    }
    while (*devs != '\0') {
        size_t k = strcspn(devs, ",");
        if (k == dl && memcmp(devs, dev, k) == 0) {
            return 1;
        }
        devs += k + (devs[k] != '\0');
    }
    return 0;
}

/* ---- present(): sysfs, nothing loaded ---------------------------------------------------- */

/* 1 if root/class/infiniband/DEV/ports/PORT/state says ACTIVE ("4: ACTIVE"). */
static int shoal_ucx_port_active(const char *ports, const char *port)
{
    char path[PATH_MAX], line[64] = "";
    FILE *fp;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s/state", ports, port) >= sizeof(path)) {
        return 0;
    }
    fp = fopen(path, "r");
    if (fp == NULL) {
        return 0;
    }
    if (fgets(line, sizeof(line), fp) == NULL) {
        line[0] = '\0';
    }
    fclose(fp);
    return strstr(line, "ACTIVE") != NULL;
}

int shoal_ucx_sysfs_active(const char *root, char *note, size_t len)
{
    char dir[PATH_MAX], ports[PATH_MAX];
    struct dirent *de;
    int ndev = 0, found = 0;
    DIR *d;

    snprintf(dir, sizeof(dir), "%s/class/infiniband", root != NULL && root[0] != '\0' ? root
                                                                                        : "/sys");
    d = opendir(dir);
    if (d == NULL) {
        snprintf(note, len, "no RDMA device (no %s)", dir);
        return 0;
    }
    while (!found && (de = readdir(d)) != NULL) {
        struct dirent *pe;
        DIR *pd;
        if (de->d_name[0] == '.') {
            continue;
        }
        ndev++;
        pd = (size_t)snprintf(ports, sizeof(ports), "%s/%s/ports", dir, de->d_name) <
                     sizeof(ports) ? opendir(ports) : NULL;
        while (pd != NULL && !found && (pe = readdir(pd)) != NULL) {
            if (pe->d_name[0] != '.' && shoal_ucx_port_active(ports, pe->d_name)) {
                snprintf(note, len, "%s port %s is ACTIVE", de->d_name, pe->d_name);
                found = 1;
            }
        }
        if (pd != NULL) {
            closedir(pd);
        }
    }
    closedir(d);
    if (!found && ndev > 0) {
        snprintf(note, len, "no ACTIVE port on the %d RDMA device(s) in %s", ndev, dir);
    } else if (!found) {
        snprintf(note, len, "no RDMA device in %s", dir);
    }
    return found;
}

int shoal_ucx_present(void)
{
    shoal_tl_lib_t *lib = &shoal_ucx_lib;
    int yes;

    shoal_config_global_init(); /* SHOAL_UCX_SYSFS_ROOT */
    pthread_mutex_lock(&lib->lock);
    yes = shoal_ucx_sysfs_active(shoal_ucx_config.sysfs_root, lib->note, sizeof(lib->note));
    pthread_mutex_unlock(&lib->lock);
    return yes;
}

/* Loads libucp (first call): only asked when the ucx transport may be used (tl_registry.c). */
int shoal_ucx_query(void)
{
    if (shoal_tl_lib_load(&shoal_ucx_lib) != SHOAL_OK) {
        return 0;
    }
    shoal_ucx_log_redirect(); /* before auto_ok() asks libuct anything */
    return 1;
}

/* ---- auto_ok(): UCX's resources ---------------------------------------------------------- */

/* Adds the RDMA transports of one memory domain to found ("rc_verbs/rxe0:1 ..."); their
 * number. */
static int shoal_ucx_md_rdma(uct_component_h comp, const char *md_name, const char *tls,
                             const char *devs, char *found, size_t len)
{
    uct_md_config_t *cfg = NULL;
    uct_tl_resource_desc_t *res = NULL;
    unsigned nres = 0;
    uct_md_h md = NULL;
    ucs_status_t st;
    int n = 0;

    st = uct_md_config_read(comp, NULL, NULL, &cfg);
    if (st != UCS_OK) {
        shoal_trace(UCX, "uct_md_config_read(%s): %s", md_name, ucs_status_string(st));
        return 0;
    }
    st = uct_md_open(comp, md_name, cfg, &md);
    uct_config_release(cfg);
    if (st != UCS_OK) {
        shoal_trace(UCX, "uct_md_open(%s): %s", md_name, ucs_status_string(st));
        return 0;
    }
    st = uct_md_query_tl_resources(md, &res, &nres);
    if (st != UCS_OK) {
        shoal_trace(UCX, "uct_md_query_tl_resources(%s): %s", md_name, ucs_status_string(st));
        nres = 0;
    }
    for (unsigned i = 0; i < nres; i++) {
        const uct_tl_resource_desc_t *r = &res[i];
        int rdma = r->dev_type == UCT_DEVICE_TYPE_NET && strcmp(r->tl_name, "tcp") != 0;
        int allowed = rdma && shoal_ucx_tls_allows(tls, r->tl_name) &&
                      shoal_ucx_dev_allowed(devs, r->dev_name);
        shoal_trace(UCX, "UCX resource %s/%s (md %s): %s", r->tl_name, r->dev_name, md_name,
                    !rdma ? "not an RDMA network transport"
                          : allowed ? "RDMA" : "RDMA, left out by UCX_TLS or UCX_NET_DEVICES");
        if (allowed) {
            size_t used = strlen(found);
            if (used + 1 < len) {
                snprintf(found + used, len - used, "%s%s/%s", used > 0 ? " " : "", r->tl_name,
                         r->dev_name);
            }
            n++;
        }
    }
    if (res != NULL) {
        uct_release_tl_resource_list(res);
    }
    uct_md_close(md);
    return n;
}

/* The number of RDMA transports UCX would use (names in found), or -1 (UCX failed: note). */
static int shoal_ucx_rdma_resources(char *found, size_t len, char *note, size_t nlen)
{
    const char *tls = getenv("UCX_TLS"), *devs = getenv("UCX_NET_DEVICES");
    uct_component_h *comps = NULL;
    unsigned ncomps = 0;
    ucs_status_t st;
    int n = 0;

    found[0] = '\0';
    st = uct_query_components(&comps, &ncomps);
    if (st != UCS_OK) {
        snprintf(note, nlen, "uct_query_components: %s", ucs_status_string(st));
        return -1;
    }
    for (unsigned c = 0; c < ncomps; c++) {
        uct_component_attr_t ca = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME |
                                                 UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
        uct_md_resource_desc_t *mds;
        if (uct_component_query(comps[c], &ca) != UCS_OK || ca.md_resource_count == 0) {
            continue;
        }
        mds = calloc(ca.md_resource_count, sizeof(*mds));
        if (mds == NULL) {
            continue;
        }
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        ca.md_resources = mds;
        if (uct_component_query(comps[c], &ca) == UCS_OK) {
            for (unsigned m = 0; m < ca.md_resource_count; m++) {
                n += shoal_ucx_md_rdma(comps[c], mds[m].md_name, tls, devs, found, len);
            }
        }
        free(mds);
    }
    uct_release_component_list(comps);
    return n;
}

int shoal_ucx_auto_ok(void)
{
    static int answer = -1; /* under the lib's lock: computed once */
    shoal_tl_lib_t *lib = &shoal_ucx_lib;
    char found[160];
    int n, yes;

    pthread_mutex_lock(&lib->lock);
    if (answer < 0) {
        n = shoal_ucx_rdma_resources(found, sizeof(found), lib->note, sizeof(lib->note));
        if (n > 0) {
            snprintf(lib->note, sizeof(lib->note), "UCX reaches other hosts over RDMA: %s",
                     found);
        } else if (n == 0) {
            snprintf(lib->note, sizeof(lib->note), "UCX has no RDMA transport%s (ucx over tcp "
                     "is slower than the tcp transport)",
                     getenv("UCX_TLS") != NULL || getenv("UCX_NET_DEVICES") != NULL
                         ? " that UCX_TLS and UCX_NET_DEVICES allow" : "");
        }
        answer = n > 0;
        shoal_info(UCX, "ucx %s across hosts: %s", answer ? "chosen ahead of tcp" : "not chosen",
                   lib->note);
    }
    yes = answer;
    pthread_mutex_unlock(&lib->lock);
    return yes;
}
