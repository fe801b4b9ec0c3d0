import pytest
import torch

from tomo_kplanes.geometry import TiltGeometry, tilt_range
from tomo_kplanes.metrics import psnr
from tomo_kplanes.phantoms import nanoparticle_phantom, shepp_logan_3d, simulate_tilt_series
from tomo_kplanes.train import (
    CollapsedReconstructionWarning,
    ReconstructionConfig,
    reconstruct,
    render_volume,
)


def _data(size=10):
    truth = shepp_logan_3d(size)
    geo = TiltGeometry(tilt_range(60, 20), (size, size))
    return truth, geo, simulate_tilt_series(truth, geo, n_samples=size)


def _config(**kw):
    base = dict(
        resolution=10,
        channels=3,
        rotations=2,
        steps=30,
        rays_per_batch=64,
        samples_per_ray=10,
        tv_points=64,
        backend="torch",
        progress=False,
        eval_every=0,
    )
    return ReconstructionConfig(**{**base, **kw})


def test_training_lowers_the_loss_and_is_seeded():
    truth, geo, series = _data()
    a = reconstruct(series, geo, _config(steps=60))
    b = reconstruct(series, geo, _config(steps=60))
    assert a.losses[-1] < a.losses[0]
    assert a.losses == b.losses
    vol = render_volume(a.object_model, truth.shape)
    assert vol.shape == truth.shape and (vol >= 0).all()


# 686 training rays in batches of 64: an epoch is 10 steps, so step 10 starts the second one
@pytest.mark.parametrize("every, stop", [(7, 14), (5, 10)], ids=["mid-epoch", "epoch-start"])
def test_checkpoint_resume_reproduces_an_uninterrupted_run(tmp_path, every, stop):
    _, geo, series = _data()
    ckpt = str(tmp_path / "ck.pt")
    full = reconstruct(series, geo, _config(steps=24))
    cfg = _config(steps=24, checkpoint_every=every, checkpoint_path=ckpt)
    part = reconstruct(series, geo, cfg, stop_at=stop)
    assert part.steps_run == stop
    resumed = reconstruct(series, geo, cfg, resume=True)
    assert resumed.steps_run == 24
    assert resumed.losses == full.losses
    for (name, a), b in zip(
        full.object_model.state_dict().items(), resumed.object_model.state_dict().values()
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_resuming_a_finished_run_runs_no_step(tmp_path):
    _, geo, series = _data()
    cfg = _config(steps=6, checkpoint_every=3, checkpoint_path=str(tmp_path / "ck.pt"))
    full = reconstruct(series, geo, cfg)
    again = reconstruct(series, geo, cfg, resume=True)
    assert again.steps_run == full.steps_run == 6 and again.losses == full.losses


def test_early_stop_on_held_out_pixels():
    _, geo, series = _data()
    # learning rates of zero: the held-out loss never improves, so training stops after `patience`
    result = reconstruct(
        series,
        geo,
        _config(
            steps=200,
            lr_planes=0.0,
            lr_decoder=0.0,
            lr_rotations=0.0,
            eval_every=5,
            patience=2,
            holdout_fraction=0.1,
        ),
    )
    assert result.stopped_early and result.steps_run == 15
    assert len(result.holdout_losses) == 3


def test_a_field_that_collapsed_to_an_empty_volume_says_so():
    """The sparse nanoparticle phantom's raw line integrals (peak ~0.4) drive every density into
    the activation's flat zero: that run must be flagged, the normalised one must not."""
    size = 16
    truth = nanoparticle_phantom(size, seed=0)
    geo = TiltGeometry(tilt_range(60, 3), (size, size))
    series = simulate_tilt_series(truth, geo)
    config = ReconstructionConfig(steps=200, backend="torch", progress=False)
    with pytest.warns(CollapsedReconstructionWarning, match="empty volume"):
        raw = reconstruct(series, geo, config)
    assert raw.collapsed and abs(raw.explained) < 0.05
    assert float(render_volume(raw.object_model, (size,) * 3).amax()) < 1e-3
    scale = float(series.amax())
    fitted = reconstruct(series / scale, geo, config)
    assert not fitted.collapsed and fitted.explained > 0.3
    volume = render_volume(fitted.object_model, (size,) * 3) * scale
    assert psnr(truth, volume) > psnr(truth, torch.zeros_like(truth)) + 2.0
    # an all-zero series has nothing to explain: an empty volume is its answer
    empty = reconstruct(torch.zeros_like(series), geo, _config())
    assert not empty.collapsed and empty.explained == 1.0


def test_bad_tilt_series_is_rejected():
    _, geo, series = _data()
    with pytest.raises(ValueError, match="shape"):
        reconstruct(series[:-1], geo, _config())
    bad = series.clone()
    bad[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        reconstruct(bad, geo, _config())


def _ddp_config(**kw):
    base = dict(
        resolution=10,
        channels=3,
        rotations=2,
        steps=8,
        rays_per_batch=64,
        samples_per_ray=10,
        tv_points=64,
        backend="torch",
        progress=False,
        eval_every=0,
    )
    return {**base, **kw}


def _ddp_worker(rank, world, config_kwargs):
    _, geo, series = _data()
    result = reconstruct(series, geo, ReconstructionConfig(**config_kwargs))
    state = {k: v.detach().clone() for k, v in result.object_model.field.state_dict().items()}
    return state, result.losses


@pytest.mark.timeout(240)
def test_ddp_ranks_match_one_process_on_the_whole_batch():
    from tomo_kplanes.distributed import launch_local

    # three ranks: 64 rays and 64 TV points round up to 3 x 22 = 66 per step
    results = launch_local(_ddp_worker, 3, _ddp_config(), timeout=200)
    (s0, losses0), *others = results
    for state, losses in others:
        assert losses == losses0
        for k in s0:
            assert torch.equal(s0[k], state[k]), k
    _, geo, series = _data()
    single = reconstruct(
        series, geo, ReconstructionConfig(**_ddp_config(rays_per_batch=66, tv_points=66))
    )
    want = single.object_model.field.state_dict()
    for k in s0:
        torch.testing.assert_close(s0[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    torch.testing.assert_close(
        torch.tensor(losses0), torch.tensor(single.losses), rtol=1e-4, atol=0
    )


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.timeout(300)
def test_ddp_on_two_gpus_with_nccl():
    from tomo_kplanes.distributed import launch_local, phantom_worker

    cfg = {**_ddp_config(), "backend": None}
    s0, s1 = launch_local(phantom_worker, 2, cfg, 16, "cuda", backend="nccl")
    for k in s0:
        torch.testing.assert_close(s0[k], s1[k], rtol=0, atol=0)


def test_cuda_graph_option_runs_eagerly_off_cuda():
    _, geo, series = _data()
    eager = reconstruct(series, geo, _config(steps=20))
    with pytest.warns(UserWarning, match="cuda_graph"):
        graphed = reconstruct(series, geo, _config(steps=20, cuda_graph=True))
    assert graphed.losses == eager.losses


def test_captured_step_rejects_a_warmup_below_one():
    from tomo_kplanes.graphed import CapturedStep

    with pytest.raises(ValueError, match="warmup"):
        CapturedStep(lambda: torch.zeros(()), warmup=0)


def _linear_run(graph: bool, steps: int = 12):
    from tomo_kplanes.graphed import CapturedStep, prepare_optimizer_for_capture

    g = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(16, 1).cuda()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 16, generator=g))
        model.bias.zero_()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    x = torch.empty(64, 16, device="cuda")
    noise_gen = torch.Generator(device="cuda").manual_seed(3)

    def step():
        noisy = x + 0.01 * torch.randn(x.shape, device="cuda", generator=noise_gen)
        loss = model(noisy).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    run = step
    if graph:
        prepare_optimizer_for_capture(opt)
        run = CapturedStep(step, warmup=2, generators=[noise_gen])
    losses = []
    for _ in range(steps):
        x.copy_(torch.randn(64, 16, generator=g).cuda())
        losses.append(run().clone())
        sched.step()
    if graph:
        assert run.captured
    return torch.stack(losses), model.weight.detach().clone()


@pytest.mark.gpu
def test_captured_step_follows_the_eager_trajectory():
    """Fresh batches, a device generator and an lr schedule all reach the replayed step."""
    eager_losses, eager_w = _linear_run(False)
    graph_losses, graph_w = _linear_run(True)
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(graph_w, eager_w, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
def test_reconstruct_with_cuda_graph_matches_eager_on_cuda(monkeypatch):
    import tomo_kplanes.train as train

    captured = []

    class Recording(train.CapturedStep):
        def __call__(self):
            loss = super().__call__()
            captured.append(self.captured)
            return loss

    monkeypatch.setattr(train, "CapturedStep", Recording)
    truth = shepp_logan_3d(16, device="cuda")
    geo = TiltGeometry(tilt_range(60, 6), (16, 16))
    series = simulate_tilt_series(truth, geo)
    cfg = dict(
        resolution=16,
        channels=4,
        rotations=2,
        steps=40,
        rays_per_batch=128,
        samples_per_ray=16,
        tv_points=128,
        backend=None,
        progress=False,
        eval_every=0,
    )
    eager = reconstruct(series, geo, ReconstructionConfig(**cfg, cuda_graph=False))
    assert not captured
    graphed = reconstruct(series, geo, ReconstructionConfig(**cfg))  # the default on CUDA
    assert captured and captured[-1] and not captured[0]
    # same batches, taps and schedule; only the order of fp32 atomics differs between runs
    torch.testing.assert_close(
        torch.tensor(graphed.losses), torch.tensor(eager.losses), rtol=2e-3, atol=1e-7
    )


@pytest.mark.gpu
def test_cuda_graph_checkpoint_resume_and_holdout_on_cuda(tmp_path):
    """A graphed run interrupted at a checkpoint and resumed follows the uninterrupted graphed run
    (generator state, optimizer state and schedule survive), with held-out evaluation between
    replays."""
    truth = shepp_logan_3d(16, device="cuda")
    geo = TiltGeometry(tilt_range(60, 6), (16, 16))
    series = simulate_tilt_series(truth, geo)
    cfg = dict(
        resolution=16,
        channels=4,
        rotations=2,
        steps=40,
        rays_per_batch=128,
        samples_per_ray=16,
        tv_points=128,
        backend=None,
        progress=False,
        eval_every=10,
        patience=100,
    )
    full = reconstruct(series, geo, ReconstructionConfig(**cfg))
    ckpt = dict(cfg, checkpoint_every=10, checkpoint_path=str(tmp_path / "ck.pt"))
    part = reconstruct(series, geo, ReconstructionConfig(**ckpt), stop_at=20)
    assert part.steps_run == 20
    resumed = reconstruct(series, geo, ReconstructionConfig(**ckpt), resume=True)
    assert resumed.steps_run == 40 and len(resumed.holdout_losses) == 4
    torch.testing.assert_close(
        torch.tensor(resumed.losses), torch.tensor(full.losses), rtol=2e-3, atol=1e-7
    )


@pytest.mark.gpu
def test_prepare_optimizer_for_capture_rejects_host_state():
    from tomo_kplanes.graphed import prepare_optimizer_for_capture

    p = torch.nn.Parameter(torch.ones(3, device="cuda"))
    opt = torch.optim.Adam([p], lr=0.1, foreach=False)
    p.grad = torch.ones_like(p)
    opt.step()  # a plain Adam keeps its step counter on the host
    with pytest.raises(ValueError, match="fused=True or capturable=True"):
        prepare_optimizer_for_capture(opt)


def test_automatic_settings_follow_the_detector_and_explicit_ones_stay():
    from dataclasses import asdict

    geo = TiltGeometry(tilt_range(60, 30), (12, 20))
    auto = ReconstructionConfig(steps=400).resolved(geo)
    assert (auto.resolution, auto.samples_per_ray, auto.eval_every) == (20, 20, 50)
    assert ReconstructionConfig(steps=2000).resolved(geo).eval_every == 250
    # the defaults of earlier versions, given explicitly, are kept as they were
    old = dict(resolution=64, channels=16, rotations=4, steps=1000, rays_per_batch=1024,
               samples_per_ray=128, tv_points=2048, eval_every=100)  # fmt: skip
    assert asdict(ReconstructionConfig(**old).resolved(geo)) == asdict(ReconstructionConfig(**old))
    assert ReconstructionConfig(eval_every=0).resolved(geo).eval_every == 0


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(resolution=1), ValueError, "resolution"),
        (dict(resolution=8.0), TypeError, "resolution"),
        (dict(samples_per_ray=0), ValueError, "samples_per_ray"),
        (dict(samples_per_ray=True), TypeError, "samples_per_ray"),
        (dict(eval_every=-1), ValueError, "eval_every"),
    ],
)
def test_bad_automatic_settings_name_the_setting(kwargs, error, name):
    with pytest.raises(error, match=name):
        ReconstructionConfig(**kwargs)


def test_reconstruct_with_the_defaults_sizes_the_field_from_the_data():
    from tomo_kplanes.train import build_object

    _, geo, series = _data()
    config = ReconstructionConfig(steps=2, backend="torch", progress=False)
    result = reconstruct(series, geo, config)
    assert result.config == config.resolved(geo)
    assert result.config.resolution == result.object_model.field.resolution == 10
    assert config.resolution is None  # the caller's config is left as it was
    with pytest.raises(ValueError, match="resolved"):
        build_object(config, "cpu")
    with pytest.raises(TypeError, match="config"):
        reconstruct(series, geo, {"steps": 2})
