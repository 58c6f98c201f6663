/*
 * What launchers take, for one placed job (ranks in ring order: rank r on node_of[r]):
 *   nodelist        hostlist form for sbatch/srun --nodelist (Slurm's ranged string)
 *   slurm_hostfile  one host per task, for SLURM_HOSTFILE with srun -m arbitrary
 *   ompi_hostfile   "host slots=N" for mpirun --hostfile
 *   rankfile        "rank R=host slot=A-B" for mpirun --rankfile: a host's cores are divided
 *                   evenly among its GPUs and a rank is bound to its GPU's share
 *   gpus            "R host CUDA_VISIBLE_DEVICES=g" per rank
 *   ring            the hosts in ring order, one a line: SHOAL_RING_HOSTS_FILE for libshoal
 *                   (or joined with commas, SHOAL_RING_HOSTS)
 */
#include "sched/sched.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *const shoal_sched_out_names[] = {"nodelist", "slurm_hostfile", "ompi_hostfile",
                                             "rankfile", "gpus", "ring", NULL};

int shoal_sched_out_kind(const char *name)
{
    for (int k = 0; shoal_sched_out_names[k] != NULL; k++) {
        if (strcmp(shoal_sched_out_names[k], name) == 0) {
            return k;
        }
    }
    return -1;
}

static shoal_status_t shoal_sched_out_nodelist(const shoal_sched_cluster_t *c,
                                               const shoal_sched_job_t *j, FILE *fp)
{
    shoal_hostlist_t hl = {0};
    shoal_status_t st = SHOAL_OK;
    char *s;

    for (int r = 0; r < j->ranks && st == SHOAL_OK; r++) {
        if (r == 0 || j->node_of[r] != j->node_of[r - 1]) {
            st = shoal_hostlist_push_host(&hl, c->nodes[j->node_of[r]].name);
        }
    }
    s = st == SHOAL_OK ? shoal_hostlist_ranged(&hl) : NULL;
    if (s != NULL) {
        fprintf(fp, "%s\n", s);
    }
    free(s);
    shoal_hostlist_free(&hl);
    return s != NULL ? SHOAL_OK : SHOAL_ERR_NO_MEMORY;
}

shoal_status_t shoal_sched_output(const shoal_sched_cluster_t *c, const shoal_sched_job_t *j,
                                  int kind, FILE *fp)
{
    if (j->state != SHOAL_SCHED_RUNNING || j->node_of == NULL) {
        shoal_error(SCHED, "job %s has no placement", j->name);
        return SHOAL_ERR_INVALID_ARG;
    }
    switch (kind) {
    case SHOAL_SCHED_OUT_NODELIST:
        return shoal_sched_out_nodelist(c, j, fp);
    case SHOAL_SCHED_OUT_SLURM_HOSTFILE:
        for (int r = 0; r < j->ranks; r++) {
            fprintf(fp, "%s\n", c->nodes[j->node_of[r]].name);
        }
        return SHOAL_OK;
    case SHOAL_SCHED_OUT_OMPI_HOSTFILE:
        for (int r = 0, n = 0; r < j->ranks; r++) {
            n++;
            if (r + 1 == j->ranks || j->node_of[r + 1] != j->node_of[r]) {
                fprintf(fp, "%s slots=%d\n", c->nodes[j->node_of[r]].name, n);
                n = 0;
            }
        }
        return SHOAL_OK;
    case SHOAL_SCHED_OUT_RANKFILE:
        for (int r = 0; r < j->ranks; r++) {
            const shoal_sched_node_t *n = &c->nodes[j->node_of[r]];
            int share = n->gpus > 0 ? n->cpus / n->gpus : n->cpus;
            int per = j->cpus > 0 ? SHOAL_MIN(j->cpus, share) : 1;
            /* fewer cores than GPUs: GPUs share cores, spread over all of them (a share of 0
             * put every rank of the host on core 0) */
            int first = share > 0 ? j->gpu_of[r] * share
                                  : (int)((long)j->gpu_of[r] * n->cpus / n->gpus);
            if (per <= 1 || share <= 1) {
                fprintf(fp, "rank %d=%s slot=%d\n", r, n->name, first);
            } else {
                fprintf(fp, "rank %d=%s slot=%d-%d\n", r, n->name, first, first + per - 1);
            }
        }
        return SHOAL_OK;
    case SHOAL_SCHED_OUT_GPUS:
        for (int r = 0; r < j->ranks; r++) {
            fprintf(fp, "%d %s CUDA_VISIBLE_DEVICES=%d\n", r, c->nodes[j->node_of[r]].name,
                    j->gpu_of[r]);
        }
        return SHOAL_OK;
    case SHOAL_SCHED_OUT_RING:
        for (int r = 0; r < j->ranks; r++) {
            if (r == 0 || j->node_of[r] != j->node_of[r - 1]) {
                fprintf(fp, "%s\n", c->nodes[j->node_of[r]].name);
            }
        }
        return SHOAL_OK;
    default:
        return SHOAL_ERR_INVALID_ARG;
    }
}

shoal_status_t shoal_sched_output_dir(const shoal_sched_cluster_t *c, const shoal_sched_job_t *j,
                                      const char *dir)
{
    for (int k = 0; k < SHOAL_SCHED_OUT_KINDS; k++) {
        char path[4096];
        FILE *fp;
        shoal_status_t st;
        int n = snprintf(path, sizeof(path), "%s/%s.%s", dir, j->name,
                         shoal_sched_out_names[k]);
        if (n < 0 || (size_t)n >= sizeof(path)) { /* cut, it named another file */
            shoal_error(SCHED, "--out: the path of job %s's %s file is longer than %zu bytes "
                        "(the directory's alone is %zu)", j->name, shoal_sched_out_names[k],
                        sizeof(path) - 1, strlen(dir));
            return SHOAL_ERR_INVALID_ARG;
        }
        fp = fopen(path, "w");
        if (fp == NULL) {
            shoal_error(SCHED, "fopen(%s) failed: %s", path, strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
        st = shoal_sched_output(c, j, k, fp);
        if (fclose(fp) != 0 && st == SHOAL_OK) {
            shoal_error(SCHED, "writing %s failed: %s", path, strerror(errno));
            st = SHOAL_ERR_SYSTEM;
        }
        SHOAL_CHECK(st);
    }
    return SHOAL_OK;
}

void shoal_sched_plan_print(const shoal_sched_cluster_t *c, const shoal_sched_queue_t *q,
                            const shoal_sched_plan_t *p, int explain, FILE *fp)
{
    char *decided = calloc((size_t)q->njobs + 1, 1);

    for (int i = 0; i < p->n; i++) {
        const shoal_sched_decision_t *d = &p->d[i];
        const shoal_sched_job_t *j = &q->jobs[d->job];
        const char *tenant = q->tenants[j->tenant].name;
        if (decided != NULL) {
            decided[d->job] = 1;
        }
        if (d->preempted_by >= 0) {
            fprintf(fp, "preempt job=%s tenant=%s signal=%s grace=%d for=%s\n", j->name, tenant,
                    j->signal, j->grace_s, q->jobs[d->preempted_by].name);
        } else if (d->placed) {
            fprintf(fp, "place job=%s tenant=%s gpus=%d level=%d cost=%.0f nodes=", j->name,
                    tenant, j->ranks, d->info.level, d->info.cost);
            shoal_sched_output(c, j, SHOAL_SCHED_OUT_NODELIST, fp);
        } else {
            fprintf(fp, "pending job=%s tenant=%s gpus=%d\n", j->name, tenant, j->ranks);
        }
        if (explain) {
            fprintf(fp, "  why: %s\n", d->why);
        }
    }
    for (int i = 0; i < q->njobs && decided != NULL; i++) {
        const shoal_sched_job_t *j = &q->jobs[i];
        if (!decided[i] && j->state == SHOAL_SCHED_QUEUED) {
            fprintf(fp, "pending job=%s tenant=%s gpus=%d\n", j->name, q->tenants[j->tenant].name,
                    j->ranks);
            if (explain) {
                fprintf(fp, "  why: behind an earlier job of tenant %s that could not start "
                        "(gangs are served in order)\n", q->tenants[j->tenant].name);
            }
        }
    }
    free(decided);
}
