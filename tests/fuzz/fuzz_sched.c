/* Fuzz target: the inputs of shoal-place (src/sched): Slurm hostlist expressions, slurm.conf,
 * topology.conf and the jobs file, and what the planner then does with them (a planning round
 * and every launcher output). Input: one byte choosing what the text is (0 hostlist, 1
 * slurm.conf, 2 topology.conf after a fixed slurm.conf, 3 a jobs file on a fixed cluster,
 * 4 a past-usage CSV (shoal-bill usage --csv) for a fixed cluster and jobs file, then the
 * round and --explain with that usage), then the text. */
#include "sched/sched.h"
#include "tests/fuzz/fuzz.h"

static const char fuzz_sched_conf[] = "NodeName=n[01-04] CPUs=16 RealMemory=64000 Gres=gpu:4\n";
static const char fuzz_sched_topo[] = "SwitchName=l1 Nodes=n[01-02]\nSwitchName=l2 Nodes=n[03-04]\n"
                                      "SwitchName=s Switches=l[1-2]\n";
static const char fuzz_sched_jobs[] = "tenant=a weight=1\ntenant=b weight=2\n"
                                      "job=ja tenant=a gpus=12\njob=jb tenant=b gpus=8\n";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

static void fuzz_sched_plan(shoal_sched_cluster_t *c, shoal_sched_queue_t *q)
{
    shoal_sched_plan_t plan = {0};
    shoal_sched_opts_t o = {.policy = SHOAL_SCHED_POLICY_SHOAL, .preempt = 1};
    FILE *null = fopen("/dev/null", "w");

    fuzz_require(null != NULL);
    if (shoal_sched_plan_round(c, q, &o, &plan) == SHOAL_OK) {
        for (int i = 0; i < q->njobs; i++) {
            const shoal_sched_job_t *j = &q->jobs[i];
            if (j->state == SHOAL_SCHED_RUNNING) {
                for (int k = 0; k < SHOAL_SCHED_OUT_KINDS; k++) {
                    fuzz_require(shoal_sched_output(c, j, k, null) == SHOAL_OK);
                }
                for (int r = 0; r < j->ranks; r++) {
                    fuzz_require(j->node_of[r] >= 0 && j->node_of[r] < c->nnodes);
                    fuzz_require(j->gpu_of[r] >= 0 && j->gpu_of[r] < c->nodes[j->node_of[r]].gpus);
                }
            }
        }
        shoal_sched_plan_print(c, q, &plan, 1, null);
    }
    shoal_sched_plan_free(&plan);
    fclose(null);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    shoal_sched_cluster_t c = {0};
    shoal_sched_queue_t q = {0};
    shoal_hostlist_t hl = {0};
    char *text;

    if (size < 1) {
        return 0;
    }
    text = fuzz_strndup(data + 1, size - 1);
    switch (data[0] % 5) {
    case 0:
        if (shoal_hostlist_parse(text, &hl) == SHOAL_OK) {
            char *s = shoal_hostlist_ranged(&hl), name[256];
            fuzz_require(s != NULL);
            free(s);
            for (size_t i = 0; i < hl.nhosts && i < 4096; i++) {
                fuzz_require(shoal_hostlist_nth(&hl, i, name, sizeof(name)) >= 0 ||
                             strlen(text) > 200);
            }
        }
        shoal_hostlist_free(&hl);
        break;
    case 1:
        if (shoal_sched_slurm_conf_parse(text, "fuzz", &c) == SHOAL_OK &&
            shoal_sched_cluster_finish(&c) == SHOAL_OK) {
            fuzz_require(c.nnodes > 0);
        }
        break;
    case 2:
        fuzz_require(shoal_sched_slurm_conf_parse(fuzz_sched_conf, "conf", &c) == SHOAL_OK);
        if (shoal_sched_topology_parse(text, "fuzz", &c) == SHOAL_OK &&
            shoal_sched_cluster_finish(&c) == SHOAL_OK) {
            shoal_sched_job_t *j = shoal_sched_job_new(&q);
            fuzz_require(j != NULL && shoal_sched_tenant_get(&q, "t") == 0);
            q.tenants[0].weight = 1;
            j->ranks = 6;
            fuzz_sched_plan(&c, &q);
        }
        break;
    case 3:
        fuzz_require(shoal_sched_slurm_conf_parse(fuzz_sched_conf, "conf", &c) == SHOAL_OK);
        fuzz_require(shoal_sched_topology_parse(fuzz_sched_topo, "topo", &c) == SHOAL_OK);
        fuzz_require(shoal_sched_cluster_finish(&c) == SHOAL_OK);
        if (shoal_sched_jobs_parse(text, "fuzz", &c, &q) == SHOAL_OK) {
            fuzz_sched_plan(&c, &q);
        }
        break;
    default: {
        shoal_sched_usage_t u = {.half_life = 3600.0, .now = 1796083200.0};
        FILE *null = fopen("/dev/null", "w");
        fuzz_require(null != NULL);
        fuzz_require(shoal_sched_slurm_conf_parse(fuzz_sched_conf, "conf", &c) == SHOAL_OK);
        fuzz_require(shoal_sched_cluster_finish(&c) == SHOAL_OK);
        fuzz_require(shoal_sched_jobs_parse(fuzz_sched_jobs, "jobs", &c, &q) == SHOAL_OK);
        if (shoal_sched_usage_parse(text, "fuzz", &c, &q, &u) == SHOAL_OK) {
            fuzz_require(u.rows >= 0 && u.decayed <= u.rows && u.unknown <= u.rows);
            fuzz_require(memchr(u.note, '\0', sizeof(u.note)) != NULL);
            for (int t = 0; t < q.ntenants; t++) {
                fuzz_require(q.tenants[t].past_gpu_s >= 0.0 && q.tenants[t].past >= 0.0);
            }
            shoal_sched_usage_explain(&c, &q, &u, null);
            fuzz_sched_plan(&c, &q);
        }
        fclose(null);
        break;
    }
    }
    shoal_sched_queue_free(&q);
    shoal_sched_cluster_free(&c);
    free(text);
    return 0;
}
