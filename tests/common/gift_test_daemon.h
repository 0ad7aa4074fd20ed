/*
 * gift_test_daemon.h: one real giftd (GIFTD_BIN) for a Check suite, started
 * on 127.0.0.1 with --bind 127.0.0.1 --port 0 --http-port 0 plus the
 * suite's own flags, its "giftd ready port=P http_port=H" line read from a
 * pipe within GIFT_TEST_READY_TIMEOUT_MS, its stderr in a file under $TMPDIR
 * (named in failure messages, removed when the test passes), with
 * PR_SET_PDEATHSIG so that a failing test (whose teardown does not run)
 * leaves nothing behind, and no GIFTD_* variable of the caller's
 * environment. Stopping it sends SIGTERM and asserts exit status 0 (the
 * drain) and a log free of sanitizer reports (the ASan build instruments the
 * daemon too).
 *
 * The includer defines _GNU_SOURCE before any system header (pipe2) and
 * compiles with -DGIFTD_BIN="path of the giftd executable". One daemon per
 * test process: its state is D.
 */
#ifndef GIFT_TEST_DAEMON_H
#define GIFT_TEST_DAEMON_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gift_test_time.h"

#ifndef GIFTD_BIN
#error "compile with -DGIFTD_BIN=\"path of the giftd executable\""
#endif

/* giftd start, to its ready line (ASan builds are slow to start). */
#define GIFT_TEST_READY_TIMEOUT_MS 20000

extern char **environ;

typedef struct daemon {
    pid_t pid;
    int port, http_port;
    int out_fd;         /* read end of its stdout */
    int stopped;        /* reaped already */
    int status;         /* wait status once stopped */
    char log_path[512]; /* its stderr */
} daemon_t;

/* How a suite starts its giftd, on top of the common flags. */
typedef struct daemon_opts {
    const char *log_prefix;   /* log file: $TMPDIR/<log_prefix>XXXXXX */
    const char *const *flags; /* after the common flags (NULL-terminated, or NULL) */
    int need_http_port;       /* the ready line must give an HTTP port > 0 */
} daemon_opts_t;

static daemon_t D = {.pid = -1, .out_fd = -1};

/* Reads the daemon's log into buf (at most cap - 1 bytes, from its end when
 * tail), NUL-terminated; returns the bytes read. */
static inline size_t log_read(char *buf, size_t cap, int tail)
{
    FILE *f = fopen(D.log_path, "r");
    size_t n;
    long size;
    buf[0] = '\0';
    if (f == NULL)
        return 0;
    if (tail && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > (long)(cap - 1))
        fseek(f, size - (long)(cap - 1), SEEK_SET);
    else
        fseek(f, 0, SEEK_SET);
    n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return n;
}

/* The last few lines of the daemon's log, for failure messages. */
static inline const char *log_tail(void)
{
    static char buf[3072];
    log_read(buf, sizeof buf, 1);
    return buf;
}

/* Occurrences of needle in the whole log (binary-safe: len bytes). */
static inline int log_count_mem(const void *needle, size_t len)
{
    static char buf[64 << 20];
    size_t n = log_read(buf, sizeof buf, 0);
    int count = 0;
    for (size_t i = 0; len > 0 && i + len <= n; i++)
        if (memcmp(buf + i, needle, len) == 0)
            count++;
    return count;
}

/* Occurrences of the string needle in the whole log. */
static inline int log_count(const char *needle)
{
    return log_count_mem(needle, strlen(needle));
}

/* Fails when the log holds a sanitizer report. */
static inline void log_check_clean(void)
{
    static const char *const bad[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                      "runtime error", "AddressSanitizer:DEADLYSIGNAL"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(log_count(bad[i]) == 0, "giftd log %s holds \"%s\":\n%s", D.log_path, bad[i],
                      log_tail());
}

/* Waits up to timeout_ms for pid; returns 1 with *status when it exited. */
static inline int wait_exit(pid_t pid, int timeout_ms, int *status)
{
    double end = now_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid)
            return 1;
        if (r < 0 && errno != EINTR)
            return 0;
        if (now_ms() >= end)
            return 0;
        sleep_ms(5);
    }
}

/* 1 while the daemon runs (reaps it, into D.status, when it has exited). */
static inline int daemon_alive(void)
{
    int status;
    if (D.pid <= 0 || D.stopped)
        return 0;
    if (waitpid(D.pid, &status, WNOHANG) == D.pid) {
        D.stopped = 1;
        D.status = status;
        return 0;
    }
    return 1;
}

/* The child side of daemon_start_opts: never returns. */
static inline void daemon_exec(char *const argv[], int out_w, int log_fd, pid_t parent)
{
    char names[64][128];
    int nn = 0;

    /* Dies with the test process, whatever happens to it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(log_fd, STDERR_FILENO) < 0)
        _exit(127);
    /* Only the flags configure it: no GIFTD_* from the caller's environment. */
    for (char **e = environ; *e != NULL && nn < 64; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "GIFTD_", 6) == 0 && eq != NULL && (size_t)(eq - *e) < sizeof names[0]) {
            memcpy(names[nn], *e, (size_t)(eq - *e));
            names[nn++][eq - *e] = '\0';
        }
    }
    for (int i = 0; i < nn; i++)
        unsetenv(names[i]);
    execv(argv[0], argv);
    _exit(127);
}

/* Starts giftd with the common flags, o->flags, then extra (NULL-terminated
 * lists). With expect_ready, reads its ready line and fails the test without
 * one (returns 0); otherwise returns 0 when the ready line came, or the exit
 * status (> 0; 128 + signal) when giftd exited first. */
static inline int daemon_start_opts(const daemon_opts_t *o, const char *const *extra,
                                    int expect_ready)
{
    const char *tmp = getenv("TMPDIR");
    const char *const *lists[2] = {o->flags, extra};
    char *argv[48];
    int argc = 0, out[2], log_fd, status;
    char line[256];
    size_t len = 0;
    double end;
    pid_t parent = getpid();

    memset(&D, 0, sizeof D);
    D.pid = -1;
    D.out_fd = -1;
    snprintf(D.log_path, sizeof D.log_path, "%s/%sXXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", o->log_prefix);
    log_fd = mkstemp(D.log_path);
    ck_assert_msg(log_fd >= 0, "mkstemp(%s): %s", D.log_path, strerror(errno));
    ck_assert_msg(pipe2(out, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno));

    argv[argc++] = (char *)GIFTD_BIN;
    argv[argc++] = (char *)"--bind";
    argv[argc++] = (char *)"127.0.0.1";
    argv[argc++] = (char *)"--port";
    argv[argc++] = (char *)"0";
    argv[argc++] = (char *)"--http-port";
    argv[argc++] = (char *)"0";
    /* world_size is required; a suite's own --world-size comes later and wins. */
    argv[argc++] = (char *)"--world-size";
    argv[argc++] = (char *)"auto";
    for (int l = 0; l < 2; l++)
        for (const char *const *a = lists[l]; a != NULL && *a != NULL && argc < 47; a++)
            argv[argc++] = (char *)*a;
    argv[argc] = NULL;

    D.pid = fork();
    ck_assert_msg(D.pid >= 0, "fork: %s", strerror(errno));
    if (D.pid == 0)
        daemon_exec(argv, out[1], log_fd, parent);
    close(out[1]);
    close(log_fd);
    D.out_fd = out[0];

    /* "giftd ready port=P http_port=H\n" */
    end = now_ms() + GIFT_TEST_READY_TIMEOUT_MS;
    while (memchr(line, '\n', len) == NULL) {
        struct pollfd pfd = {.fd = D.out_fd, .events = POLLIN};
        int left = (int)(end - now_ms());
        ssize_t n;
        ck_assert_msg(left > 0 && len < sizeof line - 1,
                      "giftd printed no ready line within %d ms; log %s:\n%s",
                      GIFT_TEST_READY_TIMEOUT_MS, D.log_path, log_tail());
        if (poll(&pfd, 1, left) <= 0)
            continue;
        n = read(D.out_fd, line + len, sizeof line - 1 - len);
        if (n <= 0) {
            ck_assert_msg(!expect_ready, "giftd closed stdout before its ready line; log %s:\n%s",
                          D.log_path, log_tail());
            ck_assert_msg(wait_exit(D.pid, GIFT_TEST_READY_TIMEOUT_MS, &status),
                          "giftd did not exit");
            D.stopped = 1;
            D.status = status;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        len += (size_t)n;
    }
    line[len] = '\0';
    ck_assert_msg(sscanf(line, "giftd ready port=%d http_port=%d", &D.port, &D.http_port) == 2 &&
                      D.port > 0 && (!o->need_http_port || D.http_port > 0),
                  "unexpected ready line \"%s\"", line);
    return 0;
}

/* SIGTERM, then waits for the drain: the exit status must be 0 within
 * timeout_ms; then (also when it was reaped already) the log must be free of
 * sanitizer reports. Returns the time the drain took (0 when there was no
 * SIGTERM to send). */
static inline double daemon_stop_ms(int timeout_ms)
{
    int status = 0;
    double t0 = now_ms(), dt = 0.0;
    if (D.pid <= 0)
        return 0.0;
    if (!D.stopped) {
        ck_assert_msg(kill(D.pid, SIGTERM) == 0, "kill: %s", strerror(errno));
        if (!wait_exit(D.pid, timeout_ms, &status)) {
            kill(D.pid, SIGKILL);
            waitpid(D.pid, &status, 0);
            D.stopped = 1;
            ck_abort_msg("giftd did not exit within %d ms of SIGTERM; log %s:\n%s", timeout_ms,
                         D.log_path, log_tail());
        }
        dt = now_ms() - t0;
        D.stopped = 1;
        D.status = status;
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "giftd ended with %s %d after SIGTERM; log %s:\n%s",
                      WIFEXITED(status) ? "exit status" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), D.log_path,
                      log_tail());
    }
    log_check_clean();
    return dt;
}

/* daemon_stop_ms, then closes its stdout and removes its log (only reached
 * when everything passed). */
static inline void daemon_teardown_ms(int stop_timeout_ms)
{
    daemon_stop_ms(stop_timeout_ms);
    if (D.out_fd >= 0)
        close(D.out_fd);
    D.out_fd = -1;
    unlink(D.log_path);
    D.pid = -1;
}

/* Resident set size of the daemon in kB (VmRSS), or -1. */
static inline long daemon_rss_kb(void)
{
    char path[64], line[256];
    long kb = -1;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/status", (int)D.pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

#endif
