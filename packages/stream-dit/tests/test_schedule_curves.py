import itertools
import math

import pytest

from stream_dit.curves import Curve
from stream_dit.schedule import flow_schedule, shift_time


def test_shift_formula_and_endpoints():
    for s in (1.0, 3.0, 0.5):
        assert shift_time(0.0, s) == 0.0 and shift_time(1.0, s) == pytest.approx(1.0)
        assert shift_time(0.3, s) == pytest.approx(s * 0.3 / (1 + (s - 1) * 0.3))
    sched = flow_schedule(8, 3.0)
    assert len(sched) == 9 and sched[0] == pytest.approx(1.0) and sched[-1] == 0.0
    assert all(a > b for a, b in itertools.pairwise(sched))


def test_partial_denoise_truncates_and_is_cached():
    full = flow_schedule(8, 2.0)
    half = flow_schedule(8, 2.0, 0.5)
    assert half == full[4:]
    assert flow_schedule(8, 2.0, 0.5) is half
    assert len(flow_schedule(3, 1.0, 0.01)) == 2


@pytest.mark.parametrize(
    "args", [(0, 1.0, 1.0), (4, 0.0, 1.0), (4, math.nan, 1.0), (4, 1.0, 0.0), (4, 1.0, 1.5)]
)
def test_bad_schedule_arguments(args):
    with pytest.raises(ValueError):
        flow_schedule(*args)


def test_curve_sampling_and_validation():
    c = Curve.of([0.0, 1.0], name="c")
    assert c.at(0, 5) == 0.0 and c.at(4, 5) == 1.0 and c.at(2, 5) == pytest.approx(0.5)
    assert Curve.of(2.0, name="c").at(3, 8) == 2.0
    assert Curve.of([1.0, 1.0], name="c").is_constant(1.0)
    with pytest.raises(ValueError, match="finite"):
        Curve.of([1.0, math.inf], name="noise")
    with pytest.raises(ValueError):
        Curve.of([], name="noise")
    with pytest.raises(TypeError):
        Curve.of(["a"], name="noise")
