"""Assumed link bandwidths per accelerator type, for node pools that do not state their own.

The planner (``controlplane.planning``) needs two figures per pool, both in GB/s (gigabytes) per device and
per direction: ``intra_node_gbps`` between devices of one node (NVLink / NVSwitch, Infinity Fabric, PCIe)
and ``inter_node_gbps`` between nodes (the device's share of the node's network). A node pool may set them
(``NodePool.intra_node_gbps`` / ``inter_node_gbps``); where it does not, the figures below are used and
every answer built on them says "assumed default".

These are ASSUMPTIONS, not measurements of any pool: the intra-node figure is the chip's published link
bandwidth halved to one direction; the inter-node figure assumes the reference 8-device server of that chip
with one NIC per device, which many clouds do not match (some give 100-200 Gb/s per device, some 3,200 Gb/s
per node of 8 devices = 50 GB/s each). A chip with no trustworthy figure has no entry: a pool of it must
state its own bandwidths before it can be planned. Like ``accelerator_facts``, this module imports no Django.
"""

from __future__ import annotations

from dataclasses import dataclass

ASSUMED_LINK_GBPS: dict[str, dict] = {
    "nvidia-h100": {
        "intra_node_gbps": 450.0,
        "inter_node_gbps": 50.0,
        "basis": "NVLink 4 900 GB/s per GPU both ways (H100 SXM datasheet) = 450 GB/s each way; one 400 Gb/s "
                 "NDR InfiniBand port per GPU as in DGX H100 = 50 GB/s each way",
    },
    "nvidia-h200": {
        "intra_node_gbps": 450.0,
        "inter_node_gbps": 50.0,
        "basis": "NVLink 4 900 GB/s per GPU both ways (H200 SXM datasheet) = 450 GB/s each way; one 400 Gb/s "
                 "port per GPU as in DGX H100/H200 = 50 GB/s each way",
    },
    "nvidia-a100": {
        "intra_node_gbps": 300.0,
        "inter_node_gbps": 25.0,
        "basis": "NVLink 3 600 GB/s per GPU both ways (A100 SXM datasheet) = 300 GB/s each way; one 200 Gb/s "
                 "HDR InfiniBand port per GPU as in DGX A100 = 25 GB/s each way (the figures of "
                 "planning/published_runs.json)",
    },
    "nvidia-l40s": {
        "intra_node_gbps": 32.0,
        "inter_node_gbps": None,
        "basis": "no NVLink: PCIe Gen4 x16 64 GB/s both ways (L40S datasheet) = 32 GB/s each way, an upper "
                 "bound (peer traffic through a CPU root complex gets less); no inter-node figure is assumed "
                 "because L40S servers ship with anything from 25 to 400 Gb/s per node",
    },
    "amd-mi300x": {
        "intra_node_gbps": 448.0,
        "inter_node_gbps": 50.0,
        "basis": "Infinity Fabric 7 links x 128 GB/s = 896 GB/s per GPU both ways (MI300X data sheet) = "
                 "448 GB/s each way, reached only when a collective uses all 7 peers of the full mesh; one "
                 "400 Gb/s NIC per GPU as in 8-GPU MI300X platforms = 50 GB/s each way",
    },
}


@dataclass(frozen=True)
class LinkBandwidth:
    """A pool's link figures as the planner will use them; None where nothing is known."""

    intra_node_gbps: float | None
    inter_node_gbps: float | None
    assumed: bool  # True when at least one figure is an assumed default, not the pool's own
    note: str

    @property
    def known(self) -> bool:
        return self.intra_node_gbps is not None and self.inter_node_gbps is not None


def resolve_link_bandwidth(accelerator_type: str, intra_node_gbps: float | None = None,
                           inter_node_gbps: float | None = None, *, given_by: str = "the pool") -> LinkBandwidth:
    """Each figure from the caller when given, else the assumed default of ``accelerator_type``, else None."""
    default = ASSUMED_LINK_GBPS.get(accelerator_type, {})
    values, given_names, assumed_names, unknown_names = {}, [], [], []
    for name, given in (("intra_node_gbps", intra_node_gbps), ("inter_node_gbps", inter_node_gbps)):
        if given is not None:
            values[name] = float(given)
            given_names.append(name)
        elif default.get(name) is not None:
            values[name] = float(default[name])
            assumed_names.append(name)
        else:
            values[name] = None
            unknown_names.append(name)
    notes = []
    if given_names:
        notes.append(f"{' and '.join(given_names)} set by {given_by}")
    if assumed_names:
        verb = "is an assumed default" if len(assumed_names) == 1 else "are assumed defaults"
        notes.append(f"{' and '.join(assumed_names)} {verb} for {accelerator_type} ({default['basis']})")
    if unknown_names:
        notes.append(f"{' and '.join(unknown_names)} unknown: no assumed default for {accelerator_type}")
    return LinkBandwidth(values["intra_node_gbps"], values["inter_node_gbps"], bool(assumed_names), "; ".join(notes))


def one_node_link(link: LinkBandwidth) -> LinkBandwidth:
    """`link` for devices on one node that talks to no other: a missing inter-node figure is not needed there, so
    the intra-node one stands in for it (no traffic between nodes uses it). `link` itself when it is known already
    or has no intra-node figure either."""
    if link.known or link.intra_node_gbps is None:
        return link
    return LinkBandwidth(link.intra_node_gbps, link.intra_node_gbps, link.assumed,
                         f"{link.note}; one node: no traffic between nodes")
