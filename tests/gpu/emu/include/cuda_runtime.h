/* cuda_runtime.h for the emulator (tests/gpu/emu): the kernels of gpu/
 * include this; the emulator stands in for the CUDA device side. */
#include "gift_emu.h"
