/*
 * gift_auth.h: shared-secret authentication at Hello (libsodium).
 *
 * The handshake (gift.proto, "Authentication"), when the shard has an
 * auth_key_file:
 *
 *   client -> Hello{client_nonce, no auth_mac}
 *   shard  -> AuthChallenge{server_nonce}           32 random bytes per connection
 *   client -> Hello{client_nonce, auth_mac = gift_auth_hello_mac(...)}
 *   shard  -> HelloAck{auth_mac = gift_auth_ack_mac(...)}   or Error GIFT_EAUTH, closed
 *
 * Both MACs are HMAC-SHA256 over a labelled transcript under the key of the
 * rank the Hello names, K_rank = HMAC-SHA256(secret, "giftd-auth-v2 rank" ||
 * le32 rank), never under the shared secret itself: the shard (which holds
 * the secret) knows the worker holds rank's key, for this connection's
 * nonces, and which world size and digest it signed; the worker knows the
 * shard holds it too. A worker may be given only its own rank's key (a rank
 * key file, gift_auth_rank_key_format), so that it cannot speak for another
 * rank; a worker given the secret derives its key. MACs are compared in
 * constant time. Nothing here logs or prints key material.
 */
#ifndef GIFT_AUTH_H
#define GIFT_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "gift.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GIFT_AUTH_NONCE_BYTES 32
#define GIFT_AUTH_MAC_BYTES 32
#define GIFT_AUTH_KEY_MIN 16 /* bytes of secret, after trailing whitespace is dropped */
#define GIFT_AUTH_KEY_MAX 4096
#define GIFT_AUTH_VERSION 2 /* the transcript below; AuthChallenge.version */
#define GIFT_AUTH_RANK_KEY_BYTES 32
/* First word of a rank key file: "giftd-rank-key-v2 RANK HEX" (64 hex digits). */
#define GIFT_AUTH_RANK_KEY_TAG "giftd-rank-key-v2"

/* A loaded key: the shared secret, or one rank's key (rank_bound). Clear it
 * with gift_auth_key_clear when done. */
typedef struct gift_auth_key {
    size_t len;
    uint8_t bytes[GIFT_AUTH_KEY_MAX];
    int rank_bound; /* bytes are K_rank of rank, not the shared secret */
    uint32_t rank;
} gift_auth_key_t;

/* Reads the shared secret from path: the file's bytes with trailing
 * whitespace (spaces, tabs, CR, LF) removed, between GIFT_AUTH_KEY_MIN and
 * GIFT_AUTH_KEY_MAX bytes; or, when the file starts with
 * GIFT_AUTH_RANK_KEY_TAG, one rank's key (key->rank_bound set). The file must be a regular file
 * that others (neither owner nor group) can neither read nor write; a group-readable file is
 * accepted with a warning sentence in warn (warn[0] == 0 when none). Returns 0, or GIFT_ECONFIG
 * with a sentence in err (missing, unreadable, not a regular file, world-accessible, empty, too
 * short or too long). The sentences name the path, never the contents. */
int gift_auth_key_load(const char *path, gift_auth_key_t *key, char *err, size_t errlen, char *warn,
                       size_t warnlen);

/* Wipes the key (sodium_memzero). NULL is allowed. */
void gift_auth_key_clear(gift_auth_key_t *key);

/* Fills out with GIFT_AUTH_NONCE_BYTES bytes from libsodium's CSPRNG.
 * Returns 0, or GIFT_EIO when libsodium cannot be initialised. */
int gift_auth_nonce(uint8_t *out);

/* Derives rank's key from the shared secret into out (rank_bound set).
 * A rank-bound secret gives itself when its rank is rank; another rank's
 * key cannot be derived from it (out is then a key no shard accepts). */
void gift_auth_rank_key(const gift_auth_key_t *secret, uint32_t rank, gift_auth_key_t *out);

/* Writes rank's key file text ("giftd-rank-key-v2 RANK HEX\n") into buf.
 * Returns 0, or GIFT_ENOSPC when cap is below 128 bytes. */
int gift_auth_rank_key_format(const gift_auth_key_t *secret, uint32_t rank, char *buf, size_t cap);

/* The worker's proof: HMAC-SHA256(K_rank, "giftd-auth-v2 hello" ||
 * server_nonce || h->client_nonce || le32 protocol_version || le32 rank ||
 * le32 world_size || le32 len(cluster_digest) || cluster_digest), with rank
 * = h->rank and K_rank from key (gift_auth_rank_key). */
void gift_auth_hello_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                         const Gift__Hello *h, uint8_t out[GIFT_AUTH_MAC_BYTES]);

/* The shard's proof: HMAC-SHA256(K_rank, "giftd-auth-v2 ack" || server_nonce
 * || client_nonce || hello_mac). */
void gift_auth_ack_mac(const gift_auth_key_t *key, uint32_t rank, const uint8_t *server_nonce,
                       const uint8_t *client_nonce, const uint8_t *hello_mac,
                       uint8_t out[GIFT_AUTH_MAC_BYTES]);

/* The rank number no worker has (ranks are below 65536): its key, derived
 * from the shared secret like any rank's, is the administrator's, which a
 * rank key file cannot derive (gift_auth_rank_key). */
#define GIFT_AUTH_ADMIN_RANK 0xFFFFFFFFu

/* giftctl reset's proof (gift.proto, Reset): HMAC-SHA256(K_admin,
 * "giftd-auth-v2 reset" || server_nonce || client_nonce || le32 len(run_id)
 * || run_id || u8 force || le64 seq), with K_admin the key of
 * GIFT_AUTH_ADMIN_RANK: only the holder of the shared secret can make it.
 * run_id is NULL or a string of at most 64 bytes. */
void gift_auth_reset_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                         const uint8_t *client_nonce, const char *run_id, int force, uint64_t seq,
                         uint8_t out[GIFT_AUTH_MAC_BYTES]);

/* Constant-time check that got (len bytes) equals want. Returns 0 or
 * GIFT_EAUTH (also when len is not GIFT_AUTH_MAC_BYTES). */
int gift_auth_verify(const uint8_t *got, size_t len, const uint8_t want[GIFT_AUTH_MAC_BYTES]);

#ifdef __cplusplus
}
#endif
#endif
