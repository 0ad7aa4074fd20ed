/*
 * device_stub.c: device.c for a libgiftclient built without CUDA. No device
 * exists: gift_declare refuses GIFT_MEMORY_CUDA tensors (GIFT_ENODEV), so
 * no wire is ever a device wire: every wire takes the host path.
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

static int dev_declare(gift_client_t *c)
{
    (void)c;
    return 0;
}

static void dev_poll(gift_client_t *c)
{
    (void)c;
}

static void dev_close(gift_client_t *c)
{
    (void)c;
}

static void dev_free(gift_client_t *c)
{
    (void)c;
}

static const gift__devices_t DEVICES = {dev_declare, dev_poll, dev_close, dev_free};

const gift__devices_t *gift__devices(void)
{
    return &DEVICES;
}
