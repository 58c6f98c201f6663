/* Link kinds, their default alpha/beta, and the cached profile (SHOAL_TUNING_FILE). */
#include "topo/topo.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const shoal_link_kind_names[] = {"shm", "tcp", "ucx", "ib", NULL};

int shoal_link_kind_from_name(const char *tl_name)
{
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        if (strcmp(tl_name, shoal_link_kind_names[k]) == 0) {
            return k;
        }
    }
    return -1;
}

/* Defaults: what the shm and tcp transports do on a small VM (loopback TCP), and typical
 * figures for UCX and verbs. Measurements or a tuning file replace them. */
shoal_link_t shoal_link_default(shoal_link_kind_t kind)
{
    static const struct {
        double lat_us, gbs, send_us, recv_us;
    } d[SHOAL_LINK_KINDS] = {
        [SHOAL_LINK_SHM] = {.lat_us = 1.5, .gbs = 6.0, .send_us = 0.3, .recv_us = 0.3},
        [SHOAL_LINK_TCP] = {.lat_us = 20.0, .gbs = 1.5, .send_us = 5.0, .recv_us = 2.0},
        [SHOAL_LINK_UCX] = {.lat_us = 3.0, .gbs = 10.0, .send_us = 0.5, .recv_us = 0.5},
        [SHOAL_LINK_IB] = {.lat_us = 2.5, .gbs = 11.0, .send_us = 0.3, .recv_us = 0.3},
    };
    return (shoal_link_t){.alpha_us = d[kind].lat_us, .beta_us = shoal_gbs_to_beta(d[kind].gbs),
                          .send_us = d[kind].send_us, .recv_us = d[kind].recv_us};
}

/* A figure the model can use: finite and within [lo, 1e9] (us, or GB/s), as SHOAL_TOPO_FILE's.
 * 'lat inf', 'lat 1e300' or 'bw 1e-320' (a time per byte of inf) made every modelled time of
 * the link's kind inf or NaN, and the algorithm choice the first row's, whatever it cost. */
static int shoal_tuning_figure_ok(double v, double lo)
{
    return v >= lo && v <= 1e9;
}

int shoal_tuning_parse_line(char *line, shoal_tuning_t *t)
{
    char name[16];
    double lat, bw, send = 0, recv = 0;
    int k, end[3] = {0, 0, 0};
    int got = sscanf(line, "%15s lat %lf bw %lf%n send %lf%n recv %lf%n", name, &lat, &bw,
                     &end[0], &send, &end[1], &recv, &end[2]);

    if (strncmp(line, "set", 3) == 0 && (line[3] == ' ' || line[3] == '\t')) {
        return 0; /* a setting: src/tune reads those */
    }
    /* Nothing but blanks past the last figure read: 'recv 4' without 'send', a misspelt
     * 'sned 3' or 'bw 2GB/s' were dropped without a word, the line taken in part. */
    if (got >= 3 && got <= 5 && line[end[got - 3] + strspn(line + end[got - 3], " \t\r")] != 0) {
        return -1;
    }
    if (got < 3 || !shoal_tuning_figure_ok(lat, 0) || !shoal_tuning_figure_ok(bw, 1e-9) ||
        !shoal_tuning_figure_ok(send, 0) || !shoal_tuning_figure_ok(recv, 0)) {
        return -1;
    }
    if (strcmp(name, "reduce") == 0) {
        t->reduce_gbs = bw;
        return 0;
    }
    if (strcmp(name, "copy") == 0) {
        t->copy_gbs = bw;
        return 0;
    }
    k = shoal_link_kind_from_name(name);
    if (k < 0) {
        return -1;
    }
    t->link[k] = (shoal_link_t){.alpha_us = lat, .beta_us = shoal_gbs_to_beta(bw),
                                .send_us = send, .recv_us = recv};
    t->have[k] = 1;
    return 0;
}

shoal_status_t shoal_tuning_parse(const char *text, shoal_tuning_t *t)
{
    char *copy = strdup(text), *line, *next;
    shoal_status_t st = SHOAL_OK;
    int lineno = 0;

    memset(t, 0, sizeof(*t));
    if (copy == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    /* Line by line, empty ones counted too: an error names the line's number. */
    for (line = copy; line != NULL; line = next) {
        char *hash;
        next = strchr(line, '\n');
        if (next != NULL) {
            *next++ = '\0';
        }
        lineno++;
        hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        line += strspn(line, " \t\r");
        if (line[0] == '\0') {
            continue;
        }
        if (shoal_tuning_parse_line(line, t) != 0) {
            shoal_error(TOPO, "SHOAL_TUNING_FILE line %d: cannot parse '%s' (want '<kind> lat "
                        "<us> bw <GB/s>')", lineno, line);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
    }
    free(copy);
    return st;
}

/* The whole file is read (src/tune reads the same file's 'set' lines up to this size too): a
 * file cut at a fixed buffer parsed its last line half, and was refused as malformed. */
#define SHOAL_TUNING_TEXT_MAX 65536

int shoal_tuning_load(const char *path, shoal_tuning_t *t)
{
    char *buf, why[96];
    int err;
    shoal_status_t st;

    memset(t, 0, sizeof(*t));
    /* Read whole or refused: a directory read as an empty profile, silently; a FIFO held
     * init in open() for ever. */
    err = shoal_text_file_read(path, SHOAL_TUNING_TEXT_MAX, &buf, NULL, why, sizeof(why));
    if (err == ENOENT) {
        return 0;
    }
    if (err != 0) {
        shoal_error(TOPO, "SHOAL_TUNING_FILE=%s %s%s", path, why,
                    err == EFBIG ? ": ignored" : "");
        return (int)(err == ENOMEM ? SHOAL_ERR_NO_MEMORY
                     : err == EFBIG ? SHOAL_ERR_INVALID_ARG
                                    : SHOAL_ERR_SYSTEM);
    }
    st = shoal_tuning_parse(buf, t);
    free(buf);
    if (st != SHOAL_OK) {
        /* Its 'set' lines are src/tune's, read and checked line by line: 'ignored' alone
         * was untrue of them (a good 'set' line of a malformed file still applies). */
        shoal_error(TOPO, "SHOAL_TUNING_FILE=%s is malformed: its link profile is ignored (its "
                    "'set' lines apply on their own)", path);
        memset(t, 0, sizeof(*t));
        return (int)st;
    }
    return 1;
}

/* Written to a temporary name, then renamed: readers see the old file or the new one. */
shoal_status_t shoal_tuning_save(const char *path, const shoal_tuning_t *t)
{
    char tmp[4096];
    FILE *fp;
    int ok;

    if (snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof(tmp)) {
        return SHOAL_ERR_INVALID_ARG;
    }
    fp = fopen(tmp, "w");
    if (fp == NULL) {
        shoal_warn(TOPO, "cannot write the tuning file %s: %s", tmp, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    fprintf(fp, "# shoal link profile (SHOAL_TUNING_FILE): <kind> lat <us> bw <GB/s> "
                "[send <us> [recv <us>]]\n");
    /* %.6g, not a fixed count of decimals: a link slower than 50 KB/s was written as
     * "bw 0.0000", a line the loader refuses, and the file stayed malformed */
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        if (t->have[k]) {
            fprintf(fp, "%s lat %.3f bw %.6g send %.3f recv %.3f\n", shoal_link_kind_names[k],
                    t->link[k].alpha_us, shoal_beta_to_gbs(t->link[k].beta_us),
                    t->link[k].send_us, t->link[k].recv_us);
        }
    }
    if (t->reduce_gbs > 0) {
        fprintf(fp, "reduce lat 0 bw %.6g\n", t->reduce_gbs);
    }
    if (t->copy_gbs > 0) {
        fprintf(fp, "copy lat 0 bw %.6g\n", t->copy_gbs);
    }
    ok = fflush(fp) == 0;
    ok = fclose(fp) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        shoal_warn(TOPO, "cannot write the tuning file %s: %s", path, strerror(errno));
        unlink(tmp);
        return SHOAL_ERR_SYSTEM;
    }
    return SHOAL_OK;
}
