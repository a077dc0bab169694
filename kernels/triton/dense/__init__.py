"""The dense Triton kernels: FlashAttention-2's forward (forward.py) and backward (backward.py)."""
