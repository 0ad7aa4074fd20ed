/*
 * gift_test_keyfile.h: key files for the authentication tests, unit
 * (tests/proto/test_auth.c) and against real giftd processes
 * (tests/server/test_auth.c).
 */
#ifndef GIFT_TEST_KEYFILE_H
#define GIFT_TEST_KEYFILE_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Writes a key file with the given bytes and mode; returns its path (static). */
static inline const char *key_file_write(const char *name, const void *bytes, size_t len,
                                         mode_t mode)
{
    static char paths[8][512];
    static int next;
    const char *tmp = getenv("TMPDIR");
    char *path = paths[next++ % 8];
    int fd;
    snprintf(path, 512, "%s/giftd-key-%d-%s", tmp != NULL && tmp[0] ? tmp : "/tmp", (int)getpid(),
             name);
    unlink(path);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_msg(fd >= 0, "create %s: %s", path, strerror(errno));
    ck_assert_msg(write(fd, bytes, len) == (ssize_t)len, "write %s", path);
    close(fd);
    ck_assert_msg(chmod(path, mode) == 0, "chmod %s", path);
    return path;
}

#endif
