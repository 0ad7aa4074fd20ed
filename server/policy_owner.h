/*
 * policy_owner.h: the geometry owner's per-tensor treatment (issue 24).
 *
 * When the owner builds a tensor's epoch it runs the chooser
 * (codec/gift_policy.h) jointly over the geometry tensors this shard owns,
 * takes this tensor's choice (GIFT or Euclidean, rank k, format) and keeps
 * it in the epoch record (store.h, epoch_rec_t.tr), from where it travels
 * in the Geometry message (gift.proto, fields 12..17). The budget is thus
 * held per shard; every shard holding it holds it for the whole model.
 *
 * A step's codecs come from its pushes (Push.codec, Push.pull_codec): the
 * owner checks them against the decision of the step's epoch, another shard
 * takes them from the step's first push and refuses a later one that
 * differs. Neither is ever larger in bytes than the declared codec, so the
 * buffers sized at declaration hold them.
 *
 * With policy all, no budget and no cap (the default) the chooser never runs, no
 * buffer is allocated and no new field is sent: behaviour and bytes are
 * those of a shard without a policy.
 */
#ifndef GIFT_POLICY_OWNER_H
#define GIFT_POLICY_OWNER_H

#include <stddef.h>
#include <stdint.h>

#include "shard_state.h"
#include "store.h"

/* A wire format as gift_format_t, or GIFT_EFORMAT. */
int gift__pol_format_from_wire(Gift__Format f);
/* Codec params from a wire Codec (NULL means f32). 0 or GIFT_EFORMAT. */
int gift__pol_codec_from_wire(const Gift__Codec *c, gift_codec_params_t *p);

/* Whether o's policy options are usable: a known policy and a finite
 * non-negative budget, cap and threshold. */
int gift__pol_opts_ok(const gift_shard_opts_t *o);

/* Whether s's policy can change a treatment (not all, a budget or a
 * transform cap set). */
int gift__pol_active(const gift_shard_t *s);

/* Bytes the policy's buffers add to the declared store (0 when inactive). */
uint64_t gift__pol_mem_need(const gift_shard_t *s);

/* Allocates, once, the buffers of the owned geometry tensors (the Euclidean
 * mean of chunk 0 and its scratch). 0 or GIFT_ENOMEM. */
int gift__pol_alloc(gift_shard_t *s);

/* Frees what gift__pol_alloc allocated for t. */
void gift__pol_free(tensor_t *t);

/* t's treatment for its newest built epoch (t->geo), from the sketch round
 * of step `round` (UINT64_MAX: epoch 0): the chooser's choice, run over
 * every owned geometry tensor once per round (at its first build; later
 * builds of the round reuse it). tr->set 0: the declared treatment (always
 * when inactive). */
void gift__pol_decide(gift_shard_t *s, tensor_t *t, gift_treat_t *tr, uint64_t round);

/* Gives every owned geometry tensor's epoch 0 its decision (after the
 * store is built, before any push). */
void gift__pol_epoch0(gift_shard_t *s);

/* The decision of t's epoch e (declared when e is no longer held). */
const gift_treat_t *gift__pol_treat_of(const tensor_t *t, uint32_t e);

/* Whether the policy keeps the f32 mean of ch's step: chunk 0 of an owned
 * tensor, on the step before a refresh (or while none is held). The shard
 * then has the mean written into the slot's accumulator, as on the steps
 * that measure boundary hits (aggregate.h). */
int gift__pol_wants_mean(const chunk_t *ch, uint64_t step);

/* Called when chunk ch finished a step from slot sl into r: on the steps of
 * gift__pol_wants_mean, keeps sl's f32 mean, brought to Euclidean
 * coordinates with the T^-1 of the step's epoch, as the chooser's gbar.
 * The f32 mean and not the decoded reply: a reply already coded in a format
 * would predict no error for that format. */
void gift__pol_observe(const chunk_t *ch, const slot_t *sl, const reply_t *r);

/* The codecs push m claims for chunk ch, validated: each the declared one
 * or a known codec no larger in bytes; *push_len the payload size it
 * implies, *pull_len the reply's. GIFT_ECODEC with a sentence in why otherwise. */
int gift__pol_push_codecs(const chunk_t *ch, const Gift__Push *m, gift_codec_params_t *push,
                          gift_codec_params_t *pull, size_t *push_len, size_t *pull_len, char *why,
                          size_t whylen);

/* Whether the codecs of an accepted push of step (epoch) fit the step: the
 * epoch's decision on the owner, the step's first push elsewhere. Fixes
 * the slot's codecs on the step's first push. 0 or GIFT_ECODEC. */
int gift__pol_step_codecs(const chunk_t *ch, slot_t *sl, uint64_t step, uint32_t epoch,
                          const gift_codec_params_t *push, const gift_codec_params_t *pull,
                          size_t push_len, size_t pull_len, char *why, size_t whylen);

/* Fills g's decision fields (and the two codecs they point at) for t's
 * newest epoch; leaves them unset for the declared treatment. */
void gift__pol_geometry_wire(const tensor_t *t, Gift__Geometry *g, Gift__Codec *push,
                             Gift__Codec *pull);

/* Checks a decision read back from disk (checkpoint, step log) for t:
 * k in 1..declared k, each codec a known one that fits the buffers sized
 * for the declared one (the declared one itself on a tensor without
 * geometry), finite figures. A decision with set 0 becomes the declared
 * treatment, its figures kept. 0, or GIFT_EIO with a sentence in why. */
int gift__pol_treat_load(const tensor_t *t, gift_treat_t *tr, char *why, size_t whylen);

/* Checks a reply's codec p and length len read back from disk for chunk
 * ch: a codec gift__pol_push_codecs could have fixed for its pull, and
 * exactly its payload's bytes. 0, or GIFT_EIO with a sentence in why. */
int gift__pol_reply_load(const chunk_t *ch, const gift_codec_params_t *p, size_t len, char *why,
                         size_t whylen);

/* The owned geometry tensors the chooser runs over (s->pol_out's length). */
size_t gift__pol_count(const gift_shard_t *s);

#endif
