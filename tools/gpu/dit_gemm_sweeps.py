"""Sweeps of two ideas for the DiT's non-GEMM time on one block's shapes of ACE-Step 1.5
(published size, bf16), against what they would replace. Imported by ``dit_forward.py --sweeps
gate_up,cross``.

* ``gate_up``: the MLP's gate/up GEMM with the SwiGLU gate as its epilogue, a persistent Triton
  GEMM (TMA loads, one activation tile for two accumulators) defined here, against cuBLAS's GEMM
  plus the package's SwiGLU pass. Not shipped: on an H200 it reached 512-545 TFLOP/s against
  cuBLAS's 686-700, so the fused pair ran 0.82-0.87x the split one.
* ``cross``: the package's few-keys attention kernel (cross-attention) against the flash kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _gate_up_swiglu_kernel(
    x_desc, gate_desc, up_desc, out_desc, n_rows, inner, width,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tiles_m = tl.cdiv(n_rows, BLOCK_M)
    tiles_n = tl.cdiv(inner, BLOCK_N)
    k_steps = tl.cdiv(width, BLOCK_K)
    per_group = GROUP_M * tiles_n
    # tiles in groups of GROUP_M row blocks, column-major inside a group: the programs running
    # side by side share weight tiles in L2
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        first_m = tile // per_group * GROUP_M
        rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
        row0 = (first_m + tile % per_group % rows_in_group) * BLOCK_M
        col0 = tile % per_group // rows_in_group * BLOCK_N
        acc_gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k in range(k_steps):
            x = x_desc.load([row0, k * BLOCK_K])
            acc_gate = tl.dot(x, gate_desc.load([col0, k * BLOCK_K]).T, acc_gate,
                              input_precision=PRECISION)  # fmt: skip
            acc_up = tl.dot(x, up_desc.load([col0, k * BLOCK_K]).T, acc_up,
                            input_precision=PRECISION)  # fmt: skip
        act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
        out_desc.store([row0, col0], act.to(out_desc.dtype))



def gate_up_sweep(rows_list=(1000, 6000, 12000)) -> list:
    """``gate_up_swiglu``'s persistent kernel over block configs, against cuBLAS's gate/up GEMM
    followed by the SwiGLU pass (and the GEMM alone: the floor the fusion has to beat)."""
    import torch.nn.functional as F
    import triton.testing

    from stream_dit.ops.swiglu import swiglu
    from triton_dispatch.tma import TensorDescriptor

    out_rows = []
    width, inner = 2048, 6144
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    weight = torch.randn(2 * inner, width, device="cuda", dtype=torch.bfloat16) / 45
    for m in rows_list:
        x = torch.randn(m, width, device="cuda", dtype=torch.bfloat16)
        flop = 2 * m * width * 2 * inner
        gemm = triton.testing.do_bench(lambda x=x: F.linear(x, weight), rep=200)
        split = triton.testing.do_bench(lambda x=x: swiglu(F.linear(x, weight)), rep=200)
        ref = swiglu(F.linear(x, weight)).float()
        base = {"rows": m, "cublas_gemm_ms": gemm, "cublas_plus_swiglu_ms": split}
        print(f"gate_up rows={m}: cuBLAS GEMM {gemm:.4f} ms ({flop / gemm / 1e9:.0f} TFLOP/s), "
              f"+swiglu {split:.4f} ms", flush=True)  # fmt: skip
        for bm, bn, bk, group, warps, stages, progs in (
            (128, 128, 64, 8, 8, 3, 1),
            (128, 128, 64, 8, 8, 4, 1),
            (128, 128, 64, 16, 8, 3, 1),
            (128, 64, 64, 8, 4, 4, 1),
            (128, 64, 64, 8, 8, 4, 1),
            (64, 128, 64, 8, 4, 4, 1),
            (128, 128, 64, 8, 8, 3, 2),
            (128, 64, 64, 8, 4, 4, 2),
            (128, 128, 128, 8, 8, 2, 1),
            (256, 64, 64, 8, 8, 3, 1),
        ):
            out = torch.empty(m, inner, device="cuda", dtype=torch.bfloat16)
            tiles = triton.cdiv(m, bm) * triton.cdiv(inner, bn)
            programs = min(progs * sms, tiles)
            descs = (
                TensorDescriptor(x, [m, width], [width, 1], [bm, bk]),
                TensorDescriptor(weight[:inner], [inner, width], [width, 1], [bn, bk]),
                TensorDescriptor(weight[inner:], [inner, width], [width, 1], [bn, bk]),
                TensorDescriptor(out, [m, inner], [inner, 1], [bm, bn]),
            )

            def run(descs=descs, bm=bm, bn=bn, bk=bk, group=group, warps=warps, stages=stages,
                    programs=programs, m=m):  # fmt: skip
                _gate_up_swiglu_kernel[(programs,)](
                    *descs, m, inner, width, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group,
                    PROGRAMS=programs, PRECISION="tf32", num_warps=warps, num_stages=stages,
                )  # fmt: skip

            config = [bm, bn, bk, group, warps, stages, progs]
            try:
                run()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                ms = triton.testing.do_bench(run, rep=200)
            except Exception as exc:  # a config that does not fit the card
                print("  config failed", config, str(exc)[:160], flush=True)
                out_rows.append({**base, "config": config, "error": str(exc)[:300]})
                continue
            out_rows.append({**base, "config": config, "ms": ms, "rel_err_vs_split": err,
                             "tflops": flop / ms / 1e9})  # fmt: skip
            print(f"  {config}: {ms:.4f} ms ({flop / ms / 1e9:.0f} TFLOP/s, {split / ms:.3f}x "
                  f"the split pair) err {err:.1e}", flush=True)  # fmt: skip
    return out_rows


def cross_sweep() -> list:
    """The few-keys attention kernel (cross-attention to 64 conditioning tokens, q and k norms
    folded in, key mask) over query blocks, warps and chunks, against the flash kernel the
    plan used before and cuDNN's SDPA with the mask (no norms)."""
    rows = []
    for batch in (8, 16):
        rows += _cross_case(batch)
    return rows


def _cross_case(batch: int) -> list:
    import torch.nn.functional as F
    import triton.testing

    from stream_dit.ops.attention.kernels import _attention_kernel, _few_keys_attention_kernel

    n, h, hk, d, keys = 750, 16, 8, 128, 64
    rows = []
    cq = torch.randn(batch, n, h, d, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(batch, keys, 2 * hk * d, device="cuda", dtype=torch.bfloat16)
    ck, cv = (p.unflatten(-1, (hk, d)) for p in kv.split(hk * d, -1))
    mask = torch.ones(batch, keys, dtype=torch.bool, device="cuda")
    mask[0, keys // 2 :] = False
    qw = torch.rand(d, device="cuda", dtype=torch.bfloat16) + 0.5
    out = torch.empty(batch, n, h, d, device="cuda", dtype=torch.bfloat16)
    strides = (*cq.stride()[:3], *ck.stride()[:3], *cv.stride()[:3], n * h * d, h * d, d,
               mask.stride(0), mask.stride(1))  # fmt: skip
    scale = d**-0.5 * math.log2(math.e)
    sdpa = triton.testing.do_bench(
        lambda: F.scaled_dot_product_attention(
            cq.transpose(1, 2), ck.transpose(1, 2), cv.transpose(1, 2),
            attn_mask=mask[:, None, None, :], enable_gqa=True,
        )
    )  # fmt: skip

    def flash(bm=128, stages=2):
        _attention_kernel[(triton.cdiv(n, bm), batch * h)](
            cq, ck, cv, out, mask, qw, qw, *strides, n, keys, h, h // hk, scale, 0, 1e-6,
            HAS_MASK=True, Q_NORM=True, K_NORM=True, WINDOWED=False, HEAD_DIM=d,
            BLOCK_M=bm, BLOCK_N=64, PRECISION="tf32", num_warps=4, num_stages=stages,
        )  # fmt: skip

    flash()
    ref = out.float().clone()
    before = triton.testing.do_bench(flash)
    moved = 2 * cq.numel() * 2
    print(f"cross B={batch}: flash kernel (before) {before:.4f} ms, SDPA {sdpa:.4f} ms, "
          f"memory floor {moved / 4.0e9:.4f} ms at 4 TB/s", flush=True)  # fmt: skip
    for bm, warps, chunks in ((64, 4, 1), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 4, 6),
                              (32, 4, 4), (32, 2, 8), (128, 8, 2), (128, 4, 2), (64, 8, 3),
                              (32, 4, 12), (64, 4, 12)):  # fmt: skip
        blocks = triton.cdiv(n, bm)
        chunks = min(chunks, blocks)

        def run(bm=bm, warps=warps, chunks=chunks):
            _few_keys_attention_kernel[(chunks, batch * h)](
                cq, ck, cv, out, mask, qw, qw, *strides, n, keys, h, h // hk, scale, 1e-6,
                HAS_MASK=True, Q_NORM=True, K_NORM=True, HEAD_DIM=d, BLOCK_M=bm,
                BLOCK_N=64, CHUNKS=chunks, PRECISION="tf32", num_warps=warps,
                num_stages=1,
            )  # fmt: skip

        out.fill_(float("nan"))
        run()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ms = triton.testing.do_bench(run)
        rows.append({"batch": batch, "config": [bm, warps, chunks], "ms": ms,
                     "flash_before_ms": before, "sdpa_ms": sdpa, "rel_err_vs_flash": err,
                     "gbps": moved / ms / 1e6})  # fmt: skip
        print(f"  few keys {bm} w{warps} chunks {chunks}: {ms:.4f} ms "
              f"({moved / ms / 1e6:.0f} GB/s) err {err:.1e}", flush=True)  # fmt: skip
    return rows
