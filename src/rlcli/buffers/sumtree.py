"""A sum tree over priorities: O(log n) updates and prefix-sum searches, vectorized over a batch."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Leaves hold priorities; each inner node holds the sum of its children (node 1 is the root)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.leaves = 1 << max(0, (capacity - 1).bit_length())  # next power of two
        self.tree = np.zeros(2 * self.leaves, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(indices) + self.leaves]

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaf priorities, then recompute the sums on every path to the root."""
        nodes = np.asarray(indices, dtype=np.int64) + self.leaves
        if nodes.size == 0:
            return
        self.tree[nodes] = priorities  # with duplicate indices the last write wins, as a loop would
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def prefix(self, index: int) -> float:
        """Sum of the priorities of leaves [0, index)."""
        total, node = 0.0, index + self.leaves
        while node > 1:
            if node % 2 == 1:  # a right child: everything under its left sibling comes before it
                total += self.tree[node - 1]
            node //= 2
        return float(total)

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """For each value v in [0, total), the leaf i with sum(p[:i]) <= v < sum(p[:i+1])."""
        values = np.asarray(prefix_sums, dtype=np.float64).copy()
        nodes = np.ones(values.shape, dtype=np.int64)
        while nodes[0] < self.leaves:
            left = 2 * nodes
            left_sum = self.tree[left]
            go_right = values >= left_sum
            values = np.where(go_right, values - left_sum, values)
            nodes = np.where(go_right, left + 1, left)
        return np.minimum(nodes - self.leaves, self.capacity - 1)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"tree": self.tree.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.tree[:] = state["tree"]
