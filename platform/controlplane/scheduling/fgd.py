"""GPU fragmentation measure and Fragmentation Gradient Descent (FGD) node scoring.

What it is for: choosing the node (and the GPU on it) for a pod that asks for a fractional GPU share or
N whole GPUs so that the cluster keeps as many GPUs usable as possible for the workload it expects
(Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC'23). Pure Python: no Django, no Ray.

Definitions (after the paper and its simulator, re-implemented here):

* A target workload is a set of typical requests ``m`` with popularity ``p_m`` (summing to 1). A request is
  ``num_gpu`` GPUs of ``gpu_milli`` thousandths each (``gpu_milli < 1000`` is a share of one GPU;
  ``gpu_milli == 0`` is a CPU-only pod), ``cpu_milli`` CPU and optionally a set of allowed GPU models.
* The fragmentation of node ``n`` for request ``m``, ``F_n(m)``, in GPU thousandths: if ``m`` cannot run on
  ``n`` at all (CPU-only request, GPU model not allowed, too little CPU left, or fewer than ``num_gpu``
  GPUs with at least ``gpu_milli`` free), every free GPU share of ``n`` is fragment; otherwise the free
  shares of the GPUs that are individually too small for ``m`` (free < ``gpu_milli``) are fragment.
* The node's fragmentation is the expectation ``F_n = sum_m p_m F_n(m)``.
* FGD places a pod on the node whose fragmentation grows least, ``F_n(after) - F_n(before)`` (lowest
  score wins), and puts a fractional pod on the GPU of that node that makes the growth smallest.

Node states are keyed by ``(gpu_model, cpu_free, free GPU thousandths sorted descending, zeros dropped)``;
fragmentation values are memoised on that key, so a scheduler only recomputes what changed.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.scheduling.placement import EPS, NodeScore, NodeState

MILLI = 1000
INF_CPU = math.inf


@dataclass(frozen=True)
class TargetRequest:
    """One typical request of the target workload."""

    gpu_milli: int  # per GPU, 0..1000; 0 = CPU-only
    num_gpu: int = 1
    cpu_milli: float = 0.0
    gpu_models: frozenset[str] = frozenset()  # empty: any GPU model

    def __post_init__(self) -> None:
        if not 0 <= self.gpu_milli <= MILLI:
            raise ValueError(f"gpu_milli must be in 0..{MILLI}, got {self.gpu_milli}")
        if self.gpu_milli and self.gpu_milli < MILLI and self.num_gpu != 1:
            raise ValueError("a fractional GPU request asks for exactly one GPU")

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.num_gpu if self.gpu_milli else 0

    def allows(self, model: str) -> bool:
        return not self.gpu_models or model in self.gpu_models

    @classmethod
    def from_devices(cls, devices: float, *, cpu_milli: float = 0.0, gpu_models: Iterable[str] = ()) -> TargetRequest:
        """A request in placement.py's terms: a fraction (< 1) of one device, or N whole devices."""
        models = frozenset(gpu_models)
        if devices >= 1.0 - EPS:
            return cls(gpu_milli=MILLI, num_gpu=round(devices), cpu_milli=cpu_milli, gpu_models=models)
        if devices <= EPS:
            return cls(gpu_milli=0, num_gpu=0, cpu_milli=cpu_milli, gpu_models=models)
        return cls(gpu_milli=round(devices * MILLI), num_gpu=1, cpu_milli=cpu_milli, gpu_models=models)


def node_key(model: str, cpu_free: float, gpu_free_milli: Iterable[int]) -> tuple[str, float, tuple[int, ...]]:
    """Canonical node state: GPU identity does not matter, and an exhausted GPU contributes nothing."""
    return model, cpu_free, tuple(sorted((g for g in gpu_free_milli if g > 0), reverse=True))


@dataclass
class _Group:  # typical requests of one (gpu_milli, num_gpu) accessible on one model, by CPU need
    gpu_milli: int
    num_gpu: int
    cpu_sorted: list[float]
    cum_weight: list[float]


@dataclass
class WorkloadDistribution:
    """Target workload: typical requests and their popularity (normalised to sum 1)."""

    requests: tuple[tuple[TargetRequest, float], ...]
    max_cache: int = 2_000_000
    _groups: dict[str, list[_Group]] = field(default_factory=dict, init=False, repr=False)
    _memo: dict[tuple, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        total = sum(weight for _, weight in self.requests)
        if total <= 0:
            raise ValueError("a workload distribution needs at least one request with positive popularity")
        self.requests = tuple((request, weight / total) for request, weight in self.requests if weight > 0)

    @classmethod
    def from_requests(cls, requests: Mapping[TargetRequest, float] | Iterable[tuple[TargetRequest, float]]
                      ) -> WorkloadDistribution:
        items = requests.items() if isinstance(requests, Mapping) else requests
        return cls(tuple(items))

    @classmethod
    def from_pods(cls, pods: Iterable[TargetRequest], *, popularity: float = 0.95,
                  weight_by: str = "count") -> WorkloadDistribution:
        """The most popular request shapes covering `popularity` of the pods (the simulator's "typical pods").

        Shapes are counted, sorted by weight (ties: a fixed order on the shape), and taken until their
        cumulative weight reaches `popularity` of the total; their popularity is then renormalised.
        `weight_by="count"` (the simulator's rule) weighs a shape by its number of pods; `weight_by="gpu"`
        weighs it by the GPU thousandths its pods ask for in all, so that rare but large gangs (8 whole GPUs)
        count as much as the capacity they need and CPU-only pods drop out.
        """
        if weight_by not in ("count", "gpu", "mix"):
            raise ValueError(f"weight_by must be 'count', 'gpu' or 'mix', got {weight_by!r}")
        counts = Counter(pods)
        if not counts:
            raise ValueError("no pods")
        n_pods = sum(counts.values())
        n_gpu = sum(count * request.total_gpu_milli for request, count in counts.items()) or 1
        if weight_by == "count":
            weights = {request: float(count) for request, count in counts.items()}
        elif weight_by == "gpu":
            weights = {request: float(count * request.total_gpu_milli) for request, count in counts.items()}
        else:  # half by pod count, half by GPU demand
            weights = {request: 0.5 * count / n_pods + 0.5 * count * request.total_gpu_milli / n_gpu
                       for request, count in counts.items()}
        total = sum(weights.values())
        if total <= 0:
            raise ValueError("no pod asks for a GPU")
        ordered = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0].cpu_milli, kv[0].gpu_milli, kv[0].num_gpu,
                                                          sorted(kv[0].gpu_models)))
        chosen, cumulative = [], 0.0
        for request, weight in ordered:
            if weight <= 0:
                break
            chosen.append((request, weight))
            cumulative += weight
            if cumulative >= popularity * total - 1e-9:
                break
        return cls(tuple(chosen))

    @classmethod
    def from_devices(cls, popularity: Mapping[float, float], *, gpu_models: Iterable[str] = ()) -> WorkloadDistribution:
        """For placement.py callers: {devices per worker: popularity}, e.g. {0.5: 3, 1: 5, 8: 1}."""
        return cls(tuple((TargetRequest.from_devices(d, gpu_models=gpu_models), w) for d, w in popularity.items()))

    # -- fragmentation -----------------------------------------------------------------------------------

    def _model_groups(self, model: str) -> list[_Group]:
        groups = self._groups.get(model)
        if groups is None:
            by_shape: dict[tuple[int, int], list[tuple[float, float]]] = {}
            for request, weight in self.requests:
                if request.gpu_milli == 0 or not request.allows(model):
                    continue  # never satisfiable here: all free GPU counts as fragment (weight stays in "total")
                by_shape.setdefault((request.gpu_milli, request.num_gpu), []).append((request.cpu_milli, weight))
            groups = []
            for (gpu_milli, num_gpu), entries in sorted(by_shape.items(), reverse=True):
                entries.sort()
                cumulative, acc = [], 0.0
                for _, weight in entries:
                    acc += weight
                    cumulative.append(acc)
                groups.append(_Group(gpu_milli, num_gpu, [cpu for cpu, _ in entries], cumulative))
            self._groups[model] = groups
        return groups

    def fragmentation_of_key(self, key: tuple[str, float, tuple[int, ...]]) -> float:
        """Expected fragmentation (GPU thousandths) of a canonical node state (see `node_key`)."""
        value = self._memo.get(key)
        if value is not None:
            return value
        model, cpu_free, gpus = key
        total = sum(gpus)
        if total == 0:
            value = 0.0
        else:
            usable = 0.0  # sum over satisfiable requests of p_m * (free share on GPUs big enough for m)
            for group in self._model_groups(model):
                count, big = 0, 0
                for free in gpus:  # descending
                    if free < group.gpu_milli:
                        break
                    count += 1
                    big += free
                if count >= group.num_gpu:
                    k = bisect_right(group.cpu_sorted, cpu_free)
                    if k:
                        usable += group.cum_weight[k - 1] * big
            value = total - usable
        if len(self._memo) >= self.max_cache:
            self._memo.clear()
        self._memo[key] = value
        return value

    def fragmentation(self, model: str, gpu_free_milli: Iterable[int], cpu_free: float = INF_CPU) -> float:
        """Expected fragmentation F_n (GPU thousandths) of a node with these free GPU shares and CPU."""
        return self.fragmentation_of_key(node_key(model, cpu_free, gpu_free_milli))

    # -- FGD -----------------------------------------------------------------------------------------------

    def best_move(self, key: tuple[str, float, tuple[int, ...]], request: TargetRequest
                  ) -> tuple[float, tuple[str, float, tuple[int, ...]], int] | None:
        """FGD for one node: (fragmentation increase, state after, free share of the GPU used) or None.

        For a fractional request each distinct free share that fits is tried and the one giving the least
        increase wins (ties: the smallest free share, i.e. best fit); whole GPUs are taken from fully
        free ones (the GPU used is reported as 1000). CPU-only requests only take CPU.
        """
        model, cpu_free, gpus = key
        if cpu_free < request.cpu_milli or (request.gpu_milli and not request.allows(model)):
            return None
        new_cpu = cpu_free - request.cpu_milli
        before = self.fragmentation_of_key(key)
        if request.gpu_milli == 0:
            after_key = (model, new_cpu, gpus)
            return self.fragmentation_of_key(after_key) - before, after_key, 0
        if request.gpu_milli >= MILLI:
            n = request.num_gpu
            if len(gpus) < n or gpus[n - 1] < MILLI:
                return None
            after_key = (model, new_cpu, gpus[n:])  # descending: the first n are whole free GPUs
            return self.fragmentation_of_key(after_key) - before, after_key, MILLI
        need = request.gpu_milli
        best = None
        previous = None
        for i in range(len(gpus) - 1, -1, -1):  # ascending free share: ties keep the tightest GPU
            free = gpus[i]
            if free < need or free == previous:
                continue
            previous = free
            rest = free - need
            new_gpus = gpus[:i] + gpus[i + 1:]
            if rest > 0:
                new_gpus = tuple(sorted(new_gpus + (rest,), reverse=True))
            after_key = (model, new_cpu, new_gpus)
            delta = self.fragmentation_of_key(after_key) - before
            if best is None or delta < best[0] - 1e-9:
                best = (delta, after_key, free)
        return best

    def score(self, model: str, gpu_free_milli: Sequence[int], request: TargetRequest,
              cpu_free: float = INF_CPU) -> float | None:
        """FGD score of a node for a request: fragmentation increase (GPU thousandths); None if it does not fit."""
        move = self.best_move(node_key(model, cpu_free, gpu_free_milli), request)
        return None if move is None else move[0]


# -- adapters for placement.NodeState -----------------------------------------------------------------------

def _node_milli(node: NodeState) -> list[int]:
    return [round(share * MILLI) for share in node.device_free]


def fgd_score(workload_distribution: WorkloadDistribution) -> NodeScore:
    """A placement.NodeScore: the FGD fragmentation increase (in GPUs) of putting `devices` on `node`.

    Node CPU is not considered (place_gang requests carry none). Nodes that cannot fit get +inf.
    """
    dist = workload_distribution

    def score(node: NodeState, devices: float) -> float:
        value = dist.score(node.accelerator_type, _node_milli(node), TargetRequest.from_devices(devices))
        return math.inf if value is None else value / MILLI

    return score


def fgd_device_choice(node: NodeState, devices: float, workload_distribution: WorkloadDistribution) -> int | None:
    """Index of the device FGD would put a fractional request on (None when nothing fits or not fractional)."""
    if devices >= 1.0 - EPS or devices <= EPS:
        return None
    milli = _node_milli(node)
    move = workload_distribution.best_move(node_key(node.accelerator_type, INF_CPU, milli),
                                           TargetRequest.from_devices(devices))
    if move is None:
        return None
    chosen_free = move[2]
    return min(i for i, free in enumerate(milli) if free == chosen_free)


def fgd_take(node: NodeState, devices: float, workload_distribution: WorkloadDistribution
             ) -> tuple[tuple[int, float], ...]:
    """Like NodeState.take, but a fractional request goes to the device FGD chooses."""
    index = fgd_device_choice(node, devices, workload_distribution)
    if index is None:
        return node.take(devices)
    if not node.schedulable or node.device_free[index] < devices - EPS:
        raise ValueError(f"{node.name} cannot fit {devices} devices")
    node.device_free[index] = max(0.0, node.device_free[index] - devices)
    return ((index, devices),)



def model_pressure(pods: Iterable[TargetRequest], capacity_milli: Mapping[str, float]) -> dict[str, float]:
    """Expected load per GPU of each model from pods that may only use some GPU models.

    For every GPU model ``g``: the sum, over the model-constrained requests that allow ``g``, of their GPU
    demand spread evenly over the capacity of the models they allow, with demand scaled so that the whole
    workload asks for exactly the cluster's capacity. A value near or above 1 means the constrained pods
    alone may fill that model, so unconstrained pods should go elsewhere; 0 means nobody needs that model
    in particular. Uses only the workload's shape (the pod list FGD's distribution comes from) and the
    cluster's capacity, never arrival order.
    """
    models = {model for model, cap in capacity_milli.items() if cap > 0}
    total_capacity = sum(capacity_milli[model] for model in models)
    demand: Counter[frozenset[str]] = Counter()
    total_demand = 0
    for pod in pods:
        total_demand += pod.total_gpu_milli
        if pod.gpu_models and pod.total_gpu_milli:
            demand[pod.gpu_models & models] += pod.total_gpu_milli
    pressure = dict.fromkeys(models, 0.0)
    if not total_demand:
        return pressure
    scale = total_capacity / total_demand
    for allowed, milli in demand.items():
        allowed_capacity = sum(capacity_milli[model] for model in allowed)
        for model in allowed:
            pressure[model] += milli * scale / allowed_capacity
    return pressure


def stranded_gpu_milli(gpu_free_milli: float, cpu_free: float, memory_free: float,
                       cpu_per_gpu_milli: float, memory_per_gpu_milli: float) -> float:
    """Free GPU thousandths of a node that its free CPU and memory cannot feed.

    The workload asks on average ``cpu_per_gpu_milli`` CPU and ``memory_per_gpu_milli`` memory per GPU
    thousandth (e.g. the pod list's totals over its GPU demand); a node whose free CPU or memory runs out
    before its free GPU share leaves the excess GPU idle whatever the pod shapes. FGD's fragmentation only
    sees CPU per typical request and never memory; adding the growth of this measure to a node's score
    keeps CPU-heavy pods off CPU-poor nodes and CPU-light ones off CPU-rich nodes. 0 when either ratio is
    not positive (that resource is not a constraint).
    """
    if cpu_per_gpu_milli <= 0 or memory_per_gpu_milli <= 0:
        return 0.0
    feedable = min(cpu_free / cpu_per_gpu_milli, memory_free / memory_per_gpu_milli)
    return max(0.0, gpu_free_milli - feedable)
