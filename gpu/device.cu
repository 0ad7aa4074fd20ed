/* device.cu: device discovery for the CUDA twins. */
#include <cuda_runtime.h>
#include <string.h>

#include "gift_error.h"
#include "gift_gpu.h"

extern "C" int gift_gpu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

extern "C" int gift_gpu_device_name(int dev, char *buf, int cap)
{
    cudaDeviceProp prop;
    if (buf == NULL || cap <= 0 || dev < 0 || dev >= gift_gpu_device_count())
        return GIFT_EINVAL;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return GIFT_EINVAL;
    strncpy(buf, prop.name, (size_t)cap - 1);
    buf[cap - 1] = '\0';
    return 0;
}
