/*
 * test_auth.c: proto/auth.c alone, no sockets and no daemon (the handshake
 * against real giftd processes is tests/server/test_auth.c).
 *
 * - Key files: what gift_auth_key_load accepts and refuses, with sentences
 *   that name the path and never the key.
 * - The MACs: each is a function of the key and of every field it covers,
 *   the shard's proof depends on the worker's, and gift_auth_verify accepts
 *   exactly the right bytes of the right length.
 */
#define _GNU_SOURCE

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_auth.h"
#include "gift_error.h"
#include "gift_proto.h"
#include "gift_test_check.h"
#include "gift_test_keyfile.h"

static const char KEY[] = "correct horse battery staple 0123456789\n";
static const char WRONG[] = "correct horse battery staple 0123456780\n";

START_TEST(test_key_file)
{
    gift_auth_key_t k;
    char err[512], warn[512];
    char big[5000];
    const char *p;

    p = key_file_write("ok", KEY, sizeof KEY - 1, 0600);
    ck_assert_int_eq(gift_auth_key_load(p, &k, err, sizeof err, warn, sizeof warn), 0);
    ck_assert_msg(k.len == sizeof KEY - 2 && memcmp(k.bytes, KEY, k.len) == 0,
                  "key of %zu bytes (the trailing newline must go)", k.len);
    ck_assert_msg(warn[0] == '\0', "unexpected warning: %s", warn);
    unlink(p);

    p = key_file_write("group", KEY, sizeof KEY - 1, 0640);
    ck_assert_int_eq(gift_auth_key_load(p, &k, err, sizeof err, warn, sizeof warn), 0);
    ck_assert_msg(strstr(warn, "group") != NULL, "no warning for a group-readable key: '%s'", warn);
    unlink(p);

    p = key_file_write("world", KEY, sizeof KEY - 1, 0644);
    ck_assert_int_eq(gift_auth_key_load(p, &k, err, sizeof err, warn, sizeof warn), GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "every user") != NULL && strstr(err, p) != NULL, "err: %s", err);
    ck_assert_msg(strstr(err, "horse") == NULL, "the error shows the key: %s", err);
    unlink(p);

    p = key_file_write("empty", "\n\n", 2, 0600);
    ck_assert_int_eq(gift_auth_key_load(p, &k, err, sizeof err, warn, sizeof warn), GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "empty") != NULL, "err: %s", err);
    unlink(p);

    p = key_file_write("short", "abc\n", 4, 0600);
    ck_assert_int_eq(gift_auth_key_load(p, &k, err, sizeof err, warn, sizeof warn), GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "at least 16") != NULL && strstr(err, "abc") == NULL, "err: %s", err);
    unlink(p);

    memset(big, 'k', sizeof big);
    p = key_file_write("long", big, sizeof big, 0600);
    ck_assert_int_eq(gift_auth_key_load(p, &k, err, sizeof err, warn, sizeof warn), GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "longer") != NULL, "err: %s", err);
    unlink(p);

    ck_assert_int_eq(
        gift_auth_key_load("/nonexistent/giftd.key", &k, err, sizeof err, warn, sizeof warn),
        GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "/nonexistent/giftd.key") != NULL && strstr(err, "No such") != NULL,
                  "err: %s", err);
    ck_assert_int_eq(gift_auth_key_load("/tmp", &k, err, sizeof err, warn, sizeof warn),
                     GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "regular file") != NULL, "err: %s", err);
}
END_TEST

/* A Hello as a worker fills it for the MAC. */
static Gift__Hello hello(uint8_t *cnonce, uint8_t *digest)
{
    Gift__Hello h = GIFT__HELLO__INIT;
    h.protocol_version = GIFT_PROTOCOL_VERSION;
    h.rank = 3;
    h.world_size = 8;
    h.client_nonce.data = cnonce;
    h.client_nonce.len = GIFT_AUTH_NONCE_BYTES;
    h.cluster_digest.data = digest;
    h.cluster_digest.len = 8;
    return h;
}

START_TEST(test_macs)
{
    gift_auth_key_t k, w;
    char err[512], warn[512];
    uint8_t sn[GIFT_AUTH_NONCE_BYTES], cn[GIFT_AUTH_NONCE_BYTES],
        digest[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t m1[GIFT_AUTH_MAC_BYTES], m2[GIFT_AUTH_MAC_BYTES], a1[GIFT_AUTH_MAC_BYTES],
        a2[GIFT_AUTH_MAC_BYTES];
    Gift__Hello h;

    ck_assert_int_eq(gift_auth_key_load(key_file_write("mac", KEY, sizeof KEY - 1, 0600), &k, err,
                                        sizeof err, warn, sizeof warn),
                     0);
    ck_assert_int_eq(gift_auth_key_load(key_file_write("macw", WRONG, sizeof WRONG - 1, 0600), &w,
                                        err, sizeof err, warn, sizeof warn),
                     0);
    ck_assert_int_eq(gift_auth_nonce(sn), 0);
    ck_assert_int_eq(gift_auth_nonce(cn), 0);
    ck_assert_msg(memcmp(sn, cn, sizeof sn) != 0, "two nonces are equal");
    h = hello(cn, digest);
    gift_auth_hello_mac(&k, sn, &h, m1);
    gift_auth_hello_mac(&k, sn, &h, m2);
    ck_assert_msg(memcmp(m1, m2, sizeof m1) == 0, "the Hello MAC is not a function of its input");
    ck_assert_int_eq(gift_auth_verify(m2, sizeof m2, m1), 0);
    ck_assert_int_eq(gift_auth_verify(m2, sizeof m2 - 1, m1), GIFT_EAUTH);
    gift_auth_hello_mac(&w, sn, &h, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH, "a wrong key verifies");
    h.rank = 4;
    gift_auth_hello_mac(&k, sn, &h, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH, "the rank is not covered");
    h.rank = 3;
    digest[7] ^= 1;
    gift_auth_hello_mac(&k, sn, &h, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH, "the digest is not covered");
    digest[7] ^= 1;
    sn[0] ^= 1;
    gift_auth_hello_mac(&k, sn, &h, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH,
                  "the server nonce is not covered (a MAC replays on another connection)");
    sn[0] ^= 1;
    gift_auth_ack_mac(&k, 3, sn, cn, m1, a1);
    gift_auth_ack_mac(&k, 3, sn, cn, m1, a2);
    ck_assert_int_eq(gift_auth_verify(a2, sizeof a2, a1), 0);
    ck_assert_msg(memcmp(a1, m1, sizeof a1) != 0, "the shard's proof equals the worker's");
    gift_auth_ack_mac(&k, 4, sn, cn, m1, a2);
    ck_assert_msg(gift_auth_verify(a2, sizeof a2, a1) == GIFT_EAUTH,
                  "the shard's proof does not depend on the rank");
    m1[0] ^= 1;
    gift_auth_ack_mac(&k, 3, sn, cn, m1, a2);
    ck_assert_msg(gift_auth_verify(a2, sizeof a2, a1) == GIFT_EAUTH,
                  "the shard's proof does not depend on the worker's");
    gift_auth_key_clear(&k);
    gift_auth_key_clear(&w);
}
END_TEST

/* giftctl reset's MAC: a function of every field, the connection's nonces
 * and the shared secret; a rank key, whichever rank, cannot make it. */
START_TEST(test_reset_mac)
{
    gift_auth_key_t k, rk;
    char err[512], warn[512];
    uint8_t sn[GIFT_AUTH_NONCE_BYTES], cn[GIFT_AUTH_NONCE_BYTES];
    uint8_t m1[GIFT_AUTH_MAC_BYTES], m2[GIFT_AUTH_MAC_BYTES];

    ck_assert_int_eq(gift_auth_key_load(key_file_write("reset", KEY, sizeof KEY - 1, 0600), &k, err,
                                        sizeof err, warn, sizeof warn),
                     0);
    ck_assert_int_eq(gift_auth_nonce(sn), 0);
    ck_assert_int_eq(gift_auth_nonce(cn), 0);
    gift_auth_reset_mac(&k, sn, cn, "run-a", 0, 1, m1);
    gift_auth_reset_mac(&k, sn, cn, "run-a", 0, 1, m2);
    ck_assert_int_eq(gift_auth_verify(m2, sizeof m2, m1), 0);
    gift_auth_reset_mac(&k, sn, cn, "run-b", 0, 1, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH, "the run id is not covered");
    gift_auth_reset_mac(&k, sn, cn, "run-a", 1, 1, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH, "force is not covered");
    gift_auth_reset_mac(&k, sn, cn, "run-a", 0, 2, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH, "the seq is not covered");
    gift_auth_reset_mac(&k, cn, sn, "run-a", 0, 1, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH, "the nonces are not covered");
    gift_auth_reset_mac(&k, sn, cn, NULL, 0, 1, m1);
    gift_auth_reset_mac(&k, sn, cn, "", 0, 1, m2);
    ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == 0, "NULL and \"\" differ");
    for (uint32_t r = 0; r < 3; r++) {
        gift_auth_rank_key(&k, r == 2 ? 65535 : r, &rk);
        gift_auth_reset_mac(&rk, sn, cn, "", 0, 1, m2);
        ck_assert_msg(gift_auth_verify(m2, sizeof m2, m1) == GIFT_EAUTH,
                      "rank %u's key makes the administrator's MAC", rk.rank);
    }
    gift_auth_key_clear(&rk);
    gift_auth_key_clear(&k);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto_auth");
    TCase *tc = tcase_create("auth");
    tcase_add_test(tc, test_key_file);
    tcase_add_test(tc, test_macs);
    tcase_add_test(tc, test_reset_mac);
    suite_add_tcase(s, tc);
    return gift_test_run(s, CK_ENV) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
