/*
 * gift_batch.h: one batch of outgoing frames for a socket writer, shared by
 * the libuv glue of giftd (server/net.c) and of libgiftclient
 * (client/net.c). No sockets and no libuv here: the batch collects frames
 * during a loop turn and the writer turns them into one gathered write.
 *
 * A frame is a head (preamble + header) copied into the batch's one head
 * buffer, then a payload that is referenced, not copied: it must stay
 * unchanged until the batch is released, and `ref` is the owner's token for
 * it (a reference count, a counter of writes in flight), handed back to the
 * release callback once per frame. Frames carry a priority and their order
 * of arrival; gift_batch_sort puts higher priorities first, keeping arrival
 * order among equals. Buffers grow to the largest batch seen and are reused.
 */
#ifndef GIFT_BATCH_H
#define GIFT_BATCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct gift_batch_item {
    size_t head_off, head_len; /* bytes in the batch's head buffer */
    const uint8_t *payload;    /* len bytes, or NULL */
    size_t len;
    void *ref;    /* the owner's token for the payload, or NULL */
    int64_t prio; /* larger is written first (gift_batch_sort) */
    size_t order; /* arrival, among the batch's frames */
} gift_batch_item_t;

typedef struct gift_batch {
    uint8_t *heads;
    size_t heads_len, heads_cap;
    gift_batch_item_t *items;
    size_t nitems, items_cap;
    uint64_t bytes; /* heads + payloads queued */
} gift_batch_t;

/* Reserves a frame of head_len head bytes, then len payload bytes at
 * payload (NULL: none), with token ref and priority prio: *head points at
 * where the caller writes the head (valid until the next reserve), and the
 * frame counts once gift_batch_commit says how many head bytes were used
 * (at most head_len). Returns 0, or GIFT_ENOMEM (nothing reserved). */
int gift_batch_reserve(gift_batch_t *b, size_t head_len, const void *payload, size_t len, void *ref,
                       int64_t prio, uint8_t **head);

/* Commits the frame reserved last, its head head_len bytes long. Returns
 * the frame. */
gift_batch_item_t *gift_batch_commit(gift_batch_t *b, size_t head_len);

/* Orders the frames by priority, highest first, stable. */
void gift_batch_sort(gift_batch_t *b);

/* Calls release(ref, arg) for every frame that has a ref, then empties the
 * batch (its buffers are kept). release may be NULL. */
void gift_batch_release(gift_batch_t *b, void (*release)(void *ref, void *arg), void *arg);

/* Frees the batch's buffers (release it first). */
void gift_batch_free(gift_batch_t *b);

#endif
