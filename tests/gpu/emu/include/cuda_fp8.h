/* cuda_fp8.h for the emulator: __CUDA_ARCH__ is undefined, so the kernels
 * never reach the hardware conversion this header would declare. */
