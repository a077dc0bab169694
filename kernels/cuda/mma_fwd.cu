// Flash attention forward on tensor cores (`cuda`): FlashAttention-2's schedule with mma.sync m16n8k16.
//
// A block of 4 warps owns BM = 64 query rows of one (batch, head); warp w owns rows 16w .. 16w + 15 and
// keeps their S, P and O in registers (mma.cuh gives the fragment layouts). Key/value tiles of BN rows
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
constexpr int WARPS = 4, THREADS = 32 * WARPS, BM = 16 * WARPS;
template <int D> __host__ __device__ constexpr int block_n() { return D == 256 ? 32 : 64; }
template <typename T, int D> constexpr int smem_bytes() {
    return (BM + 4 * block_n<D>()) * (D + PAD) * (int)sizeof(T);
}

template <typename T, int D, bool INIT_NEG_INF>
__global__ void __launch_bounds__(THREADS) fwd(Params p) {
    constexpr int BN = block_n<D>(), LD = D + PAD;
    extern __shared__ __align__(16) unsigned char smem[];
    T (*qs)[LD] = reinterpret_cast<T (*)[LD]>(smem);
    T (*ks)[LD] = qs + BM;       // two buffers of BN rows
    T (*vs)[LD] = ks + 2 * BN;   // two buffers of BN rows

    const int b = blockIdx.y / p.h, h = blockIdx.y % p.h, hk = h / (p.h / p.hk);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
    const int row0 = blockIdx.x * BM;
    const int rows[2] = {row0 + warp * 16 + gr, row0 + warp * 16 + gr + 8};
    const T *qb = (const T *)p.q + b * p.q_b + h * p.q_h;
    const T *kb = (const T *)p.k + b * p.k_b + hk * p.k_h, *vb = (const T *)p.v + b * p.v_b + hk * p.v_h;
    const float c = p.scale_log2;
    const bool aligned = p.aligned;

    const int end = key_end(p, row0, BM), tiles = (end + BN - 1) / BN;
    load_tile<T, BM, D>(qs, qb, p.q_s, row0, p.sq, p.d, aligned, THREADS);
    if (tiles > 0) {
        load_tile<T, BN, D>(ks, kb, p.k_s, 0, p.sk, p.d, aligned, THREADS);
        load_tile<T, BN, D>(vs, vb, p.v_s, 0, p.sk, p.d, aligned, THREADS);
    }
    cp_async_commit();

    float o[D / 8][4], m[2], l[2] = {0.f, 0.f};
    zero<D / 8>(o);
    m[0] = m[1] = INIT_NEG_INF ? -INFINITY : -1e30f;

    for (int t = 0; t < tiles; ++t) {
        const int n0 = t * BN, buf = t % 2;
        if (t + 1 < tiles) {  // prefetch the next tile into the other buffer while this one is used
            load_tile<T, BN, D>(ks + (1 - buf) * BN, kb, p.k_s, n0 + BN, p.sk, p.d, aligned, THREADS);
            load_tile<T, BN, D>(vs + (1 - buf) * BN, vb, p.v_s, n0 + BN, p.sk, p.d, aligned, THREADS);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile t (and Q) copied by every thread is visible to every warp

        float s[BN / 8][4];
        zero<BN / 8>(s);
        gemm_nt_smem<T, BN, D, LD, LD>(s, qs, warp * 16, ks + buf * BN, 0);

        // Only tiles that cross the end of the keys or the causal diagonal need the per-element mask.
        if (n0 + BN > p.sk || (p.causal && n0 + BN - 1 > row0 + p.sk - p.sq)) {
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (!visible(p, rows[e / 2], n0 + nt * 8 + 2 * tq + e % 2)) s[nt][e] = -INFINITY;
        }

#pragma unroll
        for (int x = 0; x < 2; ++x) {  // x = 0: row gr, x = 1: row gr + 8 (entries 2x, 2x + 1)
            float tile_max = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * x], s[nt][2 * x + 1]));
            const float m_new = fmaxf(m[x], quad_max(tile_max));
            const float m_use = (INIT_NEG_INF && m_new == -INFINITY) ? 0.f : m_new;
            const float alpha = fast_exp2((m[x] - m_use) * c);  // subtract before scaling: exact at huge logits
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
                s[nt][2 * x] = fast_exp2((s[nt][2 * x] - m_use) * c);
                s[nt][2 * x + 1] = fast_exp2((s[nt][2 * x + 1] - m_use) * c);
                sum += s[nt][2 * x] + s[nt][2 * x + 1];
            }
            l[x] = alpha * l[x] + sum;  // this lane's share of the row sum; joined at the end
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                o[dt][2 * x] *= alpha;
                o[dt][2 * x + 1] *= alpha;
            }
            m[x] = m_new;
        }

        uint32_t pa[BN / 16][4];
        c_to_a<T, BN>(pa, s);
        gemm_nn_regs<T, D, BN, LD>(o, pa, vs + buf * BN, 0);
        __syncthreads();  // all warps are done with buffer `buf` before iteration t + 1 prefetches into it
    }

#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const int i = rows[x];
        const float total = quad_sum(l[x]);
        const bool empty = !(total > 0.f);  // the row saw no key
        const float inv = empty ? 0.f : 1.f / total;
        if (i < p.sq) {
            T *out = (T *)p.out + b * p.o_b + (int64_t)i * p.o_s + h * p.o_h;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = dt * 8 + 2 * tq + e;
                    if (col < p.d) out[col] = from_float<T>(o[dt][2 * x + e] * inv);
                }
            if (tq == 0) {
                const int64_t row = ((int64_t)b * p.h + h) * p.sq + i;
                const float log2l = empty ? INFINITY : log2f(total);
                p.rowmax[row] = empty ? 0.f : m[x];
                p.log2l[row] = log2l;
                p.lse[row] = empty ? -INFINITY : (m[x] * c + log2l) * 0.69314718056f;
            }
        }
    }
}

template <typename T, int D, bool INIT_NEG_INF>
int launch(const Params &p, cudaStream_t stream) {
    constexpr int bytes = smem_bytes<T, D>();
    auto kernel = fwd<T, D, INIT_NEG_INF>;
    if (bytes > 48 * 1024) {  // above 48 KB a kernel must opt in to dynamic shared memory
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess) return (int)e;
    }
    dim3 grid((p.sq + BM - 1) / BM, p.b * p.h);
    kernel<<<grid, THREADS, bytes, stream>>>(p);
    return launch_status();
}

}  // namespace mma_fwd
}  // namespace fa

#define FA_HALF_SWITCH(dtype, T, ...)                                              \
    switch (dtype) {                                                               \
        case 0: { using T = __half; __VA_ARGS__; break; }                          \
        case 1: { using T = __nv_bfloat16; __VA_ARGS__; break; }                   \
        default: return (int)cudaErrorInvalidValue;                                \
    }

extern "C" int fa_mma_fwd(const fa::Params *p, int dtype, int init_neg_inf, cudaStream_t stream) {
    FA_HALF_SWITCH(dtype, T, FA_HEADDIM_SWITCH(p->d, D, {
        return init_neg_inf ? fa::mma_fwd::launch<T, D, true>(*p, stream) : fa::mma_fwd::launch<T, D, false>(*p, stream);
    }))
    return (int)cudaErrorInvalidValue;
}
