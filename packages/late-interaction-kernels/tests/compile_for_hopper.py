"""Compile every MaxSim kernel for an sm_90 target without a GPU (run as a script by
``test_kernels_compile_for_gpu``): catches code the interpreter accepts but the compiler rejects."""

import concurrent.futures
import multiprocessing
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from late_interaction_kernels.ops.compressed import kernels as compressed
from late_interaction_kernels.ops.maxsim import backward, forward

TARGET = GPUTarget("cuda", 90, 32)


def jit_fn(kernel):
    fn = kernel
    while not isinstance(fn, triton.runtime.jit.JITFunction):
        fn = fn.fn
    return fn


def compile_one(kernel, signature, constexprs) -> None:
    fn = jit_fn(kernel)
    signature = dict(signature, **{name: "constexpr" for name in constexprs})
    # the launcher specialises pointers and integers divisible by 16 (aligned buffers, d=128,
    # lq=32, ...); several layout passes only take the paths that fail with those hints present
    attrs = {
        (fn.arg_names.index(name),): [["tt.divisibility", 16]]
        for name, ty in signature.items()
        if ty != "constexpr"
    }
    triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET)


#: (label, kernel, signature, constexprs) of every compile main() asks for
JOBS: list[tuple] = []


def _run(index: int) -> str | None:
    label, *args = JOBS[index]
    try:
        compile_one(*args)
    except Exception as exc:
        return f"{label}: {type(exc).__name__}: {str(exc)[-1500:]}"
    return None


def main() -> int:
    def check(label, *args):
        JOBS.append((label, *args))

    fwd = {
        "Q": "*bf16", "D": "*bf16", "QM": "*u8", "DM": "*u8", "CUQ": "*i32", "CUD": "*i64",
        "PARTIAL": "*fp32", "ARGMAX": "*i32", "n_doc": "i32", "lq": "i32", "ld": "i32",
        "chunk_len": "i32", "n_chunks": "i32", "d_bound": "i32", "dim": "i32", "LQ_BUCKET": "i32",
    }  # fmt: skip
    for layout in (0, 1, 2, 3, 4):
        for dtype, norm, blocks in (
            ("bf16", True, (64, 64)), ("fp32", False, (16, 128)), ("bf16", False, (128, 256)),
        ):  # fmt: skip
            cx = dict(
                LAYOUT=layout, HAS_QM=layout != 3, HAS_DM=layout != 3, SAVE_ARGMAX=not norm,
                UPCAST=False, NORMALIZE=norm, NORM_EPS=1e-12, IEEE=dtype == "fp32",
                DYNAMIC_BOUNDS=True, EVEN_K=dtype == "bf16", BLOCK_K=64, BLOCK_Q=blocks[0], BLOCK_D=blocks[1],
            )  # fmt: skip
            sig = dict(fwd, Q="*" + dtype, D="*" + dtype)
            for tile_max in (False, True):
                label = f"forward layout={layout} {dtype} tile_max={tile_max}"
                check(label, forward.maxsim_fwd_kernel, sig, dict(cx, TILE_MAX=tile_max))
    tma = dict(fwd, QDESC="tensordesc<bf16[128,128]>", DDESC="tensordesc<bf16[64,128]>")
    del tma["LQ_BUCKET"]
    for layout in (0, 1, 2, 3, 4):
        for norm in (False, True):
            cx = dict(
                LAYOUT=layout, HAS_QM=layout != 3, HAS_DM=layout != 3, SAVE_ARGMAX=not norm,
                UPCAST=False, NORMALIZE=norm, NORM_EPS=1e-12, IEEE=False, DYNAMIC_BOUNDS=True,
                EVEN_K=True, BLOCK_K=128, BLOCK_Q=128, BLOCK_D=64,
            )  # fmt: skip
            label = f"forward tma layout={layout} normalize={norm}"
            check(label, forward.maxsim_fwd_tma_kernel, tma, cx)
    group = {
        "Q": "*bf16", "D": "*bf16", "QM": "*u8", "DM": "*u8", "PARTIAL": "*fp32", "ARGMAX": "*i32",
        "n_query": "i32", "n_doc": "i32", "lq": "i32", "ld": "i32", "dim": "i32",
    }  # fmt: skip
    for qgroup, blocks, norm, even in ((32, (128, 64), False, True), (16, (64, 128), True, False)):
        cx = dict(
            QGROUP=qgroup, HAS_QM=True, HAS_DM=True, SAVE_ARGMAX=not norm, UPCAST=False,
            NORMALIZE=norm, NORM_EPS=1e-12, IEEE=False, EVEN_K=even, BLOCK_K=128,
            BLOCK_Q=blocks[0], BLOCK_D=blocks[1], TILE_MAX=qgroup == 32,
        )  # fmt: skip
        check(f"forward query groups {qgroup}", forward.maxsim_fwd_query_group_kernel, group, cx)
    for layout in (0, 3, 4):
        cx = dict(LAYOUT=layout, NORMALIZE=layout == 3, BLOCK_K=128, BLOCK_Q=32)
        common = {"G": "*fp32", "ARGMAX": "*i32", "CUQ": "*i32", "n_doc": "i32", "lq": "i32",
                  "dim": "i32", "LQ_BUCKET": "i32"}  # fmt: skip
        sig = {"G": "*fp32", "D": "*bf16", "ARGMAX": "*i32", "CUQ": "*i32", "GQ": "*fp32",
               "n_doc": "i32", "docs_per_split": "i32", "q_rows": "i32", "lq": "i32", "dim": "i32",
               "LQ_BUCKET": "i32"}  # fmt: skip
        check(f"grad_q layout={layout}", backward.maxsim_grad_q_kernel, sig, cx)
        sig = {"G": "*fp32", "Q": "*fp16", "ARGMAX": "*i32", "CUQ": "*i32", "GD": "*fp32", **common}
        check(f"grad_d atomic layout={layout}", backward.maxsim_grad_d_atomic_kernel, sig, cx)
        sig = {"G": "*fp32", "Q": "*bf16", "ORDER": "*i64", "OFFSETS": "*i64", "CUQ": "*i64",
               "GD": "*bf16", "n_rows": "i32", "n_doc": "i32", "lq": "i32", "dim": "i32"}  # fmt: skip
        cx = dict(LAYOUT=layout, NORMALIZE=layout == 3, BLOCK_K=128, BLOCK_R=32)
        check(f"grad_d owner layout={layout}", backward.maxsim_grad_d_owner_kernel, sig, cx)
    dense = {"G": "*fp32", "Q": "*bf16", "D": "*bf16", "ARGMAX": "*i32", "GD": "*bf16",
             "GQP": "*fp32", "GQ": "*bf16", "n_query": "i32", "n_doc": "i32", "lq": "i32",
             "ld": "i32", "dim": "i32", "rows_per_program": "i32", "n_split": "i32",
             "q_rows": "i32"}  # fmt: skip
    for layout, dtype, norm, blocks in (
        (0, "bf16", False, (64, 32)), (1, "bf16", True, (128, 64)), (1, "fp16", False, (32, 16)),
        (1, "fp32", True, (64, 32)),
    ):  # fmt: skip
        for one_chunk in ((False, True) if layout else (False,)):
            cx = dict(LAYOUT=layout, NORMALIZE=norm, UPCAST=False, IEEE=dtype == "fp32",
                      ONE_CHUNK=one_chunk, FINISH_Q=one_chunk or not layout, BLOCK_K=128,
                      BLOCK_R=blocks[0], BLOCK_T=blocks[1], BLOCK_S=32)  # fmt: skip
            sig = dict(dense, Q="*" + dtype, D="*" + dtype, GD="*" + dtype, GQ="*" + dtype)
            label = (f"grad_d dense layout={layout} {dtype} normalize={norm} one_chunk={one_chunk} "
                     f"finish_q={cx['FINISH_Q']}")  # fmt: skip
            check(label, backward.maxsim_grad_d_dense_kernel, sig, cx)
    sig = {"G": "*fp32", "X": "*bf16", "OUT": "*fp32", "n_rows": "i32", "dim": "i32"}
    check("normalize backward", backward.normalize_backward_kernel, sig, dict(BLOCK_K=64, BLOCK_R=32))
    # the compressed index's pair kernels, at the shapes and dtypes a search launches them with
    sig = {"QCS": "*fp16", "PAIR_Q": "*i32", "PAIR_D": "*i32", "CODES": "*i32", "DOC_OFF": "*i64",
           "OUT": "*fp32", "n_centroids": "i32", "lq": "i32", "max_len": "i32"}  # fmt: skip
    check("compressed centroid pairs", compressed.centroid_pair_kernel, sig,
          dict(DYNAMIC_BOUNDS=True, BLOCK_L=64, BLOCK_Q=32))  # fmt: skip
    sig = {"QCS": "*fp16", "PROBES": "*i64", "LIST_OFF": "*i64", "LIST_DOCS": "*i32", "CODES": "*i32",
           "DOC_OFF": "*i64", "OUT": "*fp32", "n_probes": "i32", "n_centroids": "i32", "n_docs": "i32",
           "lq": "i32", "max_len": "i32", "per_program": "i32"}  # fmt: skip
    check("compressed probed lists", compressed.probed_lists_kernel, sig,
          dict(DYNAMIC_BOUNDS=True, BLOCK_L=64, BLOCK_Q=32))  # fmt: skip
    pairs = {"Q": "*fp16", "PAIR_Q": "*i32", "PAIR_D": "*i32", "DOC_OFF": "*i64", "TOKENS": "*fp16",
             "CODES": "*i32", "PACKED": "*u8", "C": "*fp16", "W": "*fp32", "OUT": "*fp32",
             "lq": "i32", "dim": "i32", "width": "i32", "max_len": "i32"}  # fmt: skip
    for compressed_tokens, nbits, dtype in ((True, 2, "fp16"), (True, 4, "fp16"), (False, 1, "fp16"),
                                             (True, 2, "fp32"), (False, 1, "fp32")):  # fmt: skip
        cx = dict(COMPRESSED=compressed_tokens, NBITS=nbits, PER_BYTE=8 // nbits, UPCAST=dtype == "fp32",
                  DYNAMIC_BOUNDS=True, IEEE=dtype == "fp32", BLOCK_Q=32, BLOCK_T=64, BLOCK_D=128)  # fmt: skip
        sig = dict(pairs, Q="*" + dtype, TOKENS="*" + dtype, C="*" + dtype)
        check(f"compressed pair maxsim compressed={compressed_tokens} nbits={nbits} {dtype}",
              compressed.pair_maxsim_kernel, sig, cx)  # fmt: skip
    # each compile is one CPU's work: forked workers (the kernels stay in JOBS, never pickled)
    workers = min(len(JOBS), os.cpu_count() or 1)
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        failures = [f for f in pool.map(_run, range(len(JOBS))) if f is not None]
    print("\n".join(failures) or "all kernels compiled")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
