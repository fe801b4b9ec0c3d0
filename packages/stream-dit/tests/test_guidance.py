import torch

from stream_dit.guidance import apg, cfg_combine, cfg_rescale, dcw_correct, haar_merge, haar_split
from triton_dispatch.testing import assert_close


def _pair(rng):
    return torch.randn(2, 9, 8, generator=rng), torch.randn(2, 9, 8, generator=rng)


def test_cfg_combine_and_rescale(rng):
    vp, vn = _pair(rng)
    assert torch.equal(cfg_combine(vp, vn, 1.0), vn + (vp - vn))
    out = cfg_rescale(cfg_combine(vp, vn, 5.0), vp, 1.0)
    assert_close(out.std(dim=(-2, -1)), vp.std(dim=(-2, -1)), tol=1e-5)
    assert torch.equal(cfg_rescale(vp, vn, 0.0), vp)


def test_apg_float64_reference(rng):
    vp, vn = _pair(rng)
    out, running = apg(vp, vn, 4.0, None, momentum=-0.5, norm_threshold=0.0, eta=0.0)
    d = (vp - vn).double()
    v0 = vp.double()
    unit = v0 / v0.flatten(1).norm(dim=1)[:, None, None]
    par = (d * unit).sum(dim=(1, 2), keepdim=True) * unit
    assert_close(out, vp.double() + 3.0 * (d - par), dtype=torch.float32)
    # the result's guidance part is orthogonal to v_pos
    assert_close(((out - vp).double() * v0).sum(dim=(1, 2)), torch.zeros(2), tol=1e-4)
    # momentum: second step averages with the first difference
    _out2, running2 = apg(vp, vn, 4.0, running, momentum=-0.5)
    assert_close(running2, 0.5 * (vp - vn))


def test_apg_norm_threshold_clips(rng):
    vp, vn = _pair(rng)
    out, _ = apg(vp, vn, 2.0, None, norm_threshold=1e-3, eta=1.0)
    # eta=1 keeps the whole (clipped) difference: its norm is the threshold
    norms = (out - vp).flatten(1).norm(dim=1)
    assert_close(norms, torch.full((2,), 1e-3), tol=1e-3)  # cancellation in out - vp


def test_haar_round_trip_and_dcw_bands(rng):
    for frames in (8, 9):
        x = torch.randn(frames, 4, generator=rng)
        low, high = haar_split(x)
        torch.testing.assert_close(haar_merge(low, high, frames), x)
    x, x0 = torch.randn(8, 4, generator=rng), torch.randn(8, 4, generator=rng)
    # at t=1 only the low band moves (fully, with strength 1); at t=0 only the high band
    at1 = dcw_correct(x, x0, 1.0, 1.0, 1.0)
    torch.testing.assert_close(haar_split(at1)[0], haar_split(x0)[0])
    torch.testing.assert_close(haar_split(at1)[1], haar_split(x)[1])
    at0 = dcw_correct(x, x0, 0.0, 1.0, 1.0)
    torch.testing.assert_close(haar_split(at0)[1], haar_split(x0)[1])
    torch.testing.assert_close(haar_split(at0)[0], haar_split(x)[0])
    torch.testing.assert_close(dcw_correct(x, x0, 0.5, 0.0, 0.0), x)
