// Flash attention backward on tensor cores (`cuda`), by recomputation, as two deterministic kernels.
//
// With D_i = dO_i . O_i (delta.cu) and P recomputed from the forward's row statistics (common.cuh):
//   S = Q K^T,  P = exp2(min((S - m) c, 0) - log2 l),  dP = dO V^T,  dS = P (dP - D)
//   dQ = scale dS K        (dq kernel: a block owns 64 query rows and streams every key tile past them)
//   dK = scale dS^T Q,  dV = P^T dO
//                          (dkdv kernel: a block owns 64 keys of one key head and streams the query tiles of
//                           every query head of its GQA group past them, so the group sum stays in the block)
// Each output row has exactly one writer and a fixed order of summation: the same input gives the same
// bits every run, with no atomics. The dkdv kernel works on the transposes S^T = K Q^T, dP^T = V dO^T, so
// both of its products keep keys as the rows a warp owns, like the queries of the forward. P and dS are
// rounded to the input dtype as operands of the next mma (as FlashAttention-2 does); sums are fp32.
// A dq warp owns MT stacked 16-row tiles (mma.cuh says why); a dkdv warp owns 16 keys (below). At head dim
// 256 the dK and dV accumulators (128 fp32 each per lane) do not both fit in registers: the dkdv kernel
// then runs twice, once for dV and once for dK (template flags), recomputing S^T.
#include "mma.cuh"

namespace fa {
namespace mma_bwd {

using namespace mma;  // dq takes the query-row tiles of mma.cuh (m_tiles, block_m, block_n)
// dkdv: one m-tile per warp and one pass below head dim 256. Measured on the H200 at head dim 128 (bench,
// bf16): MT = 2 with split dV and dK passes, BN = 32, gave 0.35-0.39x sdpa-flash for the whole backward;
// MT = 1, one pass, BN = 64 gave 0.44-0.47x: the split pass's extra product and loop cost more than the
// shared-memory reads it saves.
// FA_DKDV_WARPS, FA_DKDV_BN and FA_DQ_BN128 override the warps per block, the query tile of dkdv and the key
// tile of dq at head dim 128, when tuning (build.py, devtools/cuda_tune.py). Measured at head dim 128, bf16,
// on the H200 (2026-11-30, at 822ba7d, before the loads of mma.cuh lost their address arithmetic): 8 warps
// changed the dkdv kernel's time by -2% to +4%; a query tile of 32, +14%; dq's key tile 48, +50%.
#ifndef FA_DKDV_WARPS
#define FA_DKDV_WARPS 4
#endif
#ifndef FA_DKDV_BN
#define FA_DKDV_BN 64
#endif
#ifndef FA_DQ_BN128
#define FA_DQ_BN128 32
#endif
constexpr int DKDV_THREADS = 32 * FA_DKDV_WARPS;
template <int D> __host__ __device__ constexpr int dq_block_n() { return D == 128 ? FA_DQ_BN128 : block_n<D>(); }
template <int D> __host__ __device__ constexpr int m_tiles_dkdv() { return 1; }
template <int D> __host__ __device__ constexpr int block_m_dkdv() { return 16 * FA_DKDV_WARPS * m_tiles_dkdv<D>(); }
template <int D> __host__ __device__ constexpr int block_n_dkdv() { return D == 256 ? 32 : FA_DKDV_BN; }
template <int D> __host__ __device__ constexpr bool split_dkdv() { return D == 256; }

template <typename T, int D>
__global__ void __launch_bounds__(THREADS) dq_kernel(Params p) {
    constexpr int MT = m_tiles<D>(), BM = block_m<D>(), BN = dq_block_n<D>(), LD = D + PAD;
    extern __shared__ __align__(16) unsigned char smem[];
    T (*qs)[LD] = reinterpret_cast<T (*)[LD]>(smem);
    T (*dos)[LD] = qs + BM;
    T (*ks)[LD] = dos + BM;      // two buffers of BN rows
    T (*vs)[LD] = ks + 2 * BN;   // two buffers of BN rows

    const auto [b, h, hk] = block_head(p);
    const int warp = threadIdx.x / 32, tq = threadIdx.x % 4;
    const int row0 = query_tile(p) * BM;
    const T *kb = k_head<T>(p, {b, h, hk}), *vb = v_head<T>(p, {b, h, hk});
    const float c = p.scale_log2;
    const bool aligned = p.aligned;

    // the rows' statistics wait in shared memory, not registers: at head dim 128 those 12 registers spill
    float (*stats)[BM] = reinterpret_cast<float (*)[BM]>(vs + 2 * BN);  // [m, log2l, D][row]
    for (int x = threadIdx.x; x < BM; x += THREADS) {
        const bool in = row0 + x < p.sq;
        const int64_t row = ((int64_t)b * p.h + h) * p.sq + row0 + x;
        stats[0][x] = in ? p.rowmax[row] : 0.f;
        stats[1][x] = in ? p.log2l[row] : INFINITY;
        stats[2][x] = in ? p.delta[row] : 0.f;
    }

    const int end = key_end(p, row0, BM), tiles = (end + BN - 1) / BN;
    load_tile<T, BM, D, THREADS>(qs, (const T *)p.q + b * p.q_b + h * p.q_h, p.q_s, row0, p.sq, p.d, aligned);
    load_tile<T, BM, D, THREADS>(dos, (const T *)p.dout + b * p.do_b + h * p.do_h, p.do_s, row0, p.sq, p.d, aligned);
    if (tiles > 0) {
        load_tile<T, BN, D, THREADS>(ks, kb, p.k_s, 0, p.sk, p.d, aligned);
        load_tile<T, BN, D, THREADS>(vs, vb, p.v_s, 0, p.sk, p.d, aligned);
    }
    cp_async_commit();

    float dq[MT][D / 8][4];
    zero<MT, D / 8>(dq);
    for (int t = 0; t < tiles; ++t) {
        const int n0 = t * BN, buf = t % 2;
        next_kv<T, BN, D>(ks, vs, p, t, tiles, aligned);
        __syncthreads();  // tile t, Q, dO and the row statistics are visible to every warp

        float s[MT][BN / 8][4], dp[MT][BN / 8][4];
        zero<MT, BN / 8>(s);
        zero<MT, BN / 8>(dp);
        gemm_nt_smem<T, MT, BN, D, LD, LD>(s, qs, warp * 16 * MT, ks + buf * BN, 0);
        gemm_nt_smem<T, MT, BN, D, LD, LD>(dp, dos, warp * 16 * MT, vs + buf * BN, 0);
        each_entry<MT, BN>([&](int mt, int nt, int e) {  // s becomes dS
            const int r = lane_row<MT>(mt, e / 2);
            s[mt][nt][e] = recompute_p(s[mt][nt][e], stats[0][r], stats[1][r], c) * (dp[mt][nt][e] - stats[2][r]);
        });
        if (n0 + BN > p.sk || (p.causal && n0 + BN - 1 > row0 + p.sk - p.sq)) {  // masked after, as in dkdv
            each_entry<MT, BN>([&](int mt, int nt, int e) {
                if (!visible(p, row0 + lane_row<MT>(mt, e / 2), n0 + nt * 8 + 2 * tq + e % 2)) s[mt][nt][e] = 0.f;
            });
        }
        gemm_nn_c<T, MT, D, BN, LD>(dq, s, ks + buf * BN, 0);
        __syncthreads();  // every warp is done with buffer `buf` before it is refilled
    }
    store_rows<T, MT, D>(p, (T *)p.dq + b * p.dq_b + h * p.dq_h, p.dq_s, row0, p.sq, dq, times(p.scale));
}

template <typename T, int D, bool DO_DK, bool DO_DV>
__global__ void __launch_bounds__(DKDV_THREADS, 1) dkdv_kernel(Params p) {  // 1: every register, no occupancy spills
    constexpr int MT = m_tiles_dkdv<D>(), BM = block_m_dkdv<D>(), BN = block_n_dkdv<D>(), LD = D + PAD;
    extern __shared__ __align__(16) unsigned char smem[];  // here BN query rows stream past BM owned keys
    T (*ks)[LD] = reinterpret_cast<T (*)[LD]>(smem);
    T (*vs)[LD] = ks + BM;
    T (*qs)[LD] = vs + BM;       // two buffers of BN rows
    T (*dos)[LD] = qs + 2 * BN;  // two buffers of BN rows
    float (*stats)[3][BN] = reinterpret_cast<float (*)[3][BN]>(dos + 2 * BN);  // [buffer][m, log2l, D][row]

    const int b = blockIdx.z, hk = blockIdx.y, group = p.h / p.hk;  // grid: (key tiles, key heads, batch)
    const int warp = threadIdx.x / 32, tq = threadIdx.x % 4;
    const int col0 = blockIdx.x * BM;
    const float c = p.scale_log2;
    const bool aligned = p.aligned;

    const int begin = query_begin(p, col0);
    const int per_head = begin < p.sq ? (p.sq - begin + BN - 1) / BN : 0, tiles = per_head * group;
    auto fetch = [&](int h, int m0, int buf) {  // query tile [m0, m0 + BN) of head h, into buffer buf
        load_tile<T, BN, D, DKDV_THREADS>(qs + buf * BN, (const T *)p.q + b * p.q_b + h * p.q_h, p.q_s, m0, p.sq,
                                          p.d, aligned);
        load_tile<T, BN, D, DKDV_THREADS>(dos + buf * BN, (const T *)p.dout + b * p.do_b + h * p.do_h, p.do_s, m0,
                                          p.sq, p.d, aligned);
        const int64_t row = ((int64_t)b * p.h + h) * p.sq + m0;
        for (int x = threadIdx.x; x < BN; x += DKDV_THREADS) {
            const bool in = m0 + x < p.sq;
            stats[buf][0][x] = in ? p.rowmax[row + x] : 0.f;
            stats[buf][1][x] = in ? p.log2l[row + x] : INFINITY;
            stats[buf][2][x] = in ? p.delta[row + x] : 0.f;
        }
    };

    load_tile<T, BM, D, DKDV_THREADS>(ks, (const T *)p.k + b * p.k_b + hk * p.k_h, p.k_s, col0, p.sk, p.d, aligned);
    load_tile<T, BM, D, DKDV_THREADS>(vs, (const T *)p.v + b * p.v_b + hk * p.v_h, p.v_s, col0, p.sk, p.d, aligned);
    if (tiles > 0) fetch(hk * group, begin, 0);
    cp_async_commit();

    float dk[MT][D / 8][4], dv[MT][D / 8][4];  // the one a pass does not compute is never touched: no registers
    zero<MT, D / 8>(dk);
    zero<MT, D / 8>(dv);
    // Tile t is [m0, m0 + BN) of query head h: the query tiles of every head of the group, in order, stepped
    // rather than divided out of t (an integer division per tile).
    for (int t = 0, h = hk * group, m0 = begin; t < tiles; ++t) {
        const int buf = t % 2;
        const bool wrap = m0 + BN >= p.sq;  // tile t + 1 starts the next head
        if (t + 1 < tiles) {
            fetch(wrap ? h + 1 : h, wrap ? begin : m0 + BN, 1 - buf);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // query tile t, its statistics, K and V are visible to every warp

        float s[MT][BN / 8][4];  // S^T: this warp's keys x BN queries
        zero<MT, BN / 8>(s);
        gemm_nt_smem<T, MT, BN, D, LD, LD>(s, ks, warp * 16 * MT, qs + buf * BN, 0);
        each_entry<MT, BN>([&](int mt, int nt, int e) {
            const int x = nt * 8 + 2 * tq + e % 2;  // query within the tile
            s[mt][nt][e] = recompute_p(s[mt][nt][e], stats[buf][0][x], stats[buf][1][x], c);
        });
        // Only tiles that cross the end of the queries or the causal diagonal need the mask, applied after the
        // exponentials: a masked entry's P is finite (zero rows past the ends; min(., 0) at the diagonal), so
        // zeroing it then is exact, and the unmasked loop stays free of the mask's tests (registers: spills).
        if (m0 + BN > p.sq || (p.causal && col0 + BM - 1 > m0 + p.sk - p.sq)) {
            each_entry<MT, BN>([&](int mt, int nt, int e) {
                const int x = nt * 8 + 2 * tq + e % 2;
                if (!(m0 + x < p.sq && visible(p, m0 + x, col0 + lane_row<MT>(mt, e / 2)))) s[mt][nt][e] = 0.f;
            });
        }
        if constexpr (DO_DV) {
            gemm_nn_c<T, MT, D, BN, LD>(dv, s, dos + buf * BN, 0);
        }
        if constexpr (DO_DK) {
            float dp[MT][BN / 8][4];  // dP^T = V dO^T
            zero<MT, BN / 8>(dp);
            gemm_nt_smem<T, MT, BN, D, LD, LD>(dp, vs, warp * 16 * MT, dos + buf * BN, 0);
            each_entry<MT, BN>([&](int mt, int nt, int e) {
                s[mt][nt][e] *= dp[mt][nt][e] - stats[buf][2][nt * 8 + 2 * tq + e % 2];  // dS^T
            });
            gemm_nn_c<T, MT, D, BN, LD>(dk, s, qs + buf * BN, 0);
        }
        __syncthreads();  // every warp is done with buffer `buf` before it is refilled
        h += wrap;
        m0 = wrap ? begin : m0 + BN;
    }
    if constexpr (DO_DK) store_rows<T, MT, D>(p, (T *)p.dk + b * p.dk_b + hk * p.dk_h, p.dk_s, col0, p.sk, dk, times(p.scale));
    if constexpr (DO_DV) store_rows<T, MT, D>(p, (T *)p.dv + b * p.dv_b + hk * p.dv_h, p.dv_s, col0, p.sk, dv, times(1.f));
}

template <typename T, int D>
int run(const Params &p, cudaStream_t stream) {
    constexpr int BM = block_m<D>(), BK = block_m_dkdv<D>(), LD = D + PAD;
    const dim3 grid_q((p.sq + BM - 1) / BM, p.h, p.b), grid_k((p.sk + BK - 1) / BK, p.hk, p.b);
    const int bytes_q = (2 * BM + 4 * dq_block_n<D>()) * LD * sizeof(T) + 3 * BM * sizeof(float);
    const int bytes_k = (2 * BK + 4 * block_n_dkdv<D>()) * LD * sizeof(T) + 2 * 3 * block_n_dkdv<D>() * sizeof(float);
    int e = launch(dq_kernel<T, D>, grid_q, bytes_q, p, stream);
    if (e) return e;
    if constexpr (split_dkdv<D>()) {
        e = launch(dkdv_kernel<T, D, false, true>, grid_k, bytes_k, p, stream, DKDV_THREADS);
        return e ? e : launch(dkdv_kernel<T, D, true, false>, grid_k, bytes_k, p, stream, DKDV_THREADS);
    } else {
        return launch(dkdv_kernel<T, D, true, true>, grid_k, bytes_k, p, stream, DKDV_THREADS);
    }
}

}  // namespace mma_bwd
}  // namespace fa

extern "C" int fa_mma_bwd(const fa::Params *p, int dtype, cudaStream_t stream) {
    FA_HALF_SWITCH(dtype, T, FA_HEADDIM_SWITCH(p->d, D, return fa::mma_bwd::run<T, D>(*p, stream)))
    return (int)cudaErrorInvalidValue;
}
