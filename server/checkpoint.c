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
#include <sys/stat.h>
#include <limits.h>
#include <sys/types.h>
#include <sys/uio.h>
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
                 "%s is truncated or damaged: %zu bytes, the tail says %" PRIu64 " of body",
                 path, n, blen);
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
    l->gen = gen;
    l->bytes = 0;
    snprintf(l->path, sizeof l->path, "%s/log-%" PRIu64, dir, gen);
    l->fd = open(l->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0),
                 0600);
    if (l->fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", l->path, strerror(errno));
        return GIFT_EIO;
    }
    if (fsync(l->fd) < 0 || fsync_dir(dir) < 0) {
        snprintf(err, errlen, "cannot sync %s: %s", l->path, strerror(errno));
        close(l->fd);
        l->fd = -1;
        return GIFT_EIO;
    }
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
fail:
    GIFT_LOG_ERROR(0, "cannot append to %s: %s", l->path, strerror(errno));
    return GIFT_EIO;
}

void gift_log_remove_others(const char *dir, uint64_t keep)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4400];
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        char *end;
        unsigned long long g;
        if (strncmp(e->d_name, "log-", 4) != 0)
            continue;
        g = strtoull(e->d_name + 4, &end, 10);
        if (*end != '\0' || end == e->d_name + 4 || g == keep)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

int gift_ckpt_discard(const char *dir, char *err, size_t errlen)
{
    static const char *const names[] = {"checkpoint", "checkpoint.tmp"};
    char path[4200];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (unlink(path) < 0 && errno != ENOENT) {
            snprintf(err, errlen, "cannot remove %s: %s", path, strerror(errno));
            return GIFT_EIO;
        }
    }
    gift_log_remove_others(dir, UINT64_MAX);
    return 0;
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
