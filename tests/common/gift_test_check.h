/*
 * gift_test_check.h: Check glue the suites share: an assertion for hot loops
 * and the runner every suite's main() repeats.
 */
#ifndef GIFT_TEST_CHECK_H
#define GIFT_TEST_CHECK_H

#include <check.h>

/* ck_assert_msg without the mark point that Check records on every passing
 * check (a write to a file, which dominates the per-element loops). */
#define require_msg(expr, ...)                                                                     \
    do {                                                                                           \
        if (!(expr))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)

/* Runs suite s with the given output mode; returns the number of failures. */
static inline int gift_test_run(Suite *s, enum print_output mode)
{
    SRunner *sr = srunner_create(s);
    int failed;

    srunner_run_all(sr, mode);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

#endif
