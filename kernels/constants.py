"""Numbers every bundled kernel uses, defined once (the Triton and CUDA launchers and the kernels' code)."""

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E); the kernels fold it into the softmax scale
LN2 = 0.6931471805599453  # ln(2): a log2 back to a natural log (lse = (m c + log2 l) * LN2)
# the running max's start for each `init` mode of the Triton launchers (flash_attn_func's init)
INIT_VALUE = {"-inf": float("-inf"), "-1e30": -1e30}
# The most split-KV partials a bundled launcher makes, and a case asks for (flash-attn's cap too): a single
# sequence's decode over a 128k-key cache fills the H200 at 99 (interface.num_splits_for).
MAX_SPLITS = 128
