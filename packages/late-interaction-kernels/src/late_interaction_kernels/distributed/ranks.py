"""What the sharded indexes share: the process group they span, the collectives they run on it
(a gather of one flat tensor, an agreement on bad inputs so that no rank is left waiting, the
exchange of each rank's top-k candidates) and the merge of those candidates into one top-k."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

#: The id of a padding candidate (a rank holding fewer than ``k`` documents): it loses every tie.
_NO_DOC = torch.iinfo(torch.int64).max
#: The bits of a float32 -inf, the score of a padding candidate.
_NEG_INF_BITS = int(torch.tensor(float("-inf")).view(torch.int32))


def _merge(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best of ``(Nq, M)`` candidates, best first, equal scores by smaller id: a stable
    sort by id, then a stable sort by score (ids may exceed 32 bits, so no packed key)."""
    by_id = ids.argsort(dim=1, stable=True)
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    best = scores.argsort(dim=1, descending=True, stable=True)[:, :k]
    return scores.gather(1, best), ids.gather(1, best)


class RankGroup:
    """A mix-in for an index whose shards live on the ranks of a process group. It sets and uses
    ``group``, ``rank``, ``world_size`` and reads the index's ``device``."""

    device: torch.device

    def _setup_group(self, group) -> None:
        if dist.is_available() and dist.is_initialized():
            self.group = group
            self.rank = dist.get_rank(group)
            self.world_size = dist.get_world_size(group)
            if self.rank < 0:
                raise ValueError("this process is not a member of group=")
        elif group is not None:
            raise ValueError("group= was given but torch.distributed is not initialised")
        else:
            self.group, self.rank, self.world_size = None, 0, 1

    def _default_device(self) -> torch.device:
        if self.world_size > 1 and self._uses_nccl() and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _uses_nccl(self) -> bool:
        return "nccl" in str(dist.get_backend(self.group)).lower()

    def _comm_device(self) -> torch.device:
        """Where collective buffers live: CUDA for NCCL, the CPU for gloo (a backend that maps
        both, ``"cpu:gloo,cuda:nccl"``, takes the shard's device)."""
        backend = str(dist.get_backend(self.group)).lower()
        if "nccl" not in backend:
            return torch.device("cpu")
        if self.device.type == "cuda":
            return self.device
        if "gloo" in backend:
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())

    def _gather(self, flat: torch.Tensor) -> torch.Tensor:
        """``(world_size, *flat.shape)``: every rank's ``flat``, in one collective (a flat
        output, which both gloo and NCCL take)."""
        if self.world_size == 1:
            return flat.unsqueeze(0)
        comm = self._comm_device()
        src = flat.to(comm).reshape(-1)
        out = src.new_empty(self.world_size * src.numel())
        dist.all_gather_into_tensor(out, src, group=self.group)
        return out.view(self.world_size, *flat.shape)

    def _agree(self, error: Exception | None, values: Sequence[int]) -> list[list[int]]:
        """Gather ``values`` from every rank, with whether its input was bad; if any was, raise
        on every rank (``error`` itself on the rank at fault), so none is left waiting in a later
        collective."""
        row = torch.tensor([int(error is not None), *values], dtype=torch.int64)
        rows = self._gather(row).tolist()
        bad = [r for r, got in enumerate(rows) if got[0]]
        if error is not None:
            raise error
        if bad:
            raise ValueError(
                f"rank(s) {bad} of {self.world_size} rejected their input (their own error names "
                "it); every rank stops"
            )
        return [got[1:] for got in rows]

    def _exchange(self, scores, ids, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's candidates, padded to ``k`` and sent as one int64 tensor (the float32
        scores bit-cast), merged into the global top ``k``."""
        nq, have = scores.shape
        packed = torch.full((2, nq, k), _NO_DOC, dtype=torch.int64, device=self.device)
        packed[0].fill_(_NEG_INF_BITS)
        packed[0, :, :have] = scores.view(torch.int32)
        packed[1, :, :have] = ids
        every = self._gather(packed)  # (world, 2, nq, k)
        all_scores = every[:, 0].to(torch.int32).view(torch.float32).permute(1, 0, 2)
        all_ids = every[:, 1].permute(1, 0, 2)
        scores, ids = _merge(all_scores.reshape(nq, -1), all_ids.reshape(nq, -1), k)
        return scores.to(self.device), ids.to(self.device)

