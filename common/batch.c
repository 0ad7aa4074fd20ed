/*
 * batch.c: the outgoing frame batch of gift_batch.h.
 */
#include <stdlib.h>
#include <string.h>

#include "gift_batch.h"
#include "gift_error.h"
#include "gift_util.h"

int gift_batch_reserve(gift_batch_t *b, size_t head_len, const void *payload, size_t len, void *ref,
                       int64_t prio, uint8_t **head)
{
    gift_batch_item_t *it;
    if (gift_grow((void **)&b->heads, &b->heads_cap, b->heads_len + head_len, 1) < 0 ||
        gift_grow((void **)&b->items, &b->items_cap, b->nitems + 1, sizeof *b->items) < 0)
        return GIFT_ENOMEM;
    it = &b->items[b->nitems];
    it->head_off = b->heads_len;
    it->head_len = head_len;
    it->payload = payload;
    it->len = payload ? len : 0;
    it->ref = ref;
    it->prio = prio;
    it->order = b->nitems;
    *head = b->heads + b->heads_len;
    return 0;
}

gift_batch_item_t *gift_batch_commit(gift_batch_t *b, size_t head_len)
{
    gift_batch_item_t *it = &b->items[b->nitems++];
    it->head_len = head_len;
    b->heads_len += head_len;
    b->bytes += head_len + it->len;
    return it;
}

static int item_cmp(const void *a, const void *b)
{
    const gift_batch_item_t *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio > y->prio ? -1 : 1;
    return x->order < y->order ? -1 : (x->order > y->order);
}

void gift_batch_sort(gift_batch_t *b)
{
    qsort(b->items, b->nitems, sizeof *b->items, item_cmp);
}

void gift_batch_release(gift_batch_t *b, void (*release)(void *ref, void *arg), void *arg)
{
    for (size_t i = 0; release != NULL && i < b->nitems; i++)
        if (b->items[i].ref != NULL)
            release(b->items[i].ref, arg);
    b->nitems = 0;
    b->heads_len = 0;
    b->bytes = 0;
}

void gift_batch_free(gift_batch_t *b)
{
    free(b->heads);
    free(b->items);
    memset(b, 0, sizeof *b);
}
