#!/bin/bash
# Ray Serve on a machine with two GPUs: one replica against two, each replica on its own GPU.
# The GPU image has no Ray: carry its wheels (Python 3.12) in the folders named by $RAY_WHEELS
# (space-separated; default gpu-results/raywheels gpu-results/raywheels2) and they are installed
# into /tmp/raypy first. Extra arguments go to serve_load.py; results land in $OUT/ray_gpu.json.
set -euo pipefail
wheels=()
for dir in ${RAY_WHEELS:-gpu-results/raywheels gpu-results/raywheels2}; do wheels+=("$dir"/*.whl); done
python3 -m pip install -q --no-deps --no-index --target /tmp/raypy "${wheels[@]}" 2>&1 | tail -3
export PYTHONPATH=/tmp/raypy:$PWD/shared/triton-dispatch/src:$PWD/packages/stream-dit/src
export PATH=/tmp/raypy/bin:$PATH
python3 -c "import ray, ray.serve; print('ray', ray.__version__)"
nvidia-smi --query-gpu=name --format=csv,noheader
# A small queue per replica keeps the requests at the ingress for whichever replica frees first,
# so the end of the run is not one replica finishing a longer share handed out at the start.
timeout "${RAY_TIMEOUT:-560}" python3 packages/stream-dit/benchmarks/serve_load.py --ray \
  --replicas 1,2 --device cuda --preset large --frames 500,1000,1500 --steps 8 --depth 8 \
  --clients 200 --repeat 1 --malformed-every 0 --disconnect-every 0 --max-queue 4 \
  --out "$OUT/ray_gpu.json" "$@" 2>&1 \
  | grep -v "^INFO\|^(ServeReplica\|^(ProxyActor\|^(ServeController" | tail -60
