/*
 * gift_test_frames.h: the request messages the server tests build. Each
 * helper fills a message the caller declared with its *_INIT value and points
 * the envelope at it; the caller chooses seq and how the frame travels (a
 * socket in test_integration.c, gift_shard_handle in test_shard.c).
 */
#ifndef GIFT_TEST_FRAMES_H
#define GIFT_TEST_FRAMES_H

#include <stdint.h>

#include "gift_proto.h"

static inline void gift_test_fill_push(Gift__Envelope *env, Gift__Push *m, Gift__Codec *codec,
                                       uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                                       Gift__Format fmt, uint32_t block, uint64_t seq)
{
    codec->format = fmt;
    codec->block = block;
    m->key = key;
    m->chunk = chunk;
    m->step = step;
    m->epoch = epoch;
    m->codec = codec;
    m->seq = seq;
    env->msg_case = GIFT__ENVELOPE__MSG_PUSH;
    env->push = m;
}

static inline void gift_test_fill_pull(Gift__Envelope *env, Gift__Pull *m, uint32_t key,
                                       uint32_t chunk, uint64_t step, uint32_t have_epoch,
                                       uint64_t seq)
{
    m->key = key;
    m->chunk = chunk;
    m->step = step;
    m->have_epoch = have_epoch;
    m->seq = seq;
    env->msg_case = GIFT__ENVELOPE__MSG_PULL;
    env->pull = m;
}

static inline void gift_test_fill_sketch(Gift__Envelope *env, Gift__Sketch *m, uint32_t key,
                                         uint64_t step, uint32_t epoch, double trace, uint32_t din,
                                         uint32_t ks, uint64_t seq)
{
    m->key = key;
    m->step = step;
    m->epoch = epoch;
    m->trace = trace;
    m->din = din;
    m->basis_cols = ks;
    m->seq = seq;
    env->msg_case = GIFT__ENVELOPE__MSG_SKETCH;
    env->sketch = m;
}

#endif
