/* Fuzz target: the UCX transport's published address (shoal_ucx_addr_decode,
 * transports/ucx/ucx_conn.c), as another rank's allgather blob. Input: the address. */
#include "transports/ucx/ucx.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    shoal_ucx_addr_t a;

    if (shoal_ucx_addr_decode(size > 0 ? data : NULL, size, &a) == 0) {
        /* the worker address lies inside the input and ends with it */
        fuzz_require(size >= SHOAL_UCX_ADDR_HDR_BYTES && a.worker_len > 0);
        fuzz_require(a.worker == data + SHOAL_UCX_ADDR_HDR_BYTES);
        fuzz_require(a.worker + a.worker_len == data + size);
        /* what connect_all reads of it */
        volatile uint8_t sum = 0;
        for (uint32_t i = 0; i < a.worker_len; i++) {
            sum ^= a.worker[i];
        }
        for (int i = 0; i < SHOAL_UCX_NONCE_BYTES; i++) {
            sum ^= a.nonce[i];
        }
        (void)sum;
    }
    return 0;
}
