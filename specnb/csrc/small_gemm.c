/* y[M, N] = x[M, K] @ w[N, K]^T in float32 for few rows M: the weight is streamed from memory once.
 *
 * Decoding calls a linear layer on 1..64 rows. BLAS libraries are tuned for large M: for small M they
 * repack the weight on every call or fall back to a gemv per row, so on AVX2 CPUs two rows cost ~1.7x
 * one row although both are bound by reading the weight. Here each thread takes a slice of weight rows,
 * loads four rows at a time and multiplies them with every input row while they sit in L1/L2.
 *
 * Every output element is computed by the same sequence of instructions whatever M is and wherever its
 * row falls in a block (eight-lane FMA accumulation over K in order, one fixed horizontal sum, a scalar
 * tail), so a row's result does not depend on how many other rows share the call: verifying a draft
 * gives bit-identical logits to decoding the same tokens one by one.
 */
#include <immintrin.h>
#include <omp.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One output element's tail over k in [k8, K): plain scalar FMA in order, shared by every path. */
static inline float tail(const float *x, const float *w, int k8, int K, float acc) {
    for (int k = k8; k < K; k++) acc = __builtin_fmaf(x[k], w[k], acc);
    return acc;
}

/* MB input rows (1..4) times NB weight rows (1 or 4), written into y with row stride N. */
#define BLOCK(MB, NB)                                                                          \
    static void block_##MB##x##NB(const float *x, const float *w, float *y, int N, int K) {    \
        __m256 acc[MB][NB];                                                                    \
        for (int m = 0; m < MB; m++)                                                           \
            for (int j = 0; j < NB; j++) acc[m][j] = _mm256_setzero_ps();                      \
        int k8 = K & ~7;                                                                       \
        for (int k = 0; k < k8; k += 8) {                                                      \
            __m256 wv[NB];                                                                     \
            for (int j = 0; j < NB; j++) wv[j] = _mm256_loadu_ps(w + (long)j * K + k);        \
            for (int m = 0; m < MB; m++) {                                                     \
                __m256 xv = _mm256_loadu_ps(x + (long)m * K + k);                              \
                for (int j = 0; j < NB; j++) acc[m][j] = _mm256_fmadd_ps(xv, wv[j], acc[m][j]); \
            }                                                                                  \
        }                                                                                      \
        for (int m = 0; m < MB; m++)                                                           \
            for (int j = 0; j < NB; j++)                                                       \
                y[(long)m * N + j] = tail(x + (long)m * K, w + (long)j * K, k8, K, hsum(acc[m][j])); \
    }

BLOCK(1, 1) BLOCK(2, 1) BLOCK(3, 1) BLOCK(4, 1)
BLOCK(1, 4) BLOCK(2, 4) BLOCK(3, 4) BLOCK(4, 4)

typedef void (*block_fn)(const float *, const float *, float *, int, int);
static const block_fn BLOCKS[2][5] = {
    {0, block_1x1, block_2x1, block_3x1, block_4x1},
    {0, block_1x4, block_2x4, block_3x4, block_4x4},
};

void small_gemm(const float *x, const float *w, float *y, int M, int N, int K, int threads) {
    int n4 = N / 4;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int b = 0; b < n4 + (N - 4 * n4); b++) {
        int n = b < n4 ? 4 * b : 4 * n4 + (b - n4);
        int nb = b < n4 ? 1 : 0;
        for (int m = 0; m < M; m += 4) {
            int mb = M - m < 4 ? M - m : 4;
            BLOCKS[nb][mb](x + (long)m * K, w + (long)n * K, y + (long)m * N + n, N, K);
        }
    }
}
