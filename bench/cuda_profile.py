"""Measure this machine's kernel profile and compare it with the profile shipped for its device.

    python -m bench.cuda_profile [--out PATH] [--gemm-shapes N] [--resume] [--against DEVICE]

On a CUDA machine it measures GPU 0 (and NCCL between the node's GPUs) with the code `scaledl profile --device cuda
--kernels` runs on each node (`predictor.measure.kernel_profile`, here without Ray: one node), then compares each
section with the shipped profile (predictor/data/profiles/<device>.json: XLA's GEMM tables and what else was
published) point by point: a GEMM shape both hold is compared exactly, any other with the shipped shape nearest in
log2 dimensions. Without a GPU it measures this CPU the same way and prints its figures; there is no shipped CPU
profile, so `--against h200` shows the comparison against a GPU's.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def nearest_ratios(measured: np.ndarray, shipped: np.ndarray) -> tuple[np.ndarray, int]:
    """measured / shipped rate for each measured row (shape columns first, rate last) against the shipped row nearest
    in log2 shape, and how many matched a shipped shape exactly."""
    lm, ls = np.log2(measured[:, :-1]), np.log2(shipped[:, :-1])
    dist = ((lm[:, None, :] - ls[None, :, :]) ** 2).sum(-1)
    near = dist.argmin(1)
    return measured[:, -1] / shipped[near, -1], int((dist.min(1) == 0).sum())


def summary(profile: dict) -> list[str]:
    """One line per measured section: its range of figures."""
    lines = []
    for kind in ("gemm", "grouped_gemm"):
        for precision, table in profile.get(kind, {}).items():
            rates = np.array(table["points"])[:, -1]
            lines.append(f"{kind}.{precision}: {len(rates)} shapes, {rates.min() / 1e12:.3g}-{rates.max() / 1e12:.3g} TFLOP/s")
    for backend, passes in profile.get("attention", {}).items():
        for name, rows in passes.items():
            rates = np.array(rows)[:, -1]
            lines.append(f"attention.{backend}.{name}: {rates.min() / 1e12:.3g}-{rates.max() / 1e12:.3g} TFLOP/s")
    copy = np.array(profile.get("memory_bound", {}).get("points", [[1, 0]]))
    lines.append(f"memory_bound: {copy[0, 1] / 1e9:.3g} GB/s at {copy[0, 0]:.0f} B up to {copy[:, 1].max() / 1e9:.4g} GB/s")
    for key in ("launch_s", "host_op_s"):
        if key in profile:
            lines.append(f"{key}: {profile[key] * 1e6:.2f} us")
    for link, ops in profile.get("collectives", {}).items():
        for op, rows in ops.items():
            lines.append(f"collectives.{link}.{op}: bus {rows[0][1] / 1e9:.3g} GB/s at {rows[0][0]} B, "
                         f"{rows[-1][1] / 1e9:.3g} GB/s at {rows[-1][0]} B")
    lines += [f"missing {k}: {v}" for k, v in profile.get("missing", {}).items()]
    return lines


def compare(profile: dict, device: str | None = None) -> list[str]:
    """Measured against the profile shipped for `device` (default: the measured one's), section by section."""
    from predictor.kernels.profile import profile_json, shipped_profile

    device = device or profile["device"]
    shipped_obj = shipped_profile(device)
    if shipped_obj is None:
        return [f"no shipped profile for device {device!r}: nothing to compare with (--against DEVICE names one)"]
    shipped = profile_json(shipped_obj)
    lines = []
    for kind in ("gemm", "grouped_gemm"):
        for precision, table in profile.get(kind, {}).items():
            theirs = shipped.get(kind, {}).get(precision, {}).get("points")
            if not theirs:
                why = shipped.get("missing", {}).get(f"{kind}.{precision}", "no points")
                lines.append(f"{kind}.{precision}: shipped has none ({why})")
                continue
            ratio, exact = nearest_ratios(np.array(table["points"], float), np.array(theirs, float))
            lines.append(f"{kind}.{precision}: measured / shipped median {np.median(ratio):.3g} (range "
                         f"{ratio.min():.3g}-{ratio.max():.3g}) over {len(ratio)} shapes, {exact} of them shipped exactly; "
                         f"shipped source: {shipped['sources'].get(f'{kind}.{precision}', '?')[:100]}")
    for key in ("memory_bound", "launch_s", "host_op_s", "grouped_gemm", "collectives"):
        if key not in shipped:
            lines.append(f"{key}: shipped has none ({shipped.get('missing', {}).get(key, 'absent')})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="kernel_profile.json", help="where the measured profile is written")
    parser.add_argument("--gemm-shapes", type=int, default=None, help="GEMM shapes per precision (default: 24 on a "
                                                                          "GPU, 12 on a CPU)")
    parser.add_argument("--resume", action="store_true", help="complete the profile at --out")
    parser.add_argument("--against", default=None, metavar="DEVICE",
                        help="the shipped profile to compare with (default: the measured device's)")
    args = parser.parse_args(argv)
    import torch

    from predictor.measure.kernel_profile import ThisNode, measure_profile

    kind = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = args.gemm_shapes or (24 if kind == "cuda" else 12)
    print(f"device: {torch.cuda.get_device_name(0) if kind == 'cuda' else 'cpu (no CUDA GPU here)'}; torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}")
    profile = measure_profile(ThisNode(kind), kind, args.out, args.resume, gemm_shapes=shapes,
                              grouped_shapes=max(6, shapes // 2),
                              on_section=lambda key, done, total: print(f"  [{done}/{total}] {key}", flush=True))
    print(f"profile of {profile['device']} ({profile['generation']}) written to {args.out}")
    print("\n".join(summary(profile)))
    print(f"compared with the shipped profile of {args.against or profile['device']}:")
    print("\n".join(compare(profile, args.against)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
