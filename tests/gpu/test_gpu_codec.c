/*
 * test_gpu_codec.c: the CUDA codec against its CPU twin, byte for byte.
 *
 * For every format, awkward lengths, several fp8 block sizes (one that loops
 * inside a CUDA block), round to nearest and stochastic rounding, aligned and
 * misaligned buffers, and two kinds of fresh random input (gradient-like
 * normals with a scale per row, and fill_varied's mix of subnormals, huge
 * values, ties and runs of zeros), the GPU payload must equal gift_encode's
 * in every byte of layout.total, and gift_gpu_decode / gift_gpu_decode_acc
 * must equal gift_decode / gift_decode_acc in every bit. Device outputs are
 * poisoned first. NaN/Inf input and NaN codes must be refused as on the CPU,
 * leaving the accumulator untouched. Exits 77 without a device.
 */
#include "gift_kernels.h"
#include "gpu_test_util.h"

/* Gradient-like input: N(0,1) times a log-normal scale per 97 elements. */
static void fill_grad(float *x, size_t n, uint64_t *s)
{
    double scale = 1.0;
    for (size_t i = 0; i < n; i++) {
        if (i % 97 == 0)
            scale = 1e-3 * exp(2.0 * rng_normal(s));
        x[i] = (float)(scale * rng_normal(s));
    }
}

/* Fresh input of kind 0 (gradient) or 1 (varied), never all zero. */
static void fill_input(float *x, size_t n, int kind, uint64_t *s)
{
    if (kind == 0)
        fill_grad(x, n, s);
    else
        fill_varied(x, n, s);
    x[rng_next(s) % n] = 1.5f; /* at least one nonzero */
}

static size_t first_diff(const void *a, const void *b, size_t n)
{
    const uint8_t *p = a, *q = b;
    for (size_t i = 0; i < n; i++)
        if (p[i] != q[i])
            return i;
    return n;
}

/* One case: encode on both sides, compare payloads, then decode and
 * decode_acc from the CPU payload on both sides and compare outputs.
 * xoff / poff: element and byte offsets that misalign the device buffers. */
static void check_case(gift_format_t fmt, uint32_t block, int stochastic, size_t n, int kind,
                       size_t xoff, size_t poff, uint64_t seed)
{
    gift_codec_params_t p;
    gift_layout_t l;
    uint64_t s = seed;
    float *x, *out_c, *out_g, *acc_c, *acc_g;
    uint8_t *pay_c, *pay_g;
    float *x_d, *out_d;
    uint8_t *pay_d;
    size_t at;
    int rc;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    p.block = block;
    p.stochastic = stochastic;
    p.sr.seed = rng_next(&s), p.sr.rank = (uint32_t)rng_next(&s), p.sr.key = 7;
    p.sr.chunk = (uint32_t)(rng_next(&s) % 5), p.sr.step = rng_next(&s) >> (rng_next(&s) % 64);
    ck_assert_int_eq(gift_layout(&p, n, &l), 0);

    x = host_alloc(n * sizeof(float));
    fill_input(x, n, kind, &s);
    pay_c = host_alloc(l.total);
    pay_g = host_alloc(l.total);
    out_c = host_alloc(n * sizeof(float));
    out_g = host_alloc(n * sizeof(float));
    acc_c = host_alloc(n * sizeof(float));
    acc_g = host_alloc(n * sizeof(float));
    x_d = dev_alloc((n + xoff) * sizeof(float));
    pay_d = dev_alloc(l.total + poff);
    out_d = dev_alloc((n + xoff) * sizeof(float));

    /* Encode. */
    rc = gift_encode(&p, x, n, pay_c, l.total);
    ck_assert_msg(rc == 0, "cpu encode %s n %zu: %s", gift_format_name(fmt), n, gift_strerror(rc));
    h2d(x_d + xoff, x, n * sizeof(float));
    GPU_OK(ctx, gift_gpu_encode(ctx, &p, x_d + xoff, n, pay_d + poff, l.total));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(pay_g, pay_d + poff, l.total);
    at = first_diff(pay_c, pay_g, l.total);
    ck_assert_msg(at == l.total,
                  "encode %s block %u sr %d n %zu kind %d xoff %zu poff %zu: byte %zu of %zu "
                  "(code_off %zu) cpu 0x%02x gpu 0x%02x",
                  gift_format_name(fmt), block, stochastic, n, kind, xoff, poff, at, l.total,
                  l.code_off, pay_c[at], pay_g[at]);

    /* Decode (from the now identical payload on the device). */
    ck_assert_int_eq(gift_decode(&p, pay_c, l.total, n, out_c), 0);
    GPU_OK(ctx, gift_gpu_decode(ctx, &p, pay_d + poff, l.total, n, out_d + xoff));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(out_g, out_d + xoff, n * sizeof(float));
    at = first_diff(out_c, out_g, n * sizeof(float));
    ck_assert_msg(at == n * sizeof(float), "decode %s block %u n %zu: element %zu cpu %a gpu %a",
                  gift_format_name(fmt), block, n, at / 4, out_c[at / 4], out_g[at / 4]);

    /* Decode and accumulate onto a fresh nonzero accumulator. */
    fill_grad(acc_c, n, &s);
    memcpy(acc_g, acc_c, n * sizeof(float));
    h2d(out_d + xoff, acc_g, n * sizeof(float));
    ck_assert_int_eq(gift_decode_acc(&p, pay_c, l.total, n, acc_c), 0);
    GPU_OK(ctx, gift_gpu_decode_acc(ctx, &p, pay_d + poff, l.total, n, out_d + xoff));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(acc_g, out_d + xoff, n * sizeof(float));
    at = first_diff(acc_c, acc_g, n * sizeof(float));
    ck_assert_msg(at == n * sizeof(float),
                  "decode_acc %s block %u n %zu: element %zu cpu %a gpu %a", gift_format_name(fmt),
                  block, n, at / 4, acc_c[at / 4], acc_g[at / 4]);

    CUDA_OK(cudaFree(out_d));
    CUDA_OK(cudaFree(pay_d));
    CUDA_OK(cudaFree(x_d));
    free(acc_g), free(acc_c), free(out_g), free(out_c), free(pay_g), free(pay_c), free(x);
}

static const size_t lengths[] = {1, 3, 5, 17, 31, 33, 127, 129, 1000, 4097, 65537, 300007};
#define NLEN (sizeof lengths / sizeof lengths[0])
static const gift_format_t formats[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_E5M2,
                                        GIFT_FMT_NVFP4};

START_TEST(test_rne_matches_cpu)
{
    gift_format_t fmt = formats[_i];
    for (size_t li = 0; li < NLEN; li++)
        for (int kind = 0; kind < 2; kind++)
            check_case(fmt, 0, 0, lengths[li], kind, 0, 0, 1000 * _i + 10 * li + kind);
}
END_TEST

START_TEST(test_sr_matches_cpu)
{
    gift_format_t fmt = formats[_i];
    for (size_t li = 0; li < NLEN; li++)
        for (int kind = 0; kind < 2; kind++)
            check_case(fmt, 0, 1, lengths[li], kind, 0, 0, 2000 * _i + 10 * li + kind + 5);
}
END_TEST

/* fp8 block sizes: 32 (8 threads a block), 64, 256 and 1024 (a block over
 * several warps), 4096 (loops inside a CUDA block), 65536. */
START_TEST(test_fp8_blocks)
{
    static const uint32_t blocks[] = {32, 64, 256, 1024, 4096, 65536};
    static const size_t ns[] = {7, 1000, 70001, 200000};
    gift_format_t fmt = _i ? GIFT_FMT_E5M2 : GIFT_FMT_E4M3;
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int sr = 0; sr < 2; sr++)
                check_case(fmt, blocks[b], sr, ns[k], (int)(k & 1), 0, 0, 77 * b + 7 * k + sr);
}
END_TEST

/* Misaligned input, payload and output: the scalar (non-VEC) paths. */
START_TEST(test_misaligned)
{
    gift_format_t fmt = formats[_i];
    static const size_t ns[] = {9, 1001, 65539};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        check_case(fmt, 0, 0, ns[k], 1, 1, 3, 3000 + 10 * _i + k);
        check_case(fmt, 0, 1, ns[k], 0, 3, 1, 4000 + 10 * _i + k);
        check_case(fmt, 0, 0, ns[k], 0, 2, 2, 5000 + 10 * _i + k);
    }
}
END_TEST

/* NaN or Inf anywhere: the encode records GIFT_ENONFINITE, returned once by
 * gift_gpu_sync; the next sync is clean and the context still works. */
START_TEST(test_nonfinite_refused)
{
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    gift_format_t fmt = formats[_i];
    gift_codec_params_t p;
    gift_layout_t l;
    uint64_t s = 99 + _i;
    size_t n = 5003;
    float *x = host_alloc(n * sizeof(float)), *x_d = dev_alloc(n * sizeof(float));
    uint8_t *pay, *pay_d;
    int rc;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    ck_assert_int_eq(gift_layout(&p, n, &l), 0);
    pay = host_alloc(l.total);
    pay_d = dev_alloc(l.total);
    for (int b = 0; b < 3; b++)
        for (int sr = 0; sr < 2; sr++) {
            size_t at = rng_next(&s) % n;
            fill_grad(x, n, &s);
            x[at] = bad[b];
            p.stochastic = sr;
            ck_assert_int_eq(gift_encode(&p, x, n, pay, l.total), GIFT_ENONFINITE);
            h2d(x_d, x, n * sizeof(float));
            GPU_OK(ctx, gift_gpu_encode(ctx, &p, x_d, n, pay_d, l.total));
            rc = gift_gpu_sync(ctx);
            ck_assert_msg(rc == GIFT_ENONFINITE, "%s: %g at %zu gave %s", gift_format_name(fmt),
                          (double)bad[b], at, gift_strerror(rc));
            GPU_OK(ctx, gift_gpu_sync(ctx));
        }
    CUDA_OK(cudaFree(pay_d));
    CUDA_OK(cudaFree(x_d));
    free(pay);
    free(x);
}
END_TEST

/* A NaN code or a bad scale: decode_acc records GIFT_EBADCODE like the CPU
 * and leaves the accumulator bit for bit as it was. */
START_TEST(test_bad_payload_refused)
{
    gift_format_t fmt = formats[_i];
    gift_codec_params_t p;
    gift_layout_t l;
    uint64_t s = 555 + _i;
    size_t n = 4099;
    float *x = host_alloc(n * sizeof(float)), *acc = host_alloc(n * sizeof(float));
    float *acc2 = host_alloc(n * sizeof(float)), *acc_d = dev_alloc(n * sizeof(float));
    uint8_t *pay, *pay_d;
    int rc;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    ck_assert_int_eq(gift_layout(&p, n, &l), 0);
    pay = host_alloc(l.total);
    pay_d = dev_alloc(l.total);
    fill_grad(x, n, &s);
    ck_assert_int_eq(gift_encode(&p, x, n, pay, l.total), 0);
    switch (fmt) {
    case GIFT_FMT_F32: {
        float nan = NAN;
        memcpy(pay + l.code_off + 4 * (n / 3), &nan, 4);
        break;
    }
    case GIFT_FMT_BF16:
        pay[l.code_off + 2 * (n / 3) + 1] = 0x7F, pay[l.code_off + 2 * (n / 3)] = 0xC1;
        break;
    case GIFT_FMT_E4M3:
        pay[l.code_off + n / 3] = 0xFF;
        break;
    case GIFT_FMT_E5M2:
        pay[l.code_off + n / 3] = 0x7C; /* +Inf */
        break;
    default: {
        float neg = -1.0f;
        memcpy(pay, &neg, 4); /* a negative tensor scale */
        break;
    }
    }
    ck_assert_int_eq(gift_decode(&p, pay, l.total, n, acc), GIFT_EBADCODE);
    fill_grad(acc, n, &s);
    h2d(acc_d, acc, n * sizeof(float));
    h2d(pay_d, pay, l.total);
    GPU_OK(ctx, gift_gpu_decode_acc(ctx, &p, pay_d, l.total, n, acc_d));
    rc = gift_gpu_sync(ctx);
    ck_assert_msg(rc == GIFT_EBADCODE, "%s: bad payload gave %s", gift_format_name(fmt),
                  gift_strerror(rc));
    d2h(acc2, acc_d, n * sizeof(float));
    ck_assert_msg(memcmp(acc, acc2, n * sizeof(float)) == 0, "%s: accumulator changed",
                  gift_format_name(fmt));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    CUDA_OK(cudaFree(pay_d));
    CUDA_OK(cudaFree(acc_d));
    free(pay), free(acc2), free(acc), free(x);
}
END_TEST

/* Zero-length and all-below-FLT_MIN tensors lay out like the CPU too, and
 * argument errors are the CPU's. */
START_TEST(test_edges_and_arguments)
{
    gift_format_t fmt = formats[_i];
    gift_codec_params_t p;
    gift_layout_t l;
    float tiny[40];
    float *x_d = dev_alloc(sizeof tiny);
    uint8_t pay_c[512], pay_g[512], *pay_d = dev_alloc(512);

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    for (int i = 0; i < 40; i++)
        tiny[i] = (i & 1 ? -1.0f : 1.0f) * 0x1p-140f * (float)(i + 1); /* subnormal */
    ck_assert_int_eq(gift_layout(&p, 40, &l), 0);
    ck_assert_int_eq(gift_encode(&p, tiny, 40, pay_c, sizeof pay_c), 0);
    h2d(x_d, tiny, sizeof tiny);
    GPU_OK(ctx, gift_gpu_encode(ctx, &p, x_d, 40, pay_d, 512));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(pay_g, pay_d, l.total);
    ck_assert_msg(memcmp(pay_c, pay_g, l.total) == 0, "%s: subnormal tensor differs",
                  gift_format_name(fmt));
    ck_assert_int_eq(gift_layout(&p, 0, &l), 0);
    ck_assert_int_eq(gift_encode(&p, tiny, 0, pay_c, sizeof pay_c), 0);
    GPU_OK(ctx, gift_gpu_encode(ctx, &p, x_d, 0, pay_d, 512));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(pay_g, pay_d, l.total);
    ck_assert_msg(memcmp(pay_c, pay_g, l.total) == 0, "%s: empty tensor differs",
                  gift_format_name(fmt));
    ck_assert_int_eq(gift_gpu_encode(ctx, &p, x_d, 40, pay_d, 8), GIFT_ENOSPC);
    ck_assert_int_eq(gift_gpu_decode(ctx, &p, pay_d, 8, 40, x_d), GIFT_ENOSPC);
    ck_assert_int_eq(gift_gpu_encode(NULL, &p, x_d, 40, pay_d, 512), GIFT_EINVAL);
    p.fmt = GIFT_FMT_COUNT_;
    ck_assert_int_eq(gift_gpu_encode(ctx, &p, x_d, 40, pay_d, 512), GIFT_EFORMAT);
    GPU_OK(ctx, gift_gpu_sync(ctx));
    CUDA_OK(cudaFree(pay_d));
    CUDA_OK(cudaFree(x_d));
}
END_TEST

/* Error feedback: p += e and e = p - decoded, bit for bit. */
START_TEST(test_ef_matches_cpu)
{
    static const size_t ns[] = {1, 13, 1027, 100003};
    size_t n = ns[_i];
    uint64_t s = 31 + _i;
    gift_ef_t ef;
    float *p = host_alloc(n * 4), *dec = host_alloc(n * 4), *got = host_alloc(n * 4);
    float *p_d = dev_alloc(n * 4), *e_d = dev_alloc(n * 4), *dec_d = dev_alloc(n * 4);

    ck_assert_int_eq(gift_ef_init(&ef, 1, (int)n), 0);
    fill_grad(ef.e, n, &s);
    fill_varied(p, n, &s);
    fill_grad(dec, n, &s);
    h2d(e_d, ef.e, n * 4);
    h2d(p_d, p, n * 4);
    h2d(dec_d, dec, n * 4);
    gift_ef_add(&ef, p);
    GPU_OK(ctx, gift_gpu_ef_add(ctx, e_d, n, p_d));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(got, p_d, n * 4);
    ck_assert_msg(memcmp(got, p, n * 4) == 0, "ef_add n %zu differs at %zu", n,
                  first_diff(got, p, n * 4) / 4);
    gift_ef_update(&ef, p, dec);
    GPU_OK(ctx, gift_gpu_ef_update(ctx, p_d, dec_d, n, e_d));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(got, e_d, n * 4);
    ck_assert_msg(memcmp(got, ef.e, n * 4) == 0, "ef_update n %zu differs at %zu", n,
                  first_diff(got, ef.e, n * 4) / 4);
    gift_ef_free(&ef);
    CUDA_OK(cudaFree(dec_d));
    CUDA_OK(cudaFree(e_d));
    CUDA_OK(cudaFree(p_d));
    free(got), free(dec), free(p);
}
END_TEST

/* The two siblings of the backend table give the same bytes: the same code
 * path a caller takes when it picks the table by the buffer's memory kind. */
START_TEST(test_backend_table)
{
    const gift__backend_t *cpu = gift__backend_cpu(), *gpu = &gift__backend_cuda;
    gift_codec_params_t p;
    gift_layout_t l;
    uint64_t s = 4242 + _i;
    size_t n = 10007;
    float *x = host_alloc(n * 4), *x_d = dev_alloc(n * 4);
    uint8_t *pay_c, *pay_g, *pay_d;

    memset(&p, 0, sizeof p);
    p.fmt = formats[_i];
    ck_assert_int_eq(gift_layout(&p, n, &l), 0);
    pay_c = host_alloc(l.total), pay_g = host_alloc(l.total), pay_d = dev_alloc(l.total);
    fill_input(x, n, 0, &s);
    h2d(x_d, x, n * 4);
    ck_assert_str_eq(cpu->name, "cpu");
    ck_assert_str_eq(gpu->name, "cuda");
    ck_assert_int_eq(cpu->encode(NULL, &p, x, n, pay_c, l.total), 0);
    ck_assert_int_eq(cpu->sync(NULL), 0);
    GPU_OK(ctx, gpu->encode(ctx, &p, x_d, n, pay_d, l.total));
    GPU_OK(ctx, gpu->sync(ctx));
    d2h(pay_g, pay_d, l.total);
    ck_assert_msg(memcmp(pay_c, pay_g, l.total) == 0, "%s: tables differ at byte %zu",
                  gift_format_name(p.fmt), first_diff(pay_c, pay_g, l.total));
    CUDA_OK(cudaFree(pay_d));
    CUDA_OK(cudaFree(x_d));
    free(pay_g), free(pay_c), free(x);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("gpu_codec");
    TCase *tc = gpu_tcase(s, "codec", 600);

    tcase_add_loop_test(tc, test_rne_matches_cpu, 0, 5);
    tcase_add_loop_test(tc, test_sr_matches_cpu, 0, 5);
    tcase_add_loop_test(tc, test_fp8_blocks, 0, 2);
    tcase_add_loop_test(tc, test_misaligned, 0, 5);
    tcase_add_loop_test(tc, test_nonfinite_refused, 0, 5);
    tcase_add_loop_test(tc, test_bad_payload_refused, 0, 5);
    tcase_add_loop_test(tc, test_edges_and_arguments, 0, 5);
    tcase_add_loop_test(tc, test_ef_matches_cpu, 0, 4);
    tcase_add_loop_test(tc, test_backend_table, 0, 5);
    return s;
}

int main(void)
{
    return gpu_test_main(make_suite);
}
