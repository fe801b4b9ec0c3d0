import numpy as np
import pytest
import torch

from tomo_kplanes.io import load_tilt_series, read_angles, read_tilt_series, write_slices_png


def test_tiff_stack_and_tlt_round_trip(tmp_path):
    tifffile = pytest.importorskip("tifffile")
    data = np.random.default_rng(0).random((3, 5, 6)).astype(np.float32)
    tifffile.imwrite(tmp_path / "s.tif", data, photometric="minisblack")
    (tmp_path / "s.tlt").write_text("-30.0\n 0.0\n30.0\n")
    stack, angles = load_tilt_series(tmp_path / "s.tif", tmp_path / "s.tlt")
    np.testing.assert_array_equal(stack, data)
    np.testing.assert_array_equal(angles, [-30.0, 0.0, 30.0])


def test_mrc_stack_and_volume_round_trip(tmp_path):
    mrcfile = pytest.importorskip("mrcfile")
    from tomo_kplanes.io import write_volume_mrc

    data = np.random.default_rng(1).random((4, 5, 6)).astype(np.float32)
    with mrcfile.new(tmp_path / "s.st") as mrc:
        mrc.set_data(data)
    np.testing.assert_array_equal(read_tilt_series(tmp_path / "s.st"), data)
    out = write_volume_mrc(tmp_path / "v.mrc", torch.from_numpy(data))
    np.testing.assert_array_equal(read_tilt_series(out), data)


def test_tilt_count_mismatch_is_rejected(tmp_path):
    tifffile = pytest.importorskip("tifffile")
    tifffile.imwrite(tmp_path / "s.tif", np.zeros((3, 4, 4), np.float32), photometric="minisblack")
    with pytest.raises(ValueError, match="3 images but 2 tilt angles"):
        load_tilt_series(tmp_path / "s.tif", [0.0, 10.0])


def test_non_finite_pixels_are_rejected(tmp_path):
    tifffile = pytest.importorskip("tifffile")
    data = np.zeros((2, 4, 4), np.float32)
    data[1, 2, 3] = np.nan
    tifffile.imwrite(tmp_path / "s.tif", data, photometric="minisblack")
    with pytest.raises(ValueError, match="non-finite"):
        read_tilt_series(tmp_path / "s.tif")


def test_empty_files_are_rejected(tmp_path):
    (tmp_path / "e.mrc").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_tilt_series(tmp_path / "e.mrc")
    (tmp_path / "e.tlt").write_text("\n")
    with pytest.raises(ValueError, match="no angles"):
        read_angles(tmp_path / "e.tlt")
    with pytest.raises(ValueError, match="empty"):
        read_angles([])
    with pytest.raises(ValueError, match="suffix"):
        (tmp_path / "x.txt").write_text("1")
        read_tilt_series(tmp_path / "x.txt")


def test_slice_png_has_one_column_per_volume(tmp_path):
    from PIL import Image

    vols = {"a": torch.rand(8, 9, 10), "b": torch.rand(8, 9, 10)}
    img = np.asarray(Image.open(write_slices_png(tmp_path / "s.png", vols)))
    width = 2 * (10 + 2)
    assert img.shape[1] % width == 0 and img.shape[1] >= width
