"""The eager training step stays cheap to launch: ``benchmarks/step_launches.py`` counts it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from step_launches import PARTS, count_step
from training_step import make_step


def test_eager_step_launch_count_by_part(device):
    # what the folded fused step launched before the loss was fused: 104 (aten ops + Triton); 26
    # before the plane TV's gradient was folded into the features' backward
    step = make_step(8, 2, 2, 4, 3, 8, fused=True, fold=True, device=device, fused_adam=True)
    step()  # plans, optimizer state
    tally = count_step(step, 1)
    launches = {p: tally.kinds[p]["aten"] + tally.kinds[p]["triton"] for p in PARTS}
    assert launches == {
        "tap sampling": 2,  # uniform_, one broadcast add
        "field forward": 6,  # cat, rotations, features, decoder, activation (2)
        "volume TV": 0,  # inside ray_loss
        "plane TV": 2,  # partial sums, finish (inside the field call's features op)
        "loss assembly": 2,  # ray_loss: partial sums, finish
        # seed, softplus, decoder (3), zeros of the rotations' gradient, four Triton launches (loss,
        # plane TV into the planes' gradient, features adding into it, rotations); no zero fill
        # of the planes' gradient and no add of two plane gradients any more
        "backward": 10,
        "optimizer": 2,  # fused Adam and its step counter
    }, tally.ops
    assert sum(tally.kinds[p]["sync"] for p in PARTS) == 0
