/*
 * checkpoint.c: durable files for a shard (checkpoint.h): CRC-32C, the
 * atomic checkpoint file and the fsynced step log.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <limits.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "gift_error.h"
#include "log.h"

#define CKPT_MAGIC "GIFTCKP1"
#define CKPT_TAIL_MAGIC "CKPT"
#define LOG_MAGIC 0x31524c47u /* "GLR1" */
#define LOG_HEAD 16
#define LOG_MAX_RECORD (1ull << 40)

/* ------------------------------------------------------------------ */
/* CRC-32C                                                               */
/* ------------------------------------------------------------------ */

static uint32_t crc_table[8][256];
static int crc_hw = -1;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    crc_hw = 0;
#endif
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t len)
{
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= c;
        c = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^
            crc_table[5][(v >> 16) & 0xff] ^ crc_table[4][(v >> 24) & 0xff] ^
            crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
            crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const uint8_t *p,
                                                            size_t len)
{
    uint64_t c64 = c;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
        p += 8;
        len -= 8;
    }
    c = (uint32_t)c64;
    while (len--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t gift_crc32c(uint32_t crc, const void *p, size_t len)
{
    uint32_t c = ~crc;
    if (crc_hw < 0)
        crc_init();
#if defined(__x86_64__) && defined(__GNUC__)
    if (crc_hw)
        return ~crc_sse42(c, p, len);
#endif
    return ~crc_sw(c, p, len);
}

/* ------------------------------------------------------------------ */
/* Buffers                                                               */
/* ------------------------------------------------------------------ */

void gift_ckpt_put(gift_ckpt_buf_t *b, const void *p, size_t len)
{
    if (b->err)
        return;
    if (b->len + len > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        uint8_t *np;
        while (nc < b->len + len)
            nc *= 2;
        if ((np = realloc(b->p, nc)) == NULL) {
            b->err = GIFT_ENOMEM;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    if (len)
        memcpy(b->p + b->len, p, len);
    b->len += len;
}

void gift_ckpt_put_u32(gift_ckpt_buf_t *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    gift_ckpt_put(b, x, 4);
}

void gift_ckpt_put_u64(gift_ckpt_buf_t *b, uint64_t v)
{
    gift_ckpt_put_u32(b, (uint32_t)v);
    gift_ckpt_put_u32(b, (uint32_t)(v >> 32));
}

void gift_ckpt_put_f64(gift_ckpt_buf_t *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    gift_ckpt_put_u64(b, u);
}

void gift_ckpt_put_blob(gift_ckpt_buf_t *b, const void *p, size_t len)
{
    gift_ckpt_put_u64(b, len);
    gift_ckpt_put(b, p, len);
}

void gift_ckpt_buf_free(gift_ckpt_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void gift_ckpt_get(gift_ckpt_cur_t *c, void *out, size_t len)
{
    if (c->err || len > c->len - c->off) {
        c->err = GIFT_EIO;
        if (out)
            memset(out, 0, len);
        return;
    }
    if (out)
        memcpy(out, c->p + c->off, len);
    c->off += len;
}

uint32_t gift_ckpt_get_u32(gift_ckpt_cur_t *c)
{
    uint8_t x[4];
    gift_ckpt_get(c, x, 4);
    return (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
}

uint64_t gift_ckpt_get_u64(gift_ckpt_cur_t *c)
{
    uint64_t lo = gift_ckpt_get_u32(c);
    return lo | (uint64_t)gift_ckpt_get_u32(c) << 32;
}

double gift_ckpt_get_f64(gift_ckpt_cur_t *c)
{
    uint64_t u = gift_ckpt_get_u64(c);
    double v;
    memcpy(&v, &u, 8);
    return v;
}

const uint8_t *gift_ckpt_get_blob(gift_ckpt_cur_t *c, size_t *len, size_t max)
{
    uint64_t n = gift_ckpt_get_u64(c);
    const uint8_t *p;
    if (c->err || n > max || n > c->len - c->off) {
        c->err = GIFT_EIO;
        *len = 0;
        return NULL;
    }
    p = c->p + c->off;
    c->off += (size_t)n;
    *len = (size_t)n;
    return p;
}

/* ------------------------------------------------------------------ */
/* Files                                                                 */
/* ------------------------------------------------------------------ */

static int write_all(int fd, const void *p, size_t len)
{
    const uint8_t *b = p;
    while (len > 0) {
        ssize_t n = write(fd, b, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        b += n;
        len -= (size_t)n;
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    int rc;
    if (fd < 0)
        return -1;
    rc = fsync(fd);
    close(fd);
    return rc;
}

int gift_ckpt_mkdir(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return 0;
        snprintf(err, errlen, "data_dir %s exists and is not a directory", dir);
        return GIFT_EIO;
    }
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create data_dir %s: %s", dir, strerror(errno));
        return GIFT_EIO;
    }
    return 0;
}

int gift_ckpt_peek(const char *dir, void *out, size_t n, char *err, size_t errlen)
{
    char path[4200];
    uint8_t head[16];
    uint32_t v = 0;
    struct stat st;
    int fd;
    ssize_t got;
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return GIFT_EIO;
    }
    if (fstat(fd, &st) < 0 || st.st_size < (off_t)(32 + n) ||
        pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head ||
        (got = pread(fd, out, n, 16)) != (ssize_t)n) {
        snprintf(err, errlen, "%s is unreadable or too short", path);
        close(fd);
        return GIFT_EIO;
    }
    close(fd);
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)head[8 + i] << (8 * i);
    if (memcmp(head, CKPT_MAGIC, 8) != 0 || v < GIFT_CKPT_VERSION_MIN || v > GIFT_CKPT_VERSION) {
        snprintf(err, errlen, "%s is not a giftd checkpoint this giftd reads", path);
        return GIFT_EIO;
    }
    return 1;
}

int gift_ckpt_lock(const char *dir, int *fd, char *err, size_t errlen)
{
    char path[4200], pid[32];
    int n, f;
    snprintf(path, sizeof path, "%s/" GIFT_CKPT_LOCK_NAME, dir);
    *fd = -1;
    if ((f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
        snprintf(err, errlen, "cannot open the lock file %s: %s", path, strerror(errno));
        return GIFT_EIO;
    }
    if (flock(f, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        ssize_t got;
        if (e != EWOULDBLOCK && e != EAGAIN) {
            snprintf(err, errlen, "cannot lock %s: %s", path, strerror(e));
            close(f);
            return GIFT_EIO;
        }
        got = pread(f, pid, sizeof pid - 1, 0);
        close(f);
        pid[got > 0 ? got : 0] = '\0';
        pid[strcspn(pid, "\r\n")] = '\0';
        for (const char *c = pid; *c; c++)
            if (*c < '0' || *c > '9') {
                pid[0] = '\0';
                break;
            }
        snprintf(err, errlen,
                 "data_dir %s is in use by another giftd, PID %s (it holds the lock %s); "
                 "stop that giftd first, or give this one its own data_dir",
                 dir, pid[0] ? pid : "unknown (the lock file holds none yet)", path);
        return GIFT_EBUSY;
    }
    n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(f, 0) < 0 || pwrite(f, pid, (size_t)n, 0) != n) {
        snprintf(err, errlen, "cannot write the lock file %s: %s", path, strerror(errno));
        close(f);
        return GIFT_EIO;
    }
    *fd = f;
    return 0;
}

/* A step log's name: "log-" and a generation in canonical decimal. */
static int log_name(const char *name, uint64_t *gen)
{
    const char *d = name + 4;
    char *end;
    if (strncmp(name, "log-", 4) != 0 || *d < '0' || *d > '9' || (d[0] == '0' && d[1] != '\0'))
        return 0;
    for (const char *c = d; *c; c++)
        if (*c < '0' || *c > '9')
            return 0;
    errno = 0;
    *gen = strtoull(d, &end, 10);
    return errno == 0 && *end == '\0';
}

static int is_dir_at(const char *dir, const char *name)
{
    char path[4400];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Entries gift_ckpt_discard leaves where they are. */
static int kept_aside(const char *dir, const char *name)
{
    return strcmp(name, GIFT_CKPT_LOCK_NAME) == 0 ||
           ((strcmp(name, "lost+found") == 0 || strncmp(name, "discarded-", 10) == 0) &&
            is_dir_at(dir, name));
}

int gift_ckpt_audit(const char *dir, int have, uint64_t gen, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char list[400];
    size_t len = 0;
    int bad = 0, shown = 0;
    uint64_t top = have ? gen : 0;
    if (d == NULL) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot read data_dir %s: %s", dir, strerror(errno));
        return GIFT_EIO;
    }
    list[0] = '\0';
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        char why[128];
        uint64_t g;
        int w;
        if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0 || strcmp(nm, "checkpoint") == 0 ||
            strcmp(nm, "checkpoint.tmp") == 0 || kept_aside(dir, nm))
            continue;
        if (log_name(nm, &g)) {
            if (g <= top)
                continue;
            if (have)
                snprintf(why, sizeof why,
                         "a step log newer than the checkpoint, of generation %" PRIu64, gen);
            else
                snprintf(why, sizeof why,
                         "a step log of generation %" PRIu64 " without the checkpoint it extends",
                         g);
        } else {
            snprintf(why, sizeof why, "not a file giftd writes");
        }
        bad++;
        if (shown < 4) {
            w = snprintf(list + len, sizeof list - len, "%s%.64s (%s)", shown ? ", " : "", nm, why);
            if (w > 0 && (size_t)w < sizeof list - len) {
                len += (size_t)w;
                shown++;
            } else {
                list[len] = '\0';
                shown = 4;
            }
        }
    }
    closedir(d);
    if (bad == 0)
        return 0;
    snprintf(err, errlen,
             "data_dir %s holds what giftd cannot account for: %s%s; refusing to start, "
             "nothing was changed. Put back the checkpoint these files belong to (and move "
             "away what is not giftd's), or start once with --discard-state to move all of it "
             "into %s/discarded-<UTC time>/ and start empty",
             dir, list, bad > shown ? ", and more" : "", dir);
    return GIFT_ECONFIG;
}

int gift_ckpt_write(const char *dir, uint32_t version, const void *body, size_t len, char *err,
                    size_t errlen)
{
    char tmp[4200], dst[4200];
    uint8_t head[16], tail[16];
    uint32_t crc, v = version;
    uint64_t n = len;
    int fd;

    snprintf(tmp, sizeof tmp, "%s/checkpoint.tmp", dir);
    snprintf(dst, sizeof dst, "%s/checkpoint", dir);
    memcpy(head, CKPT_MAGIC, 8);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (uint8_t)(v >> (8 * i));
    memset(head + 12, 0, 4);
    crc = gift_crc32c(0, head, sizeof head);
    crc = gift_crc32c(crc, body, len);
    for (int i = 0; i < 8; i++)
        tail[i] = (uint8_t)(n >> (8 * i));
    for (int i = 0; i < 4; i++)
        tail[8 + i] = (uint8_t)(crc >> (8 * i));
    memcpy(tail + 12, CKPT_TAIL_MAGIC, 4);
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        return GIFT_EIO;
    }
    if (write_all(fd, head, sizeof head) < 0 || write_all(fd, body, len) < 0 ||
        write_all(fd, tail, sizeof tail) < 0 || fsync(fd) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return GIFT_EIO;
    }
    if (close(fd) < 0 || rename(tmp, dst) < 0 || fsync_dir(dir) < 0) {
        snprintf(err, errlen, "cannot install %s: %s", dst, strerror(errno));
        unlink(tmp);
        return GIFT_EIO;
    }
    return 0;
}

/* Reads a whole file. Returns 1 with *buf and *len, 0 when missing, GIFT_EIO. */
static int read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    uint8_t *b;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *buf = NULL;
    *len = 0;
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return GIFT_EIO;
    }
    if (fstat(fd, &st) < 0 || (b = malloc(st.st_size ? (size_t)st.st_size : 1)) == NULL) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        close(fd);
        return GIFT_EIO;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, b + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(err, errlen, "cannot read %s: %s", path, n < 0 ? strerror(errno) : "short");
            free(b);
            close(fd);
            return GIFT_EIO;
        }
        got += (size_t)n;
    }
    close(fd);
    *buf = b;
    *len = got;
    return 1;
}

int gift_ckpt_read(const char *dir, uint8_t **body, size_t *len, uint32_t *version, char *err,
                   size_t errlen)
{
    char path[4200];
    uint8_t *b;
    size_t n;
    uint64_t blen = 0;
    uint32_t crc = 0, v = 0;
    int rc;

    *body = NULL;
    *len = 0;
    *version = 0;
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    if ((rc = read_file(path, &b, &n, err, errlen)) <= 0)
        return rc;
    if (n < 32 || memcmp(b, CKPT_MAGIC, 8) != 0) {
        snprintf(err, errlen, "%s is not a giftd checkpoint (%zu bytes, bad magic or too short)",
                 path, n);
        goto bad;
    }
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)b[8 + i] << (8 * i);
    if (v < GIFT_CKPT_VERSION_MIN || v > GIFT_CKPT_VERSION) {
        snprintf(err, errlen, "%s has format version %u; this giftd reads %d to %d", path, v,
                 GIFT_CKPT_VERSION_MIN, GIFT_CKPT_VERSION);
        goto bad;
    }
    for (int i = 0; i < 8; i++)
        blen |= (uint64_t)b[n - 16 + i] << (8 * i);
    for (int i = 0; i < 4; i++)
        crc |= (uint32_t)b[n - 8 + i] << (8 * i);
    if (memcmp(b + n - 4, CKPT_TAIL_MAGIC, 4) != 0 || blen != n - 32) {
        snprintf(err, errlen,
                 "%s is truncated or damaged: %zu bytes, the tail says %" PRIu64 " of body", path,
                 n, blen);
        goto bad;
    }
    if (gift_crc32c(0, b, n - 16) != crc) {
        snprintf(err, errlen, "%s fails its checksum (CRC-32C): the file is corrupt", path);
        goto bad;
    }
    memmove(b, b + 16, (size_t)blen);
    *body = b;
    *len = (size_t)blen;
    *version = v;
    return 1;
bad:
    free(b);
    return GIFT_EIO;
}

/* ------------------------------------------------------------------ */
/* Step log                                                              */
/* ------------------------------------------------------------------ */

int gift_log_open(gift_log_t *l, const char *dir, uint64_t gen, int truncate, char *err,
                  size_t errlen)
{
    struct stat st;
    l->gen = gen;
    l->bytes = 0;
    l->base = 0;
    l->err_no = 0;
    snprintf(l->path, sizeof l->path, "%s/log-%" PRIu64, dir, gen);
    l->fd =
        open(l->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0600);
    if (l->fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", l->path, strerror(errno));
        return GIFT_EIO;
    }
    if (fstat(l->fd, &st) < 0 || fsync(l->fd) < 0 || fsync_dir(dir) < 0) {
        snprintf(err, errlen, "cannot sync %s: %s", l->path, strerror(errno));
        close(l->fd);
        l->fd = -1;
        return GIFT_EIO;
    }
    l->base = (uint64_t)st.st_size;
    return 0;
}

void gift_log_close(gift_log_t *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

int gift_log_sync(gift_log_t *l)
{
    if (l->fd < 0 || fdatasync(l->fd) < 0) {
        if (l->err_no == 0)
            l->err_no = l->fd < 0 ? EBADF : errno;
        GIFT_LOG_ERROR(0, "cannot sync %s: %s", l->path, l->fd < 0 ? "not open" : strerror(errno));
        return GIFT_EIO;
    }
    return 0;
}

int gift_log_append(gift_log_t *l, uint32_t type, const void *const *parts, const size_t *lens,
                    int n, int sync)
{
    /* One gather write (no copy of the parts), so that a record is either
     * whole or a torn tail. */
    struct iovec iov[GIFT_LOG_MAX_PARTS + 2];
    uint8_t head[LOG_HEAD], tail[4];
    uint64_t len = 0, total;
    uint32_t crc;
    int niov = 0;

    if (l->fd < 0 || n < 0 || n > GIFT_LOG_MAX_PARTS)
        return GIFT_EIO;
    for (int i = 0; i < n; i++)
        len += lens[i];
    for (int i = 0; i < 4; i++) {
        head[i] = (uint8_t)(LOG_MAGIC >> (8 * i));
        head[4 + i] = (uint8_t)(type >> (8 * i));
    }
    for (int i = 0; i < 8; i++)
        head[8 + i] = (uint8_t)(len >> (8 * i));
    crc = gift_crc32c(0, head + 4, 12);
    for (int i = 0; i < n; i++)
        crc = gift_crc32c(crc, parts[i], lens[i]);
    for (int i = 0; i < 4; i++)
        tail[i] = (uint8_t)(crc >> (8 * i));
    iov[niov].iov_base = head;
    iov[niov++].iov_len = LOG_HEAD;
    for (int i = 0; i < n; i++) {
        iov[niov].iov_base = (void *)parts[i];
        iov[niov++].iov_len = lens[i];
    }
    iov[niov].iov_base = tail;
    iov[niov++].iov_len = 4;
    total = LOG_HEAD + len + 4;
    for (int i = 0;;) {
        ssize_t w = writev(l->fd, iov + i, niov - i);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            goto fail;
        /* Skip what was written; a short write goes on from there. */
        while (i < niov && (size_t)w >= iov[i].iov_len) {
            w -= (ssize_t)iov[i].iov_len;
            i++;
        }
        if (i == niov)
            break;
        iov[i].iov_base = (uint8_t *)iov[i].iov_base + w;
        iov[i].iov_len -= (size_t)w;
    }
    if (sync && fdatasync(l->fd) < 0)
        goto fail;
    l->bytes += total;
    return 0;
fail : {
    int e = errno;
    if (l->err_no == 0)
        l->err_no = e;
    /* Cut a partly written record off again, so that the log ends with
     * its last whole record (shrinking needs no space). */
    if (ftruncate(l->fd, (off_t)(l->base + l->bytes)) < 0)
        GIFT_LOG_WARN(0, "cannot cut %s back to %" PRIu64 " bytes: %s", l->path, l->base + l->bytes,
                      strerror(errno));
    GIFT_LOG_ERROR(0, "cannot append to %s: %s", l->path, strerror(e));
}
    return GIFT_EIO;
}

void gift_log_remove_superseded(const char *dir, uint64_t gen)
{
    DIR *d;
    struct dirent *e;
    char path[4400];
    int fd;
    if (gen == 0)
        return;
    /* The checkpoint holding their steps must be durable first. */
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fsync(fd) < 0 || fsync_dir(dir) < 0) {
        GIFT_LOG_WARN(0, "%s: not synced (%s); the step logs it supersedes are kept", path,
                      strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    close(fd);
    if ((d = opendir(dir)) == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        uint64_t g;
        if (!log_name(e->d_name, &g) || g >= gen)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0)
            GIFT_LOG_DEBUG(0,
                           "removed %s: the checkpoint of generation %" PRIu64 " holds its steps",
                           path, gen);
    }
    closedir(d);
}

int gift_ckpt_discard(const char *dir, char *where, size_t wherelen, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL, stamp[32], src[4400], dst[8800];
    size_t n = 0, cap = 0;
    struct tm tm;
    time_t now = time(NULL);
    int rc = GIFT_EIO;

    where[0] = '\0';
    if (d == NULL) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot read data_dir %s: %s", dir, strerror(errno));
        return GIFT_EIO;
    }
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            kept_aside(dir, e->d_name))
            continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
            if (nn == NULL)
                goto nomem;
            names = nn;
        }
        if ((names[n] = strdup(e->d_name)) == NULL)
            goto nomem;
        n++;
    }
    closedir(d);
    d = NULL;
    if (n == 0) {
        free(names);
        return 0;
    }
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    for (int k = 0;; k++) {
        if (k == 0)
            snprintf(where, wherelen, "%s/discarded-%s", dir, stamp);
        else
            snprintf(where, wherelen, "%s/discarded-%s-%d", dir, stamp, k);
        if (mkdir(where, 0700) == 0)
            break;
        if (errno != EEXIST || k >= 1000) {
            snprintf(err, errlen, "cannot create %s: %s", where, strerror(errno));
            where[0] = '\0';
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(src, sizeof src, "%s/%s", dir, names[i]);
        snprintf(dst, sizeof dst, "%s/%s", where, names[i]);
        if (rename(src, dst) < 0) {
            snprintf(err, errlen, "cannot move %s into %s: %s (%zu of %zu entries moved)", src,
                     where, strerror(errno), i, n);
            fsync_dir(where);
            fsync_dir(dir);
            goto out;
        }
    }
    if (fsync_dir(where) < 0 || fsync_dir(dir) < 0) {
        snprintf(err, errlen, "cannot sync %s after moving the state into it: %s", dir,
                 strerror(errno));
        goto out;
    }
    rc = (int)(n > INT_MAX ? INT_MAX : n);
    goto out;
nomem:
    snprintf(err, errlen, "out of memory listing data_dir %s", dir);
out:
    if (d != NULL)
        closedir(d);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

int gift_log_replay(const char *dir, uint64_t gen, gift_log_record_cb fn, void *arg, int *torn,
                    char *err, size_t errlen)
{
    char path[4200];
    uint8_t *b;
    size_t n, off = 0;
    int rc;

    *torn = 0;
    snprintf(path, sizeof path, "%s/log-%" PRIu64, dir, gen);
    if ((rc = read_file(path, &b, &n, err, errlen)) <= 0)
        return rc;
    while (off < n) {
        uint32_t magic = 0, type = 0, crc = 0;
        uint64_t len = 0;
        const char *why = NULL;
        if (n - off >= 4)
            for (int i = 0; i < 4; i++)
                magic |= (uint32_t)b[off + i] << (8 * i);
        if (n - off < LOG_HEAD + 4) {
            why = "a record head cut short";
        } else {
            magic = 0;
            for (int i = 0; i < 4; i++) {
                magic |= (uint32_t)b[off + i] << (8 * i);
                type |= (uint32_t)b[off + 4 + i] << (8 * i);
            }
            for (int i = 0; i < 8; i++)
                len |= (uint64_t)b[off + 8 + i] << (8 * i);
            if (magic != LOG_MAGIC || len > LOG_MAX_RECORD) {
                why = "a bad record head";
            } else if (len + LOG_HEAD + 4 > n - off) {
                why = "a record cut short";
            } else {
                for (int i = 0; i < 4; i++)
                    crc |= (uint32_t)b[off + LOG_HEAD + len + i] << (8 * i);
                if (gift_crc32c(gift_crc32c(0, b + off + 4, 12), b + off + LOG_HEAD, len) != crc)
                    why = "a record that fails its checksum";
            }
        }
        if (why != NULL) {
            /* A cut-short record at the end is a write the crash interrupted;
             * its fsync never returned, so nothing that depends on it was
             * acknowledged. Anything else is damage. */
            int tail = (magic == LOG_MAGIC || n - off < 4) &&
                       (n - off < LOG_HEAD + 4 || len + LOG_HEAD + 4 > n - off);
            if (tail) {
                GIFT_LOG_WARN(0, "%s: dropping %zu bytes of an unfinished last record", path,
                              n - off);
                if (truncate(path, (off_t)off) < 0) {
                    snprintf(err, errlen, "cannot truncate %s: %s", path, strerror(errno));
                    rc = GIFT_EIO;
                    goto out;
                }
                *torn = 1;
                break;
            }
            snprintf(err, errlen, "%s is corrupt: %s at byte %zu of %zu", path, why, off, n);
            rc = GIFT_EIO;
            goto out;
        }
        if ((rc = fn(type, b + off + LOG_HEAD, (size_t)len, arg)) < 0) {
            if (err[0] == '\0')
                snprintf(err, errlen, "%s: record at byte %zu refused", path, off);
            goto out;
        }
        off += LOG_HEAD + (size_t)len + 4;
    }
    rc = 0;
out:
    free(b);
    return rc;
}
