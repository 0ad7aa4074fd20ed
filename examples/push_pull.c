/*
 * push_pull.c: the smallest complete libgiftclient program.
 *
 * Opens a client from the environment, declares two tensors (a weight
 * matrix sent as FP8 E4M3 in the GIFT geometry, and its bias in FP32), then
 * for a few steps pushes a gradient of each and pulls back the mean over
 * all workers. Every worker pushes the same made-up gradients here, so the
 * mean should equal them up to the encoding: each step prints how far off
 * it is (the largest difference, against the largest gradient value).
 *
 * One shard, one worker:
 *   giftd --port 7070 --world-size 1 &
 *   GIFT_SERVERS=127.0.0.1:7070 RANK=0 WORLD_SIZE=1 ./push_pull
 *
 * Build against an installed libgiftclient:
 *   cc push_pull.c $(pkg-config --cflags --libs giftclient) -o push_pull
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <gift/client.h>

enum {
    ROWS = 256,    /* the weight is ROWS x COLS */
    COLS = 512,    /* (its layer's inputs have COLS features) */
    BIAS = 256,    /* the bias is 1 x BIAS */
    INPUTS = 1024, /* layer inputs (rows of X) per sketch: more than COLS */
    REFRESH = 50,  /* the weight's geometry is refreshed every REFRESH steps */
    STEPS = 5
};

/* Fills x with n made-up values in [-scale, scale), the same for a given seed. */
static void fill(float *x, size_t n, uint64_t seed, float scale)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15u + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17; /* xorshift64 */
        x[i] = scale * (float)((double)(s >> 11) / 4503599627370496.0 - 1.0);
    }
}

/* The larger of m and |v|. */
static float max_abs(float m, float v)
{
    v = v < 0 ? -v : v;
    return v > m ? v : m;
}

int main(void)
{
    gift_client_opts_t opts = GIFT_CLIENT_OPTS_INIT; /* all from the environment */
    gift_tensor_desc_t t[2] = {GIFT_TENSOR_INIT, GIFT_TENSOR_INIT};
    gift_client_t *c = NULL;
    float *w = malloc(sizeof(float) * ROWS * COLS), *w_mean = malloc(sizeof(float) * ROWS * COLS);
    float *b = malloc(sizeof(float) * BIAS), *b_mean = malloc(sizeof(float) * BIAS);
    float *x = malloc(sizeof(float) * INPUTS * COLS);
    int rc = GIFT_ENOMEM;

    printf("push_pull: libgiftclient %s\n", gift_version());
    if (!w || !w_mean || !b || !b_mean || !x) {
        fprintf(stderr, "push_pull: out of memory\n");
        goto out;
    }

    /* Servers, rank and world size come from GIFT_SERVERS, RANK, WORLD_SIZE. */
    if ((rc = gift_client_open(&opts, &c)) < 0) {
        char why[512];
        gift_client_last_error(NULL, why, sizeof why);
        fprintf(stderr, "push_pull: cannot open the client: %s%s%s\n", gift_strerror(rc),
                why[0] ? ": " : "", why);
        /* The variables are the likely cause only when no shard was reached
         * or they are missing; a shard's refusal says its own fix. */
        if (rc == GIFT_EINVAL || rc == GIFT_ETIMEDOUT)
            fprintf(stderr, "  set GIFT_SERVERS=host:port[,host:port...], RANK and WORLD_SIZE,\n"
                            "  e.g. GIFT_SERVERS=127.0.0.1:7070 RANK=0 WORLD_SIZE=1\n");
        goto out;
    }

    /* The same list, in the same order, on every worker; tensor i gets id i. */
    t[0].name = "layer0.weight";
    t[0].rows = ROWS;
    t[0].cols = COLS;
    t[0].push_codec = t[0].pull_codec = GIFT_CODEC_FP8_E4M3;
    t[0].geometry = 1;
    t[0].refresh = REFRESH;
    t[0].error_feedback = 1;
    t[1].name = "layer0.bias";
    t[1].rows = 1;
    t[1].cols = BIAS;
    t[1].push_codec = t[1].pull_codec = GIFT_CODEC_F32;
    if ((rc = gift_declare(c, t, 2)) < 0) {
        fprintf(stderr, "push_pull: gift_declare: %s\n", gift_strerror(rc));
        goto out;
    }

    for (uint64_t step = 0; step < STEPS; step++) {
        gift_op_t *op_w = NULL, *op_b = NULL;
        float w_err = 0, w_max = 0, b_err = 0;

        fill(w, (size_t)ROWS * COLS, 2 * step, 1e-2f);
        fill(b, BIAS, 2 * step + 1, 1e-3f);
        /* On a refresh step, a geometry tensor takes a sketch of its layer's
         * inputs before the push: X is INPUTS x COLS, one input per row, e.g.
         * the batch's activations. The geometry (used from the next step on)
         * is only as good as X: a few inputs for many columns make GIFT
         * spend its bits on directions those inputs never reach. */
        if (step % REFRESH == 0) {
            fill(x, (size_t)INPUTS * COLS, 1000 + step, 1.0f);
            if ((rc = gift_sketch_inputs(c, 0, step, x, INPUTS)) < 0) {
                fprintf(stderr, "push_pull: gift_sketch_inputs: %s\n", gift_strerror(rc));
                goto out;
            }
        }

        /* Start both exchanges, then wait for both. The buffers stay ours
         * and must stay untouched until each operation completes. */
        rc = gift_push_pull(c, 0, step, w, w_mean, NULL, NULL, &op_w);
        if (rc == 0)
            rc = gift_push_pull(c, 1, step, b, b_mean, NULL, NULL, &op_b);
        if (rc == 0)
            rc = gift_op_wait(op_w);
        if (rc == 0)
            rc = gift_op_wait(op_b);
        if (op_w)
            gift_op_free(op_w);
        if (op_b)
            gift_op_free(op_b);
        if (rc < 0) {
            fprintf(stderr, "push_pull: step %" PRIu64 ": %s\n", step, gift_strerror(rc));
            goto out;
        }

        for (size_t i = 0; i < (size_t)ROWS * COLS; i++) {
            w_err = max_abs(w_err, w_mean[i] - w[i]);
            w_max = max_abs(w_max, w[i]);
        }
        for (size_t i = 0; i < BIAS; i++)
            b_err = max_abs(b_err, b_mean[i] - b[i]);
        printf("step %" PRIu64 ": weight (fp8-e4m3) error %.2e of %.2e, bias (f32) error %.2e\n",
               step, (double)w_err, (double)w_max, (double)b_err);
    }

out:
    gift_client_close(c);
    free(x);
    free(b_mean);
    free(b);
    free(w_mean);
    free(w);
    return rc < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
