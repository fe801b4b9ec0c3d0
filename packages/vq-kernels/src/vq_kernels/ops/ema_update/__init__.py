"""``ema_update_``: the fused in-place EMA codebook update with dead-code restarts."""

from .dispatch import ema_statistics, ema_update_
from .learned import restart_dead_learned_
from .reference import SEMANTICS
from .validation import DEFAULT_THRESHOLDS

__all__ = [
    "DEFAULT_THRESHOLDS",
    "SEMANTICS",
    "ema_statistics",
    "ema_update_",
    "restart_dead_learned_",
]
