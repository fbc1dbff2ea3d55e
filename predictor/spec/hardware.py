"""Hardware catalogue: devices and links, every figure with its public source.

Figures are dense (never the 2:4-sparsity number). Link bandwidths are one direction in
bytes/s. `cpu` is this machine: its figures are measured on first use and cached (see
`predictor.measure.device`), one rank being one single-threaded process. This module imports no
other project module, so everything can import it; `predictor.spec.resolver` turns a spec's
device into a `Device`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

GB = 1e9
GIB = 1024**3
TFLOPS = 1e12


@dataclass(frozen=True)
class Link:
    """A communication link: bandwidth (bytes/s, one direction) and per-message latency (s) of the α-β model, and the
    link generation (`nvlink4`, `ib-ndr`, ...) whose public bus-bandwidth curve prices collectives over it where the
    catalogue has one (`predictor.costs.collective_curve`); a measured or overridden link has none."""

    bandwidth: float
    latency: float
    source: str = ""
    generation: str = ""


class UnsupportedPrecision(ValueError):
    """A precision the device lacks (A100 has no fp8 tensor cores, only Blackwell has fp4)."""


@dataclass(frozen=True)
class Device:
    """One accelerator model: peak FLOP/s per precision, HBM bandwidth and capacity, default links."""

    name: str
    peak_flops: dict[str, float]  # precision -> dense FLOP/s
    mem_bandwidth: float  # bytes/s
    mem_capacity: float  # bytes
    intra_node: Link
    inter_node: Link
    source: str
    measured: bool = False
    extra: dict[str, float] = field(default_factory=dict)
    op_links: dict[str, Link] = field(default_factory=dict)  # measured: each collective's own intra-node α-β
    model: str = ""  # measured: the hardware its profile was taken on (CPU model); a catalogue name says it already
    host_link: Link | None = None  # GPU <-> host memory (PCIe or NVLink-C2C): what offloading moves data over
    host_memory_bandwidth: float = 0.0  # bytes/s of host DRAM per GPU (the node's sockets shared by its GPUs)

    def flops(self, precision: str) -> float:
        """Dense peak FLOP/s at `precision`; one the device has no peak for is refused, never priced at another."""
        if precision not in self.peak_flops:
            raise UnsupportedPrecision(f"device {self.name!r} has no {precision} peak; its precisions: "
                                       f"{', '.join(self.peak_flops) or 'none'}")
        return self.peak_flops[precision]


# NVLink: the data sheets give total bidirectional bandwidth; one direction is half.
# Inter-node: one 200 Gb/s HDR (A100) or 400 Gb/s NDR (H100/H200) NIC per GPU (DGX reference designs).
_NVLINK3 = Link(300 * GB, 5e-6, "NVIDIA A100 data sheet: NVLink 600 GB/s bidirectional", "nvlink3")
_NVLINK4 = Link(450 * GB, 5e-6, "NVIDIA H100 data sheet: NVLink 900 GB/s bidirectional", "nvlink4")
_NVLINK2 = Link(150 * GB, 5e-6, "NVIDIA V100 data sheet: NVLink 300 GB/s bidirectional", "nvlink2")
_HDR = Link(25 * GB, 10e-6, "DGX A100 user guide: 8x 200 Gb/s HDR InfiniBand, one per GPU", "ib-hdr")
_NDR = Link(50 * GB, 10e-6, "DGX H100 user guide: 8x 400 Gb/s NDR InfiniBand, one per GPU", "ib-ndr")
_EDR = Link(12.5 * GB, 10e-6, "DGX-1 V100: 100 Gb/s EDR InfiniBand per GPU pair (conservative per GPU)", "ib-edr")
_NVLINK5 = Link(900 * GB, 5e-6, "NVIDIA DGX B200 / GB200 NVL72 / GB300 NVL72 data sheets: fifth-generation NVLink "
                                "1.8 TB/s bidirectional per GPU", "nvlink5")
_CX7 = Link(50 * GB, 10e-6, "DGX B200 data sheet: 8x ConnectX-7 400 Gb/s, one per GPU; DGX GB200 user guide: 4x "
                            "ConnectX-7 400G per 4-GPU compute tray", "ib-ndr")
_CX8 = Link(100 * GB, 10e-6, "ConnectX-8 800 Gb/s, one per GPU: HGX B300 spec (1.6 TB/s networking, 8 GPUs); "
                             "NVIDIA GB300 NVL72 enterprise RA (4x ConnectX-8 per 4-GPU compute tray)", "ib-xdr")


# Host links, achievable one-direction bandwidth of one GPU's pinned host copies (nvbandwidth host_to_device /
# device_to_host): PCIe x16 reaches ~80 % of its line rate (Gen3 16, Gen4 32, Gen5 64 GB/s); NVLink-C2C is 900 GB/s
# bidirectional per Grace, shared by the superchip's two Blackwell GPUs (GB200 / GB300 NVL72 data sheets).
_PCIE3 = Link(12.5 * GB, 10e-6, "PCIe Gen3 x16 (DGX-1): 16 GB/s line rate, ~80 % achievable")
_PCIE4 = Link(25 * GB, 10e-6, "PCIe Gen4 x16 (DGX A100): 32 GB/s line rate, ~80 % achievable")
_PCIE5 = Link(50 * GB, 10e-6, "PCIe Gen5 x16 (DGX H100 / H200 / B200 / HGX B300): 64 GB/s line rate, ~80 % achievable")
_C2C = Link(225 * GB, 5e-6, "NVLink-C2C 900 GB/s bidirectional per Grace, two GPUs per Grace (GB200 / GB300 NVL72 "
                            "data sheets): 225 GB/s per GPU and direction")
# Host DRAM per GPU: the node's memory bandwidth over its GPUs. DGX-1: 2x Xeon E5-2698 v4, 4x DDR4-2400 (77 GB/s
# each); DGX A100: 2x EPYC 7742, 8x DDR4-3200 (205 GB/s each); DGX H100: 2x Xeon 8480C, 8x DDR5-4800 (307 GB/s
# each); DGX B200: 2x Xeon 8570, 8x DDR5-5600 (358 GB/s each); all over 8 GPUs. Grace: LPDDR5X up to 512 GB/s
# (GB200 superchip data sheet), over its two GPUs.
_HOST_DRAM: dict[str, float] = {"dgx1": 2 * 77 * GB / 8, "dgx-a100": 2 * 205 * GB / 8, "dgx-h100": 2 * 307 * GB / 8,
                                "dgx-b200": 2 * 358 * GB / 8, "grace": 512 * GB / 2}


def _fp(bf16_tflops: float, tf32_tflops: float, fp32_tflops: float, fp8_tflops: float | None = None,
        fp4_tflops: float | None = None) -> dict[str, float]:
    # Mixed-precision training in fp32 mode uses TF32 tensor cores where the device has them.
    peaks = {"fp16": bf16_tflops * TFLOPS, "bf16": bf16_tflops * TFLOPS, "fp32": max(tf32_tflops, fp32_tflops) * TFLOPS}
    # fp8 / fp4 only where the tensor cores have them (Hopper fp8, Blackwell fp8 + fp4): a missing key is refused
    if fp8_tflops is not None:
        peaks["fp8"] = fp8_tflops * TFLOPS
    if fp4_tflops is not None:
        peaks["fp4"] = fp4_tflops * TFLOPS
    return peaks


DEVICES: dict[str, Device | None] = {
    "v100-32gb": Device("v100-32gb", {"fp16": 125 * TFLOPS, "bf16": 125 * TFLOPS, "fp32": 15.7 * TFLOPS},
                        900 * GB, 32 * GIB, _NVLINK2, _EDR, "NVIDIA V100 SXM2 data sheet", extra={"sms": 80},
                   host_link=_PCIE3, host_memory_bandwidth=_HOST_DRAM["dgx1"]),
    "a100-40gb": Device("a100-40gb", _fp(312, 156, 19.5), 1555 * GB, 40 * GIB, _NVLINK3, _HDR,
                        "NVIDIA A100 SXM data sheet", extra={"sms": 108},
                   host_link=_PCIE4, host_memory_bandwidth=_HOST_DRAM["dgx-a100"]),
    "a100-80gb": Device("a100-80gb", _fp(312, 156, 19.5), 2039 * GB, 80 * GIB, _NVLINK3, _HDR,
                        "NVIDIA A100 SXM data sheet", extra={"sms": 108},
                   host_link=_PCIE4, host_memory_bandwidth=_HOST_DRAM["dgx-a100"]),
    "h100": Device("h100", _fp(989, 495, 67, fp8_tflops=1979), 3350 * GB, 80 * GIB, _NVLINK4, _NDR,
                   "NVIDIA H100 SXM data sheet (FP8 3,958 TFLOPS with sparsity: 1,979 dense)", extra={"sms": 132},
                   host_link=_PCIE5, host_memory_bandwidth=_HOST_DRAM["dgx-h100"]),
    "h200": Device("h200", _fp(989, 495, 67, fp8_tflops=1979), 4800 * GB, 141 * GB, _NVLINK4, _NDR,
                   "NVIDIA H200 SXM data sheet (FP8 3,958 TFLOPS with sparsity: 1,979 dense)", extra={"sms": 132},
                   host_link=_PCIE5, host_memory_bandwidth=_HOST_DRAM["dgx-h100"]),
    "h20": Device("h20", _fp(148, 74, 44, fp8_tflops=296), 4000 * GB, 96 * GB, _NVLINK4, _NDR,
                  "NVIDIA H20 product brief (dense: FP8 296, BF16 148 TFLOPS)", extra={"sms": 78},
                   host_link=_PCIE5, host_memory_bandwidth=_HOST_DRAM["dgx-h100"]),
    # Blackwell data sheets give tensor-core figures with 2:4 sparsity (and FP4 dense only for some): dense is
    # half the sparse figure; a rack or 8-GPU board figure is divided by its GPUs. TF32 dense is the fp32 key.
    "b200": Device("b200", _fp(2250, 1100, 75, fp8_tflops=4500, fp4_tflops=9000), 8000 * GB, 180 * GB, _NVLINK5, _CX7,
                   "NVIDIA DGX B200 data sheet (8 GPUs: FP4 144 / FP8 72 PFLOPS sparse, 1,440 GB HBM3e at 64 TB/s) and "
                   "HGX B200 spec (per GPU, sparse: FP16/BF16 4.5, TF32 2.2 PFLOPS; FP32 75 TFLOPS); dense = half",
                   extra={"sms": 148},
                   host_link=_PCIE5, host_memory_bandwidth=_HOST_DRAM["dgx-b200"]),
    "gb200": Device("gb200", _fp(2500, 1250, 80, fp8_tflops=5000, fp4_tflops=10000), 8000 * GB, 186 * GB, _NVLINK5,
                    _CX7, "NVIDIA GB200 NVL72 data sheet (per GPU, sparse: FP4 20, FP8 10, FP16/BF16 5, TF32 2.5 "
                          "PFLOPS; FP32 80 TFLOPS; 186 GB HBM3e at 8 TB/s; rack: 72 GPUs in one NVLink domain); "
                          "dense = half", extra={"sms": 152, "nvlink_domain": 72},
                   host_link=_C2C, host_memory_bandwidth=_HOST_DRAM["grace"]),
    "b300": Device("b300", _fp(2250, 1125, 75, fp8_tflops=4500, fp4_tflops=13125), 8000 * GB, 288 * GB, _NVLINK5,
                   _CX8, "NVIDIA HGX B300 spec (8 GPUs: FP4 144 sparse | 105 dense, FP8 72, FP16/BF16 36, TF32 18 "
                         "PFLOPS sparse, FP32 600 TFLOPS) / 8 GPUs, sparse halved; Blackwell Ultra architecture "
                         "(NVIDIA technical blog): 288 GB HBM3e at 8 TB/s per GPU", extra={"sms": 148},
                   host_link=_PCIE5, host_memory_bandwidth=_HOST_DRAM["dgx-b200"]),
    "gb300": Device("gb300", _fp(2500, 1250, 6000 / 72, fp8_tflops=5000, fp4_tflops=15000), 8000 * GB, 288 * GB,
                    _NVLINK5, _CX8, "NVIDIA GB300 NVL72 data sheet (72 GPUs: FP4 1,440 sparse | 1,080 dense, "
                                    "FP8/FP6 720, FP16/BF16 360, TF32 180 PFLOPS sparse, FP32 6 PFLOPS; HBM3e at "
                                    "576 TB/s) / 72 GPUs, sparse halved; 288 GB HBM3e per GPU (Blackwell Ultra "
                                    "technical blog)", extra={"sms": 152, "nvlink_domain": 72},
                   host_link=_C2C, host_memory_bandwidth=_HOST_DRAM["grace"]),
    "cpu": None,  # measured on first use: see predictor.spec.resolver.get_device("cpu")
}
# Streaming multiprocessors ("sms" in Device.extra), used for GEMM wave quantisation: NVIDIA
# architecture whitepapers (V100 80, A100 108, H100/H200 SXM 132); H20: 78 per public spec listings.
# Blackwell: the data sheets give none; the SMs CUDA reports (multiProcessorCount) in public kernel
# measurements: B200 and B300 148, GB200 and GB300 152 (the Blackwell Ultra die has 160, not all enabled).
# "nvlink_domain" in extra: GPUs that share one NVLink switch fabric where it spans more than a node
# (NVL72 racks); ClusterSpec.nvlink_domain_gpus defaults to it.


# Each catalogue device's architecture generation: a framework constant fitted on one generation's measurements
# prices that generation only (`predictor.frameworks.base.recorded_constants`).
GENERATIONS: dict[str, str] = {"v100-32gb": "volta", "a100-40gb": "ampere", "a100-80gb": "ampere", "h100": "hopper",
                               "h200": "hopper", "h20": "hopper", "b200": "blackwell", "gb200": "blackwell",
                               "b300": "blackwell", "gb300": "blackwell"}
assert set(GENERATIONS) == {name for name, d in DEVICES.items() if d is not None}


def generation(device: Device) -> str:
    """The device's generation ('measured' for a device priced from its own measurements, e.g. this CPU)."""
    return "measured" if device.measured else GENERATIONS.get(device.name, device.name)


def catalogue_name(fingerprint: str) -> str:
    """The catalogue device a dataset fingerprint was measured on ('cpu:…' → cpu, 'cuda:NVIDIA H200' → h200).

    A catalogue name matches when all its parts (e.g. 'a100', '80gb') are words of the GPU's
    name; the most specific match wins.
    """
    if fingerprint.startswith("cpu"):
        return "cpu"
    words = set(re.findall(r"[a-z]+\d+|\d+gb", fingerprint.lower()))
    matches = [name for name in DEVICES if name != "cpu" and set(name.split("-")) <= words]
    if not matches:
        raise KeyError(f"measured device {fingerprint!r} is not in the catalogue ({', '.join(DEVICES)}); "
                       f"add it to predictor/spec/hardware.py DEVICES")
    return max(matches, key=lambda name: len(name.split("-")))



# Public measurements of the kernels a step runs (GEMM throughput against shape and precision, fused attention,
# memory-bound kernels, collectives' bus bandwidth), each with its source: docs/device-facts.md.
FACTS_FILE = Path(__file__).resolve().parents[1] / "data" / "device_facts.json"


@dataclass(frozen=True)
class GemmFact:
    """A public GEMM measurement on one device of a generation: points (batch, m, n, k, FLOP/s), or only the best
    FLOP/s a kernel reports (`best`), at one precision and scaling."""

    generation: str
    device: str
    precision: str
    source: str
    points: tuple[tuple[int, int, int, int, float], ...] = ()
    best: float = 0.0
    scaling: str = ""


@cache
def device_facts() -> dict[str, list[dict]]:
    """The catalogue of FACTS_FILE, each section a list of entries with their `source`."""
    facts = json.loads(FACTS_FILE.read_text())
    return {k: v for k, v in facts.items() if k != "about"}


def gemm_facts(gen: str, precision: str) -> list[GemmFact]:
    """The catalogue's GEMM measurements of generation `gen` at `precision` ('bf16', 'fp8', ...)."""
    return [GemmFact(e["generation"], e["device"], e["precision"], e["source"],
                     tuple((int(b), int(m), int(n), int(k), t * TFLOPS) for b, m, n, k, t in e.get("points", ())),
                     e.get("best_tflops", 0.0) * TFLOPS, e.get("scaling", ""))
            for e in device_facts()["gemm"] if e["generation"] == gen and e["precision"] == precision]


def tensor_core_facts(gen: str) -> dict:
    """What a generation's tensor cores run of Transformer Engine's low-precision recipes: `recipes` (the names it
    trains with), `fp8_tn_only` (whether an FP8 GEMM's columnwise operand must be a transposed copy) and, where it
    emulates FP8 block scaling, `blockwise_runs_as`. A generation without FP8 tensor cores runs none."""
    entry = next((e for e in device_facts()["low_precision_recipes"] if e["generation"] == gen and "recipes" in e), None)
    return entry or {"recipes": [], "fp8_tn_only": True}


def default_recipe(precision: str, gen: str) -> str:
    """The recipe a spec without `training.recipe` runs: NVFP4 for FP4; for FP8, MXFP8 where the generation has
    block-scaled tensor cores, else per-tensor current scaling (Megatron-Core's `--fp8-recipe mxfp8` and
    `tensorwise`, as Megatron-Bridge's FP8 performance recipes run)."""
    if precision == "fp4":
        return "nvfp4"
    return "mxfp8" if "mxfp8" in tensor_core_facts(gen)["recipes"] else "current"


@dataclass(frozen=True)
class Recipe:
    """One Transformer Engine recipe: the tensor cores it runs on and the bytes its quantisation moves
    (`predictor.models.lowprec` prices it).

    precision: the tensor cores' data type, a `Device.peak_flops` key ('fp8' or 'fp4').
    data_bytes: bytes per quantised element (E4M3/E5M2 1, E2M1 0.5).
    scale_bytes: scale bytes per element: the block scale's bytes over its block (0 for one scale per tensor).
    amax_pass: whether the cast needs the tensor's amax first (a per-tensor scale computed now): one more read.
    own_columnwise: whether the columnwise usage is quantised apart (block scales run along one dimension).
    """

    name: str
    precision: str
    data_bytes: float
    scale_bytes: float
    amax_pass: bool
    own_columnwise: bool


# Transformer Engine's recipes, the names a spec's `training.recipe` may take.
RECIPES: dict[str, Recipe] = {
    "delayed": Recipe("delayed", "fp8", 1.0, 0.0, amax_pass=False, own_columnwise=False),
    "current": Recipe("current", "fp8", 1.0, 0.0, amax_pass=True, own_columnwise=False),
    "blockwise": Recipe("blockwise", "fp8", 1.0, 4 / 128, amax_pass=False, own_columnwise=True),
    "mxfp8": Recipe("mxfp8", "fp8", 1.0, 1 / 32, amax_pass=False, own_columnwise=True),
    "nvfp4": Recipe("nvfp4", "fp4", 0.5, 1 / 16, amax_pass=True, own_columnwise=True),
    # torchao's row-wise float8 (Float8LinearConfig recipe "rowwise": axiswise E4M3 with a dynamic power-of-two
    # scale per row, the columnwise operands scaled along the other axis; torch._scaled_mm's row-wise GEMMs). One
    # fp32 scale per row of thousands of elements: its scale bytes are counted as none.
    "rowwise": Recipe("rowwise", "fp8", 1.0, 0.0, amax_pass=True, own_columnwise=True),
}
# Recipes outside Transformer Engine and the TE recipe whose tensor cores they need: torchao's row-wise float8 runs
# wherever per-tensor FP8 GEMMs run (torch._scaled_mm on SM 8.9 and later).
RUNS_WHERE = {"rowwise": "current"}


def runs_recipe(name: str, gen: str) -> bool:
    """Whether generation `gen`'s tensor cores run recipe `name`."""
    return RUNS_WHERE.get(name, name) in tensor_core_facts(gen)["recipes"]


def recipe_kernels(name: str, gen: str) -> Recipe:
    """The recipe whose kernels a run asking for recipe `name` runs on generation `gen`: FP8 block scaling on a
    generation that emulates it runs that recipe's kernels, every other recipe its own."""
    return RECIPES[tensor_core_facts(gen).get("blockwise_runs_as", name) if name == "blockwise" else name]
