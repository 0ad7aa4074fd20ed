/* test_gpu_probe.c: the gpu/ library links and finds a device, or the test
 * is skipped (exit 77) where this machine has none. */
#include <stdio.h>

#include "gift_gpu.h"

int main(void)
{
    char name[256];
    int n = gift_gpu_device_count();
    if (n == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    if (gift_gpu_device_name(0, name, sizeof name) != 0) {
        printf("device 0 exists but has no name\n");
        return 1;
    }
    if (gift_gpu_device_name(n, name, sizeof name) == 0) {
        printf("device %d past the count %d was accepted\n", n, n);
        return 1;
    }
    printf("%d CUDA device(s); device 0: %s\n", n, name);
    return 0;
}
