/*
 * test_auth.c: shared-secret authentication at Hello (gift.proto,
 * proto/gift_auth.h) against real giftd processes.
 *
 * - Key files: giftd refuses to start with a key it cannot use (what
 *   gift_auth_key_load itself accepts and refuses: tests/proto/test_auth.c).
 * - The handshake done by hand: the right key gets a HelloAck whose MAC
 *   proves the shard's key; no MAC, a wrong MAC, a MAC replayed from another
 *   connection, a missing client nonce, or any request before the handshake
 *   completes gets Error GIFT_EAUTH (fatal) and the connection is closed;
 *   the shard stays up and serves the next authenticated client.
 * - libgiftclient: the right key (option or GIFT_AUTH_KEY_FILE) runs steps;
 *   no key, a wrong key, an unsafe key file, or a key against a shard without
 *   authentication fail gift_client_open with GIFT_EAUTH.
 * - The key never appears in giftd's log.
 */
#define _GNU_SOURCE

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift/client.h"
#include "gift_test_check.h"
#include "test_bad_input_common.h"

static const char KEY[] = "correct horse battery staple 0123456789\n";
static const char WRONG[] = "correct horse battery staple 0123456780\n";

static gift_auth_key_t K;

static const char *key_path(void)
{
    return key_file_write("right", KEY, sizeof KEY - 1, 0600);
}

static void start_auth_daemon(void)
{
    const char *extra[] = {"--auth-key-file", key_path(), "--log-level", "debug",
                           "--world-size",    "1",        NULL};
    char err[256], warn[256];
    ck_assert_msg(gift_auth_key_load(extra[1], &K, err, sizeof err, warn, sizeof warn) == 0, "%s",
                  err);
    daemon_start(extra);
}

/* ------------------------------------------------------------------ */

START_TEST(test_giftd_refuses_bad_key_file)
{
    const char *world = key_file_write("world-d", KEY, sizeof KEY - 1, 0644);
    const char *extra1[] = {"--auth-key-file", world, NULL};
    const char *extra2[] = {"--auth-key-file", "/nonexistent/giftd.key", NULL};
    int rc;

    rc = daemon_start_ex(extra1, 0);
    ck_assert_msg(rc == 2, "giftd with a world-readable key: exit %d, log:\n%s", rc, log_tail());
    ck_assert_msg(log_count("accessible to every user") == 1, "log:\n%s", log_tail());
    ck_assert_msg(log_count("horse") == 0, "the log shows the key:\n%s", log_tail());
    daemon_teardown();
    unlink(world);

    rc = daemon_start_ex(extra2, 0);
    ck_assert_msg(rc == 2, "giftd with a missing key file: exit %d, log:\n%s", rc, log_tail());
    ck_assert_msg(log_count("/nonexistent/giftd.key") >= 1, "log:\n%s", log_tail());
    daemon_teardown();
}
END_TEST

START_TEST(test_raw_handshake)
{
    raw_t a, b;
    const Gift__Stats *st;

    start_auth_daemon();
    raw_open(&a);
    raw_hello_auth(&a, &K, 0, 1);
    st = raw_stats(&a);
    ck_assert_msg(st->connections == 1, "connections %u", st->connections);
    /* Every connection gets its own challenge. */
    raw_open(&b);
    raw_hello_auth(&b, &K, 0, 1);
    raw_stats(&b);
    raw_close(&a);
    raw_close(&b);
    daemon_stop();
    ck_assert_msg(log_count("authenticated") == 2, "log:\n%s", log_tail());
    ck_assert_msg(log_count("horse") == 0, "the log shows the key");
    daemon_teardown();
}
END_TEST

START_TEST(test_raw_rejections)
{
    gift_auth_key_t wrong;
    char err[256], warn[256];
    uint8_t cn[GIFT_AUTH_NONCE_BYTES], sn[GIFT_AUTH_NONCE_BYTES], mac[GIFT_AUTH_MAC_BYTES];
    raw_t c;
    const gift_frame_t *f;
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Declare d = GIFT__DECLARE__INIT;
    Gift__Pull pl = GIFT__PULL__INIT;

    start_auth_daemon();
    ck_assert(gift_auth_key_load(key_file_write("wrong", WRONG, sizeof WRONG - 1, 0600), &wrong,
                                 err, sizeof err, warn, sizeof warn) == 0);

    /* 1. No key: the answer to the challenge carries no MAC. */
    raw_open(&c);
    gift_auth_nonce(cn);
    raw_send_hello(&c, 0, 1, cn, NULL);
    raw_expect(&c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "no key: first hello");
    raw_send_hello(&c, 0, 1, cn, NULL);
    raw_expect_error(&c, GIFT_EAUTH, 1, "no key: second hello");
    raw_close(&c);

    /* 2. A wrong key. */
    raw_open(&c);
    raw_send_hello(&c, 0, 1, cn, NULL);
    f = raw_expect(&c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "wrong key: first hello");
    memcpy(sn, f->env->auth_challenge->server_nonce.data, sizeof sn);
    raw_hello_mac(&wrong, sn, 0, 1, cn, mac);
    raw_send_hello(&c, 0, 1, cn, mac);
    raw_expect_error(&c, GIFT_EAUTH, 1, "wrong key");
    raw_close(&c);

    /* 3. The right MAC of another connection (a replay): the nonce differs. */
    raw_hello_mac(&K, sn, 0, 1, cn, mac);
    raw_open(&c);
    raw_send_hello(&c, 0, 1, cn, NULL);
    f = raw_expect(&c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "replay: first hello");
    ck_assert_msg(memcmp(f->env->auth_challenge->server_nonce.data, sn, sizeof sn) != 0,
                  "two connections got the same nonce");
    raw_send_hello(&c, 0, 1, cn, mac);
    raw_expect_error(&c, GIFT_EAUTH, 1, "replayed MAC");
    raw_close(&c);

    /* 4. The right key, but the MAC signs other fields (rank 0, Hello says 1 of 2). */
    raw_open(&c);
    raw_send_hello(&c, 0, 1, cn, NULL);
    f = raw_expect(&c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "tampered: first hello");
    memcpy(sn, f->env->auth_challenge->server_nonce.data, sizeof sn);
    raw_hello_mac(&K, sn, 0, 1, cn, mac);
    raw_send_hello(&c, 1, 2, cn, mac);
    raw_expect_error(&c, GIFT_EAUTH, 1, "MAC over other fields");
    raw_close(&c);

    /* 5. No client nonce in the second Hello. */
    raw_open(&c);
    raw_send_hello(&c, 0, 1, NULL, NULL);
    f = raw_expect(&c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "no nonce: first hello");
    raw_send_hello(&c, 0, 1, NULL, mac);
    raw_expect_error(&c, GIFT_EAUTH, 1, "no client nonce");
    raw_close(&c);

    /* 6. Declare with no Hello at all. */
    raw_open(&c);
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
    env.declare = &d;
    ck_assert(raw_send(&c, &env, NULL, 0) == 0);
    raw_expect_error(&c, GIFT_EAUTH, 1, "declare before hello");
    raw_close(&c);

    /* 7. A pull between the challenge and the answer. */
    raw_open(&c);
    raw_send_hello(&c, 0, 1, cn, NULL);
    raw_expect(&c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "pull: first hello");
    env.msg_case = GIFT__ENVELOPE__MSG_PULL;
    env.pull = &pl;
    ck_assert(raw_send(&c, &env, NULL, 0) == 0);
    raw_expect_error(&c, GIFT_EAUTH, 1, "pull before authentication");
    raw_close(&c);

    /* The shard is up and serves the right key; it counted the refusals. */
    ck_assert_msg(daemon_alive(), "giftd died; log:\n%s", log_tail());
    raw_open(&c);
    raw_hello_auth(&c, &K, 0, 1);
    raw_stats(&c);
    raw_close(&c);
    daemon_stop();
    ck_assert_msg(log_count("error -24") == 7, "%d EAUTH errors logged, want 7:\n%s",
                  log_count("error -24"), log_tail());
    ck_assert_msg(log_count_mem(K.bytes, K.len) == 0 && log_count("horse") == 0,
                  "the log shows the key");
    gift_auth_key_clear(&wrong);
    daemon_teardown();
}
END_TEST

/* ------------------------------------------------------------------ */
/* libgiftclient                                                         */
/* ------------------------------------------------------------------ */

static int client_open_with(const char *key_file, gift_client_t **c)
{
    char servers[64];
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    snprintf(servers, sizeof servers, "127.0.0.1:%d", D.port);
    o.servers = servers;
    o.rank = 0;
    o.world_size = 1;
    o.connect_timeout_ms = 8000;
    o.timeout_ms = 10000;
    o.auth_key_file = key_file;
    return gift_client_open(&o, c);
}

/* Declares one tensor and runs steps push/pulls; world 1, so the mean is the gradient. */
static void client_steps(gift_client_t *c, int first, int steps)
{
    gift_tensor_desc_t t = GIFT_TENSOR_INIT;
    float g[8 * 32], m[8 * 32];
    int rc;
    t.name = "w";
    t.rows = 8;
    t.cols = 32;
    rc = gift_declare(c, &t, 1);
    ck_assert_msg(rc == 0, "declare: %s", gift_strerror(rc));
    for (int s = first; s < first + steps; s++) {
        gift_op_t *op;
        for (int i = 0; i < 8 * 32; i++)
            g[i] = (float)(i % 7) - 3.0f + (float)s;
        rc = gift_push_pull(c, 0, (uint64_t)s, g, m, NULL, NULL, &op);
        ck_assert_msg(rc == 0, "push_pull step %d: %s", s, gift_strerror(rc));
        rc = gift_op_wait(op);
        gift_op_free(op);
        ck_assert_msg(rc == 0, "step %d: %s", s, gift_strerror(rc));
        ck_assert_msg(memcmp(g, m, sizeof g) == 0, "step %d: the mean of one rank differs", s);
    }
}

START_TEST(test_client_right_key)
{
    gift_client_t *c = NULL;
    int rc;

    start_auth_daemon();
    rc = client_open_with(key_path(), &c);
    ck_assert_msg(rc == 0, "open with the right key: %s; log:\n%s", gift_strerror(rc), log_tail());
    client_steps(c, 0, 5);
    gift_client_close(c);

    /* The same through GIFT_AUTH_KEY_FILE (a later run of the same job). */
    setenv("GIFT_AUTH_KEY_FILE", key_path(), 1);
    rc = client_open_with(NULL, &c);
    unsetenv("GIFT_AUTH_KEY_FILE");
    ck_assert_msg(rc == 0, "open with GIFT_AUTH_KEY_FILE: %s", gift_strerror(rc));
    client_steps(c, 5, 3);
    gift_client_close(c);
    daemon_stop();
    ck_assert_msg(log_count("horse") == 0, "the log shows the key");
    daemon_teardown();
}
END_TEST

START_TEST(test_client_refused)
{
    gift_client_t *c = NULL;
    const char *wrong = key_file_write("wrong-c", WRONG, sizeof WRONG - 1, 0600);
    const char *unsafe = key_file_write("unsafe-c", KEY, sizeof KEY - 1, 0604);
    double t0;
    int rc;

    start_auth_daemon();
    unsetenv("GIFT_AUTH_KEY_FILE");
    t0 = now_ms();
    rc = client_open_with(NULL, &c);
    ck_assert_msg(rc == GIFT_EAUTH && c == NULL, "open without a key: %s", gift_strerror(rc));
    rc = client_open_with(wrong, &c);
    ck_assert_msg(rc == GIFT_EAUTH && c == NULL, "open with a wrong key: %s", gift_strerror(rc));
    ck_assert_msg(now_ms() - t0 < 5000, "refusals took %.0f ms (not a timeout)", now_ms() - t0);
    rc = client_open_with(unsafe, &c);
    ck_assert_msg(rc == GIFT_EAUTH && c == NULL, "open with a world-readable key: %s",
                  gift_strerror(rc));
    ck_assert_msg(daemon_alive(), "giftd died; log:\n%s", log_tail());
    /* Still serving. */
    rc = client_open_with(key_path(), &c);
    ck_assert_msg(rc == 0, "open with the right key after refusals: %s", gift_strerror(rc));
    client_steps(c, 0, 2);
    gift_client_close(c);
    daemon_teardown();

    /* A client with a key refuses a shard that does not authenticate. */
    {
        const char *extra[] = {"--world-size", "1", NULL};
        daemon_start(extra);
        rc = client_open_with(key_path(), &c);
        ck_assert_msg(rc == GIFT_EAUTH && c == NULL, "key against an open shard: %s",
                      gift_strerror(rc));
        rc = client_open_with("", &c);
        ck_assert_msg(rc == 0, "no key against an open shard: %s", gift_strerror(rc));
        client_steps(c, 0, 2);
        gift_client_close(c);
        daemon_teardown();
    }
    unlink(wrong);
    unlink(unsafe);
}
END_TEST

/* The shard restarts (SIGKILL, then the same port and data directory): the
 * client reconnects, authenticates again with a fresh nonce, declares again
 * and goes on. (A shard restarted empty would refuse it with GIFT_ESTATE.) */
START_TEST(test_client_reconnect)
{
    gift_client_t *c = NULL;
    gift_client_stats_t st;
    char port[16], dir[256], cmd[300];
    const char *tmp = getenv("TMPDIR");
    int rc, status;

    snprintf(dir, sizeof dir, "%s/giftd-auth-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    {
        const char *extra[] = {"--auth-key-file",
                               key_path(),
                               "--log-level",
                               "debug",
                               "--world-size",
                               "1",
                               "--checkpoint-steps",
                               "1",
                               "--data-dir",
                               dir,
                               NULL};
        char err[256], warn[256];
        ck_assert_msg(gift_auth_key_load(extra[1], &K, err, sizeof err, warn, sizeof warn) == 0,
                      "%s", err);
        daemon_start(extra);
    }
    rc = client_open_with(key_path(), &c);
    ck_assert_msg(rc == 0, "open: %s", gift_strerror(rc));
    client_steps(c, 0, 3);
    snprintf(port, sizeof port, "%d", D.port);
    kill(D.pid, SIGKILL);
    waitpid(D.pid, &status, 0);
    D.stopped = 1;
    daemon_teardown();
    {
        const char *extra[] = {"--auth-key-file",
                               key_path(),
                               "--log-level",
                               "debug",
                               "--world-size",
                               "1",
                               "--port",
                               port,
                               "--checkpoint-steps",
                               "1",
                               "--data-dir",
                               dir,
                               NULL};
        daemon_start(extra);
    }
    for (int s = 3; s < 6; s++) {
        static float g[8 * 32], m[8 * 32];
        gift_op_t *op;
        for (int i = 0; i < 8 * 32; i++)
            g[i] = (float)(i % 5) + (float)s;
        rc = gift_push_pull(c, 0, (uint64_t)s, g, m, NULL, NULL, &op);
        ck_assert_msg(rc == 0, "push_pull step %d after the restart: %s", s, gift_strerror(rc));
        rc = gift_op_wait(op);
        gift_op_free(op);
        ck_assert_msg(rc == 0, "step %d after the restart: %s; log:\n%s", s, gift_strerror(rc),
                      log_tail());
        ck_assert_msg(memcmp(g, m, sizeof g) == 0, "step %d: wrong mean", s);
    }
    gift_client_stats(c, &st);
    ck_assert_msg(st.reconnects >= 1, "reconnects %llu", (unsigned long long)st.reconnects);
    gift_client_close(c);
    daemon_stop();
    ck_assert_msg(log_count("authenticated") >= 1, "log:\n%s", log_tail());
    daemon_teardown();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The handshake of raw_hello_auth, keeping both nonces (for a Reset's MAC). */
static void hello_keep(raw_t *c, const gift_auth_key_t *key, uint8_t *cn, uint8_t *sn)
{
    uint8_t mac[GIFT_AUTH_MAC_BYTES];
    const gift_frame_t *f;
    ck_assert(gift_auth_nonce(cn) == 0);
    raw_send_hello(c, 0, 1, cn, NULL);
    f = raw_expect(c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "first hello");
    memcpy(sn, f->env->auth_challenge->server_nonce.data, GIFT_AUTH_NONCE_BYTES);
    raw_hello_mac(key, sn, 0, 1, cn, mac);
    raw_send_hello(c, 0, 1, cn, mac);
    raw_expect(c, GIFT__ENVELOPE__MSG_HELLO_ACK, "authenticated hello");
}

static void send_reset(raw_t *c, const uint8_t *mac)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Reset m = GIFT__RESET__INIT;
    m.run_id = "";
    m.seq = 5;
    m.auth_mac.data = (uint8_t *)mac;
    m.auth_mac.len = mac ? GIFT_AUTH_MAC_BYTES : 0;
    env.msg_case = GIFT__ENVELOPE__MSG_RESET;
    env.reset = &m;
    ck_assert_msg(raw_send(c, &env, NULL, 0) == 0, "send reset");
}

/* giftctl reset against a shard with a key: an authenticated Hello is not
 * enough, the Reset needs the administrator's MAC over this connection's
 * nonces, which a rank key (even rank 0's) cannot make and which does not
 * carry over to another connection. */
START_TEST(test_raw_reset)
{
    uint8_t cn[GIFT_AUTH_NONCE_BYTES], sn[GIFT_AUTH_NONCE_BYTES], mac[GIFT_AUTH_MAC_BYTES];
    gift_auth_key_t rk;
    raw_t c;

    start_auth_daemon();
    gift_auth_rank_key(&K, 0, &rk);
    raw_open(&c); /* no MAC */
    hello_keep(&c, &rk, cn, sn);
    send_reset(&c, NULL);
    raw_expect_error(&c, GIFT_EAUTH, 1, "a reset without a MAC");
    ck_assert_msg(strstr(c.f.env->error->text, "shared secret") != NULL, "text: %s",
                  c.f.env->error->text);
    raw_close(&c);
    raw_open(&c); /* rank 0's key: its Hello passes, its Reset does not */
    hello_keep(&c, &rk, cn, sn);
    gift_auth_reset_mac(&rk, sn, cn, "", 0, 5, mac);
    send_reset(&c, mac);
    raw_expect_error(&c, GIFT_EAUTH, 1, "a reset with a rank key");
    raw_close(&c);
    raw_open(&c); /* the secret's MAC of another connection */
    gift_auth_reset_mac(&K, sn, cn, "", 0, 5, mac);
    hello_keep(&c, &K, cn, sn);
    send_reset(&c, mac);
    raw_expect_error(&c, GIFT_EAUTH, 1, "a reset replayed from another connection");
    raw_close(&c);
    raw_open(&c); /* the secret */
    hello_keep(&c, &K, cn, sn);
    gift_auth_reset_mac(&K, sn, cn, "", 0, 5, mac);
    send_reset(&c, mac);
    ck_assert_msg(raw_expect(&c, GIFT__ENVELOPE__MSG_RESET_ACK, "reset")->env->reset_ack->seq == 5,
                  "the ResetAck does not echo the seq");
    raw_close(&c);
    gift_auth_key_clear(&rk);
    daemon_teardown();
}
END_TEST

/* Under a key, a refused Hello whose resume_step says another worker has a
 * step this shard never finished (it restarted empty, before its first
 * step) proves the cluster's key: the ranks already back are told at once
 * (fatal ESTATE), not at their timeout. Without a key the same Hello is
 * refused alone (test_hostile.c's stranger). */
START_TEST(test_resume_race_auth)
{
    const char *extra[] = {"--auth-key-file", key_path(), "--world-size", "2", NULL};
    char err[256], warn[256];
    raw_t a, b;
    ck_assert_msg(gift_auth_key_load(extra[1], &K, err, sizeof err, warn, sizeof warn) == 0, "%s",
                  err);
    daemon_start(extra);
    raw_open(&a);
    raw_hello_auth(&a, &K, 0, 2);
    { /* rank 0 declares: its connection is now the member of rank 0 */
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__Declare d = GIFT__DECLARE__INIT;
        Gift__TensorDecl t = GIFT__TENSOR_DECL__INIT, *tp = &t;
        Gift__ChunkDecl ch = GIFT__CHUNK_DECL__INIT, *cp = &ch;
        uint8_t dg[8];
        t.name = (char *)"w";
        t.rows = 8;
        t.cols = 32;
        ch.rows = 8;
        gift_digest_bytes(gift_digest_tensors(&tp, 1), dg);
        d.tensors = &tp;
        d.n_tensors = 1;
        d.chunks = &cp;
        d.n_chunks = 1;
        d.digest.data = dg;
        d.digest.len = 8;
        env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
        env.declare = &d;
        ck_assert_msg(raw_send(&a, &env, NULL, 0) == 0, "send declare");
        raw_expect(&a, GIFT__ENVELOPE__MSG_DECLARE_ACK, "rank 0's declare");
    }
    raw_open(&b);
    raw_resume_step = 1;
    {
        uint8_t cn[GIFT_AUTH_NONCE_BYTES], sn[GIFT_AUTH_NONCE_BYTES], mac[GIFT_AUTH_MAC_BYTES];
        const gift_frame_t *f;
        ck_assert(gift_auth_nonce(cn) == 0);
        raw_send_hello(&b, 1, 2, cn, NULL);
        f = raw_expect(&b, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "first hello");
        memcpy(sn, f->env->auth_challenge->server_nonce.data, sizeof sn);
        raw_hello_mac(&K, sn, 1, 2, cn, mac);
        raw_send_hello(&b, 1, 2, cn, mac);
    }
    raw_resume_step = 0;
    raw_expect_error(&b, GIFT_ESTATE, 1, "an authenticated Hello with resume_step 1");
    raw_expect_error(&a, GIFT_ESTATE, 1, "rank 0, told of rank 1's refusal");
    raw_close(&a);
    raw_close(&b);
    daemon_stop();
    daemon_teardown();
}
END_TEST

static void teardown(void)
{
    if (D.pid > 0)
        daemon_teardown();
    gift_auth_key_clear(&K);
}

static Suite *suite(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("auth");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_giftd_refuses_bad_key_file);
    tcase_add_test(tc, test_raw_handshake);
    tcase_add_test(tc, test_raw_rejections);
    tcase_add_test(tc, test_client_right_key);
    tcase_add_test(tc, test_client_refused);
    tcase_add_test(tc, test_client_reconnect);
    tcase_add_test(tc, test_raw_reset);
    tcase_add_test(tc, test_resume_race_auth);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    return gift_test_run(suite(), CK_NORMAL) ? 1 : 0;
}
