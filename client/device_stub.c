/*
 * device_stub.c: device.c for a libgiftclient built without CUDA. No device
 * exists: gift_declare refuses GIFT_MEMORY_CUDA tensors (GIFT_ENODEV), so
 * no wire is ever a device wire and the other entry points are never
 * reached with one.
 */
#include <stdio.h>

#include "giftclient_internal.h"

int gift__dev_available(int device, const char *name)
{
    fprintf(stderr,
            "giftclient: tensor %s asks for CUDA device %d, but this libgiftclient was "
            "built without CUDA\n",
            name, device);
    return GIFT_ENODEV;
}

int gift__dev_declare(gift_client_t *c)
{
    (void)c;
    return 0;
}

void gift__dev_push(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, const float *src)
{
    (void)src;
    (void)w;
    gift__eng_push_fail(c, ps, GIFT_ENODEV);
}

void gift__dev_pull_reset(gift__wire_t *w, gift__lstate_t *pl)
{
    (void)w;
    (void)pl;
}

void gift__dev_pull_chunk(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl,
                          const gift__chunk_t *ch, const void *payload, size_t len)
{
    (void)c, (void)w, (void)pl, (void)ch, (void)payload, (void)len;
}

int gift__dev_sketch(gift_client_t *c, gift__wire_t *w, const gift__req_t *r, const gift__geo_t *G)
{
    (void)c, (void)w, (void)r, (void)G;
    return GIFT_ENODEV;
}

int gift__dev_copy(gift__wire_t *w, float *dst, const float *src, size_t n)
{
    (void)w, (void)dst, (void)src, (void)n;
    return GIFT_ENODEV;
}

void gift__dev_quiesce(gift_client_t *c, gift__wire_t *w)
{
    (void)c, (void)w;
}

void gift__dev_poll(gift_client_t *c)
{
    (void)c;
}

void gift__dev_close(gift_client_t *c)
{
    (void)c;
}

void gift__dev_free(gift_client_t *c)
{
    (void)c;
}
