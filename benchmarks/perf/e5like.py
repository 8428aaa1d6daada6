"""Synthetic 768-d passage and query vectors with e5-base-v2's geometry, generated in chunks.

No registry ships e5 weights or Wikipedia's e5 vectors, so the wiki-scale benchmark stands in
for them with vectors that share e5's published geometry:

- **Anisotropy.** Every vector has a large component along one common direction, so random
  passage pairs score a cosine of about 0.72 and nearly all scores lie between 0.7 and 1.0, as
  e5's model card says of its scores (InfoNCE at temperature 0.01).
- **Clusters at several levels.** Topics, subtopics and leaves (32 x 16 x 16 = 8,192 leaves,
  with skewed popularity), each level a random offset of decreasing scale drawn from a power-law
  spectrum (few directions carry most of the variance), then per-leaf low-rank noise (rank 16,
  from 256 shared bases) and a small isotropic floor: locally low intrinsic dimension.
- **Queries shifted from passages.** A query is a gold passage moved by one fixed shift (e5's
  `query: ` / `passage: ` offset, the same for every query) and by noise; `difficulty` scales the
  noise (hard: queries land further from their gold passage, so the top-10 scores crowd together).

Row i depends only on the seed and i: rows are drawn in fixed blocks of `BLOCK_ROWS`, each from
its own seeded generator, so any chunking and any prefix N give the same rows bit for bit.
`tracerl index stats` prints the same statistics for a real index, so the stand-in can be
checked against e5 by anyone who holds `e5_Flat.index`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np

__all__ = ["BLOCK_ROWS", "DIFFICULTY_NOISE", "Difficulty", "E5Like", "write_flat_file"]

BLOCK_ROWS = 16_384
Difficulty = Literal["easy", "medium", "hard"]
DIFFICULTY_NOISE: dict[Difficulty, float] = {"easy": 0.5, "medium": 1.0, "hard": 2.0}
"""Query noise scale per difficulty, relative to medium."""


@dataclass(frozen=True, kw_only=True)
class E5Like:
    """The generator; equal fields give equal vectors.

    Component variances are shares of a vector's squared norm before it is normalised; the
    common direction has variance 1, so random pairs score about 1 / (1 + sum of the others).
    """

    dim: int = 768
    seed: int = 0
    fanout: tuple[int, int, int] = (32, 16, 16)
    """children per node at each level: topics, subtopics per topic, leaves per subtopic"""
    level_var: tuple[float, float, float] = (0.12, 0.09, 0.07)
    """variance of each level's offset"""
    leaf_rank: int = 16
    """rank of the noise within a leaf"""
    n_bases: int = 256
    """distinct leaf-noise subspaces, shared round-robin by the leaves"""
    leaf_var: float = 0.08
    """variance of the low-rank noise within a leaf"""
    iso_var: float = 0.03
    """variance of the isotropic floor"""
    spectrum_power: float = 0.5
    """offsets are drawn with variance proportional to (j + 1) ** -power along direction j"""
    query_shift_var: float = 0.05
    """variance of the one shift every query gets (e5's query/passage offset)"""
    query_noise_var: float = 0.15
    """variance of a query's own noise at medium difficulty"""
    query_leaf_share: float = 0.8
    """share of that noise in its gold passage's leaf subspace (the rest isotropic)"""

    @cached_property
    def _structure(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, 0xE5])
        d = self.dim
        rotation, _ = np.linalg.qr(rng.standard_normal((d, d)))  # (d, d) orthonormal
        spectrum = (np.arange(d) + 1.0) ** -self.spectrum_power
        spectrum *= d / spectrum.sum()  # E|offset|^2 = d before scaling

        def offsets(n: int, var: float) -> np.ndarray:  # (n, d), E|row|^2 = var
            z = rng.standard_normal((n, d)) * np.sqrt(spectrum / d * var)
            return (z @ rotation.T).astype(np.float32)

        mean = rng.standard_normal(d)
        mean /= np.linalg.norm(mean)
        n1, n2, n3 = self.fanout
        top = offsets(n1, self.level_var[0])  # (n1, d)
        sub = offsets(n1 * n2, self.level_var[1]) + np.repeat(top, n2, axis=0)
        leaves = offsets(n1 * n2 * n3, self.level_var[2]) + np.repeat(sub, n3, axis=0)
        centres = leaves + mean.astype(np.float32)  # (n_leaves, d)
        bases = offsets(self.n_bases * self.leaf_rank, self.leaf_var).reshape(
            self.n_bases, self.leaf_rank, d
        )  # each leaf's noise: g @ bases[b], g ~ N(0, I_r / r)
        popularity = (
            np.repeat(rng.dirichlet(np.full(n1, 0.5)), n2 * n3)
            * np.repeat(np.tile(rng.dirichlet(np.full(n2, 1.0), size=n1).ravel(), 1), n3)
            * rng.dirichlet(np.full(n3, 2.0), size=n1 * n2).ravel()
        )
        shift = offsets(1, self.query_shift_var)[0]
        return {
            "centres": centres,
            "bases": bases,
            "cdf": np.cumsum(popularity / popularity.sum()),
            "shift": shift,
        }

    @property
    def n_leaves(self) -> int:
        """Leaves of the topic tree."""
        n1, n2, n3 = self.fanout
        return n1 * n2 * n3

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of one block, unnormalised, and their leaves: ((BLOCK_ROWS, d), (BLOCK_ROWS,))."""
        s = self._structure
        rng = np.random.default_rng([self.seed, 1, block])
        leaf = np.minimum(np.searchsorted(s["cdf"], rng.random(BLOCK_ROWS)), self.n_leaves - 1)
        g = rng.standard_normal((BLOCK_ROWS, self.leaf_rank), dtype=np.float32)
        g /= np.sqrt(self.leaf_rank)
        basis = s["bases"][leaf % self.n_bases]  # (B, r, d)
        rows = s["centres"][leaf] + np.einsum("br,brd->bd", g, basis)
        rows += rng.standard_normal((BLOCK_ROWS, self.dim), dtype=np.float32) * np.float32(
            np.sqrt(self.iso_var / self.dim)
        )
        return rows, leaf

    def passages(self, start: int, stop: int) -> np.ndarray:
        """Unit-norm passage vectors of rows [start, stop), float32, (stop - start, dim)."""
        out = np.empty((stop - start, self.dim), dtype=np.float32)
        last = (stop - 1) // BLOCK_ROWS + 1 if stop > start else 0
        for block in range(start // BLOCK_ROWS, last):
            rows, _ = self._block(block)
            lo, hi = max(start, block * BLOCK_ROWS), min(stop, (block + 1) * BLOCK_ROWS)
            out[lo - start : hi - start] = rows[lo - block * BLOCK_ROWS : hi - block * BLOCK_ROWS]
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out

    def queries(
        self, n: int, *, max_row: int, difficulty: Difficulty = "medium"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Unit-norm query vectors and the rows of their gold passages.

        Args:
            n: how many queries.
            max_row: gold passages are drawn from rows [0, max_row), so the same queries serve
                every N >= max_row.
            difficulty: the query noise scale (`DIFFICULTY_NOISE`).

        Returns:
            ((n, dim) float32, (n,) int64).
        """
        s = self._structure
        rng = np.random.default_rng([self.seed, 2, n, max_row])
        gold = np.sort(rng.choice(max_row, size=n, replace=False))
        noise_var = self.query_noise_var * DIFFICULTY_NOISE[difficulty]
        out = np.empty((n, self.dim), dtype=np.float32)
        by_block: dict[int, list[int]] = {}
        for i, row in enumerate(gold):
            by_block.setdefault(int(row) // BLOCK_ROWS, []).append(i)
        for block, members in by_block.items():
            rows, leaf = self._block(block)
            local = gold[members] - block * BLOCK_ROWS
            base = rows[local] / np.linalg.norm(rows[local], axis=1, keepdims=True)
            g = rng.standard_normal((len(members), self.leaf_rank)).astype(np.float32)
            leaf_scale = noise_var * self.query_leaf_share / self.leaf_var / self.leaf_rank
            g *= np.float32(np.sqrt(leaf_scale))
            in_leaf = np.einsum("br,brd->bd", g, s["bases"][leaf[local] % self.n_bases])
            iso = rng.standard_normal((len(members), self.dim)).astype(np.float32)
            iso *= np.float32(np.sqrt(noise_var * (1 - self.query_leaf_share) / self.dim))
            out[members] = base + s["shift"] + in_leaf + iso
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out, gold


def write_flat_file(path: Path, generator: E5Like, n: int, *, chunk_rows: int = 65_536) -> None:
    """Write rows [0, n) as a faiss `IndexFlatIP` file, chunk by chunk.

    The bytes are what `faiss.write_index` writes for an `IndexFlatIP` holding those rows.
    """
    d = generator.dim
    with path.open("wb") as handle:
        # fourcc, d, ntotal, two unused int64 (faiss writes 1 << 20), is_trained, metric (IP = 0)
        handle.write(struct.pack("<4siqqq?i", b"IxFI", d, n, 1 << 20, 1 << 20, True, 0))
        handle.write(struct.pack("<Q", n * d))
        for lo in range(0, n, chunk_rows):
            handle.write(generator.passages(lo, min(n, lo + chunk_rows)).tobytes())
