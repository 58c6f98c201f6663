/* shoal-bill's pieces (src/agent/shoal_bill.c, shoal_bill_plot.c). */
#ifndef SHOAL_AGENT_SHOAL_BILL_H
#define SHOAL_AGENT_SHOAL_BILL_H

#include "agent/ledger.h"
#include "util/util.h"

typedef struct {
    const char *ledger;
    const char *key_file;
    int64_t from, to;
    const char *tenant;
    const char *job;
    const char *out;
    const char *metric;
    int64_t step;
    const char *month;
    const char *head;
    double target;
    int csv;
} shoal_bill_args_t;

/* Opens the ledger of a->ledger as a reader (no file or table is created) with the key of
 * a->key_file (required when need_key); prints why not and returns the exit code (1, or 2 for
 * a missing key file), 0 on success. */
int shoal_bill_open(const shoal_bill_args_t *a, int need_key, shoal_ledger_t **ledger_p);
/* shoal-bill plot: returns the exit code. */
int shoal_bill_cmd_plot(const shoal_bill_args_t *a);

#endif
