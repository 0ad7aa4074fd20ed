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
    case GIFT_EBADMAGIC:
        return "bad frame magic (expected \"GIF1\")";
    case GIFT_EHDRSIZE:
        return "frame header length is zero or above max_header_bytes";
    case GIFT_EFRAMESIZE:
        return "frame payload length is above max_frame_bytes";
    case GIFT_ETRUNCATED:
        return "stream ended inside a frame";
    case GIFT_EBADHEADER:
        return "frame header is not a valid message";
    case GIFT_ENOKEY:
        return "unknown tensor or chunk";
    case GIFT_ESHAPE:
        return "shape or payload size does not match the declaration";
    case GIFT_ECODEC:
        return "codec does not match the declaration";
    case GIFT_EWORLD:
        return "rank or world size does not match the cluster";
    case GIFT_ESTEP:
        return "step outside the shard's window";
    case GIFT_EEPOCH:
        return "geometry epoch not held by the shard";
    case GIFT_EDIGEST:
        return "tensor list differs from the declared one";
    case GIFT_EPROTO:
        return "message not allowed in this state";
    case GIFT_EBUSY:
        return "limit reached";
    case GIFT_ETIMEDOUT:
        return "timed out";
    case GIFT_EVERSION:
        return "unsupported protocol version";
    case GIFT_EAUTH:
        return "authentication failed";
    case GIFT_ECLOSED:
        return "connection closed";
    case GIFT_ERUNID:
        return "the shard holds another run's state (reset it: giftctl reset)";
    case GIFT_ESTATE:
        return "the shard lost the run's state (restarted without checkpoints, or reset): "
               "restart the run";
    case GIFT_ENODEV:
        return "no such CUDA device (or libgiftclient was built without CUDA)";
    case GIFT_EIO:
        return "system call failed";
    case GIFT_ECONFIG:
        return "invalid configuration";
    default:
        return "unknown error code";
    }
}
