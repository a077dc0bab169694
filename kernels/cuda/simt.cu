// Flash attention forward and backward on CUDA cores: the readable, verified stepping stone (`cuda-simt`).
//
// Work split: a block of 128 threads holds 16 rows (queries in the forward and dq, keys in dk/dv); each
// row belongs to a group of G = 8 consecutive lanes, and lane g of the group owns the head-dim columns
// g, g + 8, g + 16, ... A dot product over the head dim is G partial sums joined by three warp shuffles,
// so every lane of the group ends with the full value, and the softmax state is kept, identical, by all 8.
//
// Forward, per query row i, over key tiles j (FlashAttention-2's online softmax):
//   s_ij = q_i . k_j                                  (raw score; masked keys are -inf)
//   m_new = max(m, max_j s_ij)                        (running max, started at -inf or -1e30)
//   alpha = exp2((m - m_new) * c),  c = scale * log2(e)
//   p_ij = exp2((s_ij - m_new) * c)
//   l = alpha * l + sum_j p_ij,   o = alpha * o + sum_j p_ij v_j
//   finally out_i = o / l, lse_i = (m * c + log2 l) / log2(e); a row with l == 0 saw no key: out 0, lse -inf.
// Backward, with D_i = dO_i . O_i (delta.cu) and P_ij recomputed from (m_i, log2l_i) (common.cuh):
//   dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i)
//   dq_i = scale * sum_j dS_ij k_j;  dk_j = scale * sum_i dS_ij q_i;  dv_j = sum_i P_ij dO_i
// dq and dk/dv are separate kernels, each the only writer of its rows, so the result is deterministic;
// dk and dv of a key head sum over the query heads of its group inside one block.
#include "common.cuh"

namespace fa {
namespace simt {

constexpr int THREADS = 128;
constexpr int G = 8;                     // lanes per row
constexpr int ROWS = THREADS / G;        // rows per block
template <int D> __host__ __device__ constexpr int tile() { return D == 256 ? 16 : 32; }  // streamed rows per smem tile: 32 KB

// Sum over the 8 lanes of a row group (groups are aligned to 8 lanes, so xor 4, 2, 1 stays inside).
__device__ __forceinline__ float group_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x;
}

// Copy rows [row0, row0 + N) of a [b, s, h, d] tensor (one batch and head at `base`) into smem as fp32,
// zero outside the sequence and past the head dim so partial tiles need no special case in the maths.
template <typename T, int N, int D>
__device__ __forceinline__ void load_tile(float (*dst)[D], const T *base, int64_t stride_s, int row0, int rows,
                                          int d) {
    for (int idx = threadIdx.x; idx < N * D; idx += THREADS) {
        int r = idx / D, c = idx % D;
        dst[r][c] = (row0 + r < rows && c < d) ? to_float(base[(int64_t)(row0 + r) * stride_s + c]) : 0.f;
    }
}

// One row's columns owned by lane g, as fp32 registers (zero past the head dim or past the last row).
template <typename T, int DT>
__device__ __forceinline__ void load_row(float (&x)[DT], const T *row, bool ok, int g, int d) {
#pragma unroll
    for (int t = 0; t < DT; ++t) {
        int c = g + G * t;
        x[t] = (ok && c < d) ? to_float(row[c]) : 0.f;
    }
}

template <typename T, int DT>
__device__ __forceinline__ void store_row(T *row, const float (&x)[DT], float mul, bool ok, int g, int d) {
    if (!ok) return;
#pragma unroll
    for (int t = 0; t < DT; ++t) {
        int c = g + G * t;
        if (c < d) row[c] = from_float<T>(x[t] * mul);
    }
}

template <int D, int DT>
__device__ __forceinline__ float dot(const float (&x)[DT], const float *smem_row, int g) {
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < DT; ++t) acc += x[t] * smem_row[g + G * t];
    return group_sum(acc);
}

// Where the forward and dQ begin: the query row a thread group works on (the block's first row row0, the
// group's row r, its lane g, the row i, whether it exists), its kv head's K and V, and the log2 scale c
template <typename T> struct QueryRow {
    Head head;
    int row0, r, g, i;
    bool active;
    const T *kb, *vb;
    float c;
};

template <typename T> __device__ __forceinline__ QueryRow<T> query_row(const Params &p) {
    const Head head = query_head(p);
    const int row0 = blockIdx.x * ROWS, r = threadIdx.x / G, i = row0 + r;
    return {head, row0, r, (int)(threadIdx.x % G), i, i < p.sq, k_head<T>(p, head), v_head<T>(p, head),
            p.scale_log2};
}

template <typename T, int D, bool INIT_NEG_INF>
__global__ void __launch_bounds__(THREADS) fwd(Params p) {
    constexpr int BN = tile<D>(), DT = D / G;
    __shared__ float ks[BN][D], vs[BN][D];
    const auto [head, row0, r, g, i, active, kb, vb, c] = query_row<T>(p);
    const auto [b, h, hk] = head;

    float q[DT], o[DT];
    load_row<T, DT>(q, (const T *)p.q + b * p.q_b + (int64_t)i * p.q_s + h * p.q_h, active, g, p.d);
#pragma unroll
    for (int t = 0; t < DT; ++t) o[t] = 0.f;
    float m = INIT_NEG_INF ? -INFINITY : -1e30f, l = 0.f;

    const int end = key_end(p, row0, ROWS);
    for (int n0 = 0; n0 < end; n0 += BN) {
        __syncthreads();  // every row group has finished reading the previous tile before it is overwritten
        load_tile<T, BN, D>(ks, kb, p.k_s, n0, p.sk, p.d);
        load_tile<T, BN, D>(vs, vb, p.v_s, n0, p.sk, p.d);
        __syncthreads();  // the tile is complete before any row group reads it

        float s[BN], tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < BN; ++j) {
            float x = dot<D, DT>(q, ks[j], g);
            s[j] = (active && visible(p, i, n0 + j)) ? x : -INFINITY;
            tile_max = fmaxf(tile_max, s[j]);
        }
        const float m_new = fmaxf(m, tile_max);
        // "-inf" start: a row that has seen no key yet keeps m_new = -inf, and (-inf) - (-inf) would be NaN;
        // subtracting 0 instead gives p = exp2(-inf) = 0 and alpha = 0 for an o and l that are still 0.
        const float m_use = (INIT_NEG_INF && m_new == -INFINITY) ? 0.f : m_new;
        const float alpha = fast_exp2((m - m_use) * c);  // subtract before scaling: exact for huge logits
        l *= alpha;
#pragma unroll
        for (int t = 0; t < DT; ++t) o[t] *= alpha;
#pragma unroll
        for (int j = 0; j < BN; ++j) {
            const float pj = fast_exp2((s[j] - m_use) * c);
            l += pj;
#pragma unroll
            for (int t = 0; t < DT; ++t) o[t] += pj * vs[j][g + G * t];
        }
        m = m_new;
    }

    // l == 0: the row saw no key ("-1e30" start: every p underflowed against m = -1e30; "-inf": none seen).
    const bool empty = !(l > 0.f);
    store_row<T, DT>((T *)p.out + b * p.o_b + (int64_t)i * p.o_s + h * p.o_h, o, empty ? 0.f : 1.f / l, active,
                     g, p.d);
    if (active && g == 0) {
        const int64_t row = ((int64_t)b * p.h + h) * p.sq + i;
        const float log2l = empty ? INFINITY : log2f(l);
        p.rowmax[row] = empty ? 0.f : m;
        p.log2l[row] = log2l;
        p.lse[row] = empty ? -INFINITY : (m * c + log2l) * LN2;
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(THREADS) dq_kernel(Params p) {
    constexpr int BN = tile<D>(), DT = D / G;
    __shared__ float ks[BN][D], vs[BN][D];
    const auto [head, row0, r, g, i, active, kb, vb, c] = query_row<T>(p);
    const auto [b, h, hk] = head;

    float q[DT], dout[DT], dq[DT];
    load_row<T, DT>(q, (const T *)p.q + b * p.q_b + (int64_t)i * p.q_s + h * p.q_h, active, g, p.d);
    load_row<T, DT>(dout, (const T *)p.dout + b * p.do_b + (int64_t)i * p.do_s + h * p.do_h, active, g, p.d);
#pragma unroll
    for (int t = 0; t < DT; ++t) dq[t] = 0.f;
    const int64_t row = ((int64_t)b * p.h + h) * p.sq + i;
    const float m = active ? p.rowmax[row] : 0.f, log2l = active ? p.log2l[row] : INFINITY;
    const float delta = active ? p.delta[row] : 0.f;

    const int end = key_end(p, row0, ROWS);
    for (int n0 = 0; n0 < end; n0 += BN) {
        __syncthreads();  // the previous tile is no longer read
        load_tile<T, BN, D>(ks, kb, p.k_s, n0, p.sk, p.d);
        load_tile<T, BN, D>(vs, vb, p.v_s, n0, p.sk, p.d);
        __syncthreads();  // the tile is complete
#pragma unroll 4
        for (int j = 0; j < BN; ++j) {
            const float s = dot<D, DT>(q, ks[j], g), dp = dot<D, DT>(dout, vs[j], g);
            const float pij = (active && visible(p, i, n0 + j)) ? recompute_p(s, m, log2l, c) : 0.f;
            const float ds = pij * (dp - delta);
#pragma unroll
            for (int t = 0; t < DT; ++t) dq[t] += ds * ks[j][g + G * t];
        }
    }
    store_row<T, DT>((T *)p.dq + b * p.dq_b + (int64_t)i * p.dq_s + h * p.dq_h, dq, p.scale, active, g, p.d);
}

template <typename T, int D>
__global__ void __launch_bounds__(THREADS) dkdv_kernel(Params p) {
    constexpr int BM = tile<D>(), DT = D / G;
    __shared__ float qs[BM][D], dos[BM][D];
    __shared__ float ms[BM], ls[BM], deltas[BM];
    const int b = blockIdx.y / p.hk, hk = blockIdx.y % p.hk, group = p.h / p.hk;
    const int col0 = blockIdx.x * ROWS, r = threadIdx.x / G, g = threadIdx.x % G, j = col0 + r;
    const bool active = j < p.sk;
    const float c = p.scale_log2;

    float k[DT], v[DT], dk[DT], dv[DT];
    load_row<T, DT>(k, (const T *)p.k + b * p.k_b + (int64_t)j * p.k_s + hk * p.k_h, active, g, p.d);
    load_row<T, DT>(v, (const T *)p.v + b * p.v_b + (int64_t)j * p.v_s + hk * p.v_h, active, g, p.d);
#pragma unroll
    for (int t = 0; t < DT; ++t) dk[t] = dv[t] = 0.f;

    const int begin = query_begin(p, col0);
    for (int h = hk * group; h < (hk + 1) * group; ++h) {  // GQA: this key head's query heads, summed here
        const T *qb = (const T *)p.q + b * p.q_b + h * p.q_h, *dob = (const T *)p.dout + b * p.do_b + h * p.do_h;
        const int64_t stats = ((int64_t)b * p.h + h) * p.sq;
        for (int m0 = begin; m0 < p.sq; m0 += BM) {
            __syncthreads();  // the previous query tile is no longer read
            load_tile<T, BM, D>(qs, qb, p.q_s, m0, p.sq, p.d);
            load_tile<T, BM, D>(dos, dob, p.do_s, m0, p.sq, p.d);
            for (int x = threadIdx.x; x < BM; x += THREADS) {
                const bool in = m0 + x < p.sq;
                ms[x] = in ? p.rowmax[stats + m0 + x] : 0.f;
                ls[x] = in ? p.log2l[stats + m0 + x] : INFINITY;
                deltas[x] = in ? p.delta[stats + m0 + x] : 0.f;
            }
            __syncthreads();  // the query tile and its row statistics are complete
#pragma unroll 4
            for (int x = 0; x < BM; ++x) {
                const int i = m0 + x;
                const float s = dot<D, DT>(k, qs[x], g), dp = dot<D, DT>(v, dos[x], g);
                const float pij = (active && i < p.sq && visible(p, i, j)) ? recompute_p(s, ms[x], ls[x], c) : 0.f;
                const float ds = pij * (dp - deltas[x]);
#pragma unroll
                for (int t = 0; t < DT; ++t) {
                    dv[t] += pij * dos[x][g + G * t];
                    dk[t] += ds * qs[x][g + G * t];
                }
            }
        }
    }
    store_row<T, DT>((T *)p.dk + b * p.dk_b + (int64_t)j * p.dk_s + hk * p.dk_h, dk, p.scale, active, g, p.d);
    store_row<T, DT>((T *)p.dv + b * p.dv_b + (int64_t)j * p.dv_s + hk * p.dv_h, dv, 1.f, active, g, p.d);
}

}  // namespace simt
}  // namespace fa

using namespace fa;

extern "C" int fa_simt_fwd(const Params *p, int dtype, int init_neg_inf, cudaStream_t stream) {
    dim3 grid((p->sq + simt::ROWS - 1) / simt::ROWS, p->b * p->h);
    FA_DTYPE_SWITCH(dtype, T, FA_HEADDIM_SWITCH(p->d, D, {
        if (init_neg_inf) simt::fwd<T, D, true><<<grid, simt::THREADS, 0, stream>>>(*p);
        else simt::fwd<T, D, false><<<grid, simt::THREADS, 0, stream>>>(*p);
    }))
    return launch_status();
}

extern "C" int fa_simt_bwd(const Params *p, int dtype, cudaStream_t stream) {
    dim3 grid_q((p->sq + simt::ROWS - 1) / simt::ROWS, p->b * p->h);
    dim3 grid_k((p->sk + simt::ROWS - 1) / simt::ROWS, p->b * p->hk);
    FA_DTYPE_SWITCH(dtype, T, FA_HEADDIM_SWITCH(p->d, D, {
        simt::dq_kernel<T, D><<<grid_q, simt::THREADS, 0, stream>>>(*p);
        simt::dkdv_kernel<T, D><<<grid_k, simt::THREADS, 0, stream>>>(*p);
    }))
    return launch_status();
}
