"""The plan of one kind of ``tilted_plane_features_with_tv`` call: the two ops' plans, the plane
TV's gradient serving as the buffer the features' backward adds into where both kernels use the
planes' own layout."""

from __future__ import annotations

import torch

from ..plane_tv.kernels import dense, plane_tv_plan
from ..tilted_plane_features.backward import FeaturesPlan, features_plan


class FeaturesWithTVPlan:
    """Both ops' launches; ``folds``: the TV's gradient has the layout the features' backward
    scatters into (a dense planes layout), so it is that backward's starting buffer instead of a
    second gradient added afterwards."""

    def __init__(self, features: FeaturesPlan, tv, folds: bool) -> None:
        self.features, self.tv, self.folds = features, tv, folds

    def forward(self, points, rotations, planes) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features.forward(points, rotations, planes), self.tv.forward(planes)

    def backward(self, grad_features, grad_tv, points, rotations, planes, needs):
        grad_tv_planes = None
        if needs[2] and grad_tv is not None:
            grad_tv_planes = self.tv.backward(grad_tv, planes)
        if grad_features is None:
            return None, None, grad_tv_planes
        if self.folds:
            return self.features.backward(
                grad_features, points, rotations, planes, needs, grad_tv_planes
            )
        grads = self.features.backward(grad_features, points, rotations, planes, needs)
        if grad_tv_planes is None:
            return grads
        return grads[0], grads[1], grads[2] + grad_tv_planes


def features_with_tv_plan(points, rotations, planes) -> FeaturesWithTVPlan | None:
    """The plan of validated inputs; ``None`` (the reference) where the TV kernels do not take
    the planes."""
    tv = plane_tv_plan(planes)
    if tv is None:
        return None
    return FeaturesWithTVPlan(features_plan(points, rotations, planes), tv, dense(planes))
