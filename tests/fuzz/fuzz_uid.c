/* Fuzz target: the unique id, as SHOAL_UID text (shoal_boot_uid_from_hex) and as the 128
 * bytes a launcher or another rank hands over (shoal_boot_uid_decode), src/core/boot.c.
 * Written against those two functions only, whatever the id's layout. Input: the first byte
 * chooses the form (even: text, odd: raw bytes), the rest is the id. */
#include "core/boot.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

static void fuzz_uid_check(const shoal_uid_t *uid)
{
    shoal_boot_uid_t u, v;
    shoal_uid_t again;

    if (shoal_boot_uid_decode(uid, &u) != SHOAL_OK) {
        return;
    }
    fuzz_require(u.root_len > 0 && (size_t)u.root_len <= sizeof(u.root));
    fuzz_require(u.root.ss_family == AF_INET || u.root.ss_family == AF_INET6);
    /* what decodes, re-encodes into an id that decodes to the same root and secret */
    shoal_boot_uid_encode(&u, &again);
    fuzz_require(shoal_boot_uid_decode(&again, &v) == SHOAL_OK);
    fuzz_require(v.root_len == u.root_len && memcmp(&v.root, &u.root, u.root_len) == 0);
    fuzz_require(memcmp(v.secret, u.secret, sizeof(u.secret)) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    shoal_uid_t uid;

    if (size == 0) {
        return 0;
    }
    if ((data[0] & 1) == 0) {
        char *hex = fuzz_strndup(data + 1, size - 1);
        memset(&uid, 0, sizeof(uid));
        if (shoal_boot_uid_from_hex(hex, &uid) == SHOAL_OK) {
            fuzz_require(strlen(hex) == 2 * SHOAL_UID_BYTES);
            fuzz_uid_check(&uid);
        }
        free(hex);
    } else {
        size_t n = SHOAL_MIN(size - 1, sizeof(uid.internal));
        memset(&uid, 0, sizeof(uid));
        memcpy(uid.internal, data + 1, n);
        fuzz_uid_check(&uid);
    }
    return 0;
}
