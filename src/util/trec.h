/* Per-thread records that any thread must be able to drop: what a thread's group
 * (shoal_group_start .. shoal_group_end) recorded on a communicator, which a destroy on any
 * thread must drop (the application serializes its calls on a communicator, not its groups).
 * Each thread's records are listed process-wide under the list's lock, and freed at the
 * thread's exit (a thread that exits inside a group; a thread-local pointer has no
 * destructor). A record is size bytes whose first member is its owner (void *, the
 * communicator; NULL once dropped). Used by src/api (host sends and receives) and src/cuda
 * (stream-ordered and device calls). */
#ifndef SHOAL_UTIL_TREC_H
#define SHOAL_UTIL_TREC_H

#include "util/util.h"

#include <pthread.h>

typedef struct shoal_trec shoal_trec_t;
typedef struct {
    size_t size;             /* bytes of a record */
    pthread_mutex_t lock;    /* the list, and every thread's records */
    shoal_trec_t *head;      /* every thread's records, under the lock */
    pthread_key_t key;       /* the calling thread's shoal_trec_t, freed at its exit */
    int key_ok;              /* 0: not made yet, 1: made, -1: failed or unloaded (atomic) */
} shoal_trec_list_t;

#define SHOAL_TREC_LIST_INIT(type) {.size = sizeof(type), .lock = PTHREAD_MUTEX_INITIALIZER}

/* Appends a copy of rec to the calling thread's records: SHOAL_OK, or SHOAL_ERR_NO_MEMORY. */
SHOAL_HIDDEN shoal_status_t shoal_trec_add(shoal_trec_list_t *l, const void *rec);
/* Drops every thread's records of owner; returns how many were dropped. */
SHOAL_HIDDEN int shoal_trec_forget(shoal_trec_list_t *l, const void *owner);
/* Takes the calling thread's records away (the caller frees the array; those dropped since
 * they were added have owner NULL) and how many of them were dropped (*dropped_p); NULL and
 * 0 if it has none. A destroy after this no longer sees them. */
SHOAL_HIDDEN void *shoal_trec_take(shoal_trec_list_t *l, int *n_p, int *dropped_p);
/* The library is unloaded: no thread exit may call into it later (the records are lost). */
SHOAL_HIDDEN void shoal_trec_unload(shoal_trec_list_t *l);

#endif
