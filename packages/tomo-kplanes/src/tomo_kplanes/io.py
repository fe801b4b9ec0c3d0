"""Reading tilt series and angles, writing volumes and slice images.

``mrcfile`` is imported inside the MRC functions only, so the rest of the package (and the
benchmarks) import without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from PIL import Image

MRC_SUFFIXES = (".mrc", ".st", ".ali", ".rec", ".mrcs")
TIFF_SUFFIXES = (".tif", ".tiff")


class CorruptMRCHeaderError(ValueError):
    """An MRC file whose header ``mrcfile`` rejects; ``permissive=True`` reads it anyway.

    ``path`` and ``reason`` (``mrcfile``'s complaint) are kept so that a front end can word the
    hint its own way: the command line names its flag, not the keyword argument."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(self.with_hint("pass permissive=True"))

    def with_hint(self, hint: str) -> str:
        """The message, ``hint`` saying how to read the file anyway."""
        return (
            f"tilt series {self.path} has a corrupt MRC header ({self.reason}); "
            f"{hint} to read it anyway"
        )


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
        raise ValueError(
            f"tilt series {path} must be a non-empty stack of 2D images, got shape {data.shape}"
        )
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
        raise CorruptMRCHeaderError(path, str(exc)) from exc


def read_angles(source: str | Path | Sequence[float]) -> np.ndarray:
    """Tilt angles in degrees from an IMOD ``.tlt`` file (one per line) or a sequence."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"angle file {path} does not exist")
        values = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for token in line.split()[:1]:
                try:
                    values.append(float(token))
                except ValueError:
                    raise ValueError(
                        f"angle file {path} line {number}: {token!r} is not an angle in degrees"
                    ) from None
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


def write_volume_mrc(
    path: str | Path, volume: torch.Tensor | np.ndarray, *, voxel_size: float = 1.0
) -> Path:
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


@dataclass
class SlicesFigure:
    """The picture :func:`write_slices_png` saves, with the texts drawn on it."""

    image: Image.Image
    title: str
    #: one per column (volume); a second line (``notes``) under the name where given
    column_titles: list[str]
    #: one per row: the slice's plane and index, e.g. ``"XY slice\nz = 16 of 32"``
    row_labels: list[str]
    #: the value range of the grey scale every panel shares (black, white), shown by the colour bar
    colorbar_range: tuple[float, float]
    colorbar_labels: list[str]


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)  # where installed: wide glyph coverage
    except OSError:
        pass
    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1 with FreeType: scalable
    except (TypeError, AttributeError, OSError):
        return ImageFont.load_default()  # a small bitmap font: still labelled, if less legible


def _text(draw, xy: tuple[float, float], text: str, font, anchor: str) -> None:
    """Draw ``text`` placed by ``anchor`` (horizontal ``l``/``m``/``r``, vertical ``t``/``m``)
    from its measured box, which works with bitmap fonts too (they take no ``anchor``)."""
    x0, y0, x1, y1 = draw.multiline_textbbox((0, 0), text, font=font, align="center")
    w, h = x1 - x0, y1 - y0
    x = xy[0] - {"l": 0, "m": w / 2, "r": w}[anchor[0]] - x0
    y = xy[1] - {"t": 0, "m": h / 2}[anchor[1]] - y0
    align = {"l": "left", "m": "center", "r": "right"}[anchor[0]]
    draw.multiline_text((round(x), round(y)), text, fill=0, font=font, align=align)


def _central_slices(v: np.ndarray) -> list[tuple[np.ndarray, str]]:
    z, y, x = (s // 2 for s in v.shape)
    nz, ny, nx = v.shape
    return [
        (v[z], f"XY slice\nz = {z} of {nz}"),
        (v[:, y, :], f"XZ slice\ny = {y} of {ny}"),
        (v[:, :, x], f"YZ slice\nx = {x} of {nx}"),
    ]


def slices_figure(
    volumes: dict[str, torch.Tensor | np.ndarray],
    *,
    title: str = "Central slices",
    notes: dict[str, str] | None = None,
    value_range: tuple[float, float] | None = None,
    min_width: int = 960,
) -> SlicesFigure:
    """A titled grid of the central XY, XZ and YZ slices (rows, labelled with the slice index) of
    each volume (columns, titled by the dict's keys, with ``notes[key]`` such as a PSNR under the
    name), all on one grey scale with a colour bar showing its value range.

    Args:
        volumes: ``(Z, Y, X)`` volumes by column title, e.g. ground truth, SIRT, ours.
        title: the figure's title.
        notes: a second title line per column (optional, by key).
        value_range: the values shown black and white; default: the 0.5 and 99.5 percentiles of
            all volumes together. Values outside are clipped.
        min_width: the picture is at least this many pixels wide (slices are enlarged by an integer
            factor, nearest neighbour).
    """
    from PIL import Image, ImageDraw

    if not volumes:
        raise ValueError("volumes must hold at least one volume")
    notes = notes or {}
    arrays = {}
    for name, vol in volumes.items():
        v = (
            vol.detach().cpu().double().numpy()
            if isinstance(vol, torch.Tensor)
            else np.asarray(vol, dtype=np.float64)
        )
        if v.ndim != 3 or v.size == 0:
            raise ValueError(
                f"volume {name!r} must be a non-empty (Z, Y, X) array, got shape {v.shape}"
            )
        arrays[name] = v
    if value_range is None:
        pooled = np.concatenate([v.ravel() for v in arrays.values()])
        lo, hi = (float(q) for q in np.percentile(pooled, [0.5, 99.5]))
    else:
        lo, hi = (float(q) for q in value_range)
    if not hi > lo:
        hi = lo + 1.0
    slices = {name: _central_slices(v) for name, v in arrays.items()}
    row_labels = [label for _, label in next(iter(slices.values()))]
    n_cols, n_rows = len(arrays), 3

    title_font, head_font, text_font = _font(26), _font(19), _font(16)
    pad, gap, left, right = 16, 12, 130, 130
    max_w = max(s.shape[1] for cols in slices.values() for s, _ in cols)
    max_h = [max(slices[n][r][0].shape[0] for n in slices) for r in range(n_rows)]
    # integer enlargement: slices at least ~256 px wide and the figure at least min_width wide
    cell_target = max(256, (min_width - left - right + gap) / n_cols - gap)
    zoom = max(1, math.ceil(cell_target / max_w))
    cell_w = max_w * zoom
    cell_h = [h * zoom for h in max_h]
    width = left + n_cols * (cell_w + gap) - gap + right
    column_titles = [name if name not in notes else f"{name}\n{notes[name]}" for name in arrays]

    measure = ImageDraw.Draw(Image.new("L", (1, 1)))

    def box(text: str, font) -> tuple[int, int]:
        x0, y0, x1, y1 = measure.multiline_textbbox((0, 0), text, font=font, align="center")
        return x1 - x0, y1 - y0

    lines: list[str] = []  # the title, wrapped at spaces to the figure's width
    for word in title.split(" "):
        if lines and box(f"{lines[-1]} {word}", title_font)[0] <= width - 2 * pad:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    wrapped = "\n".join(lines)
    title_h = box(wrapped, title_font)[1]
    head_h = max(box(head, head_font)[1] for head in column_titles) + pad
    top = pad + title_h + pad + head_h
    grid_h = sum(cell_h) + gap * (n_rows - 1)
    height = top + grid_h + pad + box("0", text_font)[1] + 2 * pad

    img = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(img)
    _text(draw, (width // 2, pad), wrapped, title_font, "mt")
    for c, (name, head) in enumerate(zip(arrays, column_titles)):
        cx = left + c * (cell_w + gap) + cell_w // 2
        _text(draw, (cx, top - head_h), head, head_font, "mt")
        y0 = top
        for r in range(n_rows):
            s = _to_uint8(slices[name][r][0], lo, hi)
            panel = Image.fromarray(s).resize((s.shape[1] * zoom, s.shape[0] * zoom), Image.NEAREST)
            x0 = left + c * (cell_w + gap) + (cell_w - panel.width) // 2
            img.paste(panel, (x0, y0 + (cell_h[r] - panel.height) // 2))
            y0 += cell_h[r] + gap
    y0 = top
    for r, label in enumerate(row_labels):
        _text(draw, (left - gap, y0 + cell_h[r] // 2), label, text_font, "rm")
        y0 += cell_h[r] + gap

    # the colour bar: white (hi) at the top, black (lo) at the bottom, three labelled ticks
    bar_x = width - right + 2 * gap
    bar_w = 22
    ramp = np.linspace(255, 0, grid_h).round().astype(np.uint8)[:, None].repeat(bar_w, axis=1)
    img.paste(Image.fromarray(ramp), (bar_x, top))
    draw.rectangle((bar_x - 1, top - 1, bar_x + bar_w, top + grid_h), outline=0)
    colorbar_labels = []
    for frac in (0.0, 0.5, 1.0):
        value = hi - frac * (hi - lo)
        y = top + round(frac * (grid_h - 1))
        draw.line((bar_x + bar_w, y, bar_x + bar_w + 5, y), fill=0)
        label = f"{value:.3g}"
        colorbar_labels.append(label)
        _text(draw, (bar_x + bar_w + 8, y), label, text_font, "lm")
    caption = (
        f"one grey scale for every panel: {lo:.3g} (black) to {hi:.3g} (white); "
        "values outside are clipped"
    )
    _text(draw, (width // 2, top + grid_h + pad), caption, text_font, "mt")
    return SlicesFigure(img, title, column_titles, row_labels, (lo, hi), colorbar_labels)


def write_slices_png(
    path: str | Path,
    volumes: dict[str, torch.Tensor | np.ndarray],
    *,
    title: str = "Central slices",
    notes: dict[str, str] | None = None,
    value_range: tuple[float, float] | None = None,
) -> Path:
    """Save :func:`slices_figure` of ``volumes`` as a PNG: a titled grid, rows the central XY, XZ
    and YZ slices (labelled with their index), columns the given volumes (e.g. ground truth, SIRT,
    ours; ``notes`` adds a line under each title, such as its PSNR), one grey scale with a colour
    bar, at least 960 pixels wide."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    slices_figure(volumes, title=title, notes=notes, value_range=value_range).image.save(path)
    return path
