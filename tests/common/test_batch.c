/*
 * test_batch.c: common/batch.c, the outgoing frame batch both libuv glues
 * share: heads copied in, payloads referenced, priority order stable among
 * equals, every ref handed back once on release, buffers reused.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gift_batch.h"
#include "gift_test_check.h"

static void count_release(void *ref, void *arg)
{
    (*(int *)ref)--;
    (*(int *)arg)++;
}

/* Adds a frame with a head of n bytes of value v. */
static void add(gift_batch_t *b, size_t n, uint8_t v, const void *payload, size_t len, int *ref,
                int64_t prio)
{
    uint8_t *h;
    int rc = gift_batch_reserve(b, n + 8, payload, len, ref, prio, &h);
    ck_assert_msg(rc == 0, "reserve returned %d", rc);
    memset(h, v, n);
    (void)gift_batch_commit(b, n);
    if (ref)
        (*ref)++;
}

START_TEST(test_batch_order_and_release)
{
    gift_batch_t b = {0};
    static const uint8_t pay[3] = {1, 2, 3};
    int refs[4] = {0}, released = 0;
    uint8_t *heads_before;

    add(&b, 5, 0xA0, NULL, 0, NULL, 0);
    add(&b, 3, 0xA1, pay, sizeof pay, &refs[1], 7);
    add(&b, 4, 0xA2, pay, 2, &refs[2], 0);
    add(&b, 2, 0xA3, NULL, 9, &refs[3], 7);
    ck_assert_msg(b.nitems == 4 && b.heads_len == 14, "%zu frames, %zu head bytes", b.nitems,
                  b.heads_len);
    ck_assert_msg(b.bytes == 14 + 3 + 2, "%llu bytes queued, want 19", (unsigned long long)b.bytes);
    ck_assert_msg(b.items[3].len == 0, "a frame without payload counts %zu payload bytes",
                  b.items[3].len);
    gift_batch_sort(&b);
    /* prio 7 first in arrival order (frames 1, 3), then prio 0 (0, 2). */
    static const uint8_t want[4] = {0xA1, 0xA3, 0xA0, 0xA2};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(b.heads[b.items[i].head_off] == want[i], "frame %d after sort has head %#x",
                      i, b.heads[b.items[i].head_off]);
    ck_assert_msg(b.items[0].payload == pay && b.items[0].len == 3,
                  "the payload is referenced, not copied");
    heads_before = b.heads;
    gift_batch_release(&b, count_release, &released);
    ck_assert_msg(released == 3 && refs[1] == 0 && refs[2] == 0 && refs[3] == 0,
                  "%d releases, refs %d %d %d", released, refs[1], refs[2], refs[3]);
    ck_assert_msg(b.nitems == 0 && b.heads_len == 0 && b.bytes == 0, "not empty after release");
    add(&b, 5, 0xB0, NULL, 0, NULL, 0);
    ck_assert_msg(b.heads == heads_before, "the head buffer was not reused");
    gift_batch_release(&b, NULL, NULL);
    gift_batch_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("common_batch");
    TCase *tc = tcase_create("batch");
    tcase_add_test(tc, test_batch_order_and_release);
    suite_add_tcase(s, tc);
    return gift_test_run(s, CK_ENV) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
