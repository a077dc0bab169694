"""The sources the AOT report compiles (build/aot.py): each kernel variant as its launcher would launch it, as a
Triton ASTSource or a Gluon source with the signature, constants and alignment the launch gives it. The
kernels and Triton's compiler are imported inside each builder: run with TRITON_INTERPRET unset only."""
from __future__ import annotations

ELEM = {"fp16": 2, "bf16": 2, "fp32": 4}
FUSED_BWD_KERNEL = "bwd-fused-hopper"  # the fused Hopper backward (hopper/backward_fused.py): sm_90 only, as bwd-hopper


_FP32_POINTERS = ("Lse", "Delta", "Rowmax", "Log2l", "Alibi", "Sinks", "DQsum")


def _signature(fn, dtype: str, constants: dict, pointers: dict | None = None) -> dict:
    """Each argument's type as the launch passes it: constants, pointers (`pointers` names those whose
    element type is not the kernel's dtype), fp32 scales, the rest i32."""
    pointers = {name: "*fp32" for name in _FP32_POINTERS} if pointers is None else pointers
    sig = {}
    for name in fn.arg_names:
        if name in constants:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        elif name[0].isupper():
            sig[name] = f"*{dtype}"
        elif name in ("qk_scale", "softmax_scale", "init", "cap_scale", "inv_cap_scale", "bias_unit"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _aligned_attrs(fn, constants: dict, sizes: tuple = ()) -> dict:
    """Pointers and strides declared divisible by 16, as for contiguous inputs (the fast build); also the
    named sizes, for a build specialized on them (hopper.forward.kernel)."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
            if (name[0].isupper() or name.startswith("stride_") or name in sizes) and name not in constants}


def _hopper_source(v, capability: int):
    """(source, options, tile) of the Hopper forward as interface.forward launches it on sm_90."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from faverify.kernels.triton import configs
    from faverify.kernels.triton.hopper import layouts

    module = _module("hopper.forward", v.mutant)
    on = set(v.switches.split("+")) - {""}
    tile = configs.hopper_tile(v.block_d, "softcap" in on, bool(on & {"window", "alibi"}))
    constants, options = layouts.launch(tile)
    constants.update(CAUSAL=v.causal, BLOCK_D=v.block_d, WINDOW="window" in on, SOFTCAP="softcap" in on,
                     ALIBI="alibi" in on, SINKS="sinks" in on)
    fn = module._fwd_hopper_aligned  # the build bench's shapes take: seqlens multiples of 16, specialized on that
    signature = _signature(fn, v.dtype, constants)
    dtype = {"bf16": gl.bfloat16, "fp16": gl.float16}[v.dtype]
    # host-made descriptors (layouts.descriptors)
    for name, rows in zip(("q_desc", "k_desc", "v_desc", "o_desc"), layouts.box_rows(tile)):
        layout = layouts.box_layout(rows, v.block_d, dtype)
        signature[name] = f"tensordesc<{v.dtype}[1,{rows},1,{v.block_d}],{layout!r}>"
    source = GluonASTSource(fn, signature, constants, _aligned_attrs(fn, constants, module.ALIGNED))
    return source, options, str(tile)


def _module(name: str, mutant: str = ""):
    """Kernel module `name` of kernels/triton, or the mutated copy of it that mutant runs
    (kernels/mutants/build.py)."""
    import importlib
    if not mutant:
        return importlib.import_module("faverify.kernels.triton." + name)
    from faverify.kernels.mutants.build import load
    return importlib.import_module(load(mutant).__package__ + "." + name)


def _hopper_bwd_source(v, capability: int):
    """(source, options, tile) of the Hopper dK/dV as interface.backward launches it on sm_90, or with the
    kernel FUSED_BWD_KERNEL the fused Hopper backward."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from faverify.kernels.triton.hopper import backward as hopper_backward
    from faverify.kernels.triton.hopper import layouts

    fused = v.kernel == FUSED_BWD_KERNEL
    module = _module("hopper.backward_fused" if fused else "hopper.backward", v.mutant)
    constants = dict(CAUSAL=v.causal, BLOCK_D=v.block_d)
    if not fused:
        constants["FUSED_DQ"] = v.switches == "fused-dq"
    fn = module.kernel
    signature = _signature(fn, v.dtype, constants)
    dtype = {"bf16": gl.bfloat16, "fp16": gl.float16}[v.dtype]
    names = ("q_desc", "k_desc", "v_desc", "do_desc") + (("dk_desc", "dv_desc") if fused else ())
    for name, rows in zip(names, hopper_backward.box_rows() * 2):  # 64 rows each
        layout = layouts.box_layout(rows, v.block_d, dtype)
        signature[name] = f"tensordesc<{v.dtype}[1,{rows},1,{v.block_d}],{layout!r}>"
    if fused:  # k in one box of the key tile, the fp32 dQ buffer (hopper.backward_fused.descriptors)
        keys = hopper_backward.CONSUMERS.value * layouts.HALF.value
        signature["k_desc"] = f"tensordesc<{v.dtype}[1,{keys},1,{v.block_d}],{module.k_layout(v.block_d, dtype, 4)!r}>"
        signature["dq_desc"] = (f"tensordesc<fp32[1,{hopper_backward.BLOCK_M.value},{module.dq_cols(v.block_d)}],"
                                f"{module.dq_box_layout()!r}>")
    source = GluonASTSource(fn, signature, constants, _aligned_attrs(fn, constants))
    tile = f"M{hopper_backward.BLOCK_M.value} N{hopper_backward.CONSUMERS.value * 64} hopper"
    return source, dict(module.OPTIONS), tile + (" fused" if fused else "")


def _triton_source(v, capability: int):
    """(source, options, tile) of a Triton kernel with the tile its launcher picks by default."""
    from triton.compiler import ASTSource

    from faverify.kernels.triton import configs
    from faverify.kernels.triton.dense.backward import _bwd_dkdv, _bwd_dq, _bwd_preprocess
    from faverify.kernels.triton.dense.forward import _fwd_kernel

    fn = {"fwd": _fwd_kernel, "dkdv": _bwd_dkdv, "dq": _bwd_dq, "preprocess": _bwd_preprocess}[v.kernel]
    constants = {"BLOCK_D": v.block_d, "EVEN_D": v.even_d}
    options = {"num_warps": 4, "num_stages": 1}
    tile = None
    if v.kernel == "preprocess":
        constants["BLOCK_M"] = 64
    else:
        # as interface._use_tma launches it: the 16-bit forward loads through tensor descriptors on sm_90+
        tma = v.kernel == "fwd" and configs.tma_forward(ELEM[v.dtype], capability // 10)
        tile = configs.default(v.kernel, v.block_d, ELEM[v.dtype], v.causal, tma)
        constants.update(CAUSAL=v.causal, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, INTERPRETED=False,
                         IEEE=v.dtype == "fp32")
        if v.kernel != "fwd":
            constants["ALIBI"] = v.switches == "alibi"
        if v.kernel == "fwd":
            constants["TMA"] = tma
        options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
    source = ASTSource(fn, _signature(fn, v.dtype, constants), constants, _aligned_attrs(fn, constants))
    return source, options, str(tile) if tile else "M64"


def _variant_source(v, capability: int):
    """(source, options, tile) of a variant kernel as variant/interface.py launches it, with its configs.variant
    tile: the generic build (no divisibility declared: every runtime argument is unspecialized), or with
    even_d the fast one (the streamed tensors' pointers and strides declared divisible by 16)."""
    from triton.compiler import ASTSource

    from faverify.kernels.triton import configs
    from faverify.kernels.triton.common import STREAMED
    from faverify.kernels.triton.variant import backward as vb
    from faverify.kernels.triton.variant import decode as vdec
    from faverify.kernels.triton.variant import forward as vf
    from faverify.kernels.triton.variant.interface import COMBINE_SPLITS, SPLIT_BLOCK

    fast = v.even_d and v.kernel != "vcombine"

    on = set(v.switches.split("+")) - {""}
    if v.kernel == "vcombine":
        fn, tile = vf._combine_kernel, None
        constants = {"BLOCK_S": COMBINE_SPLITS, "BLOCK_DV": v.block_dv, "INTERPRETED": False}
        options = {"num_warps": 4, "num_stages": 1}
        pointers = {name: "*fp32" for name in ("OutSplits", "LseSplits", "Lse")} | {"Out": f"*{v.dtype}"}
    elif v.kernel == "vdecode":
        fn, tile = vdec._decode_kernel, configs.decode(ELEM[v.dtype], fast)
        constants = dict(SOFTCAP="softcap" in on, SPLIT_BLOCK=SPLIT_BLOCK if "split" in on else 0,
                         BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_D=v.block_d, BLOCK_DV=v.block_dv,
                         EVEN_D=fast, EVEN_DV=fast, INTERPRETED=False, IEEE=v.dtype == "fp32")
        options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
        pointers = {name: "*fp32" for name in ("Lse", "Alibi", "Sinks")}
        pointers.update({name: "*i32" for name in ("BlockTable", "CacheSeqlens")})
        if "split" in on:
            pointers["Out"] = "*fp32"  # the split partials
    else:
        kind = v.kernel[1:]
        tile = configs.variant(kind, max(v.block_d, v.block_dv), ELEM[v.dtype], "varlen" in on,
                               bool(on & {"bias", "blocks"}), fast, capability // 10)
        constants = dict(SOFTCAP="softcap" in on, VARLEN="varlen" in on, BIAS="bias" in on, BLOCKS="blocks" in on,
                         BLOCK_M=tile.block_m,
                         BLOCK_N=tile.block_n, BLOCK_D=v.block_d, BLOCK_DV=v.block_dv, EVEN_D=fast,
                         EVEN_DV=fast, INTERPRETED=False, IEEE=v.dtype == "fp32")
        fn = {"fwd": vf._fwd_kernel, "dkdv": vb._dkdv_kernel, "dq": vb._dq_kernel}[kind]
        if kind == "dq":
            constants["DBIAS"] = "dbias" in on
        if kind == "fwd":
            constants.update(PAGED="paged" in on, STATS="split" not in on,
                             SPLIT_BLOCK=SPLIT_BLOCK if "split" in on else 0)
        options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
        pointers = {name: "*fp32" for name in ("Lse", "Rowmax", "Log2l", "Delta", "Alibi", "Sinks")}
        pointers.update({name: "*i32" for name in ("CuQ", "CuK", "BlockTable", "CacheSeqlens")})
        pointers.update(Bias="*fp32", Blocks="*i8", DBias="*fp32")
        if "split" in on:
            pointers["Out"] = "*fp32"  # the split partials
    signature = _signature(fn, v.dtype, constants, pointers)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if fast and name in STREAMED}
    return ASTSource(fn, signature, constants, attrs), options, str(tile) if tile else "M16"


def _sparse_source(v, capability: int):
    """(source, options, tile) of a sparse-indices kernel (sparse.py) as sparse.forward and backward launch it:
    the group's rows padded to 16, BLOCK_N listed keys a tile."""
    from triton.compiler import ASTSource

    from faverify.kernels.triton import sparse

    fn = {"sfwd": sparse._sparse_fwd, "sbwd": sparse._sparse_bwd}[v.kernel]
    constants = dict(BLOCK_T=1, BLOCK_M=16, BLOCK_N=sparse.BLOCK_N, BLOCK_D=v.block_d,
                     BLOCK_DV=v.block_dv or v.block_d, INTERPRETED=False, IEEE=v.dtype == "fp32")
    pointers = {name: "*fp32" for name in ("Lse", "Rowmax", "Log2l", "Delta", "DK", "DV")} | {"Idx": "*i32"}
    if v.kernel == "sfwd":
        pointers.pop("DV")
    source = ASTSource(fn, _signature(fn, v.dtype, constants, pointers), constants, {})
    return source, {"num_warps": 4, "num_stages": 1}, f"M16 N{sparse.BLOCK_N}"


def _fp8_source(v, capability: int):
    """(source, options, tile) of the FP8 forward (fp8.py) as fp8_attn_func launches it: e4m3 q, k, v, fp32
    descales, bf16 out."""
    from triton.compiler import ASTSource

    from faverify.kernels.triton import fp8

    constants = dict(CAUSAL=v.causal, BLOCK_M=fp8.BLOCK_M, BLOCK_N=fp8.BLOCK_N, BLOCK_D=v.block_d, INTERPRETED=False)
    pointers = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv", "Out": "*bf16", "Lse": "*fp32", "QD": "*fp32",
                "KD": "*fp32", "VD": "*fp32"}
    signature = _signature(fp8._fp8_fwd, v.dtype, constants, pointers)
    signature["scale_log2"] = "fp32"
    return ASTSource(fp8._fp8_fwd, signature, constants, {}), {"num_warps": 4, "num_stages": 2}, \
        f"M{fp8.BLOCK_M} N{fp8.BLOCK_N}"
