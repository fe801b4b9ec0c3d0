#!/usr/bin/env bash
# The compressed index on one GPU: its GPU tests, then benchmarks/retrieval.py (ours exact, ours
# compressed, fast-plaid) at the sizes in RETRIEVAL_DOCS. JSON and logs go to $OUT. fast-plaid and
# its needs travel as wheels in .gpu-wheels/ (git-ignored), fetched beforehand with
#   pip download --no-deps --python-version 3.12 --only-binary=:all: \
#       --platform manylinux_2_28_x86_64 -d .gpu-wheels \
#       fast-plaid==1.7.0.2110 fastkmeans==0.5.0 usearch numkong joblib filelock
#   RETRIEVAL_DOCS="100000" RETRIEVAL_SYSTEMS="exact compressed fast-plaid" bash tools/gpu/compressed_index.sh
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-wheels/*.whl \
    > "$OUT/pip.log" 2>&1 || echo "fast-plaid wheels not installed (see pip.log)"
export PYTHONPATH=shared/triton-dispatch/src:packages/late-interaction-kernels/src:/tmp/site
export PYTHONUNBUFFERED=1
if [ "${RUN_TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -x packages/late-interaction-kernels/tests/test_compressed_index.py \
        -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/tests.log"
fi
for n in ${RETRIEVAL_DOCS:-100000}; do
    python3 packages/late-interaction-kernels/benchmarks/retrieval.py --docs "$n" \
        --systems ${RETRIEVAL_SYSTEMS:-exact compressed fast-plaid} \
        --options "${RETRIEVAL_OPTIONS:-}" --search-settings "${RETRIEVAL_SEARCH:-}" \
        ${RETRIEVAL_FP:+--fast-plaid-settings "$RETRIEVAL_FP"} ${RETRIEVAL_FLAGS:-} --out "$OUT/retrieval-$n${RETRIEVAL_TAG:-}.json" 2>&1 | tee -a "$OUT/retrieval.log"
done
