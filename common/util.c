/* util.c: see gift_util.h. */
#include <stdlib.h>

#include "gift_error.h"
#include "gift_util.h"

int gift_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t ncap = *cap ? *cap : 16;
    void *np;
    if (need <= *cap)
        return 0;
    while (ncap < need)
        ncap *= 2;
    if ((np = realloc(*p, ncap * elem)) == NULL)
        return GIFT_ENOMEM;
    *p = np;
    *cap = ncap;
    return 0;
}
