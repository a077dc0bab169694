"""FlashAttention-2 forward and backward in Triton: `flash_attn_func` (see interface.py).

Imported lazily: whether the kernels are compiled or interpreted (TRITON_INTERPRET=1) is fixed when they
are defined, and the `triton` subject chooses the interpreter on machines without a GPU first.
"""

__all__ = ["Launch", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]


def __getattr__(name):
    if name in __all__:
        from faverify.kernels.triton import interface
        return getattr(interface, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
