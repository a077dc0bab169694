"""FlashAttention forward and backward in CUDA C++, built by nvcc on first use and loaded with ctypes."""
from faverify.kernels.cuda.interface import flash_attn_func, flash_attn_func_simt

__all__ = ["flash_attn_func", "flash_attn_func_simt"]
