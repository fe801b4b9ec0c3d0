import pytest
import torch

from stream_dit.cond_cache import PaddedStatesCache


def test_pads_memoises_evicts_and_keeps_inputs_alive(rng):
    cache = PaddedStatesCache(maxsize=2)
    a = (torch.randn(2, 4, generator=rng), torch.tensor([True, False]))
    b = (torch.randn(3, 4, generator=rng), torch.ones(3, dtype=torch.bool))
    rows = [a, b]
    states, mask = cache.get(rows, 5)
    assert rows == [a, b] and len(rows) == 2  # the caller's list is not modified
    assert (
        states.shape == (2, 5, 4)
        and torch.equal(states[0, :2], a[0])
        and torch.equal(states[1, 3:], torch.zeros(2, 4))
    )
    assert mask.tolist() == [[True, False, False, False, False], [True, True, True, False, False]]
    again = cache.get([a, b], 5)
    assert again[0] is states and cache.hits == 1
    cache.get([b], 5)
    cache.get([a], 5)
    assert len(cache) == 2
    cache.get([a, b], 5)  # evicted: rebuilt
    assert cache.misses == 4
    # entries hold the input tensors, so their ids cannot be reused by new tensors while cached
    held = {id(t) for entry in cache._entries.values() for pair in entry[0] for t in pair}
    assert id(a[0]) in held
    with pytest.raises(ValueError):
        PaddedStatesCache(0)
