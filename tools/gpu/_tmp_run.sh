export PYTHONPATH=$PWD/gpu-results/pylibs:$PWD/shared/triton-dispatch/src:$PWD/packages/stream-dit/src
python3 tools/gpu/dit_forward.py --out $OUT/dit_forward.json --rows 8,16 --profile 2>&1 | grep -v -i "warn" | tail -60
cd packages/stream-dit && timeout 200 python3 benchmarks/tick.py --out $OUT/tick.json --models ace-step --engines eager,graphs --quick 2>&1 | tail -12
