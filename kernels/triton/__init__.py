"""FlashAttention-2 forward and backward in Triton: `flash_attn_func` (see interface.py).

Imported lazily: whether the kernels are compiled or interpreted (TRITON_INTERPRET=1) is fixed when they
are defined, and the `triton` subject chooses the interpreter on machines without a GPU first.
"""

__all__ = ["flash_attn_func"]


def __getattr__(name):
    if name == "flash_attn_func":
        from faverify.kernels.triton.interface import flash_attn_func
        return flash_attn_func
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
