"""Scale of one scheduling cycle: time per cycle (p50/p99) and peak memory from 1k to 100k accelerators.

Run from the repository root::

    .venv/bin/python -m benchmarks.scale [--sizes 1000,10000,100000] [--pending 10000] [--cycles 20] [--seed 0]
                                         [--max-cycles-large 10]

Each size builds deterministic synthetic clusters (seeded): 8 devices per node, leaf groups of 32 nodes, four
pools of different accelerator types (h100 40%, a100 30%, l40s 20%, p800 10% of the nodes), eight
ClusterQueues in one cohort (nominal quotas that add up to the cluster; some with borrowing or lending
limits), a running set filling about 70% of the devices (whole-node gang workers, 1/2/4-device jobs,
fractional 0.25/0.5 inference replicas, some elastic), and `--pending` pending workloads: ~55% 1-8 devices
on one node, ~12% multi-node gangs of 2-16 workers x 8, ~20% fractional 0.25/0.5 inference replicas, ~13%
elastic 1-2 (up to 4) x 8; priorities 0-3 (running 0-2), one or two accepted types.

Per size, `--cycles` cycles of `schedule(snapshot)` are timed with time.perf_counter over up to four
different seeded snapshots (used round-robin), then one more cycle runs under tracemalloc for the peak
memory (a separate pass, as tracemalloc slows Python down). Snapshot construction is not timed. At sizes
of 50,000 accelerators or more, at most `--max-cycles-large` cycles run (so a full run stays within
minutes); the table says how many cycles each p50/p99 comes from.

Those are first cycles: 10,000 workloads meet a cluster none of them has been scheduled on. Then
`--follow-on` cycles continue from the first snapshot, each on the state the previous one left
(`follow_on`): its decisions applied (admissions and held preemptors run, victims requeued, shrinks and
growth applied), 1% of the running workloads finish, and new arrivals top the pending list back up to
`--pending`; each of those cycles is timed too (building its snapshot is not). Those are a stress case: thousands
of workloads arrive, start and are preempted in every cycle. Then `--steady` cycles go on from where the follow-on
ones ended, at a pace closer to a real cluster's: 0.1% of the running workloads finish per cycle (at 100k about
10; a cycle runs every few seconds) and as many new ones arrive, so the waiting list stays near `--pending`. The
target verdict takes the worst p99 of the three kinds. Results go to ``benchmarks/results/scale.{json,csv}``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gc
import json
import platform as host_platform
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):  # controlplane's source root; benchmarks
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, OFFSET, count_list, positive_float  # noqa: E402
from controlplane.scheduling.model import (  # noqa: E402
    ClusterQueueSpec,
    NodeSpec,
    Quota,
    Running,
    Snapshot,
    Workload,
)
from controlplane.scheduling.placement import WorkerPlacement, without_workers  # noqa: E402
from controlplane.scheduling.scheduler import schedule  # noqa: E402

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
DEVICES_PER_NODE = 8
LEAF_GROUP_NODES = 32
POOLS = (("nvidia-h100", 0.40), ("nvidia-a100", 0.30), ("nvidia-l40s", 0.20), ("kunlun-p800", 0.10))
QUEUES = 8
RUNNING_FILL = 0.70
LARGE = 50_000
FINISH_PER_CYCLE = 0.01
STEADY_FINISH = 0.001
SNAPSHOT_VARIANTS = 4
# Accepted-type sets of pending workloads (training prefers h100 then a100; inference l40s or a100).
TRAIN_TYPES = (("nvidia-h100",), ("nvidia-h100", "nvidia-a100"), ("nvidia-a100",), ("kunlun-p800",),
               ("nvidia-a100", "nvidia-h100"))
INFER_TYPES = (("nvidia-l40s",), ("nvidia-l40s", "nvidia-a100"), ("nvidia-a100", "nvidia-l40s"))


def build_nodes(accelerators: int) -> tuple[NodeSpec, ...]:
    count = max(len(POOLS), accelerators // DEVICES_PER_NODE)
    nodes = []
    assigned = 0
    for index, (accelerator_type, share) in enumerate(POOLS):
        pool_nodes = count - assigned if index == len(POOLS) - 1 else max(1, round(count * share))
        assigned += pool_nodes
        short = accelerator_type.split("-")[1]
        for i in range(pool_nodes):
            nodes.append(NodeSpec(f"{short}-n{i:05d}", f"{short}-pool", accelerator_type,
                                  f"{short}-lg{i // LEAF_GROUP_NODES:03d}", DEVICES_PER_NODE,
                                  schedulable=(i % 97) != 13))  # ~1% cordoned
    return tuple(nodes)


def build_queues(nodes: tuple[NodeSpec, ...]) -> tuple[ClusterQueueSpec, ...]:
    capacity: dict[str, float] = {}
    for node in nodes:
        capacity[node.accelerator_type] = capacity.get(node.accelerator_type, 0) + node.devices
    queues = []
    weights = [3, 2, 2, 1, 1, 1, 1, 1]
    for q in range(QUEUES):
        quotas = {}
        for accelerator_type, total in capacity.items():
            nominal = float(round(total * weights[q] / sum(weights)))
            borrowing = None if q % 3 == 0 else float(round(nominal * 0.5))
            lending = None if q % 4 != 1 else float(round(nominal * 0.5))
            quotas[accelerator_type] = Quota(nominal, borrowing, lending)
        queues.append(ClusterQueueSpec(f"team-{q}", quotas, "org"))
    return tuple(queues)


def build_running(nodes: tuple[NodeSpec, ...], rng: random.Random) -> tuple[Running, ...]:
    """Fill about RUNNING_FILL of the devices with running workloads, pool by pool, leaf group by leaf group."""
    running: list[Running] = []
    by_type: dict[str, list[NodeSpec]] = {}
    for node in nodes:
        by_type.setdefault(node.accelerator_type, []).append(node)
    serial = 0

    def add(accelerator_type, devices_per_worker, workers, queue=None, workers_max=None):
        nonlocal serial
        serial += 1
        workload = Workload(f"run-{serial:06d}", queue or f"team-{rng.randrange(QUEUES)}", (accelerator_type,),
                            devices_per_worker, len(workers) if workers_max is None else 1,
                            workers_max or len(workers), rng.choices((0, 1, 2), (6, 3, 1))[0],
                            -rng.uniform(0, 86_400), preemptible=rng.random() < 0.95)
        running.append(Running(workload, accelerator_type, tuple(workers), rng.uniform(0, 3600)))

    for accelerator_type, members in by_type.items():
        free = [[1.0] * node.devices for node in members]
        target = RUNNING_FILL * len(members) * DEVICES_PER_NODE
        busy = 0.0
        order = list(range(len(members)))
        rng.shuffle(order)
        position = 0
        while busy < target and position < len(order):
            kind = rng.random()
            if kind < 0.55:  # a gang of whole nodes (1-4 workers x 8), on consecutive shuffled nodes
                gang = []
                for _ in range(rng.choice((1, 1, 2, 2, 4))):
                    if position >= len(order):
                        break
                    i = order[position]
                    position += 1
                    free[i] = [0.0] * DEVICES_PER_NODE
                    gang.append(WorkerPlacement(members[i].name, tuple((d, 1.0) for d in range(DEVICES_PER_NODE))))
                if gang:
                    elastic = len(gang) >= 2 and rng.random() < 0.2
                    add(accelerator_type, 8.0, gang, workers_max=len(gang) if elastic else None)
                    if elastic:  # an elastic job running above its minimum of 1 worker
                        last = running[-1]
                        running[-1] = Running(Workload(last.workload.id, last.workload.cluster_queue,
                                                       last.workload.accepted_types, 8.0, 1, len(gang),
                                                       last.workload.priority, last.workload.arrival),
                                              accelerator_type, last.workers, last.work_since_checkpoint_s)
                    busy += 8 * len(gang)
            else:  # a node shared by small jobs and fractional replicas, left partly free
                i = order[position]
                position += 1
                fill = rng.randint(2, 7)
                device = 0
                while device < fill:
                    size = min(rng.choice((1, 1, 2, 4)), fill - device)
                    if rng.random() < 0.25:  # fractional replicas sharing one device
                        share = rng.choice((0.25, 0.5))
                        for _ in range(rng.randint(1, int(1 / share))):
                            add(accelerator_type, share, [WorkerPlacement(members[i].name, ((device, share),))])
                            free[i][device] -= share
                            busy += share
                        device += 1
                        continue
                    taken = tuple((d, 1.0) for d in range(device, device + size))
                    add(accelerator_type, float(size), [WorkerPlacement(members[i].name, taken)])
                    for d in range(device, device + size):
                        free[i][d] = 0.0
                    busy += size
                    device += size
    return tuple(running)


def build_pending(count: int, rng: random.Random) -> tuple[Workload, ...]:
    pending = []
    for i in range(count):
        kind = rng.random()
        priority = rng.choices((0, 1, 2, 3), (55, 25, 15, 5))[0]
        queue = f"team-{rng.choices(range(QUEUES), (3, 2, 2, 1, 1, 1, 1, 1))[0]}"
        arrival = rng.uniform(0, 3600)
        if kind < 0.55:
            devices, workers, workers_max, types = rng.choice((1, 1, 1, 2, 2, 4, 8)), 1, 1, rng.choice(TRAIN_TYPES)
        elif kind < 0.67:
            workers = rng.choice((2, 2, 4, 4, 8, 16))
            devices, workers_max, types = 8, workers, rng.choice(TRAIN_TYPES[:3])
        elif kind < 0.87:
            devices, workers, types = rng.choice((0.25, 0.5)), 1, rng.choice(INFER_TYPES)
            workers_max = rng.choice((1, 1, 2, 4))
        else:
            workers = rng.choice((1, 2))
            devices, workers_max, types = 8, rng.choice((2, 4)), rng.choice(TRAIN_TYPES[:3])
        pending.append(Workload(f"wl-{i:06d}", queue, types, float(devices), workers, max(workers, workers_max),
                                priority, arrival, preemptible=True))
    return tuple(pending)


def build_snapshot(accelerators: int, pending: int, seed: int) -> Snapshot:
    rng = random.Random(f"scale-{accelerators}-{pending}-{seed}")
    nodes = build_nodes(accelerators)
    return Snapshot(nodes, build_queues(nodes), running=build_running(nodes, rng), pending=build_pending(pending, rng))


def follow_on(snapshot: Snapshot, result, rng: random.Random, cycle: int, pending: int,
              finish: float = FINISH_PER_CYCLE, steady: bool = False) -> Snapshot:
    """The snapshot the next cycle sees: `result` applied to `snapshot` (admissions and the preemptors' held
    admissions run, victims go back to the queue, shrinks and growth applied), then `finish` of the running
    workloads end (seeded) and new arrivals (ids `c{cycle}-...`, arriving after everything before) top the
    pending list back up to `pending`; `steady`: as many arrive as workloads finished (at most `pending` wait)."""
    by_id = {w.id: w for w in snapshot.pending}
    gone = {p.workload_id for p in result.preempted}
    released = {s.workload_id: s.released for s in result.shrunk}
    added = {g.workload_id: g.added for g in result.grown}
    running, requeued = [], []
    for r in snapshot.running:
        if r.workload.id in gone:
            requeued.append(r.workload)
            continue
        workers = without_workers(r.workers, released.get(r.workload.id, ()))
        running.append(Running(r.workload, r.accelerator_type, workers + tuple(added.get(r.workload.id, ())),
                               r.work_since_checkpoint_s))
    started = [*result.admitted, *(w.held for w in result.waiting if w.held is not None)]
    running += [Running(by_id[a.workload_id], a.accelerator_type, a.workers) for a in started]
    ending = set(rng.sample(range(len(running)), int(len(running) * finish)))
    running = [r for i, r in enumerate(running) if i not in ending]
    left = {a.workload_id for a in started}
    waiting = [w for w in snapshot.pending if w.id not in left] + requeued
    arriving = min(len(ending), pending - len(waiting)) if steady else pending - len(waiting)
    arrivals = build_pending(max(0, arriving), rng)
    after = 3600.0 * (cycle + 2)
    waiting += [Workload(f"c{cycle}-{w.id}", w.cluster_queue, w.accepted_types, w.devices_per_worker, w.workers_min,
                         w.workers_max, w.priority, after + w.arrival / 3600, preemptible=w.preemptible)
                for w in arrivals]
    return Snapshot(snapshot.nodes, snapshot.cluster_queues, tuple(running), tuple(waiting))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _cycles_timed(snapshot: Snapshot, result, rng: random.Random, cycles: int, pending: int, first_index: int,
                  **how) -> tuple[Snapshot, object, list[float], list[int], list[int]]:
    """`cycles` timed cycles, each on the state the previous one left (follow_on with `how`)."""
    times, admitted, preempted = [], [], []
    for cycle in range(first_index, first_index + cycles):
        snapshot = follow_on(snapshot, result, rng, cycle, pending, **how)
        gc.collect()
        start = time.perf_counter()
        result = schedule(snapshot)
        times.append((time.perf_counter() - start) * 1000)
        admitted.append(len(result.admitted))
        preempted.append(len(result.preempted) + len(result.shrunk))
    return snapshot, result, times, admitted, preempted


def measure_follow_on(first: Snapshot, pending: int, cycles: int, seed: int, steady_cycles: int = 0) -> dict:
    """`cycles` follow-on cycles from `first` (each on the state the previous one left, the pending list topped up),
    then `steady_cycles` steady ones from where they ended: STEADY_FINISH of the running workloads finish per cycle
    and as many new workloads arrive."""
    rng = random.Random(f"follow-on-{seed}")
    snapshot, result = first, schedule(first)
    snapshot, result, times, admitted, preempted = _cycles_timed(snapshot, result, rng, cycles, pending, 0)
    row: dict = {"follow_cycles": cycles}
    if times:
        row.update({"follow_p50_ms": round(statistics.median(times), 2),
                    "follow_p99_ms": round(percentile(times, 99), 2), "follow_max_ms": round(max(times), 2),
                    "follow_admitted_per_cycle": round(statistics.fmean(admitted), 1),
                    "follow_preempted_or_shrunk_per_cycle": round(statistics.fmean(preempted), 1),
                    "follow_times_ms": [round(t, 3) for t in times]})
    if steady_cycles:
        snapshot, _, times, admitted, preempted = _cycles_timed(snapshot, result, rng, steady_cycles, pending,
                                                                cycles, finish=STEADY_FINISH, steady=True)
        row.update({"steady_cycles": steady_cycles, "steady_p50_ms": round(statistics.median(times), 2),
                    "steady_p99_ms": round(percentile(times, 99), 2), "steady_max_ms": round(max(times), 2),
                    "steady_admitted_per_cycle": round(statistics.fmean(admitted), 1),
                    "steady_preempted_or_shrunk_per_cycle": round(statistics.fmean(preempted), 1),
                    "steady_pending_at_end": len(snapshot.pending),
                    "steady_times_ms": [round(t, 3) for t in times],
                    "steady_admitted": admitted, "steady_preempted_or_shrunk": preempted})
    return row


def measure(accelerators: int, pending: int, cycles: int, seed: int, follow_cycles: int = 0,
            steady_cycles: int = 0) -> dict:
    snapshots = [build_snapshot(accelerators, pending, seed + v) for v in range(min(cycles, SNAPSHOT_VARIANTS))]
    first = snapshots[0]
    times, admitted, preempted, waiting, preemptors = [], [], [], [], []
    for cycle in range(cycles):
        snapshot = snapshots[cycle % len(snapshots)]
        gc.collect()
        start = time.perf_counter()
        result = schedule(snapshot)
        times.append((time.perf_counter() - start) * 1000)
        admitted.append(len(result.admitted))
        preempted.append(len(result.preempted) + len(result.shrunk))
        waiting.append(len(result.waiting))
        preemptors.append(sum(1 for wait in result.waiting if wait.held is not None))
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    schedule(first)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    devices = sum(node.devices for node in first.nodes)
    busy = sum(r.usage for r in first.running)
    return {
        "accelerators": devices, "nodes": len(first.nodes), "pending": len(first.pending),
        "running": len(first.running), "running_fill": round(busy / devices, 3), "cycles": cycles,
        "p50_ms": round(statistics.median(times), 2), "p99_ms": round(percentile(times, 99), 2),
        "max_ms": round(max(times), 2), "mean_ms": round(statistics.fmean(times), 2),
        "peak_mib": round((peak - base) / 2**20, 2),
        "admitted_per_cycle": round(statistics.fmean(admitted), 1),
        "preempted_or_shrunk_per_cycle": round(statistics.fmean(preempted), 1),
        "waiting_per_cycle": round(statistics.fmean(waiting), 1),
        "preemptors_per_cycle": round(statistics.fmean(preemptors), 1),
        "times_ms": [round(t, 3) for t in times],
        **measure_follow_on(first, pending, follow_cycles, seed, steady_cycles),
    }


COLUMNS = (("accelerators", "accelerators", "d"), ("nodes", "nodes", "d"), ("pending", "pending", "d"),
           ("running", "running", "d"), ("cycles", "cycles", "d"), ("p50_ms", "p50 ms", ".1f"),
           ("p99_ms", "p99 ms", ".1f"), ("peak_mib", "peak MiB", ".1f"), ("admitted_per_cycle", "admitted", ".0f"),
           ("preempted_or_shrunk_per_cycle", "preempt+shrink", ".0f"), ("preemptors_per_cycle", "preemptors", ".0f"),
           ("waiting_per_cycle", "waiting", ".0f"))
FOLLOW_COLUMNS = (("accelerators", "accelerators", "d"), ("follow_cycles", "follow-on cycles", "d"),
                  ("follow_p50_ms", "p50 ms", ".1f"), ("follow_p99_ms", "p99 ms", ".1f"),
                  ("follow_admitted_per_cycle", "admitted", ".0f"),
                  ("follow_preempted_or_shrunk_per_cycle", "preempt+shrink", ".0f"))
STEADY_COLUMNS = (("accelerators", "accelerators", "d"), ("steady_cycles", "steady cycles", "d"),
                  ("steady_p50_ms", "p50 ms", ".1f"), ("steady_p99_ms", "p99 ms", ".1f"),
                  ("steady_max_ms", "max ms", ".1f"), ("steady_admitted_per_cycle", "admitted", ".1f"),
                  ("steady_preempted_or_shrunk_per_cycle", "preempt+shrink", ".1f"),
                  ("steady_pending_at_end", "pending at end", "d"))


def table(rows: list[dict], columns=COLUMNS) -> str:
    cells = [[format(row[key], fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(title), *(len(c[i]) for c in cells)) for i, (_, title, _) in enumerate(columns)]
    lines = ["  ".join(title.rjust(w) for (_, title, _), w in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=count_list, default="1000,10000,100000",
                        help="accelerators per cluster, comma-separated")
    parser.add_argument("--pending", type=OFFSET, default=10_000)
    parser.add_argument("--cycles", type=COUNT, default=20)
    parser.add_argument("--max-cycles-large", type=COUNT, default=10,
                        help=f"at most this many timed cycles at {LARGE:,} accelerators or more")
    parser.add_argument("--follow-on", type=OFFSET, default=10,
                        help="cycles after the first, each on the state the previous one left (0: none)")
    parser.add_argument("--steady", type=OFFSET, default=30,
                        help=f"steady cycles after the follow-on ones: {STEADY_FINISH * 100:.1f}%% of the running "
                             "workloads finish per cycle and as many new ones arrive (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS_DIR / "scale"), help="output path without extension")
    parser.add_argument("--target-ms", type=positive_float, default=100.0, help="p99 target at the largest size")
    args = parser.parse_args(argv)
    sizes = args.sizes
    rows = []
    for size in sizes:
        cycles = min(args.cycles, args.max_cycles_large) if size >= LARGE else args.cycles
        started = time.perf_counter()
        row = measure(size, args.pending, cycles, args.seed, args.follow_on, args.steady)
        rows.append(row)
        print(f"  {size:,} accelerators: {cycles} first, {args.follow_on} follow-on and {args.steady} steady cycles in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
    print("first cycles (every workload new to the cluster):")
    print(table(rows))
    if args.follow_on:
        print(f"follow-on cycles (decisions applied, {FINISH_PER_CYCLE:.0%} of running finish, pending topped up "
              f"to {args.pending:,}):")
        print(table(rows, FOLLOW_COLUMNS))
    if args.steady:
        print(f"steady cycles (after the follow-on ones: {STEADY_FINISH:.1%} of running finish per cycle, as many "
              "arrive):")
        print(table(rows, STEADY_COLUMNS))
    largest = rows[-1]
    worst = max(largest["p99_ms"], largest.get("follow_p99_ms", 0.0), largest.get("steady_p99_ms", 0.0))
    verdict = "met" if worst < args.target_ms else "MISSED"
    print(f"target: p99 < {args.target_ms:g} ms at {largest['accelerators']:,} accelerators: {verdict} "
          f"(first cycles p99 {largest['p99_ms']:.1f} ms"
          + (f", follow-on p99 {largest['follow_p99_ms']:.1f} ms" if args.follow_on else "")
          + (f", steady p99 {largest['steady_p99_ms']:.1f} ms" if args.steady else "") + ")")
    payload = {
        "benchmark": "scale", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "parameters": {"sizes": sizes, "pending": args.pending, "cycles": args.cycles,
                       "max_cycles_large": args.max_cycles_large, "large_from": LARGE, "seed": args.seed,
                       "follow_on": args.follow_on, "finish_per_cycle": FINISH_PER_CYCLE,
                       "steady": args.steady, "steady_finish_per_cycle": STEADY_FINISH,
                       "devices_per_node": DEVICES_PER_NODE, "leaf_group_nodes": LEAF_GROUP_NODES,
                       "pools": dict(POOLS), "queues": QUEUES, "running_fill": RUNNING_FILL,
                       "snapshot_variants": SNAPSHOT_VARIANTS},
        "host": {"python": sys.version.split()[0], "machine": host_platform.machine(),
                 "processor": host_platform.processor()},
        "target": {"p99_ms": args.target_ms, "accelerators": largest["accelerators"], "met": verdict == "met"},
        "results": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        writer = csv.writer(fh)
        keys = [key for key in rows[0] if key not in ("times_ms", "follow_times_ms", "steady_times_ms",
                                                      "steady_admitted", "steady_preempted_or_shrunk")]
        writer.writerow(["date", "seed", *keys])
        for row in rows:
            writer.writerow([payload["date"], args.seed, *(row[key] for key in keys)])
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
