// What every CUDA kernel here shares: the launch parameters, element types, and the attention mask.
//
// Conventions (docs/design.md): q [b, sq, h, d], k and v [b, sk, hk, d] with hk dividing h; the last dimension
// is contiguous and every other stride is given in elements. lse, rowmax and log2l are float32
// [b, h, sq], contiguous. Causal is bottom-right aligned: query i sees key j iff j <= i + sk - sq.
//
// The forward stores, per query row, m = max_j s_ij over the keys it sees (raw scores, before the softmax
// scale) and log2l = log2(sum_j exp2((s_ij - m) * c)), c = scale * log2(e). The backward recomputes
//   P_ij = exp2(min((s_ij - m_i) * c, 0) - log2l_i)
// rather than exp(s_ij * scale - lse_i): at logits near 1e6 the fp32 lse has lost the digits that
// exp(s - lse) needs (its ulp is 0.06), while s - m is exact to the ulp of s. A row that sees no key
// stores log2l = +inf, so its P is 0 whatever m is.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace fa {

struct Params {
    const void *q, *k, *v;
    void *out;
    float *lse, *rowmax, *log2l;
    // backward only
    const void *dout;
    float *delta;
    void *dq, *dk, *dv;
    int64_t q_b, q_s, q_h;  // strides in elements; the head dim is contiguous
    int64_t k_b, k_s, k_h;
    int64_t v_b, v_s, v_h;
    int64_t o_b, o_s, o_h;
    int64_t do_b, do_s, do_h;
    int64_t dq_b, dq_s, dq_h;
    int64_t dk_b, dk_s, dk_h;
    int64_t dv_b, dv_s, dv_h;
    int b, h, hk, sq, sk, d;
    float scale;   // softmax scale
    float scale_log2;  // scale * log2(e): exp(x * scale) == exp2(x * scale_log2)
    int causal;
    int aligned;  // d, strides and pointers are multiples of 8 elements / 16 bytes: cp.async applies
};

// Element types: the kernels are templates over T; all arithmetic is fp32.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The batch, query head and key head (GQA: h / group) of a block whose grid y enumerates (batch, head).
struct Head {
    int b, h, hk;
};
__device__ __forceinline__ Head query_head(const Params &p) {
    const int b = blockIdx.y / p.h, h = blockIdx.y % p.h;  // unsigned division, as blockIdx is
    return {b, h, h / (p.h / p.hk)};
}
template <typename T> __device__ __forceinline__ const T *k_head(const Params &p, Head x) {
    return (const T *)p.k + x.b * p.k_b + x.hk * p.k_h;
}
template <typename T> __device__ __forceinline__ const T *v_head(const Params &p, Head x) {
    return (const T *)p.v + x.b * p.v_b + x.hk * p.v_h;
}

// Key j is visible to query i (both in range) under the causal rule.
__device__ __forceinline__ bool visible(const Params &p, int i, int j) {
    return j < p.sk && (!p.causal || j <= i + p.sk - p.sq);
}

// One past the last key any query in [row0, row0 + rows) can see: the causal loop stops there.
__device__ __forceinline__ int key_end(const Params &p, int row0, int rows) {
    if (!p.causal) return p.sk;
    long last = (long)row0 + rows - 1 + p.sk - p.sq;
    return last < 0 ? 0 : (int)min((long)p.sk, last + 1);
}

// First query that can see any key in [col0, ...): the causal backward starts there.
__device__ __forceinline__ int query_begin(const Params &p, int col0) {
    if (!p.causal) return 0;
    int first = col0 - (p.sk - p.sq);
    return first < 0 ? 0 : first;
}

// exp2 on the special-function unit (ex2.approx, relative error about 2^-22): what FlashAttention uses.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// P_ij recomputed in the backward from the forward's row statistics (the top of this file says why not
// from lse); the min keeps a rounding above the row max from giving P > 1. Written min((s - m) c - log2l,
// -log2l), equal to min((s - m) c, 0) - log2l, so that the product and the subtraction are one fma: one
// instruction less per element of the backward's tiles (devtools/sass_loops.py). A row that saw no key
// (log2l = +inf) still gives 0: -inf, or NaN when (s - m) c overflows, which fminf passes over.
__device__ __forceinline__ float recompute_p(float s, float m, float log2l, float c) {
    return fast_exp2(fminf(fmaf(s - m, c, -log2l), -log2l));
}

// The first kernel error in this launch, as a message for the Python side.
inline int launch_status() {
    cudaError_t e = cudaGetLastError();
    return (int)e;
}

constexpr float LN2 = 0.69314718056f;  // ln 2: an lse kept in log2 units back to natural log

}  // namespace fa

#define FA_DTYPE_SWITCH(dtype, T, ...)                                             \
    switch (dtype) {                                                               \
        case 0: { using T = __half; __VA_ARGS__; break; }                          \
        case 1: { using T = __nv_bfloat16; __VA_ARGS__; break; }                   \
        case 2: { using T = float; __VA_ARGS__; break; }                           \
        default: return (int)cudaErrorInvalidValue;                                \
    }

// the 16-bit dtypes alone: the tensor-core (mma) kernels take no fp32
#define FA_HALF_SWITCH(dtype, T, ...)                                              \
    switch (dtype) {                                                               \
        case 0: { using T = __half; __VA_ARGS__; break; }                          \
        case 1: { using T = __nv_bfloat16; __VA_ARGS__; break; }                   \
        default: return (int)cudaErrorInvalidValue;                                \
    }

#define FA_HEADDIM_SWITCH(d, D, ...)                                               \
    if (d <= 32) { constexpr int D = 32; __VA_ARGS__; }                            \
    else if (d <= 64) { constexpr int D = 64; __VA_ARGS__; }                       \
    else if (d <= 128) { constexpr int D = 128; __VA_ARGS__; }                     \
    else if (d <= 256) { constexpr int D = 256; __VA_ARGS__; }                     \
    else return (int)cudaErrorInvalidValue;
