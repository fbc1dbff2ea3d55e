"""Fused attention's throughput from the device facts: forward and backward FLOP/s of a kernel on a device generation
against the query length, head dimension and mask, interpolated from the catalogue's published figures
(the device profiles' `attention` sections, predictor/data/profiles/; docs/device-facts.md says where each comes from).

FLOPs are counted as FlashAttention's benchmarks count them (benchmarks/benchmark_flash_attention.py): forward
4·s_q·s_kv·head_dim·heads, halved under a causal mask; backward 2.5 times the forward (its recomputation of the
scores included). A rate is that count over the measured time, so a time is the same count over the rate.

Where the catalogue lacks a combination it is filled from the figures it has, each step a ratio measured on the same
kernel and generation: a head dimension's backward from the backward at 128 times the forward's ratio of the two head
dimensions; a causal rate from the unmasked one times the forward's causal over unmasked ratio at head dimension 128.
A generation with only a kernel's best forward figure (FlashAttention-2 on Ampere, cuDNN on Blackwell) takes the
curves of that kernel measured on another generation, scaled so their best forward figure is its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import numpy as np

from predictor.kernels.profile import AttentionTable, DeviceProfile, generation_profiles
from predictor.spec.hardware import GENERATIONS, TFLOPS

PASSES: tuple[str, ...] = ("forward", "backward")
BWD_FLOPS = 2.5  # backward FLOPs over the forward's, as FlashAttention counts them
REFERENCE_HEAD_DIM = 128  # where the catalogue has both masks: the causal ratio is taken there


@dataclass(frozen=True)
class AttentionCurves:
    """One kernel's FLOP/s on one generation: `rates[pass, causal, head_dim, seq]` over the grid `head_dims` x `seqs`.

    `how`: where the rates come from, as a prediction's extra says it."""

    kernel: str
    generation: str
    head_dims: np.ndarray
    seqs: np.ndarray
    rates: np.ndarray
    how: str

    def rate(self, backward: bool, causal: bool, head_dim, seq) -> np.ndarray:
        """FLOP/s at each (head_dim, query length), log-linear between grid points, flat beyond its ends (the
        published figures plateau by 16k tokens; below 512 the shortest figure stands)."""
        grid = self.rates[int(backward), int(causal)]  # (head dims, seqs)
        ls = np.log2(np.clip(np.atleast_1d(np.asarray(seq, dtype=float)), self.seqs[0], self.seqs[-1]))
        lh = np.log2(np.clip(np.atleast_1d(np.asarray(head_dim, dtype=float)), self.head_dims[0], self.head_dims[-1]))
        ls, lh = np.broadcast_arrays(ls, lh)
        by_dim = np.array([np.interp(ls, np.log2(self.seqs), row) for row in grid])  # (head dims, points)
        if len(self.head_dims) == 1:
            return by_dim[0]
        x = np.log2(self.head_dims)
        i = np.clip(np.searchsorted(x, lh, side="right") - 1, 0, len(x) - 2)
        t = np.clip((lh - x[i]) / (x[i + 1] - x[i]), 0.0, 1.0)
        cols = np.arange(ls.size)
        return by_dim[i, cols] * (1 - t) + by_dim[i + 1, cols] * t


def _tables(generation: str, kernel: str) -> list[tuple[DeviceProfile, AttentionTable]]:
    """The kernel's attention tables in the shipped profiles of the generation's devices."""
    return [(p, p.attention[kernel]) for p in generation_profiles(generation) if kernel in p.attention]


def _measured_curves(generation: str, kernel: str) -> AttentionCurves | None:
    """The grid of the first profile of the generation that gives the kernel's curves, filled by the module's
    ratios."""
    found = [(p, t) for p, t in _tables(generation, kernel) if any(len(r) for r in t.passes.values())]
    if not found:
        return None
    profile, table = found[0]
    rows = {key: r for key, r in table.passes.items() if len(r)}
    seqs = np.unique(np.concatenate([r[:, 0] for r in rows.values()]))
    dims = sorted(int(d) for d in np.unique(np.concatenate([r[:, 1] for r in rows.values()])))
    given = {}
    for key, r in rows.items():
        for d in np.unique(r[:, 1]):
            at = r[r[:, 1] == d]
            at = at[np.argsort(at[:, 0])]
            assert np.array_equal(at[:, 0], seqs), "one sequence grid per kernel and device"
            given[("forward" if key.startswith("fwd") else "backward", key.endswith("_causal"), int(d))] = at[:, 2]
    ref = REFERENCE_HEAD_DIM if REFERENCE_HEAD_DIM in dims else dims[0]
    fwd = {d: given[("forward", False, d)] for d in dims if ("forward", False, d) in given}
    rates = np.zeros((2, 2, len(dims), len(seqs)))
    for p, pass_ in enumerate(PASSES):
        for h, d in enumerate(dims):
            unmasked = given.get((pass_, False, d))
            if unmasked is None:  # the pass's reference head dimension times the forward's head-dimension ratio
                unmasked = given[(pass_, False, ref)] * fwd[d] / fwd[ref]
            rates[p, 0, h] = unmasked
            masked = given.get((pass_, True, d))
            if masked is None:
                causal_ratio = (given[("forward", True, ref)] / fwd[ref] if ("forward", True, ref) in given
                                else np.ones_like(seqs))
                masked = unmasked * causal_ratio
            rates[p, 1, h] = masked
    return AttentionCurves(kernel, generation, np.array(dims, dtype=float), seqs, rates,
                           f"{kernel} on {generation}: the figures of {_cite(profile, kernel)}")


def _best_forward(generation: str, kernel: str) -> tuple[float, str] | None:
    """A generation's best published forward FLOP/s of the kernel and its citation, where a profile gives only that."""
    for profile, table in _tables(generation, kernel):
        if table.best_fwd:
            return table.best_fwd, _cite(profile, kernel)
    return None


@cache
def attention_curves(generation: str, kernel: str) -> AttentionCurves | None:
    """The kernel's curves on the generation: its own figures, else another generation's curves of the same kernel
    scaled to its best forward figure; None where the catalogue has neither (the caller prices from first
    principles and says so)."""
    own = _measured_curves(generation, kernel)
    if own is not None:
        return own
    found = _best_forward(generation, kernel)
    if found is None:
        return None
    best, cite = found
    donors = [c for g in sorted(set(GENERATIONS.values())) if g != generation
              for c in [_measured_curves(g, kernel)] if c is not None]
    if not donors:
        return None
    donor = donors[0]
    scale = best / donor.rates[0].max()
    return AttentionCurves(kernel, generation, donor.head_dims, donor.seqs, donor.rates * scale,
                           f"{kernel} on {generation}: its best forward figure ({best / TFLOPS:.0f} TFLOP/s, "
                           f"{cite}) on the shape of {donor.how}")


def _cite(profile: DeviceProfile, kernel: str) -> str:
    """The papers (arXiv identifiers) the profile's source of the kernel's figures names."""
    return ", ".join(sorted(set(re.findall(r"arXiv:\d{4}\.\d{4,5}", profile.sources.get(f"attention.{kernel}", "")))))
