"""Testing kit shared by every package: float64 references, relative errors, poisoned outputs,
gradient parity and seeded random inputs.

The convention: an op's output in its working dtype is compared with its ``reference.py`` evaluated
in float64 on the same (upcast) inputs, by the relative error ``‖out − ref‖₂ / ‖ref‖₂``, against a
per-dtype threshold. Output buffers are filled with NaN before the call so a kernel that skips an
element cannot pass by leaving an old value behind.
"""

from ..bad_inputs import (
    CASE_KINDS,
    BadCase,
    OpSpec,
    TensorArg,
    bad_input_cases,
    bad_input_params,
    check_bad_input,
)
from .compare import (
    DEFAULT_TOLERANCES,
    assert_close,
    assert_gradients_match,
    errors_table,
    relative_error,
    to_reference,
    tolerance,
)
from .compile_ahead_calls import recorded_compile_aheads
from .inputs import generator, lengths_mask, rand_mask, randint, randn, seed_for
from .poison import poison_, poisoned, poisoned_like
from .ranks import RankFailed, run_ranks

__all__ = [
    "CASE_KINDS",
    "DEFAULT_TOLERANCES",
    "BadCase",
    "OpSpec",
    "RankFailed",
    "TensorArg",
    "assert_close",
    "assert_gradients_match",
    "bad_input_cases",
    "bad_input_params",
    "check_bad_input",
    "errors_table",
    "generator",
    "lengths_mask",
    "poison_",
    "poisoned",
    "poisoned_like",
    "rand_mask",
    "randint",
    "randn",
    "recorded_compile_aheads",
    "relative_error",
    "run_ranks",
    "seed_for",
    "to_reference",
    "tolerance",
]
