// Warp-level tensor-core building blocks for the `cuda` kernels: mma.sync m16n8k16 with fp32
// accumulation, ldmatrix to feed it from shared memory, and cp.async to fill shared memory.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4 * gr + tq:
//   A 16x16 (row): a0 = (gr, 2tq..2tq+1), a1 = (gr+8, same), a2 = (gr, 2tq+8..), a3 = (gr+8, 2tq+8..)
//   B 16x8  (col): b0 = (k 2tq..2tq+1, n gr), b1 = (k 2tq+8.., n gr)
//   C 16x8  fp32:  c0, c1 = (gr, 2tq..2tq+1), c2, c3 = (gr+8, same)
// So two neighbouring C tiles of S (16 x 16 keys) are, packed to 16-bit pairs, exactly the A fragment of
// P for the next product P V: S and P never leave registers (FlashAttention-2's trick).
//
// Shared-memory tiles are [rows][D + PAD] of 16-bit elements. ldmatrix reads 8 rows of 16 bytes per
// matrix; with a row pitch of D * 2 bytes (a multiple of 128) those 8 rows would sit in the same banks,
// an 8-way conflict. PAD = 8 elements moves each row 16 bytes further along the banks: conflict-free.
#pragma once

#include "common.cuh"

namespace fa {
namespace mma {

constexpr int PAD = 8;
constexpr int WARPS = 4, THREADS = 32 * WARPS;

// Tiles per head dim for the kernels whose warps own query rows (forward, dq): a warp owns MT * 16 rows
// (MT m-tiles, below), a block 64 MT; BN key rows per shared-memory tile. At head dim 256 the O (or dQ)
// accumulator alone is 128 registers per 16 rows, so MT = 1. dq's BN = 64 spills at head dim 128 (the
// forward's own BN: mma_fwd.cu).
// Measured on the H200 (docs/measurements.md); compile_report.py checks that nothing spills.
template <int D> __host__ __device__ constexpr int m_tiles() { return D == 256 ? 1 : 2; }
template <int D> __host__ __device__ constexpr int block_m() { return 16 * WARPS * m_tiles<D>(); }
template <int D> __host__ __device__ constexpr int block_n() { return D >= 128 ? 32 : 64; }

// The grids of the tensor-core kernels are (row tiles, heads, batch): batch and head are read from blockIdx
// (z, y) where they are used, so the compiler need not keep them, or a division's result, in a register
// across the main loop (at head dim 128 one such value was what spilled: ptxas -v).
__device__ __forceinline__ Head block_head(const Params &p) {
    return {(int)blockIdx.z, (int)blockIdx.y, (int)blockIdx.y / (p.h / p.hk)};
}

// The query tile of a block of the forward or dq grid. Causal: the last query tiles see the most keys;
// launched first, they do not trail the grid's end (forward at seqlen 16384: +1.4%, measured).
__device__ __forceinline__ int query_tile(const Params &p) {
    return p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
}

// Launch with `bytes` of dynamic shared memory: above 48 KB a kernel must opt in first.
template <typename Kernel>
int launch(Kernel kernel, dim3 grid, int bytes, const Params &p, cudaStream_t stream, int threads = THREADS) {
    if (bytes > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess) return (int)e;
    }
    kernel<<<grid, threads, bytes, stream>>>(p);
    return launch_status();
}

template <typename T> struct Pack;
template <> struct Pack<__half> {
    static __device__ __forceinline__ uint32_t two(float lo, float hi) {
        __half2 x = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&x);
    }
};
template <> struct Pack<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t two(float lo, float hi) {
        __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&x);
    }
};

// c += a * b on one 16x8x16 tile.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// 16 bytes global -> shared without passing through registers; src_bytes = 0 writes zeros (tile tails).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool in_range) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(in_range ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

// x through an empty asm the compiler must assume changes it: what is computed from the result stays where
// it is written, inside the kernel's main loop, instead of being hoisted out to occupy registers across it.
__device__ __forceinline__ int opaque(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

// Copy rows [row0, row0 + N) of one (batch, head) slice of a [b, s, h, d] tensor into a padded smem tile,
// zeros past the sequence end and past d. `aligned` (d, strides and pointer multiples of 8 elements / 16
// bytes, checked on the host) takes cp.async; otherwise element by element, synchronously.
// Each of the NT threads owns one 16-byte column chunk and every (NT / CHUNKS)-th row from its first: its
// source address is computed once and then stepped, in a loop unrolled at compile time. A loop over a
// flat index (row = idx / CHUNKS) cost about 30 instructions per chunk in address arithmetic: in the
// dkdv kernel more instructions than its mma's (devtools/sass_loops.py at ccb7886; docs/measurements.md,
// "CUDA kernels").
template <typename T, int N, int D, int NT>
__device__ __forceinline__ void load_tile(T (*dst)[D + PAD], const T *base, int64_t stride_s, int row0, int rows,
                                          int d, bool aligned) {
    constexpr int CHUNKS = D / 8, STEP = NT / CHUNKS;
    static_assert(NT % CHUNKS == 0, "a thread's chunk column must not change from row to row");
    if (aligned) {
        const int tid = opaque(threadIdx.x);
        const int r0 = tid / CHUNKS, c = (tid % CHUNKS) * 8;
        // A row past the end is copied as zeros: src-size 0, no byte read, so its address (past the end too)
        // needs no select (compute-sanitizer's memcheck on devtools/sanitize_cases.py agrees).
        const T *src = base + (int64_t)(row0 + r0) * stride_s + c;
        const int64_t step = (int64_t)STEP * stride_s;
        const int left = c < d ? rows - row0 - r0 : 0;  // rows this thread may copy, from its first on
#pragma unroll
        for (int i = 0; i < (N + STEP - 1) / STEP; ++i, src += step) {
            if (N % STEP != 0 && r0 + i * STEP >= N) break;
            cp_async16(&dst[r0 + i * STEP][c], src, i * STEP < left);
        }
    } else {  // the rare path, rolled, as registers are short beside the main loop
        for (int idx = threadIdx.x; idx < N * CHUNKS; idx += NT) {
            const int r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
            const bool row_ok = row0 + r < rows;
            const T *src = base + (int64_t)(row_ok ? row0 + r : 0) * stride_s + c;
#pragma unroll
            for (int e = 0; e < 8; ++e) dst[r][c + e] = (row_ok && c + e < d) ? src[e] : from_float<T>(0.f);
        }
    }
}

// Double buffering of K and V tiles of BN rows: before computing on tile t (buffer t % 2), start copying
// tile t + 1 into the other buffer and wait only for tile t; on the last tile, wait for everything.
template <typename T, int BN, int D>
__device__ __forceinline__ void next_kv(T (*ks)[D + PAD], T (*vs)[D + PAD], const Params &p, int t, int tiles,
                                        bool aligned) {
    if (t + 1 < tiles) {
        // the head's K and V found again from blockIdx, not kept: two 64-bit pointers across the main loop
        // were registers the forward at head dim 128 did not have (ptxas -v: spills)
        const Head x = block_head(p);
        const int buf = 1 - t % 2, n0 = (t + 1) * BN;
        load_tile<T, BN, D, THREADS>(ks + buf * BN, k_head<T>(p, x), p.k_s, n0, p.sk, p.d, aligned);
        load_tile<T, BN, D, THREADS>(vs + buf * BN, v_head<T>(p, x), p.v_s, n0, p.sk, p.d, aligned);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

// A fragment of rows [row0, row0+16), columns [k0, k0+16) of a padded smem tile.
template <typename T, int LD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T (*tile)[LD], int row0, int k0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4(a, &tile[row0 + lane % 16][k0 + (lane / 16) * 8]);
}

// A warp computes MT stacked 16-row tiles at once: each B fragment read from shared memory then feeds MT
// mma's instead of one. Shared-memory reads per flop fall by MT, and they, not the tensor cores, bound a
// warp that owns only 16 rows (measured: 0.5x sdpa-flash with MT = 1 at head dim 128).

// acc[MT x 16 x N] += A[MT x 16 x K] * B^T, B stored [n][k] in smem (B's rows are acc's columns):
// S = Q K^T. A comes from smem rows a_row0 .. a_row0 + 16 MT of tile `a`.
template <typename T, int MT, int N, int K, int LDA, int LDB>
__device__ __forceinline__ void gemm_nt_smem(float (&acc)[MT][N / 8][4], const T (*a)[LDA], int a_row0,
                                             const T (*b)[LDB], int b_row0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) load_a<T, LDA>(af[mt], a, a_row0 + 16 * mt, k0);
#pragma unroll
        for (int n0 = 0; n0 < N; n0 += 16) {
            uint32_t bf[4];  // b0, b1 of n-tile n0, then of n0 + 8
            ldmatrix_x4(bf, &b[b_row0 + n0 + lane % 8 + (lane / 16) * 8][k0 + ((lane / 8) % 2) * 8]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma16816<T>(acc[mt][n0 / 8], af[mt], bf[0], bf[1]);
                mma16816<T>(acc[mt][n0 / 8 + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

// acc[MT x 16 x N] += A[MT x 16 x K] * B, B stored [k][n] in smem, A given as the fp32 C fragments of the
// product before (P or dS): O += P V. Two neighbouring C tiles, packed to 16-bit pairs, are one A fragment
// (layouts at the top); each 16-wide k slice is packed just before its mma's, so no packed copy of the
// whole tile is live beside the fp32 one (registers: the forward's BN = 48 at head dim 128).
template <typename T, int MT, int N, int K, int LDB>
__device__ __forceinline__ void gemm_nn_c(float (&acc)[MT][N / 8][4], const float (&c)[MT][K / 8][4],
                                          const T (*b)[LDB], int b_row0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[MT][4];
        const int kk = k0 / 16;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            a[mt][0] = Pack<T>::two(c[mt][2 * kk][0], c[mt][2 * kk][1]);
            a[mt][1] = Pack<T>::two(c[mt][2 * kk][2], c[mt][2 * kk][3]);
            a[mt][2] = Pack<T>::two(c[mt][2 * kk + 1][0], c[mt][2 * kk + 1][1]);
            a[mt][3] = Pack<T>::two(c[mt][2 * kk + 1][2], c[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int n0 = 0; n0 < N; n0 += 16) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, &b[b_row0 + k0 + lane % 8 + ((lane / 8) % 2) * 8][n0 + (lane / 16) * 8]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma16816<T>(acc[mt][n0 / 8], a[mt], bf[0], bf[1]);
                mma16816<T>(acc[mt][n0 / 8 + 1], a[mt], bf[2], bf[3]);
            }
        }
    }
}

// f(mt, nt, e) for each entry of this lane's C fragments [MT][N / 8][4] (S, P, dP): entry e of n-tile nt
// of m-tile mt sits in row half e / 2 (lane_row) and column nt * 8 + 2 (lane % 4) + e % 2 of the tile.
template <int MT, int N, typename F>
__device__ __forceinline__ void each_entry(F &&f) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(mt, nt, e);
}

template <int MT, int N>
__device__ __forceinline__ void zero(float (&acc)[MT][N][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < N; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
}

// Max and sum over the 4 lanes that share a row of a C fragment (lanes 4 gr .. 4 gr + 3).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// This lane's row in a block's rows: m-tile mt, half x (fragment entries 2x, 2x + 1).
template <int MT>
__device__ __forceinline__ int lane_row(int mt, int x) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    return warp * 16 * MT + 16 * mt + lane / 4 + 8 * x;
}

// Write a warp's fp32 accumulator rows [MT x 16 x D] (out, dq, dk, dv), each row times mul(mt, x), to rows
// row0 + lane_row of a [b, s, h, d] slice at base with row stride stride_s: rows past `rows` and columns
// past d are left alone.
template <typename T, int MT, int D, typename Mul>
__device__ __forceinline__ void store_rows(const Params &p, T *base, int64_t stride_s, int row0, int rows,
                                           const float (&acc)[MT][D / 8][4], Mul mul) {
    const int tq = threadIdx.x % 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const int r = row0 + lane_row<MT>(mt, x);
            if (r >= rows) continue;
            T *row = base + (int64_t)r * stride_s;
            const float f = mul(mt, x);
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = dt * 8 + 2 * tq + e;
                    if (col < p.d) row[col] = from_float<T>(acc[mt][dt][2 * x + e] * f);
                }
        }
}

// store_rows' multiplier when every row takes the same one.
__device__ __forceinline__ auto times(float f) {
    return [f](int, int) { return f; };
}

}  // namespace mma
}  // namespace fa
