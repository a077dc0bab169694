"""faverify's bundled FlashAttention kernels, imported as faverify.kernels.

triton/  forward and backward in Triton (GPU, or the CPU under TRITON_INTERPRET=1)
cuda/    forward and backward in CUDA C++, built with nvcc and loaded through ctypes
mutants/ copies of the Triton kernels with one seeded bug each, for `faverify mutants`
"""
