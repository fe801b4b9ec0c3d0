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


def test_an_angle_file_with_a_word_names_the_line(tmp_path):
    (tmp_path / "a.tlt").write_text("-30\n0\nthirty\n")
    with pytest.raises(ValueError, match=r"a.tlt line 3: 'thirty' is not an angle"):
        read_angles(tmp_path / "a.tlt")


def test_slice_figure_is_titled_labelled_and_has_a_colour_bar(tmp_path):
    from PIL import Image

    from tomo_kplanes.io import slices_figure

    vols = {"ground truth": torch.rand(8, 9, 10), "SIRT": torch.rand(8, 9, 10) * 2,
            "K-Planes (ours)": torch.rand(8, 9, 10)}
    notes = {"SIRT": "PSNR 19.8 dB", "K-Planes (ours)": "PSNR 24.5 dB"}
    fig = slices_figure(vols, title="Central slices: test", notes=notes, value_range=(0.0, 1.0))
    assert fig.title == "Central slices: test"
    assert fig.column_titles == ["ground truth", "SIRT\nPSNR 19.8 dB", "K-Planes (ours)\nPSNR 24.5 dB"]
    assert fig.row_labels == ["XY slice\nz = 4 of 8", "XZ slice\ny = 4 of 9", "YZ slice\nx = 5 of 10"]
    assert fig.colorbar_range == (0.0, 1.0) and fig.colorbar_labels == ["1", "0.5", "0"]
    assert fig.image.width >= 900
    pixels = np.asarray(fig.image)
    assert (pixels[:30] < 128).any()  # the title is drawn at the top
    # the colour bar: a vertical ramp from white (top) to black (bottom) right of the panels
    ramp = pixels[pixels.shape[0] // 4 : 3 * pixels.shape[0] // 4, -100]
    assert (np.diff(ramp.astype(int)) <= 0).all() and ramp[0] > ramp[-1]

    # the PNG is the figure; the default grey scale spans every volume's values
    path = write_slices_png(tmp_path / "s.png", vols, title="Central slices: test", notes=notes)
    with Image.open(path) as img:
        assert img.size == fig.image.size and img.width >= 900
    lo, hi = slices_figure(vols).colorbar_range
    assert 0 <= lo < 0.05 and 1.5 < hi <= 2


def test_slice_figure_rejects_what_is_not_a_volume():
    from tomo_kplanes.io import slices_figure

    with pytest.raises(ValueError, match="at least one volume"):
        slices_figure({})
    with pytest.raises(ValueError, match="'flat'"):
        slices_figure({"flat": torch.rand(4, 4)})


def _corrupt_mrc(path, offset, raw):
    mrcfile = pytest.importorskip("mrcfile")
    with mrcfile.new(path, overwrite=True) as mrc:
        mrc.set_data(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    data = bytearray(path.read_bytes())
    data[offset : offset + len(raw)] = raw
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    "offset, raw, why",
    [
        (208, b"XXXX", "Map ID"),  # the MAP signature
        (12, (99).to_bytes(4, "little"), "mode"),  # an unknown data mode
        (0, (10**6).to_bytes(4, "little"), "bytes"),  # nx larger than the file
    ],
)
def test_corrupt_mrc_header_is_a_clear_error_unless_permissive(tmp_path, offset, raw, why):
    path = _corrupt_mrc(tmp_path / "bad.mrc", offset, raw)
    with pytest.raises(ValueError, match=f"corrupt MRC header.*{why}.*permissive") as err:
        read_tilt_series(path)
    assert str(path) in str(err.value)
    assert "pass permissive=True to read it anyway" in str(err.value)
    assert "--permissive-mrc" not in str(err.value)  # the Python API's words only
    with pytest.warns(RuntimeWarning):
        if why == "Map ID":  # a broken signature alone leaves the data readable
            data = read_tilt_series(path, permissive=True)
            assert data.shape == (2, 3, 4) and data[1, 2, 3] == 23
        else:
            with pytest.raises(ValueError, match="no image data"):
                read_tilt_series(path, permissive=True)


def test_cli_reads_a_corrupt_mrc_only_with_permissive_mrc(tmp_path, capsys):
    from tomo_kplanes.cli import main

    path = _corrupt_mrc(tmp_path / "bad.mrc", 208, b"XXXX")
    args = ["reconstruct", "--tilt-series", str(path), "--angles", "0,30", "--steps", "2",
            "--sirt-iterations", "1", "--rays-per-batch", "16", "--channels", "2", "--no-progress",
            "--device", "cpu", "--backend", "torch", "--tv-points", "16", "--rotations", "0"]
    assert main([*args, "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tilt-series" in err and "corrupt MRC header" in err
    # the command line's words: its flag, not the Python keyword argument
    assert "pass --permissive-mrc to read it anyway" in err and "permissive=True" not in err
    with pytest.warns(RuntimeWarning):
        assert main([*args, "--output", str(tmp_path / "b"), "--permissive-mrc"]) == 0
