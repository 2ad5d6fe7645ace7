"""Heterogeneity-aware scheduling on Gavel's Philly traces: a discrete-event simulator and a benchmark.

Run from the repository root::

    .venv/bin/python -m benchmarks.gavel [--traces all] [--cluster 36:36:36] [--policies fifo,agnostic,fleetyard]
                                         [--seed 0] [--trace PATH ...] [--limit N]

Data: ``../shared/benchmarks/gavel-2020/`` (relative to the repository root; never copied here): Gavel's
throughput matrix ``simulation_throughputs.json`` and three Philly virtual-cluster traces. A trace line has
7 tab-separated fields: ``job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time_s,
scale_factor``. Jobs are converted exactly as Gavel's simulator runs these traces (see the data README):
type, steps and arrival kept; jobs with scale factor 0 dropped; the GPU count becomes the largest power of
two not above the scale factor, capped at 8, for ResNet-18, ResNet-50, Transformer and LM, and 1 for every
other family. A job of type T on S GPUs of chip c advances ``throughputs[c]["('T', S)"]["null"]`` steps/s.

The simulated cluster has ``--cluster V:P:K`` GPUs of v100, p100 and k80 (Gavel's ``v100:p100:k80``
order), each chip type one pool (no server boundaries). Every policy is non-preemptive and gang: a job
starts only when all its GPUs of ONE chip type are free, and then runs to completion at its throughput on
that chip. A chip with published throughput 0 (e.g. ResNet-50 at batch size 128 on several K80s) cannot
run the job; every policy respects that.

Policies:

- ``fifo``: arrival order, strict (the head of the queue blocks the rest); the head takes the first chip
  type with room in the fixed order v100, p100, k80. It ignores how much each job gains from each chip.
- ``agnostic``: arrival order with backfill (any waiting job that fits starts), on a chip type chosen
  uniformly at random (seeded) among those with room: heterogeneity-agnostic.
- ``fleetyard``: heterogeneity-aware, built on ``controlplane.scheduling.efficiency.EfficiencyMatrix``
  (the job's run time on chip c is total_steps / (matrix throughput * GPUs)). At every arrival and
  completion it makes one pass over the waiting jobs:

  1. Order: highest response ratio first, ``(wait + t_best) / t_best`` where ``t_best`` is the job's run
     time on its fastest chip. Short jobs go first (what lowers average JCT), and a long job's priority
     grows while it waits, so it is not starved.
  2. Chip: for each chip type the job can run on, the earliest start is estimated from the remaining run
     times of the running jobs and the reservations made earlier in this pass; the job takes the chip
     with the earliest estimated *finish* (start + run time). So it waits for a much faster chip when the
     expected wait is shorter than the slowdown, and otherwise runs now on a slower one. Among chips whose
     finish is within ``SLACK`` (10%) of the earliest, it takes the one where it is relatively best, i.e.
     the highest ``throughput(c) / best throughput`` divided by the queue's average of the same ratio on c:
     a job that gains little from a fast chip leaves it to the jobs that gain most from it.
  3. Start or reserve: if the chosen chip has room now, the job starts. Otherwise the first ``RESERVE``
     (16) such jobs in the order hold a reservation for their estimated start; later jobs backfill: they
     may start now only on GPUs that do not delay a reservation.

  It uses the declared ``total_steps`` of each job (the trace gives them; Gavel's ``_perf`` policies know
  the throughputs too, but not the step counts). ``fleetyard-arrival`` is the same policy with step 1
  replaced by arrival order: an ablation that shows how much comes from chip choice alone.

Reported per trace and policy: average and p99 JCT (hours, completion minus arrival), makespan (hours,
first arrival to last completion) and GPU utilization (busy GPU-time over capacity x makespan), plus the
ratio of fleetyard's average JCT to each other policy's, and a lower bound for context: the average run
time of each job alone on its fastest chip (no queueing), which no non-preemptive policy can beat.
Gavel's published numbers are printed for reference; they come from Gavel's own simulator, which is
preemptive and round-based, so they are not directly comparable with ours. Results go to
``benchmarks/results/gavel.{json,csv}``.
"""

from __future__ import annotations

import argparse
import codecs
import csv
import datetime as dt
import heapq
import io
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):  # controlplane's source root; benchmarks
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT  # noqa: E402
from controlplane.scheduling.efficiency import (  # noqa: E402
    EfficiencyMatrix,
    gavel_workload_class,
    load_gavel_matrix,
)

DATA_DIR = REPO_ROOT.parent / "shared" / "benchmarks" / "gavel-2020"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
TRACES = ("0e4a51", "2869ce", "e13805")
CHIPS = ("v100", "p100", "k80")  # the order of --cluster, and fifo's preference order
POLICIES = ("fifo", "agnostic", "fleetyard", "fleetyard-arrival")
DEFAULT_POLICIES = "fifo,agnostic,fleetyard,fleetyard-arrival"
BASELINES = ("fifo", "agnostic")
SCALED_FAMILIES = ("ResNet-18", "ResNet-50", "Transformer", "LM")
MAX_SCALE = 8
SLACK = 0.10
RESERVE = 16
EPS = 1e-9

# Gavel's own simulator (preemptive, round-based), v100:p100:k80 = 36:36:36, seed 0, average JCT in hours,
# as given in ../shared/benchmarks/README.md. None: did not finish.
GAVEL_PUBLISHED: dict[str, dict[str, float | None]] = {
    "0e4a51": {"fifo": 231.0, "fifo_perf": 138.0, "max_min_fairness": 111.3, "max_min_fairness_perf": 84.7,
               "gandiva": None},
    "2869ce": {"fifo": 8.69, "fifo_perf": 7.46, "max_min_fairness": 11.78, "max_min_fairness_perf": 8.06,
               "gandiva": 8.02},
    "e13805": {"fifo": 16.50, "fifo_perf": 15.58, "max_min_fairness": 24.10, "max_min_fairness_perf": 16.12,
               "gandiva": 16.14},
}


# -- traces --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceJob:
    """One job of a trace, as converted for the simulator."""

    job_id: int
    line: int  # 1-based line number in the trace file
    job_type: str
    total_steps: int
    arrival: float  # seconds
    scale_factor: int  # as in the trace
    gpus: int  # after Gavel's conversion


@dataclass(frozen=True)
class TraceError:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class Trace:
    name: str
    jobs: list[TraceJob]
    errors: list[TraceError]
    dropped: list[int]  # line numbers of jobs with scale factor 0


def job_family(job_type: str) -> str:
    return job_type.split(" (", 1)[0].strip()


def convert_scale(job_type: str, scale_factor: int) -> int | None:
    """Gavel's conversion of a trace scale factor to a GPU count; None means the job is dropped."""
    if scale_factor <= 0:
        return None
    if job_family(job_type) not in SCALED_FAMILIES:
        return 1
    return min(1 << (scale_factor.bit_length() - 1), MAX_SCALE)


def _number(kind: type, field_name: str, text: str) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{field_name} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def parse_trace(lines: Iterable[str], name: str = "trace") -> Trace:
    """Parse Gavel's 7-field trace format; bad lines are reported with their line numbers and skipped."""
    jobs: list[TraceJob] = []
    errors: list[TraceError] = []
    dropped: list[int] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) != 7:
            errors.append(TraceError(number, f"expected 7 tab-separated fields, got {len(fields)}"))
            continue
        job_type, _command, _steps_arg, needs_data_dir, total_steps, arrival, scale = (f.strip() for f in fields)
        problem = None
        if not job_type:
            problem = "empty job_type"
        elif needs_data_dir not in ("0", "1"):
            problem = f"needs_data_dir must be 0 or 1, got {needs_data_dir!r}"
        if problem is None:
            try:
                steps_value = _number(int, "total_steps", total_steps)
                arrival_value = _number(float, "arrival_time", arrival)
                scale_value = _number(int, "scale_factor", scale)
            except ValueError as error:
                problem = str(error)
            else:
                if steps_value <= 0:
                    problem = f"total_steps must be positive, got {steps_value}"
                elif steps_value > sys.float_info.max:  # run times are floats: total_steps / rate would overflow
                    problem = f"total_steps is too large, got a {len(str(steps_value))}-digit number"
                elif not math.isfinite(arrival_value) or arrival_value < 0:
                    problem = f"arrival_time must be a finite number >= 0, got {arrival!r}"
                elif scale_value < 0:
                    problem = f"scale_factor must be >= 0, got {scale_value}"
        if problem is not None:
            errors.append(TraceError(number, problem))
            continue
        gpus = convert_scale(job_type, scale_value)
        if gpus is None:
            dropped.append(number)
            continue
        jobs.append(TraceJob(len(jobs), number, job_type, steps_value, arrival_value, scale_value, gpus))
    return Trace(name, jobs, errors, dropped)


def load_trace(path: str | Path) -> Trace:
    """Read a trace file (UTF-8, any line endings); ValueError naming the file and line if it is not UTF-8 text."""
    path = Path(path)
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):  # a byte order mark is not part of the first job type
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 text ({error.reason})") from None
    return parse_trace(io.StringIO(text, newline=None), name=path.stem)


# -- simulator -----------------------------------------------------------------------------------------------

RateFn = Callable[[TraceJob, str], float]


def matrix_rate(matrix: EfficiencyMatrix) -> RateFn:
    """Steps per second of a whole job on a chip type (0.0: cannot run there)."""

    def rate(job: TraceJob, chip: str) -> float:
        return matrix.throughput(gavel_workload_class(job.job_type, job.gpus), chip) * job.gpus

    return rate


@dataclass(frozen=True)
class Running:
    job: TraceJob
    chip: str
    start: float
    finish: float


@dataclass
class ClusterView:
    """What a policy sees: the time, free GPUs per chip type, capacity, and the running jobs."""

    now: float
    capacity: dict[str, int]
    free: dict[str, int]
    running: list[Running]


class Policy:
    name = "policy"

    def __init__(self, rate: RateFn, chips: Sequence[str], seed: int = 0) -> None:
        self.rate = rate
        self.chips = tuple(chips)
        self.seed = seed

    def feasible(self, job: TraceJob, capacity: dict[str, int]) -> list[str]:
        return [c for c in self.chips if capacity.get(c, 0) >= job.gpus and self.rate(job, c) > 0]

    def schedule(self, view: ClusterView, waiting: list[TraceJob]) -> list[tuple[TraceJob, str]]:
        raise NotImplementedError


class FifoPolicy(Policy):
    name = "fifo"

    def schedule(self, view, waiting):
        free = dict(view.free)
        starts = []
        for job in waiting:
            chip = next((c for c in self.chips if free.get(c, 0) >= job.gpus and self.rate(job, c) > 0), None)
            if chip is None:
                break  # strict FIFO: the head blocks everyone behind it
            free[chip] -= job.gpus
            starts.append((job, chip))
        return starts


class AgnosticPolicy(Policy):
    name = "agnostic"

    def __init__(self, rate, chips, seed=0):
        super().__init__(rate, chips, seed)
        self.rng = random.Random(seed)

    def schedule(self, view, waiting):
        free = dict(view.free)
        starts = []
        for job in waiting:
            room = [c for c in self.chips if free.get(c, 0) >= job.gpus and self.rate(job, c) > 0]
            if room:
                chip = self.rng.choice(room)
                free[chip] -= job.gpus
                starts.append((job, chip))
        return starts


class _Profile:
    """GPU use of one chip type over time: running jobs (until their finish) plus reservations."""

    def __init__(self, capacity: int, now: float, running: Iterable[Running]) -> None:
        self.capacity = capacity
        self.now = now
        self.finishes: list[tuple[float, int]] = [(r.finish, r.job.gpus) for r in running]
        self.reservations: list[tuple[float, float, int]] = []

    def used(self, t: float) -> int:
        total = sum(g for finish, g in self.finishes if finish > t + EPS)
        return total + sum(g for start, end, g in self.reservations if start <= t + EPS and end > t + EPS)

    def fits(self, start: float, duration: float, gpus: int) -> bool:
        end = start + duration
        points = [start] + [s for s, _, _ in self.reservations if start < s < end - EPS]
        return all(self.used(t) + gpus <= self.capacity for t in points)

    def earliest_start(self, duration: float, gpus: int) -> float:
        if gpus > self.capacity:
            return math.inf
        candidates = {self.now}
        candidates.update(f for f, _ in self.finishes if f > self.now)
        candidates.update(e for _, e, _ in self.reservations if e > self.now)
        for t in sorted(candidates):
            if self.fits(t, duration, gpus):
                return t
        return math.inf  # unreachable: once everything has finished the chip is empty

    def add_running(self, finish: float, gpus: int) -> None:
        self.finishes.append((finish, gpus))

    def reserve(self, start: float, end: float, gpus: int) -> None:
        self.reservations.append((start, end, gpus))


class FleetyardPolicy(Policy):
    """Heterogeneity-aware non-preemptive policy; the rule is in the module docstring."""

    name = "fleetyard"

    def __init__(self, rate, chips, seed=0, *, order: str = "response-ratio", slack: float = SLACK,
                 reserve: int = RESERVE):
        super().__init__(rate, chips, seed)
        if order not in ("response-ratio", "arrival"):
            raise ValueError(f"unknown order {order!r}")
        self.order = order
        self.slack = slack
        self.reserve_limit = reserve
        self._runtime: dict[int, dict[str, float]] = {}

    def runtimes(self, job: TraceJob) -> dict[str, float]:
        cached = self._runtime.get(job.job_id)
        if cached is None:
            cached = {}
            for chip in self.chips:
                rate = self.rate(job, chip)
                if rate > 0:
                    cached[chip] = job.total_steps / rate
            self._runtime[job.job_id] = cached
        return cached

    def schedule(self, view, waiting):
        now = view.now
        free = dict(view.free)
        profiles = {c: _Profile(view.capacity.get(c, 0), now, (r for r in view.running if r.chip == c))
                    for c in self.chips}
        runtimes = {job.job_id: {c: t for c, t in self.runtimes(job).items() if view.capacity.get(c, 0) >= job.gpus}
                    for job in waiting}
        # Relative speed of each job on each chip (1.0 on its fastest), and the queue's average per chip.
        relative: dict[int, dict[str, float]] = {}
        queue_mean = dict.fromkeys(self.chips, 0.0)
        for job in waiting:
            times = runtimes[job.job_id]
            best = min(times.values(), default=math.inf)
            relative[job.job_id] = {c: best / t for c, t in times.items()}
            for c in self.chips:
                queue_mean[c] += relative[job.job_id].get(c, 0.0)
        for c in self.chips:
            queue_mean[c] = queue_mean[c] / len(waiting) if waiting else 1.0

        if self.order == "arrival":
            ordered = list(waiting)
        else:
            def response_ratio(job: TraceJob) -> float:
                best = min(runtimes[job.job_id].values(), default=math.inf)
                return -((now - job.arrival + best) / best) if best > 0 else 0.0

            ordered = sorted(waiting, key=lambda j: (response_ratio(j), j.arrival, j.job_id))

        starts = []
        reserved = 0
        for job in ordered:
            times = runtimes[job.job_id]
            if not times:
                continue
            if reserved >= self.reserve_limit and max(free.values(), default=0) < job.gpus:
                continue  # nothing can start and we reserve no more: skip the estimate
            options = []
            for chip, duration in times.items():
                start = profiles[chip].earliest_start(duration, job.gpus)
                if math.isfinite(start):
                    options.append((start + duration, start, chip, duration))
            if not options:
                continue
            earliest = min(o[0] for o in options)
            close = [o for o in options if o[0] <= now + (earliest - now) * (1.0 + self.slack) + EPS]
            finish, start, chip, duration = max(
                close, key=lambda o: (relative[job.job_id][o[2]] / max(queue_mean[o[2]], EPS), -o[0], o[2]))
            if start <= now + EPS:
                profiles[chip].add_running(now + duration, job.gpus)
                free[chip] -= job.gpus
                starts.append((job, chip))
            elif reserved < self.reserve_limit:
                profiles[chip].reserve(start, finish, job.gpus)
                reserved += 1
        return starts


def make_policy(name: str, rate: RateFn, chips: Sequence[str], seed: int) -> Policy:
    if name == "fifo":
        return FifoPolicy(rate, chips, seed)
    if name == "agnostic":
        return AgnosticPolicy(rate, chips, seed)
    if name == "fleetyard":
        return FleetyardPolicy(rate, chips, seed)
    if name == "fleetyard-arrival":
        policy = FleetyardPolicy(rate, chips, seed, order="arrival")
        policy.name = "fleetyard-arrival"
        return policy
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


@dataclass
class SimResult:
    policy: str
    jobs: int
    avg_jct_h: float
    p99_jct_h: float
    makespan_h: float
    utilization: float
    chip_jobs: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the simulation
    unschedulable: list[int] = field(default_factory=list)  # trace line numbers

    def as_dict(self) -> dict:
        return {
            "policy": self.policy, "jobs": self.jobs, "avg_jct_h": self.avg_jct_h, "p99_jct_h": self.p99_jct_h,
            "makespan_h": self.makespan_h, "utilization": self.utilization, "jobs_per_chip": self.chip_jobs,
            "unschedulable_lines": self.unschedulable, "wall_seconds": round(self.seconds, 3),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def simulate(jobs: Sequence[TraceJob], capacity: dict[str, int], policy: Policy) -> SimResult:
    """Run the trace to completion under `policy`; jobs no chip type can ever run are left out and listed."""
    started_at = time.perf_counter()
    runnable = [j for j in jobs if policy.feasible(j, capacity)]
    unschedulable = [j.line for j in jobs if not policy.feasible(j, capacity)]
    pending = sorted(runnable, key=lambda j: (j.arrival, j.job_id))
    free = dict(capacity)
    heap: list[tuple[float, int, Running]] = []
    running: dict[int, Running] = {}
    waiting: list[TraceJob] = []
    jct: list[float] = []
    busy = 0.0
    last_finish = 0.0
    chip_jobs = dict.fromkeys(capacity, 0)
    index = 0
    while index < len(pending) or heap:
        next_arrival = pending[index].arrival if index < len(pending) else math.inf
        next_finish = heap[0][0] if heap else math.inf
        now = min(next_arrival, next_finish)
        while heap and heap[0][0] <= now + EPS:
            _, _, done = heapq.heappop(heap)
            del running[done.job.job_id]
            free[done.chip] += done.job.gpus
            jct.append(done.finish - done.job.arrival)
            busy += (done.finish - done.start) * done.job.gpus
            last_finish = max(last_finish, done.finish)
        while index < len(pending) and pending[index].arrival <= now + EPS:
            waiting.append(pending[index])
            index += 1
        if not waiting:
            continue
        view = ClusterView(now, dict(capacity), dict(free), list(running.values()))
        starts = policy.schedule(view, waiting)
        started = set()
        for job, chip in starts:
            rate = policy.rate(job, chip)
            if free.get(chip, 0) < job.gpus or rate <= 0 or job.job_id in started:
                raise RuntimeError(f"{policy.name} made an impossible start: job {job.job_id} on {chip}")
            free[chip] -= job.gpus
            run = Running(job, chip, now, now + job.total_steps / rate)
            running[job.job_id] = run
            heapq.heappush(heap, (run.finish, job.job_id, run))
            chip_jobs[chip] += 1
            started.add(job.job_id)
        if started:
            waiting = [j for j in waiting if j.job_id not in started]
        if not heap and waiting and index >= len(pending):
            raise RuntimeError(f"{policy.name} left {len(waiting)} jobs waiting on an idle cluster")
    first_arrival = pending[0].arrival if pending else 0.0
    makespan = max(last_finish - first_arrival, 0.0)
    total_gpus = sum(capacity.values())
    utilization = busy / (total_gpus * makespan) if makespan > 0 and total_gpus else 0.0
    return SimResult(
        policy=policy.name,
        jobs=len(jct),
        avg_jct_h=sum(jct) / len(jct) / 3600.0 if jct else math.nan,
        p99_jct_h=percentile(jct, 99) / 3600.0,
        makespan_h=makespan / 3600.0,
        utilization=utilization,
        chip_jobs=chip_jobs,
        seconds=time.perf_counter() - started_at,
        unschedulable=unschedulable,
    )


# -- command -------------------------------------------------------------------------------------------------

def parse_cluster(text: str) -> dict[str, int]:
    parts = text.split(":")
    if len(parts) != len(CHIPS) or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"--cluster wants V:P:K GPU counts for {':'.join(CHIPS)}, got {text!r}")
    return {chip: int(p) for chip, p in zip(CHIPS, parts, strict=True)}


def run_benchmark(traces: Sequence[Trace], matrix: EfficiencyMatrix, capacity: dict[str, int],
                  policies: Sequence[str], seed: int) -> list[dict]:
    rate = matrix_rate(matrix)
    results = []
    for trace in traces:
        known = [j for j in trace.jobs if any(rate(j, c) > 0 for c in CHIPS)]
        unknown = [j.line for j in trace.jobs if j not in known]
        rows = {}
        for name in policies:
            rows[name] = simulate(known, capacity, make_policy(name, rate, CHIPS, seed))
        ratios = {}
        if "fleetyard" in rows:
            for name, row in rows.items():
                if name != "fleetyard" and row.avg_jct_h > 0:
                    ratios[name] = rows["fleetyard"].avg_jct_h / row.avg_jct_h
        best = [min(j.total_steps / rate(j, c) for c in CHIPS if rate(j, c) > 0) for j in known]
        results.append({
            "trace": trace.name,
            # Every job alone on its fastest chip, no waiting: no non-preemptive policy can average less.
            "no_wait_bound_avg_jct_h": sum(best) / len(best) / 3600.0 if best else math.nan,
            "jobs_in_trace": len(trace.jobs) + len(trace.dropped) + len(trace.errors),
            "jobs_simulated": len(known),
            "dropped_scale_0_lines": trace.dropped,
            "bad_lines": [str(e) for e in trace.errors],
            "no_throughput_lines": unknown,
            "policies": {name: row.as_dict() for name, row in rows.items()},
            "fleetyard_avg_jct_ratio": ratios,
        })
    return results


def target_check(results: list[dict]) -> tuple[bool | None, list[str]]:
    """The issue's target: fleetyard's average JCT below fifo's and agnostic's on every trace."""
    lines, verdicts = [], []
    for result in results:
        policies = result["policies"]
        if "fleetyard" not in policies:
            continue
        if not result["jobs_simulated"]:  # (nothing ran: no JCT to compare; it read "MISSED (nanx)"; QA)
            lines.append(f"  {result['trace']}: no job was simulated: left out of the target")
            continue
        for baseline in BASELINES:
            if baseline not in policies:
                continue
            ours, theirs = policies["fleetyard"]["avg_jct_h"], policies[baseline]["avg_jct_h"]
            ok = ours < theirs
            verdicts.append(ok)
            lines.append(f"  {result['trace']}: fleetyard {ours:.2f} h vs {baseline} {theirs:.2f} h -> "
                         f"{'met' if ok else 'MISSED'} ({ours / theirs:.2f}x)")
    return (all(verdicts) if verdicts else None), lines


def format_report(results: list[dict], capacity: dict[str, int], seed: int) -> str:
    out = [f"Non-preemptive gang simulation, cluster v100:p100:k80 = "
           f"{':'.join(str(capacity[c]) for c in CHIPS)}, seed {seed} (our simulator)"]
    header = f"{'trace':<8} {'policy':<18} {'jobs':>5} {'avg JCT h':>10} {'p99 JCT h':>10} {'makespan h':>11} " \
             f"{'util %':>7} {'fleetyard/this':>15}"
    out += [header, "-" * len(header)]
    for result in results:
        ratios = result["fleetyard_avg_jct_ratio"]
        for name, row in result["policies"].items():
            ratio = f"{ratios[name]:.3f}" if name in ratios else ""
            out.append(f"{result['trace']:<8} {name:<18} {row['jobs']:>5} {row['avg_jct_h']:>10.2f} "
                       f"{row['p99_jct_h']:>10.2f} {row['makespan_h']:>11.2f} {100 * row['utilization']:>7.1f} "
                       f"{ratio:>15}")
        out.append(f"{'':<8} {'(no-wait bound)':<18} {result['jobs_simulated']:>5} "
                   f"{result['no_wait_bound_avg_jct_h']:>10.2f}   each job alone on its fastest chip, no queueing")
        notes = []
        if result["dropped_scale_0_lines"]:
            notes.append(f"{len(result['dropped_scale_0_lines'])} jobs with scale factor 0 dropped")
        if result["bad_lines"]:
            notes.append(f"{len(result['bad_lines'])} bad lines skipped ({'; '.join(result['bad_lines'][:5])})")
        if result["no_throughput_lines"]:
            notes.append(f"{len(result['no_throughput_lines'])} jobs with no throughput on any chip skipped")
        for note in notes:
            out.append(f"{'':<8} note: {note}")
    published = [r["trace"] for r in results if r["trace"] in GAVEL_PUBLISHED]
    if published:
        columns = ("fifo", "fifo_perf", "max_min_fairness", "max_min_fairness_perf", "gandiva")
        out += ["", "For reference only: GAVEL'S OWN SIMULATOR (preemptive, round-based; not our simulator), "
                    "36:36:36, seed 0, average JCT in hours (from the data README):"]
        head = f"{'trace':<8} " + " ".join(f"{c:>22}" for c in columns)
        out += [head, "-" * len(head)]
        for name in published:
            cells = [GAVEL_PUBLISHED[name][c] for c in columns]
            out.append(f"{name:<8} " + " ".join(f"{'(did not finish)' if v is None else f'{v:.2f}':>22}"
                                               for v in cells))
    verdict, lines = target_check(results)
    if verdict is not None or lines:
        out += ["", "Target (issue): fleetyard's average JCT lower than fifo's and agnostic's on every trace: "
                    + ("not judged: no trace simulated a job" if verdict is None else "MET" if verdict else "MISSED")]
        out += lines
    return "\n".join(out)


def write_results(results: list[dict], parameters: dict, out_dir: Path, report: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    verdict, lines = target_check(results)
    payload = {
        "benchmark": "gavel-2020 Philly traces, heterogeneity-aware non-preemptive scheduling",
        "date": date,
        "parameters": parameters,
        "results": results,
        "target": {"rule": "fleetyard avg JCT < fifo and < agnostic on every trace", "met": verdict,
                   "details": [line.strip() for line in lines]},
        "gavel_published_avg_jct_h": {
            "note": "Gavel's own simulator (preemptive, round-based), v100:p100:k80 = 36:36:36, seed 0; "
                    "not our simulator; from ../shared/benchmarks/README.md",
            "values": GAVEL_PUBLISHED,
        },
        "report": report,
    }
    json_path = out_dir / "gavel.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    csv_path = out_dir / "gavel.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["date", "trace", "cluster_v100_p100_k80", "seed", "policy", "jobs", "avg_jct_h",
                         "p99_jct_h", "makespan_h", "utilization", "fleetyard_avg_jct_ratio"])
        for result in results:
            for name, row in result["policies"].items():
                ratio = result["fleetyard_avg_jct_ratio"].get(name, 1.0 if name == "fleetyard" else "")
                writer.writerow([date, result["trace"], parameters["cluster"], parameters["seed"], name, row["jobs"],
                                 f"{row['avg_jct_h']:.4f}", f"{row['p99_jct_h']:.4f}", f"{row['makespan_h']:.4f}",
                                 f"{row['utilization']:.4f}", f"{ratio:.4f}" if ratio != "" else ""])
    return json_path, csv_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gavel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="all", help="comma-separated trace names in philly-vc/, or 'all'")
    parser.add_argument("--trace", action="append", default=[], metavar="PATH",
                        help="a trace file of the 7-field format (repeatable; replaces --traces)")
    parser.add_argument("--cluster", type=parse_cluster, default=parse_cluster("36:36:36"),
                        help="GPU counts v100:p100:k80 (default 36:36:36)")
    parser.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated, from {', '.join(POLICIES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=COUNT, default=None, help="simulate only the first N jobs of each trace")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where gavel.json and gavel.csv go")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for name in policies:
        if name not in POLICIES:
            parser.error(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    matrix_path = args.data_dir / "simulation_throughputs.json"
    if not matrix_path.exists():
        parser.error(f"{matrix_path} not found: the benchmark reads ../shared/benchmarks/gavel-2020 "
                     "relative to the repository root (or pass --data-dir)")
    if args.trace:
        paths = [Path(p) for p in args.trace]
    else:
        names = TRACES if args.traces == "all" else [t.strip() for t in args.traces.split(",") if t.strip()]
        paths = [args.data_dir / "philly-vc" / f"{name}.trace" for name in names]
    traces = []
    for path in paths:
        if not path.exists():
            parser.error(f"trace {path} not found")
        try:
            trace = load_trace(path)
        except (OSError, ValueError) as error:
            parser.error(f"cannot read trace: {error}")
        for error in trace.errors:
            print(f"{path}: {error}", file=sys.stderr)
        if args.limit is not None:
            trace.jobs = trace.jobs[: args.limit]
        traces.append(trace)

    try:
        matrix = load_gavel_matrix(matrix_path)
    except (OSError, ValueError, KeyError, TypeError, SyntaxError) as error:  # bad JSON, keys or entries
        parser.error(f"cannot read the throughput matrix {matrix_path}: {type(error).__name__}: {error}")
    results = run_benchmark(traces, matrix, args.cluster, policies, args.seed)
    report = format_report(results, args.cluster, args.seed)
    print(report)
    if not args.no_write:
        parameters = {
            "cluster": ":".join(str(args.cluster[c]) for c in CHIPS), "cluster_order": ":".join(CHIPS),
            "policies": policies, "seed": args.seed, "limit": args.limit,
            "traces": [str(p) for p in paths], "throughputs": str(matrix_path),
            "fleetyard": {"order": "response-ratio", "slack": SLACK, "reservations": RESERVE},
            "model": "non-preemptive gang, one chip type per job, one pool per chip type, declared total_steps",
        }
        json_path, csv_path = write_results(results, parameters, args.out, report)
        print(f"\nwrote {json_path} and {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
