"""Reading tilt series and angles, writing volumes and slice images.

``mrcfile`` is imported inside the MRC functions only, so the rest of the package (and the
benchmarks) import without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

MRC_SUFFIXES = (".mrc", ".st", ".ali", ".rec", ".mrcs")
TIFF_SUFFIXES = (".tif", ".tiff")


def read_tilt_series(path: str | Path, *, permissive: bool = False) -> np.ndarray:
    """A ``(n_tilts, n_v, n_u)`` float32 stack from an MRC (``.mrc``/``.st``/…) or TIFF file.

    Args:
        path: the file.
        permissive: read an MRC file whose header is invalid anyway (``mrcfile``'s permissive
            mode: a warning instead of an error; the data may be misread).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: an unknown suffix, an empty file or stack, a corrupt MRC header (unless
            ``permissive``), a stack that is not 2D images, or non-finite pixels.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tilt series {path} does not exist")
    if path.stat().st_size == 0:
        raise ValueError(f"tilt series {path} is an empty file")
    suffix = path.suffix.lower()
    if suffix in MRC_SUFFIXES:
        data = _read_mrc(path, permissive)
    elif suffix in TIFF_SUFFIXES:
        import tifffile

        data = np.asarray(tifffile.imread(path), dtype=np.float32)
    else:
        raise ValueError(
            f"tilt series {path}: unknown suffix {suffix!r}; expected one of "
            f"{', '.join(MRC_SUFFIXES + TIFF_SUFFIXES)}"
        )
    if data.ndim == 2:
        data = data[None]
    if data.ndim != 3 or data.size == 0:
        raise ValueError(f"tilt series {path} must be a non-empty stack of 2D images, got shape {data.shape}")
    if not np.isfinite(data).all():
        bad = int((~np.isfinite(data)).sum())
        raise ValueError(f"tilt series {path} holds {bad} non-finite pixels")
    return data


def _read_mrc(path: Path, permissive: bool) -> np.ndarray:
    import mrcfile

    try:
        with mrcfile.open(path, mode="r", permissive=permissive) as mrc:
            if mrc.data is None:
                raise ValueError(f"tilt series {path} holds no image data")
            return np.array(mrc.data, dtype=np.float32)  # a writable copy, not the read-only buffer
    except ValueError as exc:
        if permissive or "no image data" in str(exc):
            raise
        raise ValueError(
            f"tilt series {path} has a corrupt MRC header ({exc}); "
            "pass permissive=True (--permissive-mrc) to read it anyway"
        ) from None


def read_angles(source: str | Path | Sequence[float]) -> np.ndarray:
    """Tilt angles in degrees from an IMOD ``.tlt`` file (one per line) or a sequence."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"angle file {path} does not exist")
        values = [float(tok) for line in path.read_text().splitlines() for tok in line.split()[:1]]
        if not values:
            raise ValueError(f"angle file {path} holds no angles")
    else:
        values = [float(a) for a in source]
        if not values:
            raise ValueError("the angle list is empty")
    angles = np.asarray(values, dtype=np.float32)
    if not np.isfinite(angles).all():
        raise ValueError("tilt angles hold non-finite values")
    return angles


def load_tilt_series(
    path: str | Path, angles: str | Path | Sequence[float], *, permissive: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Stack and angles, checked against each other (``permissive``: see :func:`read_tilt_series`)."""
    data = read_tilt_series(path, permissive=permissive)
    ang = read_angles(angles)
    if data.shape[0] != ang.shape[0]:
        raise ValueError(
            f"tilt series {path} has {data.shape[0]} images but {ang.shape[0]} tilt angles were given"
        )
    return data, ang


def write_volume_mrc(path: str | Path, volume: torch.Tensor | np.ndarray, *, voxel_size: float = 1.0) -> Path:
    """Write a ``(Z, Y, X)`` volume as float32 MRC."""
    import mrcfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = volume.detach().cpu().numpy() if isinstance(volume, torch.Tensor) else np.asarray(volume)
    with mrcfile.new(path, overwrite=True) as mrc:
        mrc.set_data(arr.astype(np.float32))
        mrc.voxel_size = voxel_size
    return path


def _to_uint8(img: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return (np.clip((img - lo) / max(hi - lo, 1e-12), 0, 1) * 255).round().astype(np.uint8)


def write_slices_png(
    path: str | Path,
    volumes: dict[str, torch.Tensor | np.ndarray],
) -> Path:
    """One PNG: rows are the central XY, XZ and YZ slices, columns the given volumes (e.g. truth,
    SIRT, ours), each column scaled to its own 0.5–99.5 percentile range."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = []
    for vol in volumes.values():
        v = vol.detach().cpu().numpy() if isinstance(vol, torch.Tensor) else np.asarray(vol)
        z, y, x = (s // 2 for s in v.shape)
        lo, hi = np.percentile(v, [0.5, 99.5])
        slices = [v[z], v[:, y, :], v[:, :, x]]
        width = max(s.shape[1] for s in slices)
        padded = [np.pad(_to_uint8(s, lo, hi), ((0, 2), (0, width - s.shape[1]))) for s in slices]
        columns.append(np.concatenate(padded, axis=0))
    height = max(c.shape[0] for c in columns)
    grid = np.concatenate([np.pad(c, ((0, height - c.shape[0]), (0, 2))) for c in columns], axis=1)
    # small volumes: enlarge (nearest neighbour) so slices stay legible
    zoom = max(1, 256 // max(grid.shape))
    Image.fromarray(grid).resize((grid.shape[1] * zoom, grid.shape[0] * zoom), Image.NEAREST).save(path)
    return path
