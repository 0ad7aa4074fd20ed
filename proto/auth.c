/*
 * auth.c: shared-secret authentication at Hello (gift_auth.h), on libsodium's
 * HMAC-SHA256, CSPRNG and constant-time comparison.
 */
/* POSIX.1-2008 (O_CLOEXEC, fstat, read) on top of strict C11. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gift_auth.h"
#include "gift_error.h"

static const char HELLO_LABEL[] = "giftd-auth-v1 hello";
static const char ACK_LABEL[] = "giftd-auth-v1 ack";

static void put_le32(crypto_auth_hmacsha256_state *st, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    crypto_auth_hmacsha256_update(st, b, 4);
}

int gift_auth_key_load(const char *path, gift_auth_key_t *key, char *err, size_t errlen, char *warn,
                       size_t warnlen)
{
    struct stat st;
    ssize_t n;
    size_t len = 0;
    int fd, rc = GIFT_ECONFIG;

    if (warn != NULL && warnlen > 0)
        warn[0] = '\0';
    memset(key, 0, sizeof *key);
    if (path == NULL || *path == '\0') {
        snprintf(err, errlen, "auth key file: no path given");
        return GIFT_ECONFIG;
    }
    if (sodium_init() < 0) {
        snprintf(err, errlen, "auth key file %s: libsodium cannot be initialised", path);
        return GIFT_ECONFIG;
    }
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)) < 0) {
        snprintf(err, errlen, "auth key file %s: %s", path, strerror(errno));
        return GIFT_ECONFIG;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "auth key file %s: %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "auth key file %s is not a regular file", path);
        goto out_close;
    }
    if (st.st_mode & (S_IROTH | S_IWOTH)) {
        snprintf(err, errlen,
                 "auth key file %s is accessible to every user (mode %03o); "
                 "chmod 600 it",
                 path, (unsigned)(st.st_mode & 0777));
        goto out_close;
    }
    if ((st.st_mode & (S_IRGRP | S_IWGRP)) && warn != NULL && warnlen > 0)
        snprintf(warn, warnlen, "auth key file %s is accessible to its group (mode %03o)", path,
                 (unsigned)(st.st_mode & 0777));
    for (;;) {
        n = read(fd, key->bytes + len, sizeof key->bytes - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, errlen, "auth key file %s: %s", path, strerror(errno));
            goto out_clear;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len == sizeof key->bytes) {
            uint8_t extra;
            if (read(fd, &extra, 1) > 0) {
                snprintf(err, errlen, "auth key file %s is longer than %d bytes", path,
                         GIFT_AUTH_KEY_MAX);
                sodium_memzero(&extra, 1);
                goto out_clear;
            }
            break;
        }
    }
    while (len > 0 && (key->bytes[len - 1] == '\n' || key->bytes[len - 1] == '\r' ||
                       key->bytes[len - 1] == ' ' || key->bytes[len - 1] == '\t'))
        len--;
    if (len == 0) {
        snprintf(err, errlen, "auth key file %s is empty", path);
        goto out_clear;
    }
    if (len < GIFT_AUTH_KEY_MIN) {
        snprintf(err, errlen, "auth key file %s holds %zu bytes; at least %d are needed", path, len,
                 GIFT_AUTH_KEY_MIN);
        goto out_clear;
    }
    key->len = len;
    rc = 0;
    goto out_close;
out_clear:
    sodium_memzero(key, sizeof *key);
out_close:
    close(fd);
    return rc;
}

void gift_auth_key_clear(gift_auth_key_t *key)
{
    if (key != NULL)
        sodium_memzero(key, sizeof *key);
}

int gift_auth_nonce(uint8_t *out)
{
    if (sodium_init() < 0)
        return GIFT_EIO;
    randombytes_buf(out, GIFT_AUTH_NONCE_BYTES);
    return 0;
}

void gift_auth_hello_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                         const Gift__Hello *h, uint8_t out[GIFT_AUTH_MAC_BYTES])
{
    crypto_auth_hmacsha256_state st;
    uint8_t cn[GIFT_AUTH_NONCE_BYTES] = {0};

    /* A client nonce of the wrong size is refused before this is called;
     * hash a fixed-size field in any case. */
    if (h->client_nonce.len == GIFT_AUTH_NONCE_BYTES)
        memcpy(cn, h->client_nonce.data, GIFT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_init(&st, key->bytes, key->len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)HELLO_LABEL, sizeof HELLO_LABEL - 1);
    crypto_auth_hmacsha256_update(&st, server_nonce, GIFT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, cn, GIFT_AUTH_NONCE_BYTES);
    put_le32(&st, h->protocol_version);
    put_le32(&st, h->rank);
    put_le32(&st, h->world_size);
    put_le32(&st, (uint32_t)h->cluster_digest.len);
    if (h->cluster_digest.len > 0)
        crypto_auth_hmacsha256_update(&st, h->cluster_digest.data, h->cluster_digest.len);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

void gift_auth_ack_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                       const uint8_t *client_nonce, const uint8_t *hello_mac,
                       uint8_t out[GIFT_AUTH_MAC_BYTES])
{
    crypto_auth_hmacsha256_state st;

    crypto_auth_hmacsha256_init(&st, key->bytes, key->len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)ACK_LABEL, sizeof ACK_LABEL - 1);
    crypto_auth_hmacsha256_update(&st, server_nonce, GIFT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, client_nonce, GIFT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, hello_mac, GIFT_AUTH_MAC_BYTES);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

int gift_auth_verify(const uint8_t *got, size_t len, const uint8_t want[GIFT_AUTH_MAC_BYTES])
{
    if (got == NULL || len != GIFT_AUTH_MAC_BYTES)
        return GIFT_EAUTH;
    return crypto_verify_32(got, want) == 0 ? 0 : GIFT_EAUTH;
}
