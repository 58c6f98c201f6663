/* FNV-1a hashing, strong random bytes, HMAC-SHA256 and constant-time compare (libcrypto). */
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#define SHOAL_FNV_OFFSET 0xcbf29ce484222325ull
#define SHOAL_FNV_PRIME 0x100000001b3ull

uint64_t shoal_hash64(const void *data, size_t len, uint64_t seed)
{
    const uint8_t *p = data;
    uint64_t h = SHOAL_FNV_OFFSET ^ seed;
    size_t i;

    for (i = 0; i < len; i++) {
        h ^= p[i];
        h *= SHOAL_FNV_PRIME;
    }
    return h;
}

shoal_status_t shoal_random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t done = 0;
    ssize_t ret;

    while (done < len) {
        ret = getrandom(p + done, len - done, 0);
        if (ret < 0) {
            if (errno == EINTR)
                continue;
            shoal_error(INIT, "getrandom(%zu bytes) failed: %s", len - done, strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
        done += (size_t)ret;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_hmac(const uint8_t *key, size_t keylen, const void *msg, size_t msglen,
                          uint8_t out[SHOAL_HMAC_BYTES])
{
    unsigned int outlen = 0;
    static const uint8_t shoal_hmac_empty[1];

    if (key == NULL || (msg == NULL && msglen != 0) || out == NULL || keylen > INT32_MAX)
        return SHOAL_ERR_INVALID_ARG;
    if (msg == NULL)
        msg = shoal_hmac_empty;
    if (HMAC(EVP_sha256(), key, (int)keylen, msg, msglen, out, &outlen) == NULL ||
        outlen != SHOAL_HMAC_BYTES) {
        shoal_error(TENANT, "HMAC-SHA256 over %zu bytes failed in libcrypto", msglen);
        return SHOAL_ERR_INTERNAL;
    }
    return SHOAL_OK;
}

void shoal_crypto_init(void)
{
    (void)OPENSSL_init_crypto(0, NULL); /* registers libcrypto's atexit cleanup, once */
}

int shoal_memeq_ct(const void *a, const void *b, size_t len)
{
    return CRYPTO_memcmp(a, b, len) == 0;
}

void shoal_secret_wipe(void *p, size_t len)
{
    if (p != NULL && len > 0)
        OPENSSL_cleanse(p, len);
}

shoal_status_t shoal_kdf(const uint8_t *secret, size_t secret_len, const char *label,
                         const void *context, size_t context_len, uint8_t out[SHOAL_HMAC_BYTES])
{
    size_t llen = label != NULL ? strlen(label) : 0;
    uint8_t *msg;
    shoal_status_t st;

    if (secret == NULL || out == NULL || (context == NULL && context_len != 0) ||
        llen > 255 || context_len > (1u << 20))
        return SHOAL_ERR_INVALID_ARG;
    /* label length | label | context: no two (label, context) pairs give the same message */
    msg = malloc(1 + llen + context_len);
    if (msg == NULL)
        return SHOAL_ERR_NO_MEMORY;
    msg[0] = (uint8_t)llen;
    if (llen > 0)
        memcpy(msg + 1, label, llen);
    if (context_len > 0)
        memcpy(msg + 1 + llen, context, context_len);
    st = shoal_hmac(secret, secret_len, msg, 1 + llen + context_len, out);
    shoal_secret_wipe(msg, 1 + llen + context_len);
    free(msg);
    return st;
}
