"""Deterministic, resumable, shardable index sampling over a random-access record source.

The sampler's whole state is one integer, `position` (how many indices this shard has drawn), so
the trainer checkpoints it next to the parameters and a resumed run draws exactly the same
prompts. Epoch e visits a permutation of all records; the permutation is a pure function of
(seed, e), built from a splitmix64 hash of the record index (sorted), so it does not depend on
numpy's random generators and is the same on every machine and numpy version.

Sharding (one shard per host process): shard s of S takes the records at positions s, s+S, ...
of each epoch's permutation, truncated to floor(N/S) so every shard draws the same number of
indices per epoch (hosts stay in lockstep) and shards never overlap within an epoch.
"""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1


def _splitmix64_int(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on uint64 arrays (wrap-around arithmetic is intended)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class IndexSampler:
    """Epoch-wise permutations of range(num_records), one shard of them, drawn in order.

    Args:
      num_records: size of the source (>= num_shards).
      seed: any integer; fixes every epoch's permutation.
      shuffle: False visits records in order 0..N-1 each epoch.
      shard_index, num_shards: this process's shard.
    """

    def __init__(self, num_records: int, *, seed: int, shuffle: bool = True,
                 shard_index: int = 0, num_shards: int = 1):
        if num_shards < 1 or not 0 <= shard_index < num_shards:
            raise ValueError(
                f"IndexSampler: shard_index={shard_index} is not in [0, num_shards={num_shards})")
        if num_records < num_shards:
            raise ValueError(
                f"IndexSampler: num_records={num_records} < num_shards={num_shards}; every shard "
                "needs at least one record")
        self.num_records = num_records
        self.seed = seed
        self.shuffle = shuffle
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.per_shard = num_records // num_shards
        self._position = 0
        self._cached: tuple[int, np.ndarray] | None = None

    @property
    def position(self) -> int:
        """Indices drawn so far by this shard: the checkpointable state."""
        return self._position

    def restore(self, position: int) -> None:
        if position < 0:
            raise ValueError(f"IndexSampler.restore: position must be >= 0, got {position}")
        self._position = int(position)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """int64 [per_shard]: the record indices this shard visits in `epoch`, in order."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        if self.shuffle:
            base = _splitmix64_int(_splitmix64_int(self.seed & _MASK) ^ epoch)
            keys = _splitmix64(np.arange(self.num_records, dtype=np.uint64) + np.uint64(base))
            perm = np.argsort(keys, kind="stable")
        else:
            perm = np.arange(self.num_records)
        order = perm[self.shard_index::self.num_shards][: self.per_shard].astype(np.int64)
        self._cached = (epoch, order)
        return order

    def next_indices(self, n: int) -> np.ndarray:
        """int64 [n]: the next n record indices of this shard; advances `position` by n."""
        if n < 0:
            raise ValueError(f"IndexSampler.next_indices: n must be >= 0, got {n}")
        positions = np.arange(self._position, self._position + n, dtype=np.int64)
        epochs, offsets = np.divmod(positions, self.per_shard)
        out = np.empty(n, dtype=np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            out[sel] = self.epoch_order(int(epoch))[offsets[sel]]
        self._position += n
        return out
