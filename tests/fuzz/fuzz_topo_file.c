/* Fuzz target: the synthetic topology file (SHOAL_TOPO_FILE, shoal_topo_file_parse in
 * src/topo/topo_file.c), and what the communicator does with the result (host-aware ring
 * order). Input: two bytes for the number of ranks (1..4096), then the file's text. */
#include "topo/topo.h"
#include "tests/fuzz/fuzz.h"

#define FUZZ_TOPO_RANKS_MAX 4096
#define FUZZ_TOPO_RING_MAX 256 /* the ring order is quadratic: only on small communicators */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    shoal_topo_file_t tf;
    int nranks;
    char *text;

    if (size < 2) {
        return 0;
    }
    nranks = 1 + (int)(((unsigned)data[0] | (unsigned)data[1] << 8) % FUZZ_TOPO_RANKS_MAX);
    text = fuzz_strndup(data + 2, size - 2);
    if (shoal_topo_file_parse(text, nranks, &tf) == SHOAL_OK) {
        fuzz_require(tf.nranks == nranks && tf.nhosts >= 1 && tf.sockets >= 1);
        for (int r = 0; r < nranks; r++) {
            fuzz_require(tf.host_of[r] >= 0);
            fuzz_require(tf.socket_of[r] >= 0 && tf.socket_of[r] < tf.sockets);
        }
        if (nranks <= FUZZ_TOPO_RING_MAX) {
            int *order = malloc(sizeof(int) * (size_t)nranks);
            fuzz_require(order != NULL);
            shoal_topo_ring_order(nranks, tf.host_of, tf.socket_of, order);
            (void)shoal_topo_ring_share(nranks, tf.host_of, order);
            free(order);
        }
        shoal_topo_file_free(&tf);
    } else {
        fuzz_require(tf.host_of == NULL && tf.socket_of == NULL);
    }
    free(text);
    return 0;
}
