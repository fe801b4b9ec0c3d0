"""Latents to audio: windowed, batched decoding of finished latents inside the session.

* :class:`AudioDecoder`, :func:`default_window` (``stage.py``): the session's decoder stage.
* :class:`DecoderEngine` (``engine.py``): eager, ``torch.compile`` and CUDA-graph execution.
* :func:`plan_windows`, :class:`Stitcher`, :func:`decode_windowed` (``windows.py``): the windows
  and their crossfaded stitch.
* :func:`oobleck_receptive_field` (``receptive_field.py``): the context that makes windows exact.
* ``stream_dit.decode.oobleck`` (extra ``diffusers``): :class:`OobleckAdapter` around diffusers'
  ``AutoencoderOobleck`` (ACE-Step 1.5, Stable Audio), ``build_vae``, ``build_decoder``.
"""

from .engine import DECODER_MODES, DecoderEngine
from .receptive_field import ReceptiveField, oobleck_receptive_field
from .stage import AudioDecoder, default_window
from .windows import Stitcher, WindowPlan, decode_windowed, plan_windows, window_lengths

__all__ = [
    "DECODER_MODES",
    "AudioDecoder",
    "DecoderEngine",
    "ReceptiveField",
    "Stitcher",
    "WindowPlan",
    "decode_windowed",
    "default_window",
    "oobleck_receptive_field",
    "plan_windows",
    "window_lengths",
]
