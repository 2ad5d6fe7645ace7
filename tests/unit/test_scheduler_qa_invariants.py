"""QA: the rules of issue 3 (scheduler.py's docstring) checked on the cycle's output, the decisions applied to the
snapshot here: hand-made edge cases found by QA, and random multi-cycle clusters (workloads accepting several types
with different sizes, non-preemptible caps, settled workloads, preemption policies, cohorts with limits of 0,
cordoned and zero-device nodes)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement, without_workers
from controlplane.scheduling.scheduler import schedule

# ------------------------------------------------------------------------------------- the harness

TYPES = ("h100", "a100", "cpu")
TOL = 1e-6


def random_snapshot(rng: random.Random) -> Snapshot:
    types = rng.sample(TYPES, rng.randint(1, 3))
    nodes = []
    for t_index, t in enumerate(types):
        for i in range(rng.randint(0, 4)):
            nodes.append(NodeSpec(f"n{t_index}-{i}", f"p{t_index}", t, f"lg{t_index}-{i // rng.randint(1, 3)}",
                                  rng.choice([0, 1, 2, 4, 8]), schedulable=rng.random() > 0.15))
    queues = []
    cohorts = ["c", "d", None]
    for q in range(rng.randint(1, 4)):
        quotas = {}
        for t in types:
            if rng.random() < 0.15:
                continue
            nominal = rng.choice([0, 0.5, 2, 4, 8, 16])
            borrow = rng.choice([None, 0, 0, 2, 8])
            lend = rng.choice([None, 0, 0, 2, 4])
            if lend is not None and lend > nominal:
                lend = None
            quotas[t] = Quota(nominal, borrow, lend)
        queues.append(ClusterQueueSpec(f"q{q}", quotas, rng.choice(cohorts),
                                       preemption_within_queue=rng.choice(["LowerPriority", "LowerPriority", "Never"]),
                                       reclaim_within_cohort=rng.choice(["Any", "Any", "LowerPriority", "Never"])))
    pending = [random_workload(rng, i, types, queues) for i in range(rng.randint(1, 10))]
    caps = {t: rng.choice([0, 2, 8]) for t in types if rng.random() < 0.25}
    return Snapshot(tuple(nodes), tuple(queues), pending=tuple(pending), non_preemptible_caps=caps)


def random_workload(rng, i, types, queues, prefix="w", base_arrival=0.0):
    workers = rng.randint(1, 3)
    accepted = tuple(rng.sample(types, rng.randint(1, len(types))))
    sizes = ()
    if len(accepted) > 1 and rng.random() < 0.4:
        sizes = tuple((t, rng.choice([0.25, 0.5, 1, 2, 4])) for t in accepted if rng.random() < 0.7)
    queue = rng.choice([q.name for q in queues] + (["nope"] if rng.random() < 0.05 else []))
    return Workload(f"{prefix}{i:02d}", queue, accepted, rng.choice([0.25, 0.5, 1, 2, 4, 8]), workers,
                    workers + rng.choice([0, 0, 1, 3]), rng.randint(0, 3), base_arrival + rng.randint(0, 20),
                    preemptible=rng.random() > 0.2, sizes=sizes)


def apply(snapshot: Snapshot, result, *, held=True) -> tuple[Running, ...]:
    """The running set after the cycle's decisions (held admissions as admitted when `held`)."""
    gone = {p.workload_id for p in result.preempted}
    shrunk = {s.workload_id: s for s in result.shrunk}
    grown = {g.workload_id: g for g in result.grown}
    by_id = {w.id: w for w in snapshot.pending}
    out = []
    for r in snapshot.running:
        wid = r.workload.id
        if wid in gone:
            continue
        workers = r.workers
        if wid in shrunk:
            workers = without_workers(workers, shrunk[wid].released)
            assert len(workers) == shrunk[wid].to_workers
        if wid in grown:
            workers = workers + grown[wid].added
            assert len(workers) == grown[wid].to_workers
        out.append(replace(r, workers=workers, settled=False))
    admits = list(result.admitted)
    if held:
        admits += [w.held for w in result.waiting if w.held is not None]
    for a in admits:
        w = by_id[a.workload_id].on(a.accelerator_type)
        out.append(Running(w, a.accelerator_type, a.workers))
    return tuple(out)


def usage_of(running, t=None):
    usage = defaultdict(float)
    for r in running:
        usage[(r.workload.cluster_queue, r.accelerator_type)] += len(r.workers) * r.workload.devices_per_worker
    return usage


def quota_ok(snapshot: Snapshot, running) -> list[str]:
    errors = []
    queues = {q.name: q for q in snapshot.cluster_queues}
    usage = usage_of(running)
    for (qn, t), used in usage.items():
        if qn not in queues:
            continue
        quota = queues[qn].quotas.get(t, Quota(0, 0))
        if quota.borrowing_limit is not None and used > quota.nominal + quota.borrowing_limit + TOL:
            errors.append(f"{qn}/{t} uses {used} > {quota}")
        if not queues[qn].cohort and used > quota.nominal + TOL:
            errors.append(f"{qn}/{t} (no cohort) uses {used} > {quota.nominal}")
    cohort_used, lendable = defaultdict(float), defaultdict(float)
    types = {t for _, t in usage}
    for q in queues.values():
        for t in types | set(q.quotas):
            quota = q.quotas.get(t, Quota(0))
            used = usage[(q.name, t)]
            key = (q.cohort or q.name, t)
            cohort_used[key] += used
            kept = 0.0 if quota.lending_limit is None else max(0.0, quota.nominal - used - quota.lending_limit)
            lendable[key] += quota.nominal - kept
    for key, used in cohort_used.items():
        if used > lendable[key] + TOL:
            errors.append(f"cohort {key} uses {used} > lendable {lendable[key]}")
    fixed = defaultdict(float)
    fixed_t = defaultdict(float)
    for r in running:
        if not r.workload.preemptible:
            fixed[(r.workload.cluster_queue, r.accelerator_type)] += len(r.workers) * r.workload.devices_per_worker
            fixed_t[r.accelerator_type] += len(r.workers) * r.workload.devices_per_worker
    for (qn, t), used in fixed.items():
        if qn in queues and used > queues[qn].quotas.get(t, Quota(0)).nominal + TOL:
            errors.append(f"non-preemptible {qn}/{t} uses {used} beyond nominal")
    for t, used in fixed_t.items():
        cap = snapshot.non_preemptible_caps.get(t)
        if cap is not None and used > cap + TOL:
            errors.append(f"non-preemptible {t} uses {used} > cap {cap}")
    return errors


def devices_ok(snapshot: Snapshot, running) -> list[str]:
    errors = []
    nodes = {n.name: n for n in snapshot.nodes}
    used = defaultdict(float)
    for r in running:
        for w in r.workers:
            for index, share in w.taken:
                if share < 0:
                    errors.append(f"negative share {r.workload.id}")
                used[(w.node, index)] += share
    for (node, index), total in used.items():
        if node in nodes and index < nodes[node].devices and total > 1.0 + TOL:
            errors.append(f"{node}[{index}] holds {total}")
    return errors


def check_cycle(snapshot: Snapshot, result) -> list[str]:
    errors = []
    by_id = {w.id: w for w in snapshot.pending}
    nodes = {n.name: n for n in snapshot.nodes}
    running = {r.workload.id: r for r in snapshot.running}
    # new placements only on schedulable nodes of the type, real devices, free ones
    before_used = defaultdict(float)
    for r in snapshot.running:
        for w in r.workers:
            for index, share in w.taken:
                before_used[(w.node, index)] += share
    new_placements = []
    for a in list(result.admitted) + [w.held for w in result.waiting if w.held is not None]:
        w = by_id[a.workload_id]
        if a.accelerator_type not in w.accepted_types:
            errors.append(f"{w.id} admitted on unaccepted {a.accelerator_type}")
        sized = w.on(a.accelerator_type)
        if not sized.workers_min <= len(a.workers) <= sized.workers_max:
            errors.append(f"{w.id} admitted with {len(a.workers)} workers")
        for worker in a.workers:
            total = sum(s for _, s in worker.taken)
            if abs(total - sized.devices_per_worker) > TOL and sized.devices_per_worker < 1:
                errors.append(f"{w.id} worker takes {total}, size {sized.devices_per_worker}")
            if sized.devices_per_worker >= 1 and len(worker.taken) != round(sized.devices_per_worker):
                errors.append(f"{w.id} worker takes {worker.taken}, size {sized.devices_per_worker}")
            new_placements.append((a.accelerator_type, worker))
    for g in result.grown:
        for worker in g.added:
            new_placements.append((running[g.workload_id].accelerator_type, worker))
    for t, worker in new_placements:
        node = nodes.get(worker.node)
        if node is None or not node.schedulable or node.accelerator_type != t:
            errors.append(f"placement on {worker.node} (type {t}) not allowed: {node}")
            continue
        for index, _ in worker.taken:
            if index >= node.devices or index < 0:
                errors.append(f"placement on missing device {worker.node}[{index}]")
    after = apply(snapshot, result)
    errors += devices_ok(snapshot, after)
    # victims
    victims = [p.workload_id for p in result.preempted] + [s.workload_id for s in result.shrunk]
    if len(victims) != len(set(victims)):
        errors.append(f"victim twice: {victims}")
    if set(victims) & set(g.workload_id for g in result.grown):
        errors.append("victim grown")
    held = {w.workload_id: w.held for w in result.waiting if w.held is not None}
    queues = {q.name: q for q in snapshot.cluster_queues}
    usage_before = usage_of(snapshot.running)
    released_from = defaultdict(list)  # (queue, type) -> amounts released by each victim of another queue
    for d in list(result.preempted) + list(result.shrunk):
        if d.workload_id not in running:
            errors.append(f"victim {d.workload_id} not running")
            continue
        v = running[d.workload_id]
        if not v.workload.preemptible or v.settled:
            errors.append(f"victim {d.workload_id} not preemptible/settled")
        if d.for_workload not in held:
            errors.append(f"preemptor {d.for_workload} holds no admission")
            continue
        p = by_id[d.for_workload]
        a = held[d.for_workload]
        if a.accelerator_type != v.accelerator_type:
            errors.append(f"victim {v.workload.id} on {v.accelerator_type} for {p.id} held on {a.accelerator_type}")
        amount = (len(d.released) if hasattr(d, "released") else len(v.workers)) * v.workload.devices_per_worker
        if v.workload.cluster_queue == p.cluster_queue:
            if v.workload.priority >= p.priority:
                errors.append(f"own-queue victim {v.workload.id} prio {v.workload.priority} >= {p.priority}")
            if queues[p.cluster_queue].preemption_within_queue == "Never":
                errors.append(f"own-queue victim {v.workload.id} under Never")
        else:
            vq = v.workload.cluster_queue
            if vq in queues:
                released_from[(vq, v.accelerator_type)].append(amount)
                nominal = queues[vq].quotas.get(v.accelerator_type, Quota(0)).nominal
                if usage_before[(vq, v.accelerator_type)] <= nominal + 1e-9:
                    errors.append(f"victim {v.workload.id} of {vq} within nominal taken by {p.id}")
            policy = queues[p.cluster_queue].reclaim_within_cohort
            if policy == "Never":
                errors.append(f"cross-queue victim {v.workload.id} under Never")
            if v.workload.priority >= p.priority and policy != "Any":
                errors.append(f"cross-queue victim {v.workload.id} of >= priority under {policy}")
    for (vq, t), amounts in released_from.items():
        nominal = queues[vq].quotas.get(t, Quota(0)).nominal
        if usage_before[(vq, t)] - sum(amounts) + max(amounts) <= nominal + 1e-9:
            errors.append(f"{vq} taken below nominal on {t}: used {usage_before[(vq, t)]}, released {amounts}")
    return errors


def check_first_cycle_quota(snapshot, result):
    return quota_ok(snapshot, apply(snapshot, result))


def next_snapshot(rng: random.Random, snapshot: Snapshot, result, cycle: int) -> Snapshot:
    running = apply(snapshot, result)
    running = tuple(replace(r, work_since_checkpoint_s=float(rng.randint(0, 5)),
                            settled=rng.random() < 0.1) for r in running)
    types = sorted({n.accelerator_type for n in snapshot.nodes}
                   | {t for w in snapshot.pending for t in w.accepted_types})
    if not types:
        types = ["h100"]
    waiting = {w.workload_id for w in result.waiting if w.held is None}
    left = tuple(w for w in snapshot.pending if w.id in waiting)
    newcomers = tuple(random_workload(rng, i, types, snapshot.cluster_queues, prefix=f"c{cycle}-",
                                      base_arrival=100.0 * cycle)
                      for i in range(rng.randint(0, 6)))
    newcomers = tuple(replace(w, priority=w.priority + rng.randint(0, 3)) for w in newcomers)
    return Snapshot(snapshot.nodes, snapshot.cluster_queues, running=running, pending=left + newcomers,
                    non_preemptible_caps=snapshot.non_preemptible_caps)


def simulate(seed: int, cycles: int = 3):
    rng = random.Random(seed)
    snap = random_snapshot(rng)
    for cycle in range(cycles):
        quota_before = quota_ok(snap, snap.running)
        result = schedule(snap)
        errors = check_cycle(snap, result)
        if not quota_before:
            errors += quota_ok(snap, apply(snap, result))
        if errors:
            return snap, result, errors
        snap = next_snapshot(rng, snap, result, cycle + 1)
    return None


def shrinking_sufficed(snapshot: Snapshot, result) -> list[str]:
    """A victim stopped whole whose minimum number of workers (some of them) could have stayed beside the preemptor's
    held admission, within quota: it should have been shrunk (issue 3)."""
    from itertools import combinations

    errors = []
    running = {r.workload.id: r for r in snapshot.running}
    if quota_ok(snapshot, snapshot.running) or any(w.reserved and w.held is None for w in result.waiting):
        return errors  # (a reservation sets devices aside that the decisions applied here do not show)
    for p in result.preempted:
        v = running[p.workload_id]
        if len(v.workers) <= v.workload.workers_min:
            continue
        size = max(1, v.workload.workers_min)
        subsets = list(combinations(range(len(v.workers)), size))[:200]
        for subset in subsets:
            kept = tuple(v.workers[i] for i in subset)
            after = apply(snapshot, result) + (replace(v, workers=kept),)
            if not devices_ok(snapshot, after) and not quota_ok(snapshot, after):
                errors.append(f"victim {v.workload.id} stopped for {p.for_workload}, but keeping workers {subset} "
                              "of it would have been enough")
                break
    return errors


def random_mixed(rng: random.Random):
    """A snapshot whose training runs where a first cycle put it, and deployments whose running replicas sit on
    devices that were free."""
    from controlplane.scheduling.mixed_load import ServingDemand

    snap = random_snapshot(rng)
    first = schedule(snap)
    running = tuple(replace(r, work_since_checkpoint_s=float(rng.randint(0, 5))) for r in apply(snap, first))
    free = {n.name: [1.0] * n.devices for n in snap.nodes}
    for r in running:
        for w in r.workers:
            for index, share in w.taken:
                free[w.node][index] -= share
    demands = []
    types = sorted({n.accelerator_type for n in snap.nodes}) or ["h100"]
    queues = [q.name for q in snap.cluster_queues]
    for d in range(rng.randint(1, 3)):
        kind = rng.choice(types)
        per = rng.choice([0.25, 0.5, 1.0, 2.0])
        on = []
        for _ in range(rng.randint(0, 3)):
            nodes = [n for n in snap.nodes if n.accelerator_type == kind]
            if not nodes:
                break
            node = rng.choice(nodes).name
            shares = free[node]
            if per < 1:
                fitting = [i for i, s in enumerate(shares) if s >= per - 1e-9]
                if fitting:
                    shares[fitting[0]] -= per
                    on.append(node)
            else:
                whole = [i for i, s in enumerate(shares) if s >= 1 - 1e-9][:int(per)]
                if len(whole) == int(per):
                    for i in whole:
                        shares[i] = 0.0
                    on.append(node)
        maximum = max(len(on), rng.randint(1, 4))
        pools = sorted({n.pool for n in snap.nodes if n.accelerator_type == kind})
        demands.append(ServingDemand(
            f"d{d}", kind, per, maximum, rng.randint(0, maximum), tuple(on),
            pool=rng.choice([None, None, *pools]), cluster_queue=rng.choice([None, *queues]),
            all_or_none=not on and rng.random() < 0.3, replicas_min=rng.randint(0, len(on))))
    # (the workloads the first cycle admitted run now: not pending too; before, some were both, which the core now
    # refuses as a duplicate id; the same draws of rng, so the same cases otherwise)
    started = {r.workload.id for r in running}
    pending = tuple(w for w in rng.sample(snap.pending, len(snap.pending) // 2) if w.id not in started)
    return replace(snap, running=running, pending=pending), demands


def check_mixed(snapshot: Snapshot, demands) -> list[str]:
    from controlplane.scheduling.mixed_load import is_serving, plan_mixed_load

    errors = []
    plan = plan_mixed_load(snapshot, demands)
    errors += [f"plan: {e}" for e in devices_ok(plan.snapshot, plan.snapshot.running)]
    before = {r.workload.id: r for r in snapshot.running}
    victims = [d.workload_id for d in [*plan.preempted, *plan.shrunk]]
    if len(victims) != len(set(victims)):
        errors.append(f"plan victim twice: {victims}")
    for d in [*plan.preempted, *plan.shrunk]:
        r = before.get(d.workload_id)
        if r is None or not r.workload.preemptible or r.settled:
            errors.append(f"plan victim {d.workload_id} not a preemptible running workload")
    after_ids = {r.workload.id for r in plan.snapshot.running}
    for p in plan.preempted:
        if p.workload_id in after_ids:
            errors.append(f"plan victim {p.workload_id} still runs in the plan's snapshot")
    for s in plan.shrunk:
        narrowed = next((r for r in plan.snapshot.running if r.workload.id == s.workload_id), None)
        if narrowed is None or len(narrowed.workers) != s.to_workers or not narrowed.settled:
            errors.append(f"plan shrink {s} not applied")
        elif s.to_workers < narrowed.workload.workers_min and s.to_workers < before[s.workload_id].workload.workers_min:
            errors.append(f"plan shrink {s} below the minimum")
    by_demand = {d.id: d for d in demands}
    for r in plan.snapshot.running:
        if is_serving(r.workload):
            d = by_demand[r.workload.id.split(":", 1)[1]]
            runs = max(len(d.replica_nodes), d.replicas_running or 0)
            if len(r.workers) > max(runs, min(d.replicas_wanted, d.allowed)):
                errors.append(f"{d.id} holds {len(r.workers)} replicas")
    result = schedule(plan.snapshot)
    errors += check_cycle(plan.snapshot, result)
    cycle_victims = {d.workload_id for d in [*result.preempted, *result.shrunk]}
    if cycle_victims & set(victims):
        errors.append(f"victims of both the plan and the cycle: {cycle_victims & set(victims)}")
    if any(v.startswith("serving:") for v in cycle_victims):
        errors.append("a deployment's replicas were preempted")
    return errors


def check_additional_workers(rng: random.Random) -> list[str]:
    from controlplane.scheduling.scheduler import place_additional_workers

    snap = random_snapshot(rng)
    snap = replace(snap, running=apply(snap, schedule(snap)), pending=())
    types = sorted({n.accelerator_type for n in snap.nodes}) or ["h100"]
    kind, workers, devices = rng.choice(types), rng.randint(0, 4), rng.choice([0.25, 0.5, 1, 2, 4])
    placed = place_additional_workers(snap, accelerator_type=kind, workers=workers, devices=devices)
    if placed is None:
        return []
    errors = []
    if len(placed) != workers:
        errors.append(f"{len(placed)} placed for {workers}")
    nodes = {n.name: n for n in snap.nodes}
    for w in placed:
        node = nodes[w.node]
        if not node.schedulable or node.accelerator_type != kind or any(i >= node.devices for i, _ in w.taken):
            errors.append(f"placed on {node}: {w}")
        if abs(sum(s for _, s in w.taken) - devices) > TOL:
            errors.append(f"worker {w} for size {devices}")
    extra = Running(Workload("extra", "x", (kind,), devices, workers, workers), kind, placed)
    return errors + devices_ok(snap, snap.running + (extra,))


# -------------------------------------------------------------------------------------- cases


def _devices(first: int, count: int) -> tuple[tuple[int, float], ...]:
    return tuple((index, 1.0) for index in range(first, first + count))


def test_an_elastic_victim_keeps_the_workers_out_of_the_preemptors_way_and_is_shrunk_not_stopped():
    # v (2..3 x 4 devices) runs one worker on n1 and two on n2. An 8-device worker of higher priority needs a whole
    # node: giving back the worker on n1 is enough (v keeps its minimum of 2 on n2). Before, v kept its first worker
    # (on n1, where the preemptor would then not go), could keep neither of the others beside it, and was stopped.
    nodes = (NodeSpec("n1", "p", "h100", "g", 8), NodeSpec("n2", "p", "h100", "g", 8))
    victim = Workload("v", "a", ("h100",), 4, 2, 3, priority=0)
    running = Running(victim, "h100", (WorkerPlacement("n1", _devices(0, 4)), WorkerPlacement("n2", _devices(0, 4)),
                                       WorkerPlacement("n2", _devices(4, 4))))
    snapshot = Snapshot(nodes, (ClusterQueueSpec("a", {"h100": Quota(16)}),), running=(running,),
                        pending=(Workload("p", "a", ("h100",), 8, 1, 1, priority=1),))
    result = schedule(snapshot)
    assert result.preempted == []
    assert [(s.workload_id, s.to_workers, s.released) for s in result.shrunk] == [
        ("v", 2, (WorkerPlacement("n1", _devices(0, 4)),))]
    held = result.waiting[0].held
    assert held is not None and [w.node for w in held.workers] == ["n1"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_the_rules_hold_over_several_cycles_of_random_clusters(seed):
    failure = simulate(seed, cycles=4)
    assert failure is None, failure[2]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_an_elastic_victim_is_stopped_only_when_no_minimum_of_its_workers_could_stay(seed):
    rng = random.Random(seed)
    snapshot = random_snapshot(rng)
    for cycle in range(4):
        result = schedule(snapshot)
        assert shrinking_sufficed(snapshot, result) == []
        snapshot = next_snapshot(rng, snapshot, result, cycle + 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_mixed_load_keeps_the_rules_before_and_through_the_cycle(seed):
    snapshot, demands = random_mixed(random.Random(seed))
    assert check_mixed(snapshot, demands) == []


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_additional_workers_go_only_on_free_devices_of_schedulable_nodes(seed):
    assert check_additional_workers(random.Random(seed)) == []


def test_a_running_workload_given_with_its_per_type_sizes_counts_at_its_size_there():
    """A Running given the pending workload (per-type `sizes`, 4 cores on cpu, 1 device elsewhere) counted at the
    default size: 4 cores in use counted as 1, so a queue of nominal 4 admitted 3 more cores (QA). It is sized on the
    type it runs on now."""
    nodes = (NodeSpec("c1", "cpu-pool", "cpu", "g", 16),)
    queue = ClusterQueueSpec("a", {"cpu": Quota(4.0)})
    job = Workload("big", "a", ("nvidia-h100", "cpu"), 1.0, sizes=(("cpu", 4.0),))
    running = Running(job, "cpu", (WorkerPlacement("c1", tuple((d, 1.0) for d in range(4))),))
    assert running.usage == 4.0 and running.workload.devices_per_worker == 4.0 and running.workload.sizes == ()
    late = Workload("late", "a", ("cpu",), 3.0, arrival=1.0)
    result = schedule(Snapshot(nodes, (queue,), running=(running,), pending=(late,)))
    assert [a.workload_id for a in result.admitted] == [] and [w.workload_id for w in result.waiting] == ["late"]
