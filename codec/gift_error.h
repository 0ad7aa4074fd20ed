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
    GIFT_ERR_MIN_ = -8    /* one past the last code; later modules extend below it */
};

/* Returns a static, human-readable sentence for an error code (never NULL). */
const char *gift_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif
