/* Link kinds, their default alpha/beta, and the cached profile (SHOAL_TUNING_FILE). */
#include "topo/topo.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The line is shown only when its first word is a kind the file has ('shm', 'copy', ...): a
 * file given by mistake (a credential, a token) had its first line in every rank's log. */
static void shoal_tuning_error(int lineno, const char *line)
{
    size_t len = strcspn(line, " \t\r");
    int known = (len == 4 && strncmp(line, "copy", 4) == 0) ||
                (len == 6 && strncmp(line, "reduce", 6) == 0) ||
                (len == 3 && strncmp(line, "set", 3) == 0);

    for (int k = 0; k < SHOAL_LINK_KINDS && !known; k++) {
        known = strlen(shoal_link_kind_names[k]) == len &&
                strncmp(line, shoal_link_kind_names[k], len) == 0;
    }
    if (known) {
        shoal_error(TOPO, "SHOAL_TUNING_FILE line %d: cannot parse '%s' (want '<kind> lat "
                    "<us> bw <GB/s>')", lineno, line);
    } else {
        shoal_error(TOPO, "SHOAL_TUNING_FILE line %d: does not start with a link kind (shm, "
                    "tcp, ucx, ib), 'copy', 'reduce' or 'set' (the line is not shown: is it the "
                    "right file?)", lineno);
    }
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
            shoal_tuning_error(lineno, line);
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

/* 0 if the tuning file at path (sb: the file read) could not have been left or changed by
 * another local user, else -1 and why. It is a cache rank 0 writes, often in /tmp: a file or a
 * symbolic link another user put at its path before the job was read as the job's profile
 * and sizes. This user's file is trusted unless anyone may write to it; another user's (a
 * colleague's profile, root's) as a file the provider leaves (shoal_provider_file_untrusted:
 * not where others may write, unless it is root's or the directory owner's), checked in the
 * directory it really is in; a link at path as its directory allows (a link's mode bits mean
 * nothing, its owner does). */
static int shoal_tuning_untrusted(const char *path, const struct stat *sb, char *why,
                                  size_t whylen)
{
    struct stat lsb, rsb;
    char real[PATH_MAX];
    const char *bad = NULL;

    if ((sb->st_mode & S_IWOTH) != 0) {
        bad = "anyone may write to it";
    } else if (lstat(path, &lsb) != 0) {
        bad = "it cannot be found again";
    } else if (S_ISLNK(lsb.st_mode) && lsb.st_uid != geteuid() && lsb.st_uid != 0) {
        lsb.st_mode &= (mode_t)~(S_IWGRP | S_IWOTH);
        bad = shoal_provider_file_untrusted(path, &lsb);
        if (bad != NULL) {
            snprintf(why, whylen, "is a symbolic link of uid %u, not trusted: %s",
                     (unsigned)lsb.st_uid, bad);
            return -1;
        }
    }
    if (bad == NULL && sb->st_uid != geteuid()) {
        if (realpath(path, real) == NULL || stat(real, &rsb) != 0 ||
            rsb.st_dev != sb->st_dev || rsb.st_ino != sb->st_ino) {
            bad = "it was replaced while it was read";
        } else {
            bad = shoal_provider_file_untrusted(real, sb);
        }
    }
    if (bad != NULL) {
        snprintf(why, whylen, "belongs to uid %u, not trusted: %s", (unsigned)sb->st_uid, bad);
        return -1;
    }
    return 0;
}

int shoal_tuning_read(const char *path, char **text_p, char *why, size_t whylen)
{
    struct stat sb;
    size_t len = 0;
    int err = shoal_text_file_read_st(path, SHOAL_TUNING_TEXT_MAX, text_p, &len, &sb, why,
                                      whylen);

    /* The text ended at a NUL byte: a file of zeros was an empty profile, without a word. */
    if (err == 0 && memchr(*text_p, '\0', len) != NULL) {
        snprintf(why, whylen, "has a NUL byte at offset %zu: not a text file",
                 strlen(*text_p));
        free(*text_p);
        *text_p = NULL;
        err = EINVAL;
    } else if (err == 0 && shoal_tuning_untrusted(path, &sb, why, whylen) != 0) {
        free(*text_p);
        *text_p = NULL;
        err = EPERM;
    }
    return err;
}

int shoal_tuning_load(const char *path, shoal_tuning_t *t)
{
    char *buf, why[256];
    int err;
    shoal_status_t st;

    memset(t, 0, sizeof(*t));
    /* Read whole or refused: a directory read as an empty profile, silently; a FIFO held
     * init in open() for ever. An untrusted file is not used, nor written over (rank 0 saves
     * only where there is no file). */
    err = shoal_tuning_read(path, &buf, why, sizeof(why));
    if (err == ENOENT) {
        return 0;
    }
    if (err != 0) {
        shoal_error(TOPO, "SHOAL_TUNING_FILE=%s %s%s", path, why,
                    err == EFBIG || err == EPERM ? ": ignored" : "");
        return (int)(err == ENOMEM ? SHOAL_ERR_NO_MEMORY
                     : err == EFBIG || err == EPERM ? SHOAL_ERR_INVALID_ARG
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

/* Written to a temporary name, then renamed: readers see the old file or the new one. The
 * temporary file is made new, never opened through what is there: the name is known (the
 * pid), and fopen "w" wrote through another user's symbolic link at it (truncating its
 * target, root's files too) or into another user's file, which then became the profile. */
shoal_status_t shoal_tuning_save(const char *path, const shoal_tuning_t *t)
{
    char tmp[4096];
    FILE *fp;
    int ok, fd = -1;

    /* path.<pid>.tmp alone: a file or link at it (another user's, or one a process of the
     * same pid left when killed before its rename) made every save fail. A few names are
     * tried; the mode stays 0666 less the umask (mkstemp's would be 0600). */
    for (int i = 0; i < 16 && fd < 0; i++) {
        unsigned r = (unsigned)shoal_hash64(&i, sizeof(i), shoal_time_ns());
        if (snprintf(tmp, sizeof(tmp), "%s.%d.%08x.tmp", path, (int)getpid(), r) >=
            (int)sizeof(tmp)) {
            return SHOAL_ERR_INVALID_ARG;
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST && errno != ELOOP) {
            break;
        }
    }
    fp = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fp == NULL) {
        shoal_warn(TOPO, "cannot write the tuning file %s: %s", tmp, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
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
