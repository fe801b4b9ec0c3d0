import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from tomo_kplanes import cli, nanoparticle_phantom, psnr
from tomo_kplanes.cli import main, parse_args

_FAST = ["--steps", "6", "--sirt-iterations", "2", "--rays-per-batch", "64", "--channels", "2",
         "--no-progress", "--device", "cpu", "--backend", "torch", "--tv-points", "64"]


def test_reconstruct_phantom_writes_volume_slices_and_metrics(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["reconstruct", "--size", "12", "--angle-step", "20", "--output", str(out), *_FAST]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("psnr_ours", "psnr_sirt", "ssim_ours", "ssim_sirt", "seconds_ours"):
        assert np.isfinite(metrics[key])
    assert metrics["threads"] == 1 or "OMP_NUM_THREADS" in os.environ
    assert Image.open(out / "slices.png").width >= 900
    assert "wrote" in capsys.readouterr().out
    # a second run into the same folder refuses (before training) unless told to overwrite
    before = (out / "metrics.json").read_text()
    assert main(["reconstruct", "--size", "12", "--angle-step", "20", "--output", str(out), *_FAST]) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "metrics.json" in err and "--overwrite" in err
    assert (out / "metrics.json").read_text() == before
    args = ["reconstruct", "--size", "12", "--angle-step", "20", "--output", str(out), "--overwrite"]
    assert main([*args, *_FAST, "--seed", "3"]) == 0
    assert (out / "metrics.json").read_text() != before


def test_reconstruct_from_files(tmp_path, capsys):
    tifffile = pytest.importorskip("tifffile")
    from tomo_kplanes.geometry import TiltGeometry, tilt_range
    from tomo_kplanes.phantoms import nanoparticle_phantom, simulate_tilt_series

    angles = tilt_range(60, 30)
    series = simulate_tilt_series(nanoparticle_phantom(12, particles=3), TiltGeometry(angles, (12, 12)))
    tifffile.imwrite(tmp_path / "ts.tif", series.numpy(), photometric="minisblack")
    (tmp_path / "ts.tlt").write_text("\n".join(f"{a:.2f}" for a in angles.tolist()))
    out = tmp_path / "run"
    args = ["reconstruct", "--tilt-series", str(tmp_path / "ts.tif"), "--angles", str(tmp_path / "ts.tlt")]
    assert main([*args, "--output", str(out), *_FAST]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert "psnr_ours" not in metrics and (out / "slices.png").exists()
    # the angles as a list that starts with a minus, with and without "="
    listed = ",".join(f"{a:g}" for a in angles.tolist())
    assert listed.startswith("-60,")
    for angle_args in (["--angles", listed], [f"--angles={listed}"]):
        args = ["reconstruct", "--tilt-series", str(tmp_path / "ts.tif"), *angle_args]
        assert main([*args, "--output", str(out), "--overwrite", *_FAST]) == 0
    # the angle count must match the stack: a one-line error naming --angles
    capsys.readouterr()
    assert main(["reconstruct", "--tilt-series", str(tmp_path / "ts.tif"), "--angles", "0,10",
                 "--output", str(tmp_path / "other"), *_FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--angles" in err and "2 tilt angles" in err and "5 images" in err


# no --size: it is an error beside --tilt-series (the phantom of the default size is cheap to make)
_PHANTOM = ["reconstruct", "--angle-step", "30"]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--angles", "nope.tlt"], "--angles"),
        (["--tilt-series", "nope.st", "--angles", "nope.tlt"], "--angles"),
        (["--angles", "1,x,3"], "--angles"),
        (["--size", "0"], "--size"),
        (["--size", "ten"], "--size"),
        (["--steps", "-5"], "--steps"),
        (["--max-angle", "100"], "--max-angle"),
        (["--angle-step", "0"], "--angle-step"),
        (["--dose", "nan"], "--dose"),
        (["--rays-per-batch", "0"], "--rays-per-batch"),
        (["--volume-tv", "-1"], "--volume-tv"),
        (["--threads", "0"], "--threads"),
        (["--checkpoint-every", "-1"], "--checkpoint-every"),
        (["--tilt-series", "nope.st", "--angles", "-60,0,60"], "--tilt-series"),
        (["--tilt-series", "nope.st"], "--tilt-series"),
        (["--angles", "-60,0,60"], "--tilt-series"),
        (["--tilt-series", "nope.st", "--angles", "0,1", "--size", "8"], "--size"),
        (["--resolution", "1"], "--resolution"),
        (["--samples-per-ray", "0"], "--samples-per-ray"),
        (["--backend", "fast"], "--backend"),
        (["--resume", "nope.pt"], "--resume"),
        (["--lr-pose", "-1"], "--lr-pose"),
        (["--reference-tilt", "-2"], "--reference-tilt"),
        (["--misalign-tilt-axis", "95"], "--misalign-tilt-axis"),
        (["--tilt-series", "nope.st", "--angles", "0,1", "--misalign-shifts", "2"], "--misalign-shifts"),
    ],
)
def test_user_errors_are_one_line_naming_the_flag(tmp_path, capsys, argv, flag):
    try:  # argparse's errors exit, the later checks return the status
        code = main([*_PHANTOM, "--output", str(tmp_path / "out"), *_FAST, *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert flag in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "angle_args, bad, why",
    [
        (["--angles=-60,abc,60"], "abc", "is not a number"),
        (["--angles", "-60,abc,60"], "abc", "is not a number"),
        (["--angles", "0,30,sixty"], "sixty", "is not a number"),
        (["--angles=-60,nan,60"], "nan", "is not a finite angle"),
    ],
    ids=["equals-sign", "space", "word", "nan"],
)
def test_a_bad_value_in_an_angle_list_is_named(capsys, angle_args, bad, why):
    listed = angle_args[-1].removeprefix("--angles=")
    with pytest.raises(SystemExit) as exit_info:
        main(["reconstruct", *angle_args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--angles: {bad!r} {why} (in {listed!r})" in err
    assert "does not exist" not in err and err.count("\n") == 1


def test_the_tilt_series_file_is_checked_before_the_missing_angles(tmp_path, capsys):
    missing = tmp_path / "missing.st"
    run = ["reconstruct", "--output", str(tmp_path / "out"), *_FAST]
    assert main([*run, "--tilt-series", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--tilt-series: tilt series {missing} does not exist" in err and "--angles" not in err
    # a readable file without --angles: now the missing flag is the error
    tifffile = pytest.importorskip("tifffile")
    tifffile.imwrite(tmp_path / "ts.tif", np.ones((3, 8, 8), np.float32), photometric="minisblack")
    assert main([*run, "--tilt-series", str(tmp_path / "ts.tif")]) == 2
    assert "--tilt-series needs --angles" in capsys.readouterr().err


def test_contradicting_flags_are_reported_before_an_existing_output(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    assert main([*_PHANTOM, "--output", str(out), *_FAST, "--angles", "-60,0,60"]) == 2
    err = capsys.readouterr().err
    assert "--angles needs --tilt-series" in err and "already holds" not in err


def test_cli_runs_the_api_defaults():
    """``tomo-kplanes reconstruct`` and ``reconstruct(series, geometry)`` run the same settings,
    which are the CLI's long-standing ones."""
    from dataclasses import asdict

    from tomo_kplanes.geometry import TiltGeometry, tilt_range
    from tomo_kplanes.train import ReconstructionConfig

    args = parse_args(["reconstruct"])
    phantom = TiltGeometry(tilt_range(args.max_angle, args.angle_step), (32, 32))
    cli_config = cli.reconstruction_config(args, phantom)
    assert asdict(cli_config) == asdict(ReconstructionConfig().resolved(phantom))
    settings = ("resolution", "channels", "rotations", "steps", "rays_per_batch",
                "samples_per_ray", "tv_points", "eval_every")  # fmt: skip
    assert [getattr(cli_config, k) for k in settings] == [32, 8, 2, 1200, 512, 32, 1024, 150]
    assert cli_config.weights.volume_tv == cli_config.weights.plane_tv == 1e-4
    # a tilt series: the volume side is the detector's larger side
    stack = TiltGeometry(tilt_range(60, 30), (12, 20))
    assert asdict(cli.reconstruction_config(args, stack)) == asdict(
        ReconstructionConfig().resolved(stack)
    )
    assert cli.reconstruction_config(args, stack).resolution == 20
    # explicit flags win over the automatic values
    given = parse_args(["reconstruct", "--resolution", "16", "--samples-per-ray", "24"])
    config = cli.reconstruction_config(given, phantom)
    assert (config.resolution, config.samples_per_ray) == (16, 24)


def test_size_zero_names_size_not_the_geometry(capsys):
    with pytest.raises(SystemExit):
        parse_args(["reconstruct", "--size", "0"])
    err = capsys.readouterr().err
    assert "--size" in err and "detector_shape" not in err


def test_angles_take_a_comma_list_that_starts_with_a_minus():
    assert parse_args(["reconstruct", "--angles", "-60,0,60"]).angles == [-60.0, 0.0, 60.0]
    assert parse_args(["reconstruct", "--angles=-60,0,60"]).angles == [-60.0, 0.0, 60.0]
    assert parse_args(["reconstruct", "--angles", "-.5,0.5", "--size", "4"]).size == 4
    assert parse_args(["reconstruct", "--max-angle", "45"]).angles is None


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["reconstruct", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 32)", "(default: 1200)", "(default: 512)", "(default: 0)",
                    "(default: tomo-kplanes-output)", "(default: cuda when available, else cpu)"):
        assert default in text, default
    assert "--threads N" in text and "Default: 1, unless OMP_NUM_THREADS is set" in text


def test_top_level_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "tomo-kplanes reconstruct: reconstruct the built-in phantom" in out and "``" not in out


def test_cpu_runs_use_one_thread_unless_told_otherwise(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with cli.cpu_threads(torch.device("cpu"), None) as threads:
        assert threads == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with cli.cpu_threads(torch.device("cpu"), 2) as threads:
        assert threads == 2 == torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with cli.cpu_threads(torch.device("cpu"), None) as threads:
        assert threads == before == torch.get_num_threads()
    with cli.cpu_threads(torch.device("meta"), 3) as threads:  # not a CPU run: left alone
        assert threads is None and torch.get_num_threads() == before


def test_the_nanoparticle_phantom_reconstructs_and_a_collapse_is_an_error(tmp_path, monkeypatch, capsys):
    run = ["reconstruct", "--phantom", "nanoparticle", "--size", "16", "--steps", "200",
           "--no-progress", "--device", "cpu", "--backend", "torch"]  # fmt: skip
    assert main([*run, "--output", str(tmp_path / "ok")]) == 0
    metrics = json.loads((tmp_path / "ok" / "metrics.json").read_text())
    assert not metrics["collapsed"] and metrics["explained"] > 0.3
    # better than the all-zero volume (the collapsed run's score) by a margin
    truth = nanoparticle_phantom(16, seed=0)
    assert metrics["psnr_ours"] > psnr(truth, torch.zeros_like(truth)) + 2.0, metrics
    # fed its raw line integrals, the field collapses: exit 1, named, and no score for it
    real = cli.reconstruct
    monkeypatch.setattr(cli, "reconstruct", lambda s, *a, **kw: real(s * 0.4, *a, **kw))
    capsys.readouterr()
    with pytest.warns(UserWarning, match="empty volume"):
        assert main([*run, "--output", str(tmp_path / "bad")]) == 1
    assert "collapsed to an empty volume" in capsys.readouterr().err
    metrics = json.loads((tmp_path / "bad" / "metrics.json").read_text())
    assert metrics["collapsed"] and metrics["psnr_ours"] is None and metrics["psnr_sirt"] > 20


def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
    import tomo_kplanes.train as train

    base = ["reconstruct", "--size", "10", "--angle-step", "20", *_FAST, "--steps", "8"]
    assert main([*base, "--output", str(tmp_path / "whole")]) == 0

    real_save = train.save_checkpoint

    def save_then_stop(state, path):  # the run is killed right after its step-4 checkpoint
        real_save(state, path)
        if state["step"] == 4:
            raise KeyboardInterrupt

    part = tmp_path / "part"
    ckpt = part / "checkpoint.pt"
    monkeypatch.setattr(train, "save_checkpoint", save_then_stop)
    capsys.readouterr()
    assert main([*base, "--output", str(part), "--checkpoint-every", "2"]) == 130
    assert f"--resume {ckpt}" in capsys.readouterr().err
    monkeypatch.setattr(train, "save_checkpoint", real_save)
    assert ckpt.exists() and not (part / "metrics.json").exists()
    # a fresh run into that folder would replace the checkpoint: it refuses and names --resume
    assert main([*base, "--output", str(part), "--checkpoint-every", "2"]) == 2
    assert f"--resume {ckpt}" in capsys.readouterr().err
    # a file that is not a checkpoint is named as such, with no advice to load it unsafely
    (tmp_path / "notes.pt").write_text("hello world, not a checkpoint")
    other = str(tmp_path / "other")
    assert main([*base, "--output", other, "--resume", str(tmp_path / "notes.pt")]) == 2
    err = capsys.readouterr().err
    assert "notes.pt is not a tomo-kplanes checkpoint" in err and "weights_only" not in err
    # the checkpoint of other settings is refused, naming what differs
    assert main([*base, "--steps", "9", "--output", str(part), "--resume", str(ckpt)]) == 2
    assert "steps 8 in the checkpoint, 9 now" in capsys.readouterr().err

    args = [*base, "--output", str(part), "--checkpoint-every", "2", "--resume", str(ckpt)]
    assert main(args) == 0
    whole = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    resumed = json.loads((part / "metrics.json").read_text())
    assert resumed["resumed_from_step"] == 4 and resumed["steps_run"] == whole["steps_run"] == 8
    assert resumed["final_loss"] == whole["final_loss"]
    assert resumed["psnr_ours"] == whole["psnr_ours"]
    mrcfile = pytest.importorskip("mrcfile")
    with mrcfile.open(part / "volume.mrc") as a, mrcfile.open(tmp_path / "whole" / "volume.mrc") as b:
        np.testing.assert_array_equal(a.data, b.data)


def test_demo_replaces_its_own_previous_output(tmp_path, monkeypatch):
    """``uv run demo`` twice: the second run replaces the first one's files (the demo runner
    owns demo-output/<package>). The demo's run is shrunk to a few steps here."""
    from tomo_kplanes.demo import run_demo

    real = cli.run_reconstruct

    def small(args):
        args.size, args.steps, args.angle_step, args.sirt_iterations = 12, 4, 30.0, 2
        args.rays_per_batch, args.channels, args.tv_points, args.backend = 64, 2, 64, "torch"
        return real(args)

    monkeypatch.setattr(cli, "run_reconstruct", small)
    first = run_demo(tmp_path)
    before = (tmp_path / "metrics.json").stat().st_mtime_ns
    second = run_demo(tmp_path)
    assert (tmp_path / "metrics.json").stat().st_mtime_ns >= before
    assert {p.name for p in second.outputs} == {p.name for p in first.outputs}
    assert "PSNR" in second.key_figure


@pytest.mark.gpu
def test_fused_training_step_on_cuda_matches_the_float64_step():
    """Gradients of a full reconstruction loss (folded taps, plane TV) from the fused fp32 path
    against the grid_sample path in float64. The rotation gradient is a small sum of large
    cancelling terms: fp32 grid_sample itself is ~4e-3 off there, so the fused path is held to
    1e-3 and to no worse than fp32 grid_sample."""
    from tomo_kplanes.geometry import TiltGeometry, tilt_range
    from tomo_kplanes.model import KPlanesTilted
    from tomo_kplanes.objective import (
        LossWeights,
        ReconstructionContext,
        TomographyObject,
        reconstruction_loss,
    )

    def gradients(backend, dtype):
        g = torch.Generator().manual_seed(0)
        field = KPlanesTilted(64, 16, rotations=4, backend=backend, generator=g)
        obj = TomographyObject(field).cuda().to(dtype)
        geo = TiltGeometry(tilt_range(60, 2), (64, 64)).to("cuda")
        pts, steps = geo.rays(torch.arange(0, 64 * 64 * 61, 997, device="cuda"), 64)
        taps = obj.sample_tv_tap_coords(2000, generator=torch.Generator().manual_seed(1), device="cpu")
        ctx = ReconstructionContext(tv_tap_points=taps.cuda().to(dtype))
        target = torch.rand(steps.shape, generator=g).cuda().to(dtype)
        loss, _ = reconstruction_loss(obj, pts.to(dtype), steps.to(dtype), target,
                                      LossWeights(1e-3, 1e-4), ctx)
        loss.backward()
        return {n: p.grad.double() for n, p in obj.named_parameters()}

    exact = gradients("torch", torch.float64)
    fused = gradients(None, torch.float32)
    plain = gradients("torch", torch.float32)
    for name, g_exact in exact.items():
        err_fused = ((fused[name] - g_exact).norm() / g_exact.norm()).item()
        err_plain = ((plain[name] - g_exact).norm() / g_exact.norm()).item()
        assert err_fused < 1e-3, (name, err_fused)
        assert err_fused <= 2 * err_plain + 1e-6, (name, err_fused, err_plain)


@pytest.mark.gpu
def test_reconstruct_on_cuda_runs_the_fused_path():
    from tomo_kplanes.geometry import TiltGeometry, tilt_range
    from tomo_kplanes.phantoms import shepp_logan_3d, simulate_tilt_series
    from tomo_kplanes.train import ReconstructionConfig, reconstruct

    truth = shepp_logan_3d(32, device="cuda")
    geo = TiltGeometry(tilt_range(60, 4), (32, 32))
    series = simulate_tilt_series(truth, geo)
    result = reconstruct(series, geo, ReconstructionConfig(resolution=32, steps=100, progress=False))
    assert result.losses[-1] < result.losses[0]


def test_a_misaligned_phantom_with_pose_learning_writes_the_pose(tmp_path):
    out = tmp_path / "pose"
    argv = ["reconstruct", "--size", "12", "--angle-step", "20", "--output", str(out), *_FAST,
            "--misalign-shifts", "1.5", "--misalign-tilt-axis", "1", "--learn-shift",
            "--learn-tilt-axis"]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    pose = json.loads((out / "pose.json").read_text())
    assert len(pose["tilts"]) == 7 and pose["truth"]["tilt_axis_deg"] == 1.0
    assert sum(row["reference"] for row in pose["tilts"]) == 1
    assert all(np.isfinite(row["residual_rms"]) for row in pose["tilts"])
    for key in ("pose_tilt_axis_deg", "pose_shift_error_px", "pose_tilt_axis_error_deg"):
        assert np.isfinite(metrics[key])
    # the reference tilt (0 degrees) keeps the recorded geometry's shift: zero
    ref = pose["tilts"][pose["reference_tilt"]]
    assert ref["angle_deg"] == 0.0 and ref["shift_u_px"] == ref["shift_v_px"] == 0.0
