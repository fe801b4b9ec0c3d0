"""The plan of a ``snake_conv`` call: tile sizes and both launches bound once per kind of call
(layer shapes and flags, activation length), so a repeat call allocates its outputs and launches."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import NamedTuple

import torch

from triton_dispatch import device_facts, next_power_of_2, tile_shared_memory
from triton_dispatch.declaration import Call
from triton_dispatch.launch import KernelLaunch
from triton_dispatch.tma import TensorDescriptor, aligned, tma_supported

from .reference import output_length, rows_for

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: a 1x1 convolution (or a head) folds in only while a row of channels fits one tile
WHOLE_ROW_MAX = 128
#: the layer's tensors in the kernel's order; those a layer lacks are bound to a stand-in
LAYER_TENSORS = (
    "weight", "bias", "pw_weight", "pw_bias", "pw_alpha", "pw_inv_beta", "out_alpha",
    "out_inv_beta", "head_weight",
)  # fmt: skip


def padded_size(n: int, block: int) -> int:
    """``n`` rounded up to a power of two (at least 16, what ``tl.dot`` takes) below ``block``,
    to a multiple of ``block`` above it: the extent a tile loop covers."""
    if n <= block:
        return max(16, next_power_of_2(n))
    return -(-n // block) * block


class Tiles(NamedTuple):
    """A launch's tile sizes, warps, pipeline stages and load cache modifiers."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    a_cache: str = ""
    w_cache: str = ""
    persistent: int = 0  # programs per SM, each walking tiles; 0: one program per tile


def launch_config(taps: int, phases: int, n_p: int, cin_p: int, whole_row: bool, pointwise: bool,
                  rows: int, interpret: bool, tma: bool = False, shared_memory: int = 232_448,
                  element_size: int = 2) -> Tiles:  # fmt: skip
    """The :class:`Tiles` of a layer over ``rows`` GEMM rows (all batch rows together); ``tma``:
    the main loop reads through tensor descriptors (Hopper); ``shared_memory``: the device's
    bytes per block; ``element_size``: the activations' bytes per value."""
    block_n = n_p if whole_row else min(128, n_p)
    block_k = min(64, cin_p)
    if interpret:
        return Tiles(32, block_n, block_k, 4, 1)
    wide = Tiles(128, block_n, block_k, 8, 3)
    # its operands with a buffer per stage (an upper bound: Triton keeps one stage fewer but for
    # Hopper's wgmma) are 96 KB in half precision and 192 KB in fp32, so fp32 takes the default
    # tile where a block has less: on an RTX 4090 or 5090 (99 KB) it compiles to 128 KB
    if (taps > 1 and phases == 1 and not pointwise and rows >= 1 << 15
            and _operand_bytes(wide, element_size) <= shared_memory):  # fmt: skip
        return wide  # wide dilated convolutions over many rows
    if tma and ((phases > 1 and n_p <= 1024) or (taps == 1 and n_p <= 512)):
        # a main loop of a few K steps and an epilogue that stores as much as it reads: two
        # programs per SM walking the tiles overlap one tile's stores with the next one's loads
        # (H100 sweep: 12-27 % faster; wider layers of these kinds and the residual units ran
        # slower so)
        return Tiles(64, block_n, block_k, 4, 4 if phases > 1 else 3, persistent=2)
    # elsewhere (1x1, transposed, the fused residual unit) a smaller tile lets two or three
    # programs share an SM, so one's epilogue overlaps another's main loop (H200 sweep)
    return Tiles(64, block_n, block_k, 4, 3)


def _operand_bytes(tiles: Tiles, element_size: int) -> int:
    """Shared memory of a tile's pipelined operands, one buffer per stage."""
    a, w = (tiles.block_m, tiles.block_k), (tiles.block_k, tiles.block_n)
    return tile_shared_memory(a, w, element_size=element_size, num_stages=tiles.stages)


def output(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A new output buffer (the tests poison it through this function)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def snake_conv_plan(call: Call) -> SimpleNamespace | None:
    """The launches of a validated call; ``None`` (the reference) for float64 and empty calls."""
    from .kernels import snake_conv_kernel, tap_sum_kernel  # Triton loads once a kernel is planned

    x, weight, head_w = call["x"], call["weight"], call["head_weight"]
    if x.dtype not in KERNEL_DTYPES or x.numel() == 0:
        return None
    batch, length_in, cin = x.shape
    taps, _, n = weight.shape
    phases, shift, store_out = call["phases"], call["shift"], call["store_out"]
    cout, length = n // phases, output_length(length_in, phases, shift)
    pointwise, head = call["pw_weight"] is not None, head_w is not None
    snake_out = call["out_alpha"] is not None and not head
    rows = rows_for(length, phases, shift)
    cin_p = padded_size(cin, 64)
    n_p = max(16, next_power_of_2(n)) if pointwise or head else padded_size(n, 128)
    head_taps, head_c = (head_w.shape[0], head_w.shape[2]) if head else (1, 1)
    head_p = max(16, next_power_of_2(head_taps * head_c))
    interpret = call.backend == "interpret"
    tma = _tma_fits(x, cin, cin_p, n, n_p, interpret)
    smem = device_facts(x.device).shared_memory_per_block
    tiles = launch_config(taps, phases, n_p, cin_p, pointwise or head, pointwise, rows * batch,
                          interpret, tma, smem, x.element_size())  # fmt: skip
    stand_in = torch.zeros(1, dtype=torch.float32, device=x.device)  # never read
    absent = {name: stand_in for name in LAYER_TENSORS if call[name] is None}
    absent.update(x_desc=stand_in, w_desc=stand_in)
    per_call = {"residual": call["residual"] is not None, "out": store_out,
               "snake_out": snake_out, "partial": head}  # fmt: skip
    absent.update({name: stand_in for name, given in per_call.items() if not given})
    bound = dict(
        absent, L_in=length_in, L_out=length, rows=rows, batch=batch,
        CIN=cin, CIN_P=cin_p, N=n, N_P=n_p, COUT=cout, TAPS=taps, DIL=call["dilation"],
        PAD=call["padding"], PHASES=phases, SHIFT=shift, HAS_BIAS=call["bias"] is not None,
        POINTWISE=pointwise, PW_BIAS=call["pw_bias"] is not None,
        RESIDUAL=call["residual"] is not None, STORE_OUT=store_out, STORE_SNAKE=snake_out,
        HEAD=head, HEAD_TAPS=head_taps, HEAD_C=head_c, HEAD_P=head_p,
        FAST_SIN=not interpret and x.dtype != torch.float32, IEEE=x.dtype == torch.float32,
        TMA=False, PERSISTENT=tiles.persistent > 0,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        A_CACHE=tiles.a_cache, W_CACHE=tiles.w_cache,
    )  # fmt: skip
    grid = (-(-rows // tiles.block_m), n_p // tiles.block_n, batch)
    if tiles.persistent:
        grid = (min(math.prod(grid), device_facts(x.device).sm_count * tiles.persistent), 1, 1)
    options = {"num_warps": tiles.warps, "num_stages": tiles.stages}
    launch = KernelLaunch(snake_conv_kernel, grid, bound, device=x.device, options=options)
    if tma:
        launch = _with_tma(launch, snake_conv_kernel, grid, bound, options, tiles, x, n)
    shape = (batch, length, cout)
    # a launch's per-call arguments as compiles ahead of the call take them: the layer's own
    # tensors, dtypes where the call's activations and outputs go
    ahead = [x.dtype, *(call[name] for name in LAYER_TENSORS if call[name] is not None)]
    ahead += [x.dtype] if call["residual"] is not None else []
    ahead += [x.dtype] * store_out
    if not head:

        def forward(x, *tensors):
            out = output(shape, x) if store_out else None
            act = output(shape, x) if snake_out else None
            launch(*(t for t in (x, *tensors, out, act) if t is not None))
            return _or_empty(out, x), _or_empty(act, x)

        ahead += [x.dtype] * snake_out
        return SimpleNamespace(forward=forward, compile_ahead=lambda: launch.compile_ahead(*ahead))

    block_t = 64 if interpret else 512
    tap_sum = KernelLaunch(
        tap_sum_kernel, (-(-length // block_t), batch),
        dict(L=length, C=head_c, C_P=next_power_of_2(head_c), HEAD_P=head_p, TAPS=head_taps,
             DIL=call["head_dilation"], PAD=call["head_padding"],
             HAS_BIAS=call["head_bias"] is not None, BLOCK_T=block_t,
             **({} if call["head_bias"] is not None else {"bias_ptr": stand_in})),
        device=x.device,
    )  # fmt: skip
    audio_shape = (batch, length, head_c)

    def forward_with_head(x, *tensors):
        *layer, head_bias, residual = tensors
        out = output(shape, x) if store_out else None
        partial = torch.empty((batch, length, head_p), dtype=torch.float32, device=x.device)
        launch(*(t for t in (x, *layer, residual, out, partial) if t is not None))
        audio = output(audio_shape, x)
        tap_sum(*(t for t in (partial, head_bias, audio) if t is not None))
        return _or_empty(out, x), audio

    def compile_ahead() -> None:
        launch.compile_ahead(*ahead, torch.float32)
        head_bias = () if call["head_bias"] is None else (call["head_bias"],)
        tap_sum.compile_ahead(torch.float32, *head_bias, x.dtype)

    return SimpleNamespace(forward=forward_with_head, compile_ahead=compile_ahead)


def _or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """An output the layer does not give, as the op returns it: an empty tensor."""
    return like.new_empty(0) if t is None else t


def _tma_fits(x: torch.Tensor, cin: int, cin_p: int, n: int, n_p: int, interpret: bool) -> bool:
    """Whether the main loop can read through tensor descriptors: a Hopper GPU, half precision,
    whole channel tiles with 16-byte rows, int32 coordinates."""
    return (
        not interpret
        and tma_supported(x.device)
        and x.dtype in (torch.float16, torch.bfloat16)
        and cin == cin_p
        and n == n_p
        and cin % 8 == 0
        and n % 8 == 0
        and x.shape[1] < 2**31 - 2**16
    )


def _with_tma(pointer_launch, kernel, grid, bound, options, tiles: Tiles, x, n: int):
    """The launch through descriptors, falling back to ``pointer_launch`` for a call whose
    tensors do not start on 16 bytes."""
    tma = KernelLaunch(kernel, grid, {**{k: v for k, v in bound.items() if not k.endswith("_desc")},
                                      "TMA": True}, device=x.device, options=options)  # fmt: skip
    batch, length_in, cin = x.shape
    x_box = [1, tiles.block_m, tiles.block_k]
    w_box = [tiles.block_k, tiles.block_n]

    def descriptors(x: torch.Tensor, weight: torch.Tensor) -> tuple:
        x_desc = TensorDescriptor(x, [batch, length_in, cin], [length_in * cin, cin, 1], x_box)
        taps_cin = weight.shape[0] * weight.shape[1]
        return x_desc, TensorDescriptor(weight, [taps_cin, n], [n, 1], w_box)

    def launch(x, weight, *rest):
        if not (aligned(x) and aligned(weight)):
            return pointer_launch(x, weight, *rest)
        tma(x, weight, *rest, *descriptors(x, weight))

    def compile_ahead(x_dtype: torch.dtype, weight: torch.Tensor, *rest) -> None:
        # the kernel specialises on a descriptor's block and dtype, not on its base: a stand-in
        # base of the activations' dtype gives the call's kernel
        stand_in = torch.empty(8, dtype=x_dtype, device=weight.device)
        tma.compile_ahead(x_dtype, weight, *rest, *descriptors(stand_in, weight))

    launch.compile_ahead = compile_ahead
    return launch
