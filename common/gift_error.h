/*
 * gift_error.h: the error codes shared by every giftd library.
 *
 * Every function that can fail returns 0 or one of these negative codes;
 * gift_strerror() names each of them. Codes are stable: they travel on the
 * wire in Error frames, so a value is never reused for another meaning.
 */
#ifndef GIFT_ERROR_H
#define GIFT_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

enum gift_error {
    GIFT_OK = 0,
    GIFT_EINVAL = -1,     /* an argument is out of range or inconsistent */
    GIFT_ENONFINITE = -2, /* the input holds NaN or Inf: nothing was encoded */
    GIFT_ENOMEM = -3,     /* an allocation failed */
    GIFT_ENOSPC = -4,     /* the output buffer is smaller than the layout needs */
    GIFT_EBADCODE = -5,   /* a payload holds a NaN/Inf code or a bad scale */
    GIFT_ELAPACK = -6,    /* BLAS/LAPACK reported a failure (singular, no convergence) */
    GIFT_EFORMAT = -7,    /* unknown format or unsupported block size */
    /* Framing (proto/). */
    GIFT_EBADMAGIC = -8,   /* a frame did not start with "GIF1" */
    GIFT_EHDRSIZE = -9,    /* header_len is zero or above max_header_bytes */
    GIFT_EFRAMESIZE = -10, /* payload_len is above max_frame_bytes */
    GIFT_ETRUNCATED = -11, /* the stream ended inside a frame */
    GIFT_EBADHEADER = -12, /* the header is not a valid Envelope with one message */
    /* Requests (server/). */
    GIFT_ENOKEY = -13,    /* unknown tensor or chunk */
    GIFT_ESHAPE = -14,    /* shape or payload size does not match the declaration */
    GIFT_ECODEC = -15,    /* codec does not match the declaration */
    GIFT_EWORLD = -16,    /* rank or world size does not match the cluster */
    GIFT_ESTEP = -17,     /* step outside the shard's window */
    GIFT_EEPOCH = -18,    /* geometry epoch the shard does not hold */
    GIFT_EDIGEST = -19,   /* tensor list differs from the one declared */
    GIFT_EPROTO = -20,    /* message not allowed here (e.g. push before Hello) */
    GIFT_EBUSY = -21,     /* a limit was reached (connections, parked requests) */
    GIFT_ETIMEDOUT = -22, /* an operation did not complete in time */
    GIFT_EVERSION = -23,  /* unsupported protocol version */
    GIFT_EAUTH = -24,     /* authentication failed */
    GIFT_ECLOSED = -25,   /* the connection or server is closing */
    GIFT_EIO = -26,       /* a system call failed (see the log) */
    GIFT_ECONFIG = -27,   /* invalid configuration */
    GIFT_ENODEV = -28,    /* no such CUDA device, or the library was built without CUDA */
    GIFT_ERUNID = -29,    /* the shard holds another run's state (GIFT_RUN_ID) */
    GIFT_ESTATE = -30,    /* the shard lost state the worker saw (restarted without checkpoints) */
    GIFT_ERR_MIN_ = -31   /* one past the last code; later modules extend below it */
};

/* Returns a static, human-readable sentence for an error code (never NULL). */
const char *gift_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif
