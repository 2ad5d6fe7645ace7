"""Reads deploy/node_pools.yaml: the node pools of the demo / test cluster, as plain dataclasses.

No Django and no Ray here: scripts/up, the integration tests and the demo loader all use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

DEFAULT_TOPOLOGY = Path(__file__).resolve().parents[2] / "deploy" / "node_pools.yaml"

# Ray custom resource and label names shared by the launcher, the backend and the scheduler.
ACCEL_RESOURCE_PREFIX = "accel:"
LABEL_POOL = "fleetyard.io/pool"
LABEL_ACCELERATOR = "fleetyard.io/accelerator"
LABEL_LEAF_GROUP = "fleetyard.io/leaf-group"
LABEL_NODE = "fleetyard.io/node"
LABEL_SIMULATED = "fleetyard.io/simulated"


@dataclass(frozen=True)
class PoolSpec:
    name: str
    accelerator_type: str
    nodes: int
    devices_per_node: int
    cpus_per_node: float
    leaf_groups: tuple[str, ...]
    simulated: bool

    def node_specs(self) -> list[NodeSpec]:
        specs = []
        for index in range(self.nodes):
            node_name = f"{self.name}-{index}"
            leaf = self.leaf_groups[index % len(self.leaf_groups)]
            resources = {}
            if self.devices_per_node and self.accelerator_type != "cpu":
                resources[ACCEL_RESOURCE_PREFIX + self.accelerator_type] = float(self.devices_per_node)
            labels = {
                LABEL_POOL: self.name,
                LABEL_ACCELERATOR: self.accelerator_type,
                LABEL_LEAF_GROUP: leaf,
                LABEL_NODE: node_name,
                LABEL_SIMULATED: "true" if self.simulated else "false",
            }
            specs.append(NodeSpec(name=node_name, pool=self.name, num_cpus=self.cpus_per_node,
                                  resources=resources, labels=labels))
        return specs


@dataclass(frozen=True)
class NodeSpec:
    name: str
    pool: str
    num_cpus: float
    resources: dict[str, float] = field(hash=False)
    labels: dict[str, str] = field(hash=False)


@dataclass(frozen=True)
class Topology:
    cluster_name: str
    head_cpus: float
    pools: tuple[PoolSpec, ...]

    def node_specs(self) -> list[NodeSpec]:
        return [node for pool in self.pools for node in pool.node_specs()]


class TopologyError(ValueError):
    pass


def load_topology(path: Path = DEFAULT_TOPOLOGY) -> Topology:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TopologyError(f"cannot read node pools from {path}: {exc}") from exc
    pools = []
    for index, item in enumerate(raw.get("pools") or []):
        try:
            pool = PoolSpec(
                name=str(item["name"]),
                accelerator_type=str(item["accelerator_type"]),
                nodes=int(item["nodes"]),
                devices_per_node=int(item.get("devices_per_node", 0)),
                cpus_per_node=float(item.get("cpus_per_node", 1)),
                leaf_groups=tuple(item.get("leaf_groups") or [f"{item['name']}-lg"]),
                simulated=bool(item.get("simulated", True)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyError(f"{path}: pools[{index}] is invalid: {exc}") from exc
        if pool.nodes < 1 or pool.devices_per_node < 0 or pool.cpus_per_node < 0:
            raise TopologyError(f"{path}: pools[{index}] needs nodes >= 1 and non-negative sizes")
        pools.append(pool)
    if not pools:
        raise TopologyError(f"{path}: no pools defined")
    names = [pool.name for pool in pools]
    if len(set(names)) != len(names):
        raise TopologyError(f"{path}: pool names repeat: {names}")
    head = raw.get("head") or {}
    return Topology(cluster_name=str(raw.get("cluster_name", "fleetyard")),
                    head_cpus=float(head.get("num_cpus", 0)), pools=tuple(pools))
