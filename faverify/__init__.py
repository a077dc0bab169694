"""faverify: prove FlashAttention-style kernels numerically right, or find the smallest input on which
they are wrong. The library lives in one module a concept; the command line is faverify.cli."""

__version__ = "0.1.0"
