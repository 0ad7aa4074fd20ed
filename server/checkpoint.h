/*
 * checkpoint.h: the files a shard keeps in data_dir, without knowing what is
 * in them. No sockets, no shard internals: server/shard.c decides the
 * contents, this module makes them durable and checks them on the way back.
 *
 * Two kinds of file, both little-endian and checksummed with CRC-32C:
 *
 *   checkpoint   "checkpoint": a whole-state snapshot. Written to
 *                "checkpoint.tmp", fsynced, renamed over "checkpoint", and
 *                the folder fsynced, so a reader sees the old file or the
 *                new one, never a mix. Layout: 16-byte head {magic
 *                "GIFTCKP1", u32 version, u32 reserved}, the body, then a
 *                16-byte tail {u64 body length, u32 CRC-32C of head and
 *                body, magic "CKPT"}. A file whose tail, length or CRC does
 *                not match is refused whole.
 *   step log     "log-<generation>": records appended after the checkpoint
 *                of the same generation, each {u32 magic "GLR1", u32 type,
 *                u64 length, body, u32 CRC-32C of type, length and body},
 *                fdatasynced before gift_log_append returns. A record cut
 *                short at the very end of the file (a crash inside a write
 *                that nothing acknowledged) is dropped with a warning; a bad
 *                record followed by more bytes is corruption and refused.
 *
 *   lock file    "giftd.lock": flock()ed by the giftd using data_dir for its
 *                whole life (gift_ckpt_lock), holding its PID as text.
 *   discarded-*  folders that gift_ckpt_discard moved old state into.
 *
 * Generations: a shard without a checkpoint is at generation 0 and logs to
 * log-0. A checkpoint of generation G holds everything up to its write, and
 * log-G extends it; a log-g with g < G is superseded (its steps are in the
 * checkpoint) and is removed only once that checkpoint is durable. Nothing
 * else in data_dir is ever deleted: a file giftd cannot account for stops
 * it (gift_ckpt_audit), and discarding moves state aside, never unlinks it.
 *
 * Ownership: gift_ckpt_buf_t grows as it is written and is reused; the
 * reader's buffers are the caller's until gift_ckpt_file_free.
 */
#ifndef GIFT_CHECKPOINT_H
#define GIFT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The format version written. 2 (issue 24) adds the policy's decisions and
 * the state its chooser reads; version 1 still loads (declared treatments). */
#define GIFT_CKPT_VERSION 2
#define GIFT_CKPT_VERSION_MIN 1

/* CRC-32C (Castagnoli) of len bytes, continuing from crc (0 to start). */
uint32_t gift_crc32c(uint32_t crc, const void *p, size_t len);

/* A growable little-endian byte buffer for building bodies. Errors are
 * sticky: after a failed allocation every put is a no-op and err is set. */
typedef struct gift_ckpt_buf {
    uint8_t *p;
    size_t len, cap;
    int err;
} gift_ckpt_buf_t;

void gift_ckpt_put(gift_ckpt_buf_t *b, const void *p, size_t len);
void gift_ckpt_put_u32(gift_ckpt_buf_t *b, uint32_t v);
void gift_ckpt_put_u64(gift_ckpt_buf_t *b, uint64_t v);
void gift_ckpt_put_f64(gift_ckpt_buf_t *b, double v);
/* A u64 length then the bytes. */
void gift_ckpt_put_blob(gift_ckpt_buf_t *b, const void *p, size_t len);
void gift_ckpt_buf_free(gift_ckpt_buf_t *b);

/* A bounds-checked reader over a body. Reading past the end sets err and
 * returns zeros; callers check err once at the end of a section. */
typedef struct gift_ckpt_cur {
    const uint8_t *p;
    size_t len, off;
    int err;
} gift_ckpt_cur_t;

uint32_t gift_ckpt_get_u32(gift_ckpt_cur_t *c);
uint64_t gift_ckpt_get_u64(gift_ckpt_cur_t *c);
double gift_ckpt_get_f64(gift_ckpt_cur_t *c);
/* Copies len bytes into out (may be NULL to skip). */
void gift_ckpt_get(gift_ckpt_cur_t *c, void *out, size_t len);
/* Reads a blob's length and returns a pointer to its bytes inside the body
 * (NULL and err set when it does not fit, or when it is longer than max). */
const uint8_t *gift_ckpt_get_blob(gift_ckpt_cur_t *c, size_t *len, size_t max);

/* Writes body as DIR/checkpoint atomically (tmp, fsync, rename, fsync dir),
 * with format version `version` in its head. Returns 0 or GIFT_EIO with a
 * sentence in err. */
int gift_ckpt_write(const char *dir, uint32_t version, const void *body, size_t len, char *err,
                    size_t errlen);

/* Reads and verifies DIR/checkpoint. Returns 1 and *body, *len (malloc'd, the
 * caller frees) and *version (GIFT_CKPT_VERSION_MIN..GIFT_CKPT_VERSION) when it
 * exists and is intact, 0 when there is none, or GIFT_EIO (unreadable,
 * truncated, bad magic, unknown version or checksum) with a sentence in err. */
int gift_ckpt_read(const char *dir, uint8_t **body, size_t *len, uint32_t *version, char *err,
                   size_t errlen);

/* Creates dir (one level) when missing. Returns 0 or GIFT_EIO. */
int gift_ckpt_mkdir(const char *dir, char *err, size_t errlen);

/* Reads the first n bytes of DIR/checkpoint's body without verifying the
 * rest (gift_ckpt_read does): 1 when the file exists with a valid head and
 * at least n bytes of body, 0 when there is none, GIFT_EIO otherwise. */
int gift_ckpt_peek(const char *dir, void *out, size_t n, char *err, size_t errlen);

#define GIFT_CKPT_LOCK_NAME "giftd.lock"
/* Takes an exclusive flock (LOCK_EX|LOCK_NB) on DIR/giftd.lock (created
 * 0600) and writes this process's PID into it; *fd stays open (the lock is
 * held) until the process exits, the kernel releasing it even on SIGKILL.
 * Returns 0, GIFT_EBUSY when another process holds it (err names DIR and
 * the PID written in the file), or GIFT_EIO. */
int gift_ckpt_lock(const char *dir, int *fd, char *err, size_t errlen);

/* Checks that every entry of DIR is one giftd accounts for, given the
 * checkpoint found (have, of generation gen; without one, generation 0):
 * "checkpoint", "checkpoint.tmp", log-g for g <= gen, the lock file,
 * "lost+found" and discarded-* folders. A step log of a generation above
 * gen (with no checkpoint: above 0, a log whose checkpoint is missing) or
 * any other file refuses: GIFT_ECONFIG with one sentence in err naming the
 * files and the choices. Changes nothing. Returns 0 or a negative code. */
int gift_ckpt_audit(const char *dir, int have, uint64_t gen, char *err, size_t errlen);

/* The step log of one generation. */
typedef struct gift_log {
    int fd;
    uint64_t gen;
    uint64_t bytes; /* appended since opened */
    uint64_t base;  /* the file's size when opened */
    int err_no;     /* errno of the first failed append or sync (0: none) */
    char path[4096];
} gift_log_t;

/* Record types (the shard's). */
enum {
    GIFT_LOG_DECLARE = 1,
    GIFT_LOG_STEP = 2,
    GIFT_LOG_SKETCH = 3,
    GIFT_LOG_EPOCH = 4,
    /* Issue 24: a step with its reply's codec and the policy's observed
     * state, an epoch with its decision and the round's choices. Types 2
     * and 4 are still read (declared treatments). */
    GIFT_LOG_STEP2 = 5,
    GIFT_LOG_EPOCH2 = 6
};

/* Opens DIR/log-GEN for appending, creating it (and truncating it when
 * truncate is set), and fsyncs the folder. Returns 0 or GIFT_EIO. */
int gift_log_open(gift_log_t *l, const char *dir, uint64_t gen, int truncate, char *err,
                  size_t errlen);
void gift_log_close(gift_log_t *l);
#define GIFT_LOG_MAX_PARTS 8
/* Appends one record (head + the n parts + CRC, n <= GIFT_LOG_MAX_PARTS)
 * with one gather write, then fdatasyncs the file when sync is set (else a
 * later gift_log_sync makes it durable, together with the records before
 * it: a group commit). Returns 0 or GIFT_EIO with l->err_no set (a partly
 * written record is cut off again where possible: the caller must stop
 * acknowledging anything that depends on it, and append nothing more). */
int gift_log_append(gift_log_t *l, uint32_t type, const void *const *parts, const size_t *lens,
                    int n, int sync);
/* fdatasyncs the log. Returns 0 or GIFT_EIO (l->err_no set). */
int gift_log_sync(gift_log_t *l);
/* Removes the step logs that the checkpoint of generation gen supersedes
 * (log-<g> with g < gen), after syncing DIR/checkpoint and DIR so that the
 * checkpoint holding their steps is durable first (nothing is removed when
 * that fails). Logs of generation gen or above are never touched. */
void gift_log_remove_superseded(const char *dir, uint64_t gen);

/* Moves the state of dir aside so that a shard started on it holds none
 * (giftd --reset, --discard-state, giftctl reset): every entry except the
 * lock file, "lost+found" and earlier discarded-* folders is renamed into
 * a new DIR/discarded-YYYYMMDDTHHMMSSZ (UTC; -1, -2, ... appended when the
 * name exists), then that folder and dir are fsynced. Nothing is unlinked.
 * Returns the number of entries moved (0: nothing to move, no folder made)
 * with the folder's path in where, or GIFT_EIO with err set (what was moved
 * before the failure stays in the folder). A missing dir is no error. */
int gift_ckpt_discard(const char *dir, char *where, size_t wherelen, char *err, size_t errlen);

/* Calls fn for each intact record of DIR/log-GEN in order. A missing file
 * is an empty log. A torn last record is dropped (the file is truncated to
 * the intact prefix and *torn set); any other damage returns GIFT_EIO with a
 * sentence in err. fn returning < 0 stops the walk and is returned. */
typedef int (*gift_log_record_cb)(uint32_t type, const uint8_t *body, size_t len, void *arg);
int gift_log_replay(const char *dir, uint64_t gen, gift_log_record_cb fn, void *arg, int *torn,
                    char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
