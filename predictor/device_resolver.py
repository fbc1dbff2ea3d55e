"""The one place a device name becomes a priced `Device`: catalogue figures, measured ones, cluster overrides.

`predictor.hardware` is a pure catalogue (data-sheet figures) and `predictor.measure.device` measures
this machine; resolving a spec's device needs both and the spec types, so it lives above all three and
none of them imports it.
"""

from __future__ import annotations

from dataclasses import replace

from predictor.hardware import DEVICES, GB, Device, Link
from predictor.workload import ClusterSpec, WorkloadSpec


def get_device(name: str, cluster: ClusterSpec | None = None) -> Device:
    """The device `name` with the cluster's intra_node / inter_node link overrides applied.

    `cpu` is the cluster's `device_profile` where it names one (the machine a dataset was measured
    on), else this machine, measured on first use and cached (predictor.measure.device). A GPU with a
    `device_profile` (a kernel profile of the user's cluster) takes its measured links and launch and host costs.
    """
    if name not in DEVICES:
        raise KeyError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    device = DEVICES[name]
    profile = getattr(cluster, "device_profile", None)
    if profile is not None:
        from predictor.measure.device import profile_device  # lazy: it imports torch, which pricing a GPU does without

        device = profile_device(profile, device)
    elif device is None:
        from predictor.measure.device import measured_cpu  # lazy: it imports torch, and measuring spawns processes

        device = measured_cpu()
    if cluster is not None:
        changes = {}
        for attr in ("intra_node", "inter_node"):
            spec = getattr(cluster, attr)
            if spec is not None:
                changes[attr] = Link(spec.bandwidth_gbps * GB, spec.latency_us * 1e-6, "cluster spec override")
        if "intra_node" in changes:
            changes["op_links"] = {}  # the spec's link replaces the measured per-op links inside the node too
        if changes:
            device = replace(device, **changes)
    return device


def spec_device(spec: WorkloadSpec) -> Device:
    """The device a workload spec runs on, with its cluster's overrides and device profile."""
    return get_device(spec.cluster.device, spec.cluster)
