/* error.c: names for the codes of gift_error.h. */
#include "gift_error.h"

const char *gift_strerror(int code)
{
    switch (code) {
    case GIFT_OK:
        return "success";
    case GIFT_EINVAL:
        return "invalid argument";
    case GIFT_ENONFINITE:
        return "input holds NaN or Inf; nothing was sent";
    case GIFT_ENOMEM:
        return "out of memory";
    case GIFT_ENOSPC:
        return "output buffer too small for the payload layout";
    case GIFT_EBADCODE:
        return "payload holds a NaN/Inf code or a bad scale";
    case GIFT_ELAPACK:
        return "linear algebra failure (singular matrix or no convergence)";
    case GIFT_EFORMAT:
        return "unknown format or unsupported block size";
    default:
        return "unknown error code";
    }
}
