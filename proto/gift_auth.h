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
 * Both MACs are HMAC-SHA256 under the shared key over a labelled transcript,
 * so the shard knows the worker holds the key (and which rank, world size and
 * digest it signed), and the worker knows the shard holds it too. MACs are
 * compared in constant time. Nothing here logs or prints key material.
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
#define GIFT_AUTH_VERSION 1 /* the transcript below; AuthChallenge.version */

/* A loaded key. Clear it with gift_auth_key_clear when done. */
typedef struct gift_auth_key {
    size_t len;
    uint8_t bytes[GIFT_AUTH_KEY_MAX];
} gift_auth_key_t;

/* Reads the shared secret from path: the file's bytes with trailing
 * whitespace (spaces, tabs, CR, LF) removed, between GIFT_AUTH_KEY_MIN and
 * GIFT_AUTH_KEY_MAX bytes. The file must be a regular file that others
 * (neither owner nor group) can neither read nor write; a group-readable
 * file is accepted with a warning sentence in warn (warn[0] == 0 when none).
 * Returns 0, or GIFT_ECONFIG with a sentence in err (missing, unreadable,
 * not a regular file, world-accessible, empty, too short or too long). The
 * sentences name the path, never the contents. */
int gift_auth_key_load(const char *path, gift_auth_key_t *key, char *err, size_t errlen, char *warn,
                       size_t warnlen);

/* Wipes the key (sodium_memzero). NULL is allowed. */
void gift_auth_key_clear(gift_auth_key_t *key);

/* Fills out with GIFT_AUTH_NONCE_BYTES bytes from libsodium's CSPRNG.
 * Returns 0, or GIFT_EIO when libsodium cannot be initialised. */
int gift_auth_nonce(uint8_t *out);

/* The worker's proof: HMAC-SHA256(key, "giftd-auth-v1 hello" || server_nonce
 * || h->client_nonce || le32 protocol_version || le32 rank || le32
 * world_size || le32 len(cluster_digest) || cluster_digest). */
void gift_auth_hello_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                         const Gift__Hello *h, uint8_t out[GIFT_AUTH_MAC_BYTES]);

/* The shard's proof: HMAC-SHA256(key, "giftd-auth-v1 ack" || server_nonce ||
 * client_nonce || hello_mac). */
void gift_auth_ack_mac(const gift_auth_key_t *key, const uint8_t *server_nonce,
                       const uint8_t *client_nonce, const uint8_t *hello_mac,
                       uint8_t out[GIFT_AUTH_MAC_BYTES]);

/* Constant-time check that got (len bytes) equals want. Returns 0 or
 * GIFT_EAUTH (also when len is not GIFT_AUTH_MAC_BYTES). */
int gift_auth_verify(const uint8_t *got, size_t len, const uint8_t want[GIFT_AUTH_MAC_BYTES]);

#ifdef __cplusplus
}
#endif
#endif
