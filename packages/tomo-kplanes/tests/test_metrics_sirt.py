import math

import numpy as np
import pytest
import torch

from tomo_kplanes.geometry import TiltGeometry, tilt_range
from tomo_kplanes.metrics import psnr, ssim
from tomo_kplanes.phantoms import shepp_logan_3d, simulate_tilt_series
from tomo_kplanes.sirt import sirt


def test_psnr_known_value():
    truth = torch.zeros(4, 4, 4)
    truth[0, 0, 0] = 1.0
    est = truth + 0.1
    assert psnr(truth, est) == pytest.approx(20.0)
    assert psnr(truth, truth) == math.inf


@pytest.mark.parametrize("shape", [(20, 21, 22), (30, 25)])
def test_ssim_matches_scikit_image(rng, shape):
    metrics = pytest.importorskip("skimage.metrics")
    a = torch.rand(shape, generator=rng, dtype=torch.float64)
    b = a + 0.2 * torch.randn(shape, generator=rng, dtype=torch.float64)
    ours = ssim(a, b, data_range=1.0)
    ref = metrics.structural_similarity(
        a.numpy(), b.numpy(), data_range=1.0, gaussian_weights=True, sigma=1.5,
        use_sample_covariance=False,
    )
    assert ours == pytest.approx(ref, abs=1e-6)
    assert ssim(a, a) == pytest.approx(1.0)


def test_ssim_rejects_mismatched_or_tiny_volumes():
    with pytest.raises(ValueError):
        ssim(torch.zeros(12, 12, 12), torch.zeros(12, 12, 13))
    with pytest.raises(ValueError):
        ssim(torch.zeros(5, 5, 5), torch.zeros(5, 5, 5))


def test_sirt_reduces_the_error_on_a_small_phantom():
    truth = shepp_logan_3d(12)
    geo = TiltGeometry(tilt_range(60, 15), (12, 12))
    series = simulate_tilt_series(truth, geo, n_samples=12)
    x2 = sirt(series, geo, truth.shape, iterations=2, n_samples=12)
    x10 = sirt(series, geo, truth.shape, iterations=10, n_samples=12)
    e2, e10 = (truth - x2).norm(), (truth - x10).norm()
    assert e10 < e2 < truth.norm()
    assert (x10 >= 0).all()
    np.testing.assert_array_less(0, x10.sum().item())
