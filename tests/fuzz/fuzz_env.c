/* Fuzz target: what a user writes into SHOAL_SECRET (shoal_boot_hex_decode: exactly 64 hex
 * digits, nothing else) and SHOAL_ROOT (shoal_boot_root_split: host:port or [ipv6]:port),
 * src/core/boot.c. Input: the first byte chooses the parser (even: secret, odd: root), the
 * rest is the variable's text. */
#include "core/boot.h"
#include "tests/fuzz/fuzz.h"

#include <ctype.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

static void fuzz_env_secret(const char *text)
{
    uint8_t secret[SHOAL_SECRET_BYTES];
    char again[2 * SHOAL_SECRET_BYTES + 1];

    if (shoal_boot_hex_decode(text, secret, sizeof(secret)) != SHOAL_OK) {
        return;
    }
    /* Accepted: 64 hex digits exactly, and they are what the bytes print as. */
    fuzz_require(strlen(text) == 2 * SHOAL_SECRET_BYTES);
    for (size_t i = 0; i < sizeof(secret); i++) {
        snprintf(again + 2 * i, 3, "%02x", secret[i]);
    }
    for (size_t i = 0; i < 2 * SHOAL_SECRET_BYTES; i++) {
        fuzz_require(isxdigit((unsigned char)text[i]) &&
                     tolower((unsigned char)text[i]) == again[i]);
    }
}

static void fuzz_env_root(const char *text)
{
    char host[256], spec[300];
    uint16_t port = 0;
    int v6;

    if (shoal_boot_root_split(text, host, sizeof(host), &port) != SHOAL_OK) {
        return;
    }
    fuzz_require(port > 0 && host[0] != '\0' && strlen(host) < sizeof(host));
    /* Accepted: it prints back to the same text (no other spelling of a port is taken). */
    v6 = text[0] == '[';
    snprintf(spec, sizeof(spec), v6 ? "[%s]:%u" : "%s:%u", host, (unsigned)port);
    fuzz_require(strcmp(spec, text) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text;

    if (size == 0) {
        return 0;
    }
    text = fuzz_strndup(data + 1, size - 1);
    if ((data[0] & 1) == 0) {
        fuzz_env_secret(text);
    } else {
        fuzz_env_root(text);
    }
    free(text);
    return 0;
}
