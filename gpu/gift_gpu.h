/*
 * gift_gpu.h: plain-C entry points of the CUDA twins (gpu/). The GPU issue
 * fills this with the codec and transform kernels; for now it answers
 * whether a device is usable, so callers and tests can choose a path.
 */
#ifndef GIFT_GPU_H
#define GIFT_GPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices this process can use; 0 when there is no driver or
 * no device (never an error). */
int gift_gpu_device_count(void);

/* Writes the name of device dev into buf (cap bytes). Returns 0 or
 * GIFT_EINVAL when dev does not exist. */
int gift_gpu_device_name(int dev, char *buf, int cap);

#ifdef __cplusplus
}
#endif
#endif
