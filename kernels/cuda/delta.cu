// Backward preprocessing shared by every backward here: D_i = dO_i . O_i per query row, in fp32.
// D_i = sum_j P_ij dP_ij is what the softmax gradient subtracts: dS_ij = P_ij (dP_ij - D_i).
// One warp per row: lanes stride the head dim, then a warp sum.
#include "common.cuh"

namespace fa {

template <typename T>
__global__ void delta_kernel(Params p) {
    const int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int i = blockIdx.x * warps + w, b = blockIdx.y / p.h, h = blockIdx.y % p.h;
    if (i >= p.sq) return;  // whole warps leave together: no shuffle is left half-populated
    const T *o = (const T *)p.out + b * p.o_b + (int64_t)i * p.o_s + h * p.o_h;
    const T *dout = (const T *)p.dout + b * p.do_b + (int64_t)i * p.do_s + h * p.do_h;
    float acc = 0.f;
    for (int c = lane; c < p.d; c += 32) acc += to_float(o[c]) * to_float(dout[c]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) p.delta[((int64_t)b * p.h + h) * p.sq + i] = acc;
}

}  // namespace fa

extern "C" int fa_delta(const fa::Params *p, int dtype, cudaStream_t stream) {
    dim3 grid((p->sq + 3) / 4, p->b * p->h);
    FA_DTYPE_SWITCH(dtype, T, fa::delta_kernel<T><<<grid, 128, 0, stream>>>(*p))
    return fa::launch_status();
}

extern "C" const char *fa_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

// The size of the parameter block as compiled: Python checks its ctypes mirror against it on load.
extern "C" int fa_params_size() { return (int)sizeof(fa::Params); }
