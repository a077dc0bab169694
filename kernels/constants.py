"""Numbers every bundled kernel uses, defined once (the Triton and CUDA launchers and the kernels' code)."""
from faverify.cases.vocabulary import MAX_SPLITS  # noqa: F401  (the launchers' cap is the cases' cap)

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E); the kernels fold it into the softmax scale
LN2 = 0.6931471805599453  # ln(2): a log2 back to a natural log (lse = (m c + log2 l) * LN2)
# the running max's start for each `init` mode of the Triton launchers (flash_attn_func's init)
INIT_VALUE = {"-inf": float("-inf"), "-1e30": -1e30}
# The cases the Hopper forward and backward take (triton/configs.hopper_forward, interface._use_hopper), as
# their subjects and mutants draw them: 16-bit, padded head dim 64 or 128, every stride a multiple of 16
# elements: head dims that are multiples of 16, in the layouts that keep them so ("strided" pads rows by 8).
HOPPER_CASES = {"dtypes": ("bf16", "fp16"), "head_dims": (48, 64, 80, 96, 112, 128), "exact_head_dims": True,
                "layouts": ("contiguous", "transposed", "packed")}
