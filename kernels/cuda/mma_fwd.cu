// Flash attention forward on tensor cores (`cuda`): FlashAttention-2's schedule with mma.sync m16n8k16.
//
// A block of 4 warps owns BM query rows of one (batch, head); each warp owns 16 MT of them (MT m-tiles, see
// mma.cuh) and keeps their S, P and O in registers (mma.cuh gives the fragment layouts). Key/value tiles of BN rows
// stream through two shared-memory buffers: cp.async fills tile t + 1 while the warps compute on tile t.
//
// Per key tile, per query row (lanes 4gr..4gr+3 share a row and join their values with two shuffles):
//   S = Q K^T                                   (raw scores, fp32; masked keys set to -inf)
//   m_new = max(m, rowmax S);  alpha = exp2((m - m_new) c),  c = scale * log2(e)
//   P = exp2((S - m_new) c);   l = alpha l + rowsum P
//   O = alpha O + P V                           (P rounded to the input dtype: the operand of this mma)
// End: out = O / l; m and log2 l stored for the backward (common.cuh), lse = (m c + log2 l) ln 2.
// Guards: "-inf" start subtracts 0 while m_new is still -inf (no (-inf) - (-inf)); "-1e30" start leaves l
// at 0 for a row that sees no key, and l == 0 writes out 0, lse -inf, for both starts.
#include "mma.cuh"

namespace fa {
namespace mma_fwd {

using namespace mma;
// The key tile at head dim 128: 48 keys, measured on the H200 (docs/measurements.md, devtools/cuda_tune.py):
// 0.89-0.95x sdpa-flash against 0.79-0.83x with 32 (2026-11-30, at ccb7886), as each Q fragment read from shared memory
// feeds 3 n-tiles instead of 2; 64 spills. A library built for sm_80 takes 32: there nvcc 13.0 spills with
// 48 (ptxas -v), and no sm_80 GPU was at hand to time either. FA_FWD_BN128 overrides it when tuning
// (build.py: FAVERIFY_CUDA_DEFINES). __CUDA_ARCH_LIST__ names the one architecture a library is built for, in
// the host pass too, which sizes the launch's shared memory with the same tile.
#ifndef FA_FWD_BN128
#if defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ < 900
#define FA_FWD_BN128 32
#else
#define FA_FWD_BN128 48
#endif
#endif
template <int D> __host__ __device__ constexpr int fwd_block_n() { return D == 128 ? FA_FWD_BN128 : block_n<D>(); }
template <typename T, int D> constexpr int smem_bytes() {
    return (block_m<D>() + 4 * fwd_block_n<D>()) * (D + PAD) * (int)sizeof(T);
}

template <typename T, int D, bool INIT_NEG_INF>
__global__ void __launch_bounds__(THREADS) fwd(Params p) {
    constexpr int MT = m_tiles<D>(), BM = block_m<D>(), BN = fwd_block_n<D>(), LD = D + PAD;
    extern __shared__ __align__(16) unsigned char smem[];
    T (*qs)[LD] = reinterpret_cast<T (*)[LD]>(smem);
    T (*ks)[LD] = qs + BM;       // two buffers of BN rows
    T (*vs)[LD] = ks + 2 * BN;   // two buffers of BN rows

    const auto [b, h, hk] = block_head(p);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
    const int row0 = query_tile(p) * BM, warp_row0 = warp * 16 * MT;  // warp_row0: within the block
    // this lane's rows: m-tile mt, half x (fragment entries 2x, 2x + 1)
    auto row_of = [&](int mt, int x) { return row0 + lane_row<MT>(mt, x); };
    const T *qb = (const T *)p.q + b * p.q_b + h * p.q_h;
    const T *kb = k_head<T>(p, {b, h, hk}), *vb = v_head<T>(p, {b, h, hk});
    const float c = p.scale_log2;
    const bool aligned = p.aligned;

    const int end = key_end(p, row0, BM), tiles = (end + BN - 1) / BN;
    load_tile<T, BM, D, THREADS>(qs, qb, p.q_s, row0, p.sq, p.d, aligned);
    if (tiles > 0) {
        load_tile<T, BN, D, THREADS>(ks, kb, p.k_s, 0, p.sk, p.d, aligned);
        load_tile<T, BN, D, THREADS>(vs, vb, p.v_s, 0, p.sk, p.d, aligned);
    }
    cp_async_commit();

    float o[MT][D / 8][4], m[MT][2], l[MT][2];
    zero<MT, D / 8>(o);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m[mt][0] = m[mt][1] = INIT_NEG_INF ? -INFINITY : -1e30f;
        l[mt][0] = l[mt][1] = 0.f;
    }

    for (int t = 0; t < tiles; ++t) {
        const int n0 = t * BN, buf = t % 2;
        next_kv<T, BN, D>(ks, vs, p, t, tiles, aligned);
        __syncthreads();  // tile t (and Q) copied by every thread is visible to every warp

        float s[MT][BN / 8][4];
        zero<MT, BN / 8>(s);
        gemm_nt_smem<T, MT, BN, D, LD, LD>(s, qs, warp_row0, ks + buf * BN, 0);

        // Only tiles that cross the end of the keys or the causal diagonal need the per-element mask.
        if (n0 + BN > p.sk || (p.causal && n0 + BN - 1 > row0 + p.sk - p.sq)) {
            each_entry<MT, BN>([&](int mt, int nt, int e) {
                if (!visible(p, row_of(mt, e / 2), n0 + nt * 8 + 2 * tq + e % 2)) s[mt][nt][e] = -INFINITY;
            });
        }

#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                float tile_max = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt)
                    tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * x], s[mt][nt][2 * x + 1]));
                const float m_new = fmaxf(m[mt][x], quad_max(tile_max));
                const float m_use = (INIT_NEG_INF && m_new == -INFINITY) ? 0.f : m_new;
                const float alpha = fast_exp2((m[mt][x] - m_use) * c);  // subtract first: exact at huge logits
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                    for (int e = 2 * x; e < 2 * x + 2; ++e) {
                        s[mt][nt][e] = fast_exp2((s[mt][nt][e] - m_use) * c);
                        sum += s[mt][nt][e];
                    }
                l[mt][x] = alpha * l[mt][x] + sum;  // this lane's share of the row sum; joined at the end
#pragma unroll
                for (int dt = 0; dt < D / 8; ++dt) {
                    o[mt][dt][2 * x] *= alpha;
                    o[mt][dt][2 * x + 1] *= alpha;
                }
                m[mt][x] = m_new;
            }

        gemm_nn_c<T, MT, D, BN, LD>(o, s, vs + buf * BN, 0);
        __syncthreads();  // all warps are done with buffer `buf` before iteration t + 1 prefetches into it
    }

    float inv[MT][2];  // 1 / l per row; 0 for a row that saw no key, whose out is then 0
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const int i = row_of(mt, x);
            const float total = quad_sum(l[mt][x]);
            const bool empty = !(total > 0.f);  // the row saw no key
            inv[mt][x] = empty ? 0.f : 1.f / total;
            if (i < p.sq && tq == 0) {
                const int64_t row = ((int64_t)b * p.h + h) * p.sq + i;
                const float log2l = empty ? INFINITY : log2f(total);
                p.rowmax[row] = empty ? 0.f : m[mt][x];
                p.log2l[row] = log2l;
                p.lse[row] = empty ? -INFINITY : (m[mt][x] * c + log2l) * LN2;
            }
        }
    store_rows<T, MT, D>(p, (T *)p.out + b * p.o_b + h * p.o_h, p.o_s, row0, p.sq, o,
                         [&](int mt, int x) { return inv[mt][x]; });
}

template <typename T, int D, bool INIT_NEG_INF>
int run(const Params &p, cudaStream_t stream) {
    const dim3 grid((p.sq + block_m<D>() - 1) / block_m<D>(), p.h, p.b);
    return launch(fwd<T, D, INIT_NEG_INF>, grid, smem_bytes<T, D>(), p, stream);
}

}  // namespace mma_fwd
}  // namespace fa

extern "C" int fa_mma_fwd(const fa::Params *p, int dtype, int init_neg_inf, cudaStream_t stream) {
    FA_HALF_SWITCH(dtype, T, FA_HEADDIM_SWITCH(p->d, D, {
        return init_neg_inf ? fa::mma_fwd::run<T, D, true>(*p, stream) : fa::mma_fwd::run<T, D, false>(*p, stream);
    }))
    return (int)cudaErrorInvalidValue;
}
