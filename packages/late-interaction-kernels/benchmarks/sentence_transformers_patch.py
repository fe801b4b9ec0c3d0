"""Sentence Transformers 6 multi-vector scoring, unpatched against ``patch_sentence_transformers()``.

    python3 packages/late-interaction-kernels/benchmarks/sentence_transformers_patch.py --out st.json [--quick]

* ``mnrl-scoring``: the scoring of ``MultiVectorMultipleNegativesRankingLoss`` (``colbert_scores``
  over the stacked in-batch documents, one hard negative each, cross-entropy), forward +
  backward, on normalised bf16 embeddings as a bf16-autocast training step produces them, Lq 32,
  Ld 180 (a quarter of the document tokens padding), d 128, batch 32-128.
* ``similarity``: ``maxsim`` as ``MultiVectorEncoder.similarity`` runs it, 32 queries against
  1000-10000 documents (inference).
* ``distill``: ``colbert_kd_scores`` of ``MultiVectorDistillKLDivLoss`` (each query against its
  own 32 candidates), forward + backward.

Both sides run in this process: the library's own code first, then the same call patched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from late_interaction_kernels.integrations import sentence_transformers as st_patch
from triton_dispatch.bench import benchmark_arguments, compare, report


def _embeddings(n, length, dim, valid, device, dtype, grad=False):
    x = F.normalize(torch.randn(n, length, dim, device=device), dim=-1).to(dtype)
    mask = torch.arange(length, device=device) < valid
    mask = mask.expand(n, length).clone()
    x = x * mask.unsqueeze(-1).to(dtype)
    return x.requires_grad_(grad), mask


def _patched(fn):
    """``fn`` with the patch in place. ``compare`` times the baseline first, so patching on the
    first call of this side leaves the baseline unpatched and keeps the patching out of the
    timings; :func:`main` unpatches after each case."""

    def run():
        if not st_patch.is_patched():
            st_patch.patch_sentence_transformers()
        return fn()

    return run


def mnrl_case(batch, device, dtype):
    from sentence_transformers.multi_vector_encoder.scoring import colbert_scores

    q, q_mask = _embeddings(batch, 32, 128, 32, device, dtype, grad=True)
    d, d_mask = _embeddings(batch * 2, 180, 128, 135, device, dtype, grad=True)
    docs = d.view(batch, 2, 180, 128)
    docs_mask = d_mask.view(batch, 2, 180)
    labels = torch.arange(batch, device=device) * 2

    def step():
        scores = colbert_scores(q, docs, queries_mask=q_mask, documents_mask=docs_mask)
        F.cross_entropy(scores, labels).backward()
        q.grad = d.grad = None

    return step


def similarity_case(n_docs, device, dtype):
    from sentence_transformers.util.similarity import maxsim

    q, q_mask = _embeddings(32, 32, 128, 32, device, dtype)
    d, d_mask = _embeddings(n_docs, 180, 128, 135, device, dtype)
    return lambda: maxsim(q, d, a_mask=q_mask, b_mask=d_mask)


def distill_case(batch, device, dtype):
    # looked up per call: the patch replaces the module's binding
    from sentence_transformers.multi_vector_encoder import scoring

    q, q_mask = _embeddings(batch, 32, 128, 32, device, dtype, grad=True)
    d, d_mask = _embeddings(batch * 32, 180, 128, 135, device, dtype, grad=True)
    docs, docs_mask = d.view(batch, 32, 180, 128), d_mask.view(batch, 32, 180)
    teacher = torch.randn(batch, 32, device=device).log_softmax(-1)

    def step():
        scores = scoring.colbert_kd_scores(q, docs, queries_mask=q_mask, documents_mask=docs_mask)
        F.kl_div(scores.log_softmax(-1), teacher, log_target=True, reduction="batchmean").backward()
        q.grad = d.grad = None

    return step


def main() -> None:
    args = benchmark_arguments(__doc__.splitlines()[0]).parse_args()
    import sentence_transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    quick = args.quick or device == "cpu"
    cases = [
        *(("mnrl-scoring", {"batch": b}, mnrl_case(b, device, dtype)) for b in ((4,) if quick else (32, 64, 128))),
        *(("similarity", {"docs": n}, similarity_case(n, device, dtype)) for n in ((8,) if quick else (1000, 10000))),
        *(("distill", {"batch": b}, distill_case(b, device, dtype)) for b in ((2,) if quick else (16, 32))),
    ]  # fmt: skip
    records = []
    for name, shape, fn in cases:
        record = compare(
            name,
            {**shape, "Lq": 32, "Ld": 180, "d": 128, "dtype": str(dtype).removeprefix("torch.")},
            ours=_patched(fn),
            baseline=fn,
            baseline_name=f"sentence-transformers {sentence_transformers.__version__}",
            device=device,
            warmup=3 if quick else 10,
            rep=5 if quick else 50,
        )
        st_patch.unpatch_sentence_transformers()
        records.append(record)
        print(record.name, record.shape, record.baseline_ms, record.ours_ms, flush=True)
    report(records, args.out, meta={"script": "sentence_transformers_patch.py", "quick": quick})


if __name__ == "__main__":
    main()
