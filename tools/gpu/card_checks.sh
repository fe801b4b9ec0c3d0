#!/bin/bash
# One card's checks of the launch tables and first calls, results under $OUT:
#   the read-bound MaxSim forward against flash-maxsim (variants), the first ResidualVQ step
#   (sampled, then plain), the first-call short tune standing in for a card without a table, the
#   peers, the GPU tests, and each package's benchmarks with its table against autotuning.
# CARD_CHECKS picks the steps (default: gap cold bounded); TVA_SCRIPTS the benchmark scripts
# (TVA_BOUNDED=1 adds the short-tune run). alternate: ALT_SCRIPT in turn in the modes ALT_MODES
# (A autotuned, T table, T0 table without compile-ahead). coldvq: the first ResidualVQ step in rounds, after a
# pause and without the background start; coldmaxsim: the ten first MaxSim shapes.
# $PEERS (default gpu-results/peers, carried with the call) holds the published peers, one folder
# per peer as packages/late-interaction-kernels/benchmarks/peers.py describes (lik, flash-maxsim).
set -uo pipefail
PEERS=${PEERS:-gpu-results/peers}
export PYTHONPATH=$PWD/shared/triton-dispatch/src:$PWD/packages/late-interaction-kernels/src:$PWD/packages/vq-kernels/src:$PWD/packages/tomo-kplanes/src
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for step in ${CARD_CHECKS:-gap cold bounded}; do
  start=$(date +%s)
  case $step in
    gap) python3 tools/gpu/read_bound_gap.py --flash "$PEERS/flash-maxsim" --out "$OUT/read_bound_gap.json" 2>&1 | tail -40 ;;
    cold) python3 tools/gpu/cold_start.py --only vq --profile --out "$OUT/cold_vq_profile.json" 2>&1 | tail -8
          python3 tools/gpu/cold_start.py --only vq --out "$OUT/cold_vq.json" 2>&1 | tail -8 ;;
    coldvq) python3 tools/gpu/cold_start.py --only vq --repeat 3 --out "$OUT/cold_vq.json" 2>&1 | tail -9
            COLD_START_PAUSE=1.5 python3 tools/gpu/cold_start.py --only vq --out "$OUT/cold_vq_pause.json" 2>&1 | tail -4
            TRITON_DISPATCH_PRIME=0 python3 tools/gpu/cold_start.py --only vq --out "$OUT/cold_vq_noprime.json" 2>&1 | tail -4 ;;
    coldmaxsim) python3 tools/gpu/cold_start.py --only maxsim --out "$OUT/cold_maxsim.json" 2>&1 | tail -6 ;;
    bounded) python3 tools/gpu/bounded_tune_gpu.py --out "$OUT/bounded_tune_gpu.json" 2>&1 | grep -v '^{' | tail -20 ;;
    tests) python3 -m pytest -q -p no:cacheprovider -m gpu ${TESTS_ARGS:-} shared/triton-dispatch/tests packages/late-interaction-kernels/tests packages/vq-kernels/tests 2>&1 | grep -v "^\s*$" | tail -${TESTS_TAIL:-6} ;;
    tva) python3 tools/gpu/table_vs_autotune.py ${TVA_BOUNDED:+--bounded} --out "$OUT/table_vs_autotune.json" ${TVA_SCRIPTS:-packages/vq-kernels/benchmarks/quantize.py packages/vq-kernels/benchmarks/rvq_step.py} 2>&1 | tail -30 ;;
    alternate)  # one script in alternating modes, each its own process: A autotuned, T table, T0 table without compile-ahead
      i=0
      for m in ${ALT_MODES:-A T T A T0 A}; do
        i=$((i+1))
        env TRITON_DISPATCH_TUNING_CACHE=0 TRITON_DISPATCH_BOUNDED_TUNE=0 TRITON_DISPATCH_BENCH_BASELINES=0 TRITON_DISPATCH_BENCH_GRAPHS=1 \
          $([ "$m" = A ] && echo TRITON_DISPATCH_AUTOTUNE=1) $([ "$m" = T0 ] && echo TRITON_DISPATCH_COMPILE_AHEAD=0) \
          python3 "$ALT_SCRIPT" --out "$OUT/alternate_${i}_$m.json" > /dev/null 2>&1
        echo "alternate $i $m: rc $?"
      done
      python3 -c "
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + '/alternate_*.json')):
    rows = json.load(open(f))['records']
    print(f.rsplit('/', 1)[-1], ' | '.join('%s %.4f ms (wall %.3f)' % (r['name'], r['ours_ms'], r.get('ours_wall_ms') or 0) for r in rows))
" "$OUT" ;;
    peers) python3 packages/late-interaction-kernels/benchmarks/peers.py --peers "$PEERS" --calls 200 --out "$OUT/peers.json" 2>&1 | tail -25 ;;
  esac
  echo "== $step: $(( $(date +%s) - start )) s"
done
