"""Late interaction across the ranks of a ``torch.distributed`` process group: cross-rank
in-batch negatives for training (:func:`maxsim_across_ranks`) and exact top-k search over a
collection split across ranks (:class:`ShardedMaxSimIndex`), and compressed search over one
(:class:`ShardedCompressedIndex`)."""

from .cross_rank import maxsim_across_ranks
from .sharded_compressed import ShardedCompressedIndex
from .sharded_index import ShardedMaxSimIndex

__all__ = ["ShardedCompressedIndex", "ShardedMaxSimIndex", "maxsim_across_ranks"]
