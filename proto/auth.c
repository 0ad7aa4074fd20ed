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

static const char HELLO_LABEL[] = "giftd-auth-v2 hello";
static const char ACK_LABEL[] = "giftd-auth-v2 ack";
static const char RANK_LABEL[] = "giftd-auth-v2 rank";
static const char RESET_LABEL[] = "giftd-auth-v2 reset";

static void put_le32(crypto_auth_hmacsha256_state *st, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    crypto_auth_hmacsha256_update(st, b, 4);
}

/* A rank key file's text (len bytes in key->bytes): "TAG RANK HEX".
 * Replaces key->bytes with the 32 key bytes. Returns 0 or GIFT_ECONFIG. */
static int rank_key_parse(gift_auth_key_t *key, size_t len)
{
    uint8_t raw[GIFT_AUTH_RANK_KEY_BYTES];
    size_t i = sizeof GIFT_AUTH_RANK_KEY_TAG;
    uint32_t rank = 0;
    size_t bin_len = 0;
    int digits = 0, rc = GIFT_ECONFIG;
    while (i < len && key->bytes[i] >= '0' && key->bytes[i] <= '9' && digits < 6) {
        rank = rank * 10 + (uint32_t)(key->bytes[i++] - '0');
        digits++;
    }
    if (digits == 0 || rank >= 65536 || i >= len || key->bytes[i] != ' ')
        goto out;
    i++;
    if (len - i != 2 * GIFT_AUTH_RANK_KEY_BYTES ||
        sodium_hex2bin(raw, sizeof raw, (const char *)key->bytes + i, len - i, NULL, &bin_len,
                       NULL) != 0 ||
        bin_len != sizeof raw)
        goto out;
    sodium_memzero(key->bytes, sizeof key->bytes);
    memcpy(key->bytes, raw, sizeof raw);
    key->len = sizeof raw;
    key->rank_bound = 1;
    key->rank = rank;
    rc = 0;
out:
    sodium_memzero(raw, sizeof raw);
    return rc;
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
    if (len >= sizeof GIFT_AUTH_RANK_KEY_TAG &&
        memcmp(key->bytes, GIFT_AUTH_RANK_KEY_TAG " ", sizeof GIFT_AUTH_RANK_KEY_TAG) == 0) {
        rc = rank_key_parse(key, len);
        if (rc < 0) {
            snprintf(err, errlen,
                     "auth key file %s starts with \"%s\" but is not \"%s RANK "
                     "HEX\" with a rank below 65536 and %d hex digits",
                     path, GIFT_AUTH_RANK_KEY_TAG, GIFT_AUTH_RANK_KEY_TAG,
                     2 * GIFT_AUTH_RANK_KEY_BYTES);
            goto out_clear;
        }
        goto out_close;
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

void gift_auth_rank_key(const gift_auth_key_t *secret, uint32_t rank, gift_auth_key_t *out)
{
    crypto_auth_hmacsha256_state st;
    uint8_t k[GIFT_AUTH_RANK_KEY_BYTES];

    if (secret->rank_bound) {
        /* Only its own rank: any other gets a key of zeros, which no shard
         * derives, so the Hello is refused. */
        memset(k, 0, sizeof k);
        if (secret->rank == rank)
            memcpy(k, secret->bytes, sizeof k);
    } else {
        crypto_auth_hmacsha256_init(&st, secret->bytes, secret->len);
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)RANK_LABEL, sizeof RANK_LABEL - 1);
        put_le32(&st, rank);
        crypto_auth_hmacsha256_final(&st, k);
        sodium_memzero(&st, sizeof st);
    }
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, k, sizeof k);
    out->len = sizeof k;
    out->rank_bound = 1;
    out->rank = rank;
    sodium_memzero(k, sizeof k);
}

int gift_auth_rank_key_format(const gift_auth_key_t *secret, uint32_t rank, char *buf, size_t cap)
{
    gift_auth_key_t k;
    int n;
    if (cap < 128)
        return GIFT_ENOSPC;
    gift_auth_rank_key(secret, rank, &k);
    n = snprintf(buf, cap, "%s %u ", GIFT_AUTH_RANK_KEY_TAG, rank);
    sodium_bin2hex(buf + n, cap - (size_t)n, k.bytes, GIFT_AUTH_RANK_KEY_BYTES);
    n += 2 * GIFT_AUTH_RANK_KEY_BYTES;
    buf[n++] = '\n';
    buf[n] = '\0';
    sodium_memzero(&k, sizeof k);
    return 0;
}

void gift_auth_hello_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                         const Gift__Hello *h, uint8_t out[GIFT_AUTH_MAC_BYTES])
{
    crypto_auth_hmacsha256_state st;
    uint8_t cn[GIFT_AUTH_NONCE_BYTES] = {0};
    gift_auth_key_t rk;

    /* A client nonce of the wrong size is refused before this is called;
     * hash a fixed-size field in any case. */
    if (h->client_nonce.len == GIFT_AUTH_NONCE_BYTES)
        memcpy(cn, h->client_nonce.data, GIFT_AUTH_NONCE_BYTES);
    gift_auth_rank_key(key, h->rank, &rk);
    crypto_auth_hmacsha256_init(&st, rk.bytes, rk.len);
    sodium_memzero(&rk, sizeof rk);
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

void gift_auth_ack_mac(const gift_auth_key_t *key, uint32_t rank, const uint8_t *server_nonce,
                       const uint8_t *client_nonce, const uint8_t *hello_mac,
                       uint8_t out[GIFT_AUTH_MAC_BYTES])
{
    crypto_auth_hmacsha256_state st;
    gift_auth_key_t rk;

    gift_auth_rank_key(key, rank, &rk);
    crypto_auth_hmacsha256_init(&st, rk.bytes, rk.len);
    sodium_memzero(&rk, sizeof rk);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)ACK_LABEL, sizeof ACK_LABEL - 1);
    crypto_auth_hmacsha256_update(&st, server_nonce, GIFT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, client_nonce, GIFT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, hello_mac, GIFT_AUTH_MAC_BYTES);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

void gift_auth_reset_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                         const uint8_t *client_nonce, const char *run_id, int force, uint64_t seq,
                         uint8_t out[GIFT_AUTH_MAC_BYTES])
{
    crypto_auth_hmacsha256_state st;
    gift_auth_key_t ak;
    size_t n = run_id != NULL ? strnlen(run_id, 64) : 0;
    uint8_t f = force ? 1 : 0;

    gift_auth_rank_key(key, GIFT_AUTH_ADMIN_RANK, &ak);
    crypto_auth_hmacsha256_init(&st, ak.bytes, ak.len);
    sodium_memzero(&ak, sizeof ak);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)RESET_LABEL, sizeof RESET_LABEL - 1);
    crypto_auth_hmacsha256_update(&st, server_nonce, GIFT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, client_nonce, GIFT_AUTH_NONCE_BYTES);
    put_le32(&st, (uint32_t)n);
    if (n > 0)
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)run_id, n);
    crypto_auth_hmacsha256_update(&st, &f, 1);
    put_le32(&st, (uint32_t)seq);
    put_le32(&st, (uint32_t)(seq >> 32));
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

int gift_auth_verify(const uint8_t *got, size_t len, const uint8_t want[GIFT_AUTH_MAC_BYTES])
{
    if (got == NULL || len != GIFT_AUTH_MAC_BYTES)
        return GIFT_EAUTH;
    return crypto_verify_32(got, want) == 0 ? 0 : GIFT_EAUTH;
}
