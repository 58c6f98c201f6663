/* Per-thread records listed process-wide (trec.h). */
#include "util/trec.h"

#include <stdlib.h>
#include <string.h>

struct shoal_trec {
    shoal_trec_list_t *list;
    unsigned char *recs;     /* n records of list->size bytes, room for cap */
    int n, cap;
    int dropped;             /* records dropped since the last take */
    shoal_trec_t *next;
};

/* The thread's exit: its records are unlisted and freed; they never run. */
static void shoal_trec_exit(void *arg)
{
    shoal_trec_t *t = arg;
    shoal_trec_list_t *l = t->list;

    pthread_mutex_lock(&l->lock);
    for (shoal_trec_t **pp = &l->head; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    }
    pthread_mutex_unlock(&l->lock);
    free(t->recs);
    free(t);
}

/* The calling thread's records, made and listed on first use; NULL on no memory (or no key:
 * without it, the thread's exit would leak them). pthread_once takes no argument: the key is
 * made under the list's lock instead. */
static shoal_trec_t *shoal_trec_mine(shoal_trec_list_t *l)
{
    shoal_trec_t *t;

    if (__atomic_load_n(&l->key_ok, __ATOMIC_ACQUIRE) == 0) {
        pthread_mutex_lock(&l->lock);
        if (l->key_ok == 0) {
            int ok = pthread_key_create(&l->key, shoal_trec_exit) == 0 ? 1 : -1;
            __atomic_store_n(&l->key_ok, ok, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&l->lock);
    }
    if (__atomic_load_n(&l->key_ok, __ATOMIC_ACQUIRE) != 1) {
        return NULL;
    }
    t = pthread_getspecific(l->key);
    if (t != NULL) {
        return t;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return NULL;
    }
    t->list = l;
    if (pthread_setspecific(l->key, t) != 0) {
        free(t);
        return NULL;
    }
    pthread_mutex_lock(&l->lock);
    t->next = l->head;
    l->head = t;
    pthread_mutex_unlock(&l->lock);
    return t;
}

shoal_status_t shoal_trec_add(shoal_trec_list_t *l, const void *rec)
{
    shoal_trec_t *t = shoal_trec_mine(l);
    shoal_status_t st = SHOAL_ERR_NO_MEMORY;

    if (t == NULL) {
        return st;
    }
    pthread_mutex_lock(&l->lock); /* a destroy may walk t->recs meanwhile */
    if (t->n == t->cap) {
        int cap = t->cap > 0 ? 2 * t->cap : 16;
        unsigned char *p = realloc(t->recs, (size_t)cap * l->size);
        if (p != NULL) {
            t->recs = p;
            t->cap = cap;
        }
    }
    if (t->n < t->cap) {
        memcpy(t->recs + (size_t)t->n++ * l->size, rec, l->size);
        st = SHOAL_OK;
    }
    pthread_mutex_unlock(&l->lock);
    return st;
}

int shoal_trec_forget(shoal_trec_list_t *l, const void *owner)
{
    int dropped = 0;

    pthread_mutex_lock(&l->lock);
    for (shoal_trec_t *t = l->head; t != NULL; t = t->next) {
        for (int i = 0; i < t->n; i++) {
            void **o = (void **)(void *)(t->recs + (size_t)i * l->size);
            if (*o == owner) {
                *o = NULL;
                t->dropped++;
                dropped++;
            }
        }
    }
    pthread_mutex_unlock(&l->lock);
    return dropped;
}

void *shoal_trec_take(shoal_trec_list_t *l, int *n_p, int *dropped_p)
{
    shoal_trec_t *t = __atomic_load_n(&l->key_ok, __ATOMIC_ACQUIRE) == 1
                          ? pthread_getspecific(l->key) : NULL;
    void *recs = NULL;

    *n_p = *dropped_p = 0;
    if (t == NULL) {
        return NULL;
    }
    pthread_mutex_lock(&l->lock);
    recs = t->recs;
    *n_p = t->n;
    *dropped_p = t->dropped;
    t->recs = NULL;
    t->n = t->cap = t->dropped = 0;
    pthread_mutex_unlock(&l->lock);
    return recs;
}

void shoal_trec_unload(shoal_trec_list_t *l)
{
    if (__atomic_load_n(&l->key_ok, __ATOMIC_ACQUIRE) == 1) {
        (void)pthread_key_delete(l->key);
        __atomic_store_n(&l->key_ok, -1, __ATOMIC_RELEASE); /* no record from now on */
    }
}
