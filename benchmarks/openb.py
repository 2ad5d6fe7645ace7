"""Allocation benchmark on Alibaba's GPU 2023 "openb" trace, measured the way the FGD paper measures it.

Reads ../shared/benchmarks/alibaba-gpu-2023/ (relative to the repository root; never copied here) and,
for each pod list, policy and seed: nodes = openb_node_list_gpu_node.csv; pods = the pod list shuffled
with the seed, then random resamples of it appended (or random pods dropped) until the GPU requests
total 130% of GPU capacity; pods are placed one at a time, never leave, and a pod that does not fit
anywhere is skipped. A node fits a pod when its CPU, memory, GPU model (gpu_spec) and GPU shares allow
it. Reported: the share of GPU capacity allocated when the arrived GPU requests reach 80/90/95/100/130%
of capacity, and when the first pod could not be placed, averaged over seeds. Other lists of the same formats
can be measured with --data-dir and --pod-lists NAME (openb_pod_list_NAME.csv): the columns may come in any order
with others besides; a file that is not of the format is an error naming the file, line and field.

    .venv/bin/python -m benchmarks.openb [--seeds 42-51] [--pod-lists default,gpuspec33,multigpu50]
                                         [--policies first-fit,best-fit,fgd,fleetyard] [--quick] [--jobs N]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):  # controlplane's source root; benchmarks
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT  # noqa: E402
from controlplane.scheduling.fgd import (  # noqa: E402
    INF_CPU,
    MILLI,
    TargetRequest,
    WorkloadDistribution,
    fgd_take,
    model_pressure,
    node_key,
    stranded_gpu_milli,
)
from controlplane.scheduling.placement import EPS, NodeState, best_fit, place_gang  # noqa: E402

DATA_DIR = REPO_ROOT.parent / "shared" / "benchmarks" / "alibaba-gpu-2023"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
POD_LISTS = ("default", "gpuspec33", "multigpu50")
POLICIES = ("first-fit", "best-fit", "fgd", "fleetyard")
# The platform's scheduling core's own placement rules (controlplane.scheduling.placement.place_gang), not run by
# default: "core" is what the core does (best fit, a fraction on the fullest device it fits), "core-fgd" the same
# with FGD's node and device choice for fractional pods. Both see the trace as the core does (devices only).
CORE_POLICIES = ("core", "core-fgd")
CHECKPOINTS = (0.80, 0.90, 0.95, 1.00, 1.30)
TARGET_RATIO = 1.30
TYPICAL_POPULARITY = 0.95  # the simulator's typical-pods threshold (top shapes covering 95% of pods)
MAX_SPEC_CPU, MAX_SPEC_GPU = 128_000, 8_000  # the simulator's BestFit normalisation

# The FGD authors' published numbers (% of GPU capacity allocated at 100% arrived), see
# ../shared/benchmarks/README.md.
PUBLISHED = {
    "default": {"Random": 86.30, "DotProd": 90.62, "Clustering": 91.65, "Packing": 91.78, "BestFit": 92.86,
                "FGD": 95.23},
    "gpuspec33": {"Random": 83.87, "DotProd": 79.82, "Clustering": 81.09, "Packing": 82.22, "BestFit": 80.40,
                  "FGD": 87.84},
    "multigpu50": {"Random": 81.28, "DotProd": 94.73, "Clustering": 95.69, "Packing": 96.06, "BestFit": 95.62,
                   "FGD": 97.09},
}
PUBLISHED_NAME = {"best-fit": "BestFit", "fgd": "FGD"}


@dataclass(frozen=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    models: frozenset[str]

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    def request(self) -> TargetRequest:
        if self.num_gpu == 0:
            return TargetRequest(gpu_milli=0, num_gpu=0, cpu_milli=self.cpu_milli, gpu_models=self.models)
        return TargetRequest(gpu_milli=self.gpu_milli, num_gpu=self.num_gpu, cpu_milli=self.cpu_milli,
                             gpu_models=self.models)


class DataError(ValueError):
    """A node or pod list not of the documented format; the message names the file, and the line and field."""


NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec and the others are optional


def _rows(path: Path, columns: Sequence[str]):
    """(line number, {column: value}) of a CSV file with a header: columns in any order, extra columns ignored;
    a byte order mark, CRLF line ends, blank lines and spaces around values are accepted."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [name.strip() for name in next(reader, [])]
            if not header:
                raise DataError(f"{path}: empty file, expected a header naming {', '.join(columns)}")
            missing = [name for name in columns if name not in header]
            if missing:
                raise DataError(f"{path}: line 1: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise DataError(f"{path}: line {reader.line_num}: expected {len(header)} fields, got {len(row)}")
                yield reader.line_num, {name: cell.strip() for name, cell in zip(header, row, strict=True)}
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason})") from None


def _count(path: Path, line: int, row: dict[str, str], field: str) -> int:
    try:
        value = int(row[field])
    except ValueError:
        raise DataError(f"{path}: line {line}: {field} must be an integer, got {row[field]!r}") from None
    if value < 0:
        raise DataError(f"{path}: line {line}: {field} must be >= 0, got {value}")
    return value


def load_nodes(path: Path) -> list[Node]:
    return [Node(r["sn"], _count(path, line, r, "cpu_milli"), _count(path, line, r, "memory_mib"),
                 _count(path, line, r, "gpu"), r["model"])
            for line, r in _rows(path, NODE_COLUMNS)]


def load_pods(path: Path) -> list[Pod]:
    pods = []
    for line, r in _rows(path, POD_COLUMNS):
        num_gpu = _count(path, line, r, "num_gpu")
        gpu_milli = _count(path, line, r, "gpu_milli") if num_gpu else 0
        if num_gpu and not 0 < gpu_milli <= MILLI:
            raise DataError(f"{path}: line {line}: gpu_milli must be in 1..{MILLI} when num_gpu > 0, got {gpu_milli}")
        if gpu_milli < MILLI and num_gpu > 1:
            raise DataError(f"{path}: line {line}: gpu_milli {gpu_milli} is a share of one GPU, "
                            f"but num_gpu is {num_gpu}")
        spec = r.get("gpu_spec") or ""
        pods.append(Pod(r["name"], _count(path, line, r, "cpu_milli"), _count(path, line, r, "memory_mib"), num_gpu,
                        gpu_milli, frozenset(m.strip() for m in spec.split("|") if m.strip())))
    pods.sort(key=lambda p: p.name)
    return pods


def capacity_by_model(nodes: Sequence[Node]) -> dict[str, int]:
    capacity: dict[str, int] = {}
    for n in nodes:
        capacity[n.model] = capacity.get(n.model, 0) + n.gpus * MILLI
    return capacity


def build_arrivals(pods: Sequence[Pod], gpu_capacity_milli: int, seed: int, ratio: float = TARGET_RATIO) -> list[Pod]:
    """The simulator's order: the pod list shuffled, then random resamples appended until the next one would
    take the GPU requests over `ratio` of capacity (or random pods dropped while they are above it)."""
    if not any(p.total_gpu_milli for p in pods):  # resampling would never reach the target
        raise ValueError("no pod asks for a GPU: nothing to measure")
    rng = random.Random(seed)
    arrivals = list(pods)
    rng.shuffle(arrivals)
    target = ratio * gpu_capacity_milli
    total = sum(p.total_gpu_milli for p in arrivals)
    if total > target:
        while total > target:
            total -= arrivals.pop(rng.randrange(len(arrivals))).total_gpu_milli
    else:
        while True:
            pod = pods[rng.randrange(len(pods))]
            if total + pod.total_gpu_milli > target:
                break
            arrivals.append(pod)
            total += pod.total_gpu_milli
    return arrivals


def typical_distribution(pods: Sequence[Pod]) -> WorkloadDistribution:
    return WorkloadDistribution.from_pods((p.request() for p in pods), popularity=TYPICAL_POPULARITY)


@dataclass(frozen=True)
class FleetyardConfig:
    """Fleetyard's own placement policy ("fleetyard"); the defaults are the policy, the other values were
    measured while designing it (see NOTES).

    A node's score for a pod (lowest wins) is the sum of
      1. the FGD fragmentation increase, in GPUs, against the *full* workload distribution of the pod list
         (``popularity`` 1.0: every shape, so 8- and 4-GPU gangs are seen) with shapes weighted half by pod
         count and half by GPU demand (``weight_by="mix"``), CPU included (a node whose CPU runs out
         strands its GPUs, which the measure counts as fragment);
      2. ``pressure`` x the pod's GPUs x the GPU model's constrained pressure (`model_pressure`: expected
         load per GPU from pods that may only use some models), so pods that may run on several models go
         to the model fewest constrained pods need and keep e.g. T4 for T4-only pods;
      3. ``strand`` x the growth of the node's CPU/memory-stranded GPU (`stranded_gpu_milli`, in GPUs):
         free GPU share beyond what the node's free CPU or memory can feed at the pod list's average CPU and
         memory per GPU (`resource_ratios`). FGD sees CPU only per typical shape and memory not at all; this
         term keeps CPU-heavy pods (0.47/0.65 GPU with 11 cores, CPU-only pods) off CPU-poor nodes and
         CPU-light ones (0.81 GPU with 3 cores) off CPU-rich ones, so GPUs are not left idle behind an
         exhausted CPU or memory;
      4. ``blend`` x the simulator's BestFit score (normalised CPU and GPU left over), a packing pull (0:
         off; it was 0.1 before the stranding term, which makes it unnecessary).
    Equal scores: ``tie="pack"``: least free GPU left on the node, then least CPU left, then node order
    (deterministic; "whole": fewest whole free GPUs first; "first": node order; "random": seeded). A
    fractional pod goes to the GPU of the node with the least fragmentation increase (FGD's choice).
    Inputs are only the pod list's shape distribution, the node list and the current node states: never
    the arrival order, future pods, or the seed.
    """

    weight_by: str = "mix"
    popularity: float = 1.0
    tie: str = "pack"
    blend: float = 0.0
    pressure: float = 2.0
    strand: float = 2.0


FLEETYARD = FleetyardConfig()


def fleetyard_distribution(pods: Sequence[Pod], config: FleetyardConfig = FLEETYARD) -> WorkloadDistribution:
    return WorkloadDistribution.from_pods((p.request() for p in pods), popularity=config.popularity,
                                          weight_by=config.weight_by)


def fleetyard_pressure(nodes: Sequence[Node], pods: Sequence[Pod]) -> dict[str, float]:
    return model_pressure((p.request() for p in pods), capacity_by_model(nodes))


def policy_distribution(pods: Sequence[Pod], policy: str) -> WorkloadDistribution | None:
    """The target distribution a policy scores against (built from the pod list, never from the arrivals)."""
    if policy == "fgd":
        return typical_distribution(pods)
    if policy == "fleetyard":
        return fleetyard_distribution(pods)
    return None


def resource_ratios(pods: Sequence[Pod]) -> tuple[float, float]:
    """CPU milli and memory MiB per GPU thousandth asked by the pods that ask for GPUs (the pod list's mix)."""
    gpu = sum(p.total_gpu_milli for p in pods) or 1
    return (sum(p.cpu_milli for p in pods if p.num_gpu) / gpu, sum(p.memory_mib for p in pods if p.num_gpu) / gpu)


def simulate(nodes: Sequence[Node], arrivals: Sequence[Pod], policy: str, seed: int,
             distribution: WorkloadDistribution | None = None,
             checkpoints: Sequence[float] = CHECKPOINTS, tie_break: str = "random",
             fleetyard: FleetyardConfig = FLEETYARD, pressure: dict[str, float] | None = None,
             ratios: tuple[float, float] | None = None) -> dict:
    """Place `arrivals` one at a time on `nodes` with `policy`; return allocation at the checkpoints.

    Nodes with the same state (model, CPU, memory, free GPU shares) are interchangeable, so each policy
    scores one representative per state class; ties between nodes are broken at random (seeded), as
    kube-scheduler does (tie_break="first": the first in node-list order, for sensitivity checks).
    first-fit takes the first fitting node in node-list order. fleetyard: see `FleetyardConfig`; `pressure` is
    `model_pressure` of the pod list and `ratios` its `resource_ratios` (run_one computes both; without one
    the matching term is left out).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy}")
    if policy in ("fgd", "fleetyard") and distribution is None:
        raise ValueError(f"{policy} needs a workload distribution")
    scored_by_fgd = policy in ("fgd", "fleetyard")
    rng = random.Random(seed * 7919 + 1)
    capacity = sum(n.gpus for n in nodes) * MILLI
    models = sorted({n.model for n in nodes})
    # class key: (model, cpu_free, memory_free, free GPU shares sorted descending, zeros dropped)
    classes: dict[str, dict[tuple, list[int]]] = {m: {} for m in models}
    state: list[tuple] = []
    for i, n in enumerate(nodes):
        key = (n.model, n.cpu_milli, n.memory_mib, (MILLI,) * n.gpus)
        state.append(key)
        classes[n.model].setdefault(key, []).append(i)

    arrived = allocated = 0
    placed = failed = 0
    marks = list(checkpoints)
    at: dict[str, float] = {}
    first_failure: dict | None = None
    failed_by_kind: dict[str, int] = {}
    for pod in arrivals:
        arrived += pod.total_gpu_milli
        request = pod.request() if scored_by_fgd else None
        cpu, mem, ngpu, gmilli = pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli
        best_score = None
        best: list[tuple[tuple, list[int], tuple, tuple]] = []  # (class key, members, new gpus, pack key)
        for model in (models if not pod.models or ngpu == 0 else [m for m in models if m in pod.models]):
            for key, members in classes[model].items():
                _, kcpu, kmem, gpus = key
                if kcpu < cpu or kmem < mem:
                    continue
                if ngpu == 0:
                    new_gpus = gpus
                elif gmilli >= MILLI:
                    if len(gpus) < ngpu or gpus[ngpu - 1] < MILLI:
                        continue
                    new_gpus = gpus[ngpu:]
                else:
                    if not gpus or gpus[0] < gmilli:
                        continue
                    new_gpus = None  # chosen below
                pack: tuple = ()
                if scored_by_fgd:
                    move = distribution.best_move((model, kcpu, gpus), request)
                    if move is None:
                        continue
                    score, after, _ = move
                    new_gpus = after[2]
                    if policy == "fleetyard":
                        score /= MILLI
                        if fleetyard.pressure and pressure:
                            score += fleetyard.pressure * pressure[model] * pod.total_gpu_milli / MILLI
                        if fleetyard.blend:
                            score += fleetyard.blend * (0.5 * (kcpu - cpu) / MAX_SPEC_CPU
                                                        + 0.5 * (sum(gpus) - pod.total_gpu_milli) / MAX_SPEC_GPU)
                        if fleetyard.strand and ratios:
                            score += fleetyard.strand * (stranded_gpu_milli(sum(new_gpus), kcpu - cpu, kmem - mem,
                                                                            *ratios)
                                                         - stranded_gpu_milli(sum(gpus), kcpu, kmem, *ratios)) / MILLI
                        pack = (sum(new_gpus), kcpu - cpu)
                        if fleetyard.tie == "whole":
                            pack = (sum(1 for g in new_gpus if g >= MILLI), *pack)
                else:
                    if new_gpus is None:  # share pod: best-fit GPU (least free share that fits)
                        i = len(gpus) - 1
                        while gpus[i] < gmilli:
                            i -= 1
                        rest = gpus[i] - gmilli
                        new_gpus = gpus[:i] + gpus[i + 1:]
                        if rest:
                            new_gpus = tuple(sorted(new_gpus + (rest,), reverse=True))
                    if policy == "best-fit":  # the simulator's BestFit: normalised CPU and GPU left over
                        score = (0.5 * (kcpu - cpu) / MAX_SPEC_CPU
                                 + 0.5 * (sum(gpus) - pod.total_gpu_milli) / MAX_SPEC_GPU)
                    else:  # first-fit
                        score = min(members)
                if best_score is None or score < best_score - 1e-9:
                    best_score, best = score, [(key, members, new_gpus, pack)]
                elif score <= best_score + 1e-9:
                    best.append((key, members, new_gpus, pack))
        if not best:
            failed += 1
            kind = "cpu" if ngpu == 0 else ("share" if gmilli < MILLI else f"{ngpu}gpu")
            failed_by_kind[kind] = failed_by_kind.get(kind, 0) + 1
            if first_failure is None:
                first_failure = {"pod_index": placed + failed - 1, "arrived_pct": 100.0 * arrived / capacity,
                                 "allocated_pct": 100.0 * allocated / capacity}
        else:
            if policy == "fleetyard" and fleetyard.tie in ("pack", "whole"):
                key, members, new_gpus, _ = min(best, key=lambda entry: (entry[3], min(entry[1])))
                node = min(members)
            elif policy == "first-fit" or tie_break == "first" or (policy == "fleetyard" and fleetyard.tie == "first"):
                key, members, new_gpus, _ = min(best, key=lambda entry: min(entry[1]))
                node = min(members)
            else:
                pick = rng.randrange(sum(len(m) for _, m, _, _ in best))
                for key, members, new_gpus, _ in best:  # noqa: B007 - the chosen entry is used below
                    if pick < len(members):
                        node = members[pick]
                        break
                    pick -= len(members)
            members.remove(node)
            model = key[0]
            if not members:
                del classes[model][key]
            new_key = (model, key[1] - cpu, key[2] - mem, new_gpus)
            state[node] = new_key
            classes[model].setdefault(new_key, []).append(node)
            allocated += pod.total_gpu_milli
            placed += 1
        while marks and arrived >= marks[0] * capacity - 1e-6:
            at[f"{round(marks.pop(0) * 100)}"] = 100.0 * allocated / capacity
    for mark in marks:  # not quite reached (resampling stops just below the target): report the final state
        at[f"{round(mark * 100)}"] = 100.0 * allocated / capacity
    return {"policy": policy, "seed": seed, "allocated_pct_at_arrived_pct": at, "first_failure": first_failure,
            "pods": len(arrivals), "placed": placed, "failed": failed, "failed_by_kind": failed_by_kind,
            "arrived_pct_final": 100.0 * arrived / capacity, "allocated_pct_final": 100.0 * allocated / capacity}


# -- driver -----------------------------------------------------------------------------------------------

_CACHE: dict[tuple[Path, str], tuple] = {}


def _inputs(data_dir: Path, pod_list: str) -> tuple[list[Node], list[Pod]]:
    key = (data_dir, pod_list)
    if key not in _CACHE:
        nodes = load_nodes(data_dir / "openb_node_list_gpu_node.csv")
        pods = load_pods(data_dir / f"openb_pod_list_{pod_list}.csv")
        _CACHE[key] = (nodes, pods)
    return _CACHE[key]


def gpu_only(nodes: Sequence[Node], pods: Sequence[Pod]) -> tuple[list[Node], list[Pod]]:
    """The trace as the platform's scheduling core sees it: nodes without CPU or memory limits, pods without CPU or
    memory requests, and no CPU-only pods (the core places workers by devices only)."""
    unlimited = 10**12
    return ([replace(n, cpu_milli=unlimited, memory_mib=unlimited) for n in nodes],
            [replace(p, cpu_milli=0, memory_mib=0) for p in pods if p.num_gpu])


def core_distribution(pods: Sequence[Pod]) -> WorkloadDistribution:
    """The target workload core-fgd scores against: every GPU pod shape of the pod list as the core sees it (a
    fraction of one device or N whole devices, no CPU), weighted half by pod count and half by GPU demand."""
    counts = Counter(TargetRequest.from_devices(_core_devices(p)) for p in pods if p.num_gpu)
    if not counts:
        raise ValueError("no pod asks for a GPU")
    n_pods = sum(counts.values())
    n_gpu = sum(count * request.total_gpu_milli for request, count in counts.items())
    shapes = sorted(counts.items(), key=lambda kv: (kv[0].gpu_milli, kv[0].num_gpu))
    return WorkloadDistribution(tuple((request, 0.5 * count / n_pods + 0.5 * count * request.total_gpu_milli / n_gpu)
                                      for request, count in shapes))


def _core_devices(pod: Pod) -> float:
    """A pod's worker size in the core's terms: a share of one device, or whole devices."""
    return pod.gpu_milli / MILLI if pod.gpu_milli < MILLI else float(pod.num_gpu)


def simulate_core(nodes: Sequence[Node], arrivals: Sequence[Pod], policy: str,
                  distribution: WorkloadDistribution | None = None, checkpoints: Sequence[float] = CHECKPOINTS
                  ) -> dict:
    """Place `arrivals` one at a time with the scheduling core's placement rules (placement.place_gang, the
    reference its indexed version is tested equal to): each GPU model a node pool of one leaf group, a pod's
    accepted models tried in name order (the core tries a workload's accepted types in its preference order, which
    comes from prices the trace does not have), the first pool that holds it wins. CPU and memory are not seen.
    "core-fgd": a fractional pod goes to the node, and the device, with the least FGD fragmentation increase
    (ties: best fit, then node name); whole devices as "core"."""
    if policy not in CORE_POLICIES:
        raise ValueError(f"unknown core policy {policy}")
    if policy == "core-fgd" and distribution is None:
        raise ValueError("core-fgd needs a workload distribution")
    pools: dict[str, list[NodeState]] = {}
    for node in nodes:
        pools.setdefault(node.model, []).append(NodeState(node.name, node.model, node.model, node.model,
                                                          [1.0] * node.gpus))
    models = sorted(pools)
    score, take = best_fit, None
    if policy == "core-fgd":
        def score(node: NodeState, devices: float):
            if devices >= 1.0 - EPS:
                return (0.0, node.free_total() - devices)
            move = distribution.best_move(node_key(node.accelerator_type, INF_CPU,
                                                   [round(share * MILLI) for share in node.device_free]),
                                          TargetRequest.from_devices(devices))
            return (math.inf if move is None else move[0], node.free_total() - devices)

        def take(node: NodeState, devices: float):
            return fgd_take(node, devices, distribution)
    capacity = sum(n.gpus for n in nodes) * MILLI
    arrived = allocated = placed = failed = 0
    marks = list(checkpoints)
    at: dict[str, float] = {}
    first_failure: dict | None = None
    failed_by_kind: dict[str, int] = {}
    for pod in arrivals:
        arrived += pod.total_gpu_milli
        if pod.num_gpu:
            devices = _core_devices(pod)
            for model in (m for m in models if not pod.models or m in pod.models):
                if place_gang(pools[model], workers=1, devices=devices, score=score, take=take) is not None:
                    allocated += pod.total_gpu_milli
                    placed += 1
                    break
            else:
                failed += 1
                kind = "share" if pod.gpu_milli < MILLI else f"{pod.num_gpu}gpu"
                failed_by_kind[kind] = failed_by_kind.get(kind, 0) + 1
                if first_failure is None:
                    first_failure = {"pod_index": placed + failed - 1, "arrived_pct": 100.0 * arrived / capacity,
                                     "allocated_pct": 100.0 * allocated / capacity}
        while marks and arrived >= marks[0] * capacity - 1e-6:
            at[f"{round(marks.pop(0) * 100)}"] = 100.0 * allocated / capacity
    for mark in marks:
        at[f"{round(mark * 100)}"] = 100.0 * allocated / capacity
    return {"policy": policy, "allocated_pct_at_arrived_pct": at, "first_failure": first_failure,
            "pods": len(arrivals), "placed": placed, "failed": failed, "failed_by_kind": failed_by_kind,
            "arrived_pct_final": 100.0 * arrived / capacity, "allocated_pct_final": 100.0 * allocated / capacity}


def run_one(data_dir: str, pod_list: str, policy: str, seed: int, tie_break: str = "random",
            fleetyard: FleetyardConfig = FLEETYARD, devices_only: bool = False) -> dict:
    nodes, pods = _inputs(Path(data_dir), pod_list)
    if policy in CORE_POLICIES:  # the core sees devices only, whatever the flag
        nodes, pods = gpu_only(nodes, pods)
        capacity = sum(n.gpus for n in nodes) * MILLI
        arrivals = build_arrivals(pods, capacity, seed)
        started, cpu_started = time.perf_counter(), time.process_time()
        result = simulate_core(nodes, arrivals, policy, core_distribution(pods) if policy == "core-fgd" else None)
        result.update(seed=seed, wall_s=time.perf_counter() - started, cpu_s=time.process_time() - cpu_started,
                      pod_list=pod_list)
        return result
    if devices_only:
        nodes, pods = gpu_only(nodes, pods)
    capacity = sum(n.gpus for n in nodes) * MILLI
    arrivals = build_arrivals(pods, capacity, seed)
    distribution = (fleetyard_distribution(pods, fleetyard) if policy == "fleetyard"
                    else policy_distribution(pods, policy))
    started, cpu_started = time.perf_counter(), time.process_time()
    pressure = fleetyard_pressure(nodes, pods) if policy == "fleetyard" else None
    ratios = resource_ratios(pods) if policy == "fleetyard" else None
    result = simulate(nodes, arrivals, policy, seed, distribution, tie_break=tie_break, fleetyard=fleetyard,
                      pressure=pressure, ratios=ratios)
    result["wall_s"] = time.perf_counter() - started
    result["cpu_s"] = time.process_time() - cpu_started
    result["pod_list"] = pod_list
    return result


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def summarise(results: list[dict], pod_lists: Sequence[str], policies: Sequence[str]) -> list[dict]:
    rows = []
    for pod_list in pod_lists:
        for policy in policies:
            runs = [r for r in results if r["pod_list"] == pod_list and r["policy"] == policy]
            if not runs:
                continue
            row = {"pod_list": pod_list, "policy": policy, "seeds": len(runs)}
            for mark in CHECKPOINTS:
                label = f"{round(mark * 100)}"
                values = [r["allocated_pct_at_arrived_pct"][label] for r in runs]
                row[f"alloc_at_{label}"] = statistics.fmean(values)
                row[f"alloc_at_{label}_sd"] = statistics.pstdev(values)
            failures = [r["first_failure"] for r in runs if r["first_failure"]]
            row["first_fail_arrived_pct"] = statistics.fmean(f["arrived_pct"] for f in failures) if failures else None
            row["first_fail_alloc_pct"] = statistics.fmean(f["allocated_pct"] for f in failures) if failures else None
            row["failed_pods"] = statistics.fmean(r["failed"] for r in runs)
            row["cpu_s_per_run"] = statistics.fmean(r["cpu_s"] for r in runs)
            published = PUBLISHED.get(pod_list, {}).get(PUBLISHED_NAME.get(policy, ""))
            row["published_alloc_at_100"] = published
            row["diff_vs_published"] = None if published is None else row["alloc_at_100"] - published
            rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    header = ["pod list", "policy", "seeds", "@80%", "@90%", "@95%", "@100% (sd)", "@130%", "paper@100%", "diff",
              "1st fail: arrived", "alloc", "failed pods", "s/run"]
    lines = []
    for r in rows:
        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"
        lines.append([r["pod_list"], r["policy"], str(r["seeds"]), pct(r["alloc_at_80"]), pct(r["alloc_at_90"]),
                      pct(r["alloc_at_95"]), f"{r['alloc_at_100']:.2f} ({r['alloc_at_100_sd']:.2f})",
                      pct(r["alloc_at_130"]), pct(r["published_alloc_at_100"]),
                      "-" if r["diff_vs_published"] is None else f"{r['diff_vs_published']:+.2f}",
                      pct(r["first_fail_arrived_pct"]), pct(r["first_fail_alloc_pct"]), f"{r['failed_pods']:.0f}",
                      f"{r['cpu_s_per_run']:.1f}"])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    out.append("  ".join("-" * w for w in widths))
    for line in lines:
        cells = enumerate(zip(line, widths, strict=True))
        out.append("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in cells))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.openb", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--pod-lists", default=",".join(POD_LISTS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--quick", action="store_true", help="2 seeds (42, 43), for smoke runs")
    parser.add_argument("--jobs", type=COUNT, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--tie-break", choices=("random", "first"), default="random",
                        help="equal best scores: random node (kube-scheduler, default) or first in node-list order; "
                             "'first' writes openb_tie-first.{json,csv}")
    parser.add_argument("--gpu-only", action="store_true",
                        help="ignore CPU and memory (nodes unlimited, pods ask none, CPU-only pods dropped): the trace "
                             "as the platform's scheduling core, which places by devices, sees it; writes "
                             "openb_gpu-only.{json,csv}")
    parser.add_argument("--pressure", type=float, default=FLEETYARD.pressure,
                        help="the fleetyard policy's GPU-model pressure weight (0: FGD node choice alone)")
    parser.add_argument("--data-dir", default=str(DATA_DIR))
    parser.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)

    seeds = parse_seeds(args.seeds)[:2] if args.quick else parse_seeds(args.seeds)
    if args.quick and len(seeds) < 2:
        seeds = [42, 43]
    pod_lists = [p for p in args.pod_lists.split(",") if p]
    policies = [p for p in args.policies.split(",") if p]
    for name in policies:
        if name not in POLICIES + CORE_POLICIES:
            parser.error(f"unknown policy {name}; known: {', '.join(POLICIES + CORE_POLICIES)}")
    data_dir = Path(args.data_dir)
    if not (data_dir / "openb_node_list_gpu_node.csv").exists():
        print(f"data not found under {data_dir}", file=sys.stderr)
        return 2
    try:  # read every list once here, so a bad file is one clear error rather than a traceback from a worker
        node_path = data_dir / "openb_node_list_gpu_node.csv"
        if not any(n.gpus for n in load_nodes(node_path)):
            raise DataError(f"{node_path}: no node has a GPU: nothing to measure")
        for pod_list in pod_lists:
            pod_path = data_dir / f"openb_pod_list_{pod_list}.csv"
            if not pod_path.is_file():
                raise DataError(f"{pod_path}: not found (--pod-lists names openb_pod_list_<name>.csv in --data-dir)")
            if not any(p.total_gpu_milli for p in load_pods(pod_path)):
                raise DataError(f"{pod_path}: no pod asks for a GPU: nothing to measure")
    except (OSError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    config = replace(FLEETYARD, pressure=args.pressure)
    tasks = [(str(data_dir), pl, pol, s, args.tie_break, config, args.gpu_only)
             for pl in pod_lists for pol in policies for s in seeds]
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(run_one, *zip(*tasks, strict=True)))
    else:
        results = [run_one(*t) for t in tasks]
    total_wall = time.perf_counter() - started

    rows = summarise(results, pod_lists, policies)
    per_policy = {pol: sum(r["cpu_s"] for r in results if r["policy"] == pol) for pol in policies}
    nodes = load_nodes(data_dir / "openb_node_list_gpu_node.csv")
    print(f"openb allocation benchmark: {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, seeds {seeds}, "
          f"arrivals to {TARGET_RATIO:.0%} of GPU capacity")
    if args.gpu_only:
        print("GPU ONLY: CPU and memory ignored (nodes unlimited, pods ask none, CPU-only pods dropped), as the "
              "platform's scheduling core places by devices")
    if args.pressure != FLEETYARD.pressure:
        print(f"fleetyard policy with GPU-model pressure {args.pressure:g} (default {FLEETYARD.pressure:g})")
    print("share of GPU capacity allocated (%) when arrived GPU requests reach x% of capacity, mean over seeds")
    print(format_table(rows))
    print("time per policy (CPU seconds, all runs): "
          + ", ".join(f"{pol} {sec:.1f}s" for pol, sec in per_policy.items())
          + f"; wall {total_wall:.1f}s with {args.jobs} worker(s)")
    for r in rows:
        if r["diff_vs_published"] is not None and abs(r["diff_vs_published"]) >= 0.5:
            print(f"NOTE: {r['pod_list']}/{r['policy']}: {r['alloc_at_100']:.2f}% vs published "
                  f"{r['published_alloc_at_100']:.2f}% ({r['diff_vs_published']:+.2f} points); see notes below")
    for note in NOTES:
        print("NOTE:", note)

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "openb (Alibaba cluster-trace-gpu-v2023), FGD paper method",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seeds": seeds, "pod_lists": pod_lists, "policies": policies,
        "parameters": {"target_ratio": TARGET_RATIO, "checkpoints_pct": [round(c * 100) for c in CHECKPOINTS],
                       "typical_pod_popularity": TYPICAL_POPULARITY, "node_list": "openb_node_list_gpu_node.csv",
                       "data_dir": os.path.relpath(data_dir, REPO_ROOT), "jobs": args.jobs,
                       "tie_break": ("uniform random among equal best scores (seeded)" if args.tie_break == "random"
                                     else "first node in node-list order among equal best scores"),
                       "gpu_choice": {"fgd": "least fragmentation increase", "others": "best fit (least free share)"},
                       "best_fit": "0.5*(cpu left)/128000 + 0.5*(GPU milli left)/8000 after placing, lowest wins",
                       "gpu_only": args.gpu_only, "fleetyard_pressure": args.pressure},
        "published_alloc_at_100": PUBLISHED,
        "cpu_seconds_per_policy": per_policy, "wall_seconds": total_wall,
        "summary": rows, "runs": results,
        "notes": NOTES,
    }
    stem = "openb" if args.tie_break == "random" else f"openb_tie-{args.tie_break}"
    stem += "_gpu-only" if args.gpu_only else ""
    stem += f"_pressure-{args.pressure:g}" if args.pressure != FLEETYARD.pressure else ""
    (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    with open(out_dir / f"{stem}.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["date", "seeds", *rows[0].keys()] if rows else ["date"])
        writer.writeheader()
        for r in rows:
            writer.writerow({"date": payload["date"], "seeds": " ".join(map(str, seeds)), **r})
    print(f"wrote {out_dir / (stem + '.json')} and {out_dir / (stem + '.csv')}")
    return 0


NOTES = [
    "Differences from the authors' simulator (kubernetes-scheduler-simulator) that can move numbers: "
    "scores are exact floats here, while kube-scheduler plugins return integers 0..100 (FGD: "
    "int(100*sigmoid(-increase/1000)), BestFit: int(100*(1-score)) then normalised), which creates more ties "
    "broken at random; random streams differ (Python vs Go), so per-seed pod orders differ; resampling stops when "
    "the next pod's total GPU request would exceed 130% (the simulator compares its per-GPU request); the k8s "
    "per-node pod-count limit is not modelled.",
    "Investigated cause of the FGD gap (default pod list, seed 42): FGD's fragmentation is blind to 8- and 4-GPU "
    "pods (they are outside the 95%-popularity typical set) and scores a whole-GPU pod the same on every node with "
    "CPU headroom, so the tie-break decides. With random ties (kube-scheduler's rule, used here by default) FGD "
    "spreads 1-GPU pods over the 8-GPU G2/G3 nodes and 40 8-GPU pods fail early (allocation 78% at 80% arrived; "
    "89.6% at 100%); breaking the same ties by node order (--tie-break first) gives 80.0%/93.8% at 80/100% with "
    "19 8-GPU failures, like BestFit. BestFit (92.7-92.8%) is close to the published 92.86% either way.",
    "fleetyard (Fleetyard's own policy, see FleetyardConfig) was chosen among variants measured on seeds 42-43 "
    "(@100%, default / gpuspec33 / multigpu50): full distribution weighted by GPU demand, pack ties 94.87 / 81.10 "
    "/ 96.78 (random ties 94.78 / 81.09 / 96.66); + model pressure 2: 94.87 / 93.90 / 96.78; by pod count + "
    "pressure: 94.66 / 93.99 / 97.04; half count half GPU + pressure + BestFit blend 0.1 (chosen): 95.26 / 93.95 / "
    "96.72. The model-pressure term is what lifts gpuspec33 (T4-only pods ask for 1.25x the T4 capacity).",
    "fleetyard 2026-11-25: + CPU/memory stranding term (strand 2, see FleetyardConfig), blend 0.1 -> 0. At 100% "
    "arrived on default seed 42 the old policy left 4.77% of GPU capacity free, 2.7 points of it on nodes with "
    "< 4 CPU cores free (0.47/0.65-GPU pods ask 11 cores, G2 nodes have 12 per GPU; P100 nodes 8); with the "
    "term 4.05% is left, 3.9 points of it slivers of <= 190 milli (1,004 GPUs holding one 0.81 pod). Seeds 42-43 "
    "@100% (default / gpuspec33 / multigpu50): old 95.26 / 93.95 / 96.72; strand 1: 95.87 / 95.15 / 97.31; "
    "strand 2: 95.89 / 95.23 / 97.36; strand 2, blend 0 (chosen): 95.93 / 95.22 / 97.40; strand 2 with "
    "weight_by count: 95.88 / 95.36 / 97.62 (seeds 44-47: 95.86 / 95.33 / 97.55 vs chosen 95.88 / 95.15 / "
    "97.38). Tried and dropped (default, seeds 42-45, chosen 95.90): best-fit GPU choice for fractional pods "
    "(leftover weight 0.2-1: 95.59); expected-fill-waste lookahead on the pod list's fractional sizes (0.3-1: "
    "95.57-95.59); tight fit for <= 200-milli pods only (95.87).",
    "Why 97% is out of reach on default for an online policy: an offline best-fit-decreasing packing of just the "
    "fractional pods arrived by 100% (seeds 42/43: 3,128/3,155 pods) wastes 3.99/4.04% of GPU capacity, so "
    "placing them all caps allocation near 96%; beating that needs the late 0.81-GPU pods to fail instead of "
    "1-GPU pods, and both need the same free GPU, so no policy that places every pod that fits can choose.",
    "Ceiling on default: a GPU holding an 810-milli pod can only take pods of <= 190 milli besides, so with N such "
    "pods and S milli of <= 190-milli pods arrived, at least 0.81*(190N - S) milli is lost whatever the placement "
    "(placed: stranded 190s; not placed: the pods themselves). For seeds 42-51 that caps allocation at 100% "
    "arrived at 97.44-97.48% even for a clairvoyant offline packer, before any other shape's waste.",
]


if __name__ == "__main__":
    raise SystemExit(main())
