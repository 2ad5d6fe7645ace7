"""The planner's search: every DP x TP x PP (x EP) layout worth trying, ranked by the cost model.

Homogeneous layouts (one pool): TP divides the node size and the attention heads (so it never leaves a
node), any PP up to the layer count, DP divides the global batch, DP x TP x PP <= the pool; then every
micro-batch size up to ``max_micro_batch`` that divides the per-replica batch, Megatron's interleaved
schedule where it applies, and EP for mixture-of-experts models. The layers go to contiguous stages as
evenly as possible (``stage_splits``): equal stages when PP divides the layers, else one layer more on some
middle stages; and, as in Megatron-LM and Llama 3, one layer fewer on the first and the last stage, whose
embedding and output layer take a layer's place (126 layers on 16 stages: 7, 8 x 14, 7).

Heterogeneous layouts (several pools, ``allow_heterogeneous``): each data-parallel replica is one pipeline
whose stages run on different pools, pool by pool, each pool with its own TP. The layers are split
unevenly: each stage gets as many layers as it can run within a common per-micro-batch time and hold in
its memory (``balance_layers``), so a faster chip gets more layers and a chip with less memory fewer. Each
pool's part of the pipeline uses all its devices or half of them; heterogeneous pipelines use EP 1, no
interleaving, and micro-batch sizes 1, 2, 4 and 8 (to keep a 1,024-device search well under a second).

Memory is a hard limit. For each candidate the search takes the cheapest way to fit: nothing, then
sequence parallelism, ZeRO-1 optimizer-state sharding (free in time in this model: reduce-scatter +
all-gather move the bytes of one all-reduce), ZeRO-2 gradient sharding (a reduce-scatter per micro-batch,
which costs time when it outlasts the micro-batch's backward pass, so the next rung that fits is tried
too), layer-norm recomputation (the two norms' outputs, rebuilt from their inputs: memory traffic only),
selective recomputation (the attention core; only without FlashAttention), full recomputation. Heterogeneous
pipelines stop at ZeRO-1.

Everything is deterministic: same request, same plan, ties broken by fewer devices, then simpler layouts.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import replace
from operator import itemgetter

from controlplane.planning.cost import (
    GB,
    GRAD_BYTES,
    MEMORY_USABLE_FRACTION,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    CostModel,
)
from controlplane.planning.model import (
    RECOMPUTE_LABELS,
    DevicePool,
    Layout,
    PlanRequest,
    PlanResult,
    Prediction,
    Stage,
)

BYTES_PER_PARAMETER = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES  # 18: the least any layout keeps in total
HETEROGENEOUS_MICRO_BATCHES = (1, 2, 4, 8)  # micro-batch sizes the heterogeneous search tries
REFINE_WINDOW = 1.1  # refine_boundaries moves layers of the mixed shapes within this factor of the threshold
BOUNDARY_MOVES = 4  # at most this many one-layer moves across pool boundaries per mixed shape (refine_boundaries)


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in ascending order. Cached: the search asks for those of the global batch (and of each
    per-replica batch) for every split it tries, and their O(sqrt n) walks were most of an 11 s search (a batch of
    9,979,200, 1,000 layers; QA)."""
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return tuple(small + large[::-1])


def _tensor_degrees(request: PlanRequest, pool: DevicePool) -> list[int]:
    m = request.model
    within = request.options.tensor_parallel_within or pool.devices_per_node
    return [t for t in divisors(pool.devices_per_node)
            if m.heads % t == 0 and (m.kv % t == 0 or t % m.kv == 0) and m.ffn % t == 0 and t <= pool.devices
            and within % t == 0]


def stage_splits(layers: int, pp: int) -> list[tuple[int, ...]]:
    """Contiguous splits of ``layers`` over ``pp`` stages, as even as possible: (1) ``layers // pp`` each, the
    remainder one more on stages counted back from the last but one (the first stage holds the most
    micro-batches in flight, the last the output layer); (2) Megatron-LM's and Llama 3's: ``layers + 2`` slots
    as even as possible, the first and last stage one layer fewer (their slot goes to the embedding and the
    output layer). Each split appears once."""
    if pp > layers:
        return []
    q, r = divmod(layers, pp)
    even = [q] * pp
    order = list(range(pp - 2, 0, -1)) + [pp - 1, 0] if pp > 2 else list(range(pp - 1, -1, -1))
    for i in order[:r]:
        even[i] += 1
    splits = [tuple(even)]
    if pp > 2:
        q2, r2 = divmod(layers + 2, pp)
        ends = [q2] * pp
        for i in (list(range(pp - 2, 0, -1)) + [pp - 1, 0])[:r2]:
            ends[i] += 1
        ends[0] -= 1
        ends[-1] -= 1
        ends = tuple(ends)
        if min(ends) >= 1 and ends != splits[0]:
            splits.append(ends)
    return splits


def _feature_ladder(request: PlanRequest, tp_max: int, dp: int, zero2: bool = False) -> list[tuple[str, bool, int]]:
    """(recompute, sequence_parallel, zero) from fastest to most memory-saving. Sequence parallelism and
    ZeRO-1 are on whenever allowed and meaningful: in this model they save memory and never cost time (SP
    runs layer norm and dropout on 1/t of the tokens; ZeRO-1's reduce-scatter + all-gather move the bytes of
    one all-reduce and the optimizer step touches 1/dp of the state). Only recomputation trades time. The one
    pair not in order of time: without FlashAttention, selective recomputation (the attention core) may be
    faster than norm recomputation (short sequences, no SP), so where norms fits, selective is tried too
    (``_dominated``)."""
    opts = request.options
    recomputes = ["none"]
    if opts.allow_recompute:
        if opts.allow_norm_recompute:
            recomputes.append("norms")  # two memory-bound norms again
        if opts.allow_selective_recompute and not opts.flash_attention:  # FlashAttention: nothing to save
            recomputes.append("selective")
        recomputes.append("full")
    sp = opts.allow_sequence_parallel and tp_max > 1
    zero = opts.allow_zero and dp > 1
    if zero and zero2:  # ZeRO-2 may cost time (a reduce-scatter per micro-batch): a rung of its own
        return [(recompute, sp, level) for recompute in recomputes for level in (1, 2)]
    return [(recompute, sp, zero) for recompute in recomputes]


def _feature_cost(layout: Layout) -> int:
    """How much machinery a layout needs, for breaking ties towards the simpler one."""
    return ({"none": 0, "norms": 2, "selective": 4, "full": 8}[layout.recompute] + 2 * layout.zero
            + layout.shard_gradients + layout.sequence_parallel
            + (layout.virtual_stages > 1) + (layout.ep > 1))


def _rank_key(prediction: Prediction):
    layout = prediction.layout
    return (round(prediction.step_time_s, 9), layout.devices, _feature_cost(layout), layout.pp, layout.tp,
            layout.micro_batch_size, layout.virtual_stages, layout.recompute, layout.zero, layout.shard_gradients,
            layout.sequence_parallel, tuple((s.pool, s.tp, s.layers) for s in layout.stages))


def _ranks_before(prediction: Prediction, other: Prediction) -> bool:
    """``_rank_key(prediction) < _rank_key(other)``, without building the keys (each walks the layout's stages, up
    to hundreds of them) unless the step times tie."""
    mine, theirs = round(prediction.step_time_s, 9), round(other.step_time_s, 9)
    if mine != theirs:
        return mine < theirs
    return _rank_key(prediction) < _rank_key(other)


class _Search:
    def __init__(self, request: PlanRequest):
        self.request = request
        self.cost = CostModel(request)
        self.evaluated = 0
        self.best_per_shape: dict[tuple, Prediction] = {}
        # At least 2, as in _ranked: the explanation names the runner-up even when no alternative is listed (with 1,
        # the threshold fell to the best's time and pruned the true runner-up; QA).
        self.keep = max(request.options.max_alternatives + 1, 2)
        self.threshold = math.inf  # the keep-th best shape's step time: anything slower cannot be shown
        self.closest_miss: tuple[float, Layout, float, float] | None = None  # (share, layout, bytes, limit)
        self.model_flops = request.global_batch_size * request.model.seq_len * self.cost.model_flops_per_token
        self._figures: dict[tuple, tuple[float, float, float, float]] = {}  # _run_figures

    # -- bookkeeping ---------------------------------------------------------------------------------------

    def _lower_bound(self, flops_per_s: float) -> float:
        """No layout runs faster than all its devices doing only the model's matrix multiplies."""
        return self.model_flops / flops_per_s

    def _consider(self, layout: Layout, note: str, pools_tps: tuple | None = None) -> None:
        """``pools_tps``: the layout's sorted distinct (pool, tp) pairs, when the caller knows them."""
        prediction = self.cost.evaluate(layout)
        if note:
            prediction = _with_reason(prediction, note)
        if pools_tps is None:
            pools_tps = tuple(sorted({(s.pool, s.tp) for s in layout.stages}))
        shape = (pools_tps, layout.dp, layout.pp)
        current = self.best_per_shape.get(shape)
        if current is None or _ranks_before(prediction, current):
            self.best_per_shape[shape] = prediction
            if prediction.step_time_s < self.threshold:
                self._lower_threshold()

    def _lower_threshold(self) -> None:
        """The keep-th best shape's step time, once there are that many shapes."""
        if len(self.best_per_shape) >= self.keep:
            times = heapq.nsmallest(self.keep, (p.step_time_s for p in self.best_per_shape.values()))
            self.threshold = times[self.keep - 1]

    def refine_boundaries(self) -> None:
        """_balance evens the stages' time per micro-batch, not what each exposes once per step (its gradient
        all-reduce, over its own pool's links), so one layer more or less on either side of a boundary between pools
        may be faster: each mixed shape that could rank (within 10% of the threshold) takes such moves while one is
        faster and fits, a few at most (before, 1.5 x the NVLink bandwidth of the slower pool moved a layer to it,
        whose all-reduce crosses its slow inter-node link, and the plan got slower; QA). After the search, on the
        shapes kept, so it adds a few evaluations, not two per layout balanced."""
        pools = {pool.name: pool for pool in self.request.pools}
        for shape, prediction in list(self.best_per_shape.items()):
            if not prediction.layout.heterogeneous or prediction.step_time_s > REFINE_WINDOW * self.threshold:
                continue
            for _ in range(BOUNDARY_MOVES):
                layout = prediction.layout
                slots = [(pools[stage.pool], stage.tp) for stage in layout.stages]
                better = None
                for moved in _boundary_moves(slots, [stage.layers for stage in layout.stages]):
                    self.evaluated += 1
                    trial = self.cost.evaluate(replace(layout, stages=tuple(
                        replace(stage, layers=n) for stage, n in zip(layout.stages, moved, strict=True))))
                    if trial.fits and _ranks_before(trial, better or prediction):
                        better = trial
                if better is None:
                    break
                prediction = self.best_per_shape[shape] = _with_reason(better, prediction.reason)
        self._lower_threshold()

    def _miss(self, used: float, limit: float, make_layout) -> None:
        share = used / limit
        if self.closest_miss is None or share < self.closest_miss[0]:
            self.closest_miss = (share, make_layout(), used, limit)

    # -- homogeneous ---------------------------------------------------------------------------------------

    def homogeneous(self, pool: DevicePool) -> None:
        req, m = self.request, self.request.model
        device_rate = pool.device.peak(m.precision) * 1e12 * pool.device.achievable_fraction
        limit = pool.device.memory_bytes * MEMORY_USABLE_FRACTION
        # Matrix FLOPs of one layer per sequence (forward + backward): the slowest stage of a split runs
        # its layers for every sequence of the replica, which bounds an uneven split's step time from below.
        layer_flops_seq = 3 * m.seq_len * (self.cost.attn_linear_flops_token + self.cost.mlp_flops_token
                                           + self.cost.attn_core_flops_token)
        # Depths that divide the layers first (equal stages, usually the fastest), so the pruning threshold
        # drops before the uneven splits are tried.
        even = list(divisors(m.layers))
        depths = even + [pp for pp in range(1, m.layers + 1) if m.layers % pp]
        for tp in _tensor_degrees(req, pool):
            # One Stage per layer count, shared by every split of this TP (a deep model's splits have hundreds of
            # stages but only a few distinct ones).
            stage_of: dict[int, Stage] = {}
            for pp in depths:
                if tp * pp > pool.devices:
                    continue
                for split in stage_splits(m.layers, pp):
                    self._homogeneous_split(pool, limit, device_rate, layer_flops_seq, tp, split, stage_of)

    def _homogeneous_split(self, pool, limit, device_rate, layer_flops_seq, tp, split, stage_of=None) -> None:
        req, m = self.request, self.request.model
        gbs = req.global_batch_size
        pp = len(split)
        widest = max(split)
        middle = (max(split[1:-1]), sum(split[1:-1])) if pp > 2 else (0, 0)
        kinds = stages = vs_all = None  # made when a layout of the split first passes the bounds (each walks it)
        # More replicas first: they are usually faster, so the pruning threshold drops early.
        for dp in reversed(divisors(gbs)):
            if dp * tp * pp > pool.devices:
                continue
            if self._lower_bound(dp * tp * pp * device_rate) > self.threshold:
                continue
            if (gbs // dp) * widest * layer_flops_seq / (tp * device_rate) > self.threshold:
                continue
            ladder = _feature_ladder(req, tp, dp, zero2=True)
            sp = ladder[0][1]
            eps = [e for e in divisors(math.gcd(m.experts, dp))] if m.is_moe else [1]
            eps = [e for e in eps if not self._state_cannot_fit(pool, limit, tp, widest, dp, e, ladder)]
            if not eps:
                continue
            for mbs in divisors(gbs // dp):
                if mbs > req.options.max_micro_batch:
                    break
                micro = gbs // (dp * mbs)
                # Any EP and interleaving depth: EP 1 adds no all-to-all, v only adds sends, and no v is over the
                # widest stage's layers (which bounds how far interleaving shrinks the bubble).
                interleaves = req.options.allow_interleave and pp > 2 and micro % pp == 0
                if self._pipeline_bound(pool, tp, split, middle, dp, mbs, micro, 1, 1, sp,
                                        bubble_v=widest if interleaves else 1) > self.threshold:
                    continue
                if kinds is None:
                    kinds = _memory_kinds(split)
                    # Interleaving: every stage's layers (or, first and last, its layer slots with the embedding or
                    # output layer) split into v chunks.
                    slots = [n + (i == 0) + (i == pp - 1) for i, n in enumerate(split)]
                    vs_all = [v for v in range(2, widest + 1)
                              if all(n % v == 0 or k % v == 0 for n, k in zip(split, slots, strict=True))]
                    if stage_of is None:
                        stage_of = {}
                    for n in split:
                        if n not in stage_of:
                            stage_of[n] = Stage(pool.name, tp, n)
                    stages = tuple(stage_of[n] for n in split)
                vs = [1] + vs_all if interleaves else [1]
                for ep in eps:
                    for v in vs:
                        if self._pipeline_bound(pool, tp, split, middle, dp, mbs, micro, ep, v, sp) > self.threshold:
                            continue
                        self._fit_homogeneous(pool, limit, ladder, tp, split, stages, kinds, dp, mbs, micro, ep, v)

    def _state_cannot_fit(self, pool, limit, tp, widest, dp, ep, ladder) -> bool:
        """Whether the weights, gradients and optimizer state of a stage of ``widest`` layers alone pass ``limit`` on
        every rung of ``ladder``, whatever the micro-batch size and interleaving (which change only activations): then
        no layout of this split, TP, DP and EP fits, and none of them can be the closest miss that an infeasible
        request's reason names, once a miss that close is known (the misses it skips need at least this much). Before,
        each micro-batch size and interleaving depth was checked stage by stage: a 1.4T-parameter MoE that fits
        nowhere on 1,024 devices checked 74,382 layouts (1.5 s; QA)."""
        layer = self.cost.layer_cost(pool, tp, 1, "none", False, ep)
        dense, experts = widest * layer.dense_params, widest * layer.expert_params
        params = dense + experts
        least = math.inf
        for zero in {rung[2] for rung in ladder}:
            sharded = dense / dp + experts / max(1, dp // ep) if zero else params
            grads = min(params, sharded + layer.dense_params + layer.expert_params) if zero == 2 else params
            least = min(least, params * WEIGHT_BYTES + grads * GRAD_BYTES + sharded * OPTIMIZER_BYTES)
        share = least * (1 - 1e-9) / limit
        if share <= 1:
            return False
        # A plan found makes the closest miss moot (plan names it only when nothing fits).
        return bool(self.best_per_shape) or (self.closest_miss is not None and share >= self.closest_miss[0])

    def _fit_homogeneous(self, pool, limit, ladder, tp, split, stages, kinds, dp, mbs, micro, ep, v) -> None:
        """Evaluate the cheapest rung of the feature ladder that fits (checking the stages that can be the
        fullest: the first of each run of equal stages holds the most micro-batches in flight of its run,
        the last stage the logits). A ZeRO-2 rung may cost time, so the next rung that fits is tried too."""
        cost = self.cost
        pp = len(split)

        def peak(rung):
            recompute, sp, zero = rung
            return max(cost.stage_memory(pool, tp, split[index], index, pp, dp, mbs, micro, recompute, sp, zero, ep, v)
                       for index in kinds)

        def layout(rung):
            recompute, sp, zero = rung
            return Layout(dp=dp, stages=stages, micro_batch_size=mbs, recompute=recompute, zero=bool(zero), ep=ep,
                          virtual_stages=v, sequence_parallel=sp, shard_gradients=zero == 2)

        self.evaluated += 1
        peaks = {ladder[-1]: peak(ladder[-1])}
        if peaks[ladder[-1]] > limit:
            # The last rung usually saves the most memory, but not always: full recomputation holds one whole
            # layer's activations while it recomputes, and ZeRO-2 one layer's unsharded gradients, which on a stage
            # of one or two layers can outweigh what they save. No rung needs less than the last one's peak less
            # those two (it stores at least full recomputation's activations, sharded gradients, sharded optimizer
            # state): past that, nothing fits; else every rung is checked before giving up.
            last = ladder[-1]
            layer = cost.layer_cost(pool, tp, mbs, last[0], last[1], ep)
            slack = ((layer.working_bytes if last[0] == "full" else 0.0)
                     + (GRAD_BYTES * (layer.dense_params + layer.expert_params) if last[2] == 2 else 0.0))
            if peaks[last] - slack > limit * (1 + 1e-9):
                self._miss(peaks[last], limit, lambda: layout(last))
                return
            for rung in ladder[:-1]:
                self.evaluated += 1
                peaks[rung] = peak(rung)
            least = min(ladder, key=lambda rung: peaks[rung])
            if peaks[least] > limit:
                self._miss(peaks[least], limit, lambda: layout(least))
                return
        widest = max(split)

        pools_tps = ((pool.name, tp),)

        def consider(rung, note):
            # The same bound with the rung's recomputation: skip the full evaluation when it cannot rank.
            if micro * widest * cost.layer_cost(pool, tp, mbs, rung[0], rung[1], ep).time_s <= self.threshold:
                self._consider(layout(rung), note, pools_tps)

        skipped, fitted = [], []
        for rung in ladder:
            if _dominated(rung, fitted):
                continue
            used = peaks.get(rung)
            if used is None:
                self.evaluated += 1
                used = peaks[rung] = peak(rung)
            if used <= limit:
                consider(rung, _ladder_note(skipped, rung, fitted))
                fitted.append(rung)
            else:
                skipped.append((*rung, used / GB))

    def _pipeline_bound(self, pool, tp, split, middle, dp, mbs, micro, ep, v, sequence_parallel,
                        bubble_v=None) -> float:
        """No rung of the ladder runs this split faster than its pipeline without recomputation: CostModel.evaluate's
        micro x t_max + (t_sum - t_max) / v, each stage's time per micro-batch its layers, its embedding or output
        layer and its point-to-point sends (recomputation only adds time; the gradient sync and optimizer step, left
        out, only add more); ``bubble_v``: that v in the bubble term instead (the sends still at ``v``).
        ``middle``: (the most layers, all layers) of the stages between the first and the last, which share one time
        per layer count, so this does not walk every stage. Before, the bound was the widest stage's layers alone,
        and a deep model of small layers (1,000 layers, hidden 512, on 1,024 H100) evaluated every pipeline depth up
        to 1,000, each slower by its sends and bubble than the plans already found: 1.2 s (QA)."""
        cost = self.cost
        per_layer = cost.layer_cost(pool, tp, mbs, "none", sequence_parallel, ep).time_s
        pp = len(split)
        if pp == 1:
            return micro * (split[0] * per_layer + cost.stage_extras(pool, tp, mbs, True, True, sequence_parallel)[0])
        ends = cost.pp_comm_s(pool, tp, dp, mbs, pp, True, False, v)
        first = split[0] * per_layer + cost.stage_extras(pool, tp, mbs, True, False, sequence_parallel)[0] + ends
        last = split[-1] * per_layer + cost.stage_extras(pool, tp, mbs, False, True, sequence_parallel)[0] + ends
        t_max, t_sum = max(first, last), first + last
        if pp > 2:
            sends = cost.pp_comm_s(pool, tp, dp, mbs, pp, False, False, v)
            t_max = max(t_max, middle[0] * per_layer + sends)
            t_sum += middle[1] * per_layer + (pp - 2) * sends
        # (1 - 1e-9: the cost model adds the same terms in another order)
        return (micro * t_max + (t_sum - t_max) / (bubble_v or v)) * (1 - 1e-9)

    # -- heterogeneous -------------------------------------------------------------------------------------

    def heterogeneous(self, pools: tuple[DevicePool, ...]) -> None:
        """Every mixed pipeline worth trying, best bound first: each pool's part of it (its TP and stage count), the DP
        degree and the micro-batch size are collected with a lower bound on their step time in any order of the pools
        (_mixed_pipeline_bound with any_order), then tried from the lowest bound up, each in every order of the
        pools, until the bound passes the threshold (which only falls). Before, they were tried pool order by pool
        order, and three pools balanced 20,000 pipelines for a 1,024-device GPT-3 (2.2 s; QA). A candidate reached
        is first checked for memory (``_could_hold``) and bounded in whole layers (cheap enough only for those)."""
        req, m = self.request, self.request.model
        gbs = req.global_batch_size
        tps = {pool.name: _tensor_degrees(req, pool) for pool in pools}
        rates = {pool.name: pool.device.peak(m.precision) * 1e12 * pool.device.achievable_fraction for pool in pools}
        candidates = []
        for dp in reversed(divisors(gbs)):
            if any(dp * min(tps[p.name] or [math.inf]) > p.devices for p in pools):
                continue
            for tp_choice in itertools.product(*(tps[p.name] for p in pools)):
                counts = []
                for pool, tp in zip(pools, tp_choice, strict=True):
                    most = min(pool.devices // (dp * tp), m.layers)
                    counts.append(sorted({c for c in (most, most // 2) if c >= 1}, reverse=True))
                if any(not c for c in counts):
                    continue
                ladder = _feature_ladder(req, max(tp_choice), dp)
                figures_of = {mbs: [self._run_figures(pool, tp, mbs, "none", ladder[0][1])
                                    for pool, tp in zip(pools, tp_choice, strict=True)]
                              for mbs in HETEROGENEOUS_MICRO_BATCHES
                              if mbs <= req.options.max_micro_batch and not gbs % (dp * mbs)}
                for stage_counts in itertools.product(*counts):
                    if sum(stage_counts) > m.layers:
                        continue
                    rate = sum(dp * tp * count * rates[pool.name]
                               for pool, tp, count in zip(pools, tp_choice, stage_counts, strict=True))
                    if self._lower_bound(rate) > self.threshold:
                        continue
                    parts = tuple(zip(pools, tp_choice, stage_counts, strict=True))
                    for mbs, figures in figures_of.items():
                        bound = _bound_of_runs(figures, stage_counts, sum(stage_counts), m.layers, gbs // (dp * mbs),
                                               any_order=True)
                        if bound <= self.threshold:
                            candidates.append((bound, dp, mbs, ladder, parts))
        candidates.sort(key=itemgetter(0))  # (stable: equal bounds keep the order they were collected in)
        orders = list(itertools.permutations(range(len(pools))))
        for bound, dp, mbs, ladder, parts in candidates:
            if bound > self.threshold:
                break  # (every later one is bounded higher still)
            micro, counts = gbs // (dp * mbs), [count for *_, count in parts]
            if not _could_hold([self._layer_bytes(pool, tp, dp, mbs, ladder) for pool, tp, _ in parts], counts,
                               m.layers, micro):
                continue
            if self._mixed_pipeline_bound(parts, sum(counts), dp, mbs, micro, "none", ladder[0][1],
                                          any_order=True) > self.threshold:
                continue
            for order in orders:  # each pool's part of the pipeline in turn
                self._fit_heterogeneous(ladder, tuple(parts[i] for i in order), dp, mbs)

    def _fit_heterogeneous(self, ladder, runs, dp, mbs) -> None:
        """Evaluate the cheapest rung of the feature ladder whose layers fit (``runs``: the slots as (pool, tp,
        stages) runs). A rung that cannot fit costs little (balance_layers stops at the memory caps). Bounds on
        the step time skip what cannot rank: before balancing, with per-layer times c_i of the rung, L layers need
        t_max >= L / sum(1/c_i) (in whole layers: _whole_layer_time), and the bubble (_pipeline_at_least); after it,
        the widest stage's layers for every micro-batch, and the whole pipeline past REFINE_WINDOW x the threshold
        (within it, one-layer moves of refine_boundaries may make a pipeline rank). A rung that fits makes the rungs
        it is never slower than unnecessary (``_dominated``) only where memory held no stage back and its split is
        the only one tried: otherwise a rung that saves memory may give a faster chip more layers."""
        micro = self.request.global_batch_size // (dp * mbs)
        layer_cost = self.cost.layer_cost
        skipped, fitted = [], []
        stage_count = sum(count for _, _, count in runs)
        # No rung is faster than the first's recomputation, none: past the bound there (this order's first and last
        # stage), nothing of these runs ranks.
        if self._mixed_pipeline_bound(runs, stage_count, dp, mbs, micro, "none", ladder[0][1]) > self.threshold:
            return
        slots = [(pool, tp) for pool, tp, count in runs for _ in range(count)]
        for rung in ladder:
            recompute, sp, zero = rung
            if _dominated(rung, fitted):
                continue
            if recompute != "none" and \
                    self._mixed_pipeline_bound(runs, stage_count, dp, mbs, micro, recompute, sp) > self.threshold:
                continue
            self.evaluated += 1
            layers, capped, shorter = _balance(self.cost, slots, dp, mbs, recompute, sp, zero)
            if layers is None:
                skipped.append((recompute, sp, zero, None))
                continue
            # Where memory held a stage back, a rung saving memory may balance the layers better; and where a split
            # with a shorter bubble exists, each rung has its own (a cap that stopped it, or per-layer times that a
            # recomputation reorders), so a rung that fits does not make the next ones unnecessary (a review found
            # both: a faster layout with the norms recomputed, 8.5%, left out of the alternatives).
            if not capped and shorter is None:
                fitted.append(rung)
            note = _ladder_note(skipped, rung, [done for done in fitted if done != rung])
            for split in (layers, shorter) if shorter else (layers,):
                self.evaluated += split is shorter
                # (run by run: a run's stages share their time per layer, so its widest is its stage of most layers)
                widest, start = 0.0, 0
                for pool, tp, count in runs:
                    per_layer = layer_cost(pool, tp, mbs, recompute, sp, 1).time_s
                    widest = max(widest, max(split[start:start + count]) * per_layer)
                    start += count
                if micro * widest > self.threshold:
                    continue
                if self._balanced_pipeline_s(runs, split, mbs, micro, recompute, sp) > \
                        REFINE_WINDOW * self.threshold:
                    continue
                stages = tuple(Stage(pool.name, tp, n) for (pool, tp), n in zip(slots, split, strict=True))
                layout = Layout(dp=dp, stages=stages, micro_batch_size=mbs, recompute=recompute, zero=zero,
                                sequence_parallel=sp)
                self._consider(layout, note)

    def _run_figures(self, pool, tp, mbs, recompute, sequence_parallel) -> tuple[float, float, float, float]:
        """(time per layer, sends per micro-batch of a middle stage, what the first and what the last stage adds to
        its sends) of a pool's stages in a mixed pipeline, per micro-batch. A pipeline over two pools crosses
        nodes, so its sends depend on neither its DP nor its depth (CostModel.pp_comm_s): one entry serves every
        candidate of the pool, TP and micro-batch size (the bound below is called tens of thousands of times)."""
        key = (pool.name, tp, mbs, recompute, sequence_parallel)
        figures = self._figures.get(key)
        if figures is None:
            cost = self.cost
            sent = cost.pp_comm_s(pool, tp, 1, mbs, 2, False, False, 1, True)
            # the first and the last stage send one way only, and hold the embedding and the output layer
            figures = self._figures[key] = (
                cost.layer_cost(pool, tp, mbs, recompute, sequence_parallel, 1).time_s, sent,
                cost.stage_extras(pool, tp, mbs, True, False, sequence_parallel)[0] - sent / 2,
                cost.stage_extras(pool, tp, mbs, False, True, sequence_parallel)[0] - sent / 2)
        return figures

    def _balanced_pipeline_s(self, runs, layers, mbs, micro, recompute, sequence_parallel) -> float:
        """CostModel.evaluate's pipeline, (micro - 1) x t_max + t_sum, of a mixed pipeline of these ``runs`` and
        ``layers`` per stage, from the runs' ``_run_figures``; the gradient sync and the optimizer step, left out, only
        add to the step. Past REFINE_WINDOW x the threshold, a balanced pipeline neither ranks nor is refined: with
        few micro-batches per replica its bubble loses, not its widest stage, and a 1,000-layer model over three pools
        evaluated 2,800 mixed layouts of which 1,800 were that slow (1.5 s; QA)."""
        t_max = t_sum = 0.0
        start = 0
        last_run = len(runs) - 1
        for index, (pool, tp, count) in enumerate(runs):
            per_layer, sent, to_first, to_last = self._run_figures(pool, tp, mbs, recompute, sequence_parallel)
            part = layers[start:start + count]
            t_sum += sum(part) * per_layer + count * sent
            ends = [0.0] * count
            if index == 0:
                ends[0] += to_first
                t_sum += to_first
            if index == last_run:
                ends[-1] += to_last
                t_sum += to_last
            t_max = max(t_max, max(n * per_layer + sent + end for n, end in zip(part, ends, strict=True)))
            start += count
        return ((micro - 1) * t_max + t_sum) * (1 - 1e-9)  # (the cost model adds the same terms in another order)

    def _layer_bytes(self, pool, tp, dp, mbs, ladder) -> tuple[float, float, float]:
        """(usable bytes per device, bytes of a layer's weights, gradients and optimizer state, the fewest bytes of
        activations a layer stores per micro-batch in flight on any rung of ``ladder``) of a pool's stages in a mixed
        pipeline: with the embedding, the output layer and full recomputation's working layer left out, no rung's
        stage holds more layers than these allow (_balance's memory cap)."""
        state = _state_bytes_per_parameter(dp, ladder[0][2])
        layers = [self.cost.layer_cost(pool, tp, mbs, recompute, sp, 1) for recompute, sp, _zero in ladder]
        return (pool.device.memory_bytes * MEMORY_USABLE_FRACTION,
                (layers[0].dense_params + layers[0].expert_params) * state,
                min(layer.stored_bytes for layer in layers))

    def _mixed_pipeline_bound(self, runs, stages, dp, mbs, micro, recompute, sequence_parallel,
                              any_order: bool = False) -> float:
        """No split of the layers over these stages runs faster than (micro - 1) x t_max + t_sum (CostModel.evaluate's
        pipeline without interleaving). Each stage i takes n_i c_i + f_i per micro-batch (its layers; f_i its sends
        between pools, and the embedding or the output layer on the first and the last). t_sum is at least every layer
        at the fastest stage's time per layer plus every f_i; t_max at least t_sum / stages, and at least the common
        time T at which the stages hold all L layers, T = (L + sum f_i / c_i) / sum 1 / c_i (memory caps only raise
        it). Before balancing: a deep model of small layers over two pools balanced pipelines of hundreds of stages,
        each slower by its sends and bubble than the plans already found (1,000 layers of hidden 512 on 512 H100 +
        512 A100: 1.1 s; QA), and three pools balanced 20,000 pipelines for a 1,024-device GPT-3 (2.2 s).
        In a given order of the runs, T is also that of whole layers (``_whole_layer_time``): 96 layers on 70 stages
        cannot share a time that 1.4 layers each would, and the continuous T let 70% of the pipelines a three-pool
        GPT-3 search balanced through to lose (3.8 s on a slow day; 1.0 s with it, same plans).
        ``any_order``: a bound for every order of the runs (whichever pool holds the embedding and the output layer)."""
        figures = [self._run_figures(pool, tp, mbs, recompute, sequence_parallel) for pool, tp, _ in runs]
        return _bound_of_runs(figures, [count for _, _, count in runs], stages, self.request.model.layers, micro,
                              any_order, self.threshold)


def _bound_of_runs(figures, counts, stages: int, layers: int, micro: int, any_order: bool,
                   threshold: float = math.inf) -> float:
    """_Search._mixed_pipeline_bound of runs of ``counts`` stages with these ``_run_figures``; its whole layers only
    where the bound without them is below ``threshold`` (the caller compares it with that; without one, never)."""
    # (one pass over the runs: this is called tens of thousands of times per search)
    speed = fixed = sends = most_sent = slowest = 0.0
    fastest = first = last = share_first = share_last = math.inf
    for count, (per_layer, sent, to_first, to_last) in zip(counts, figures, strict=True):
        speed += count / per_layer
        fixed += count * sent / per_layer
        sends += count * sent
        most_sent, slowest, fastest = max(most_sent, sent), max(slowest, per_layer), min(fastest, per_layer)
        if any_order:
            first, last = min(first, to_first), min(last, to_last)
            share_first, share_last = min(share_first, to_first / per_layer), min(share_last, to_last / per_layer)
    if not any_order:
        first, last = figures[0][2], figures[-1][3]
        share_first, share_last = first / figures[0][0], last / figures[-1][0]
    t_sum = layers * fastest + sends + first + last
    common = (layers + fixed + share_first + share_last) / speed
    t_max = max(common, t_sum / stages)
    spread = slowest * speed - stages
    # Whole layers raise t_max by less than a layer of the slowest stage past the continuous T or the largest fixed
    # time: skipped where even that stays below the threshold, or where the bound is past it already.
    most = max(t_max, most_sent + max(first, last, 0.0)) + slowest
    if _pipeline_at_least(t_max, t_sum, common, stages, spread, micro) < threshold <= \
            _pipeline_at_least(most, t_sum, common, stages, spread, micro):
        t_max = max(t_max, _whole_layer_time(_stage_groups(figures, counts, first, last, any_order), layers, t_max))
    # (the cost model adds the same terms in another order)
    return _pipeline_at_least(t_max, t_sum, common, stages, spread, micro) * (1 - 1e-9)


def _pipeline_at_least(t_max: float, t_sum: float, common: float, stages: int, spread: float, micro: int) -> float:
    """The least (micro - 1) x M + sum of stage times over splits whose widest stage takes M >= ``t_max``, where
    every split's stage times sum to at least ``t_sum``, and ``common`` is (at most) the continuous common time T.
    Stage i takes t_i = n_i c_i + f_i, and sum n_i = L = sum (T - f_i) / c_i, so sum (t_i - T) / c_i = 0: a stage past
    T must be made up by stages below it, and what the fast stages run over T the slow ones save only in part. With
    t_i <= M, sum t_i >= stages x T - (M - T) x ``spread`` (spread = c_max x sum 1 / c_i - stages). A split near T
    pays the bubble of every stage at T; one far from it gives the fast stages most layers, and runs a longer widest
    stage every micro-batch. The least of the two bounds' maximum is at M = t_max or where they cross. Before, the
    bound was (micro - 1) x t_max + ``t_sum`` alone, and with a few micro-batches per replica, where the bubble
    decides, a 1,000-layer model over three pools balanced 2,900 pipelines that lost (QA)."""
    def at(m: float) -> float:
        return (micro - 1) * m + max(t_sum, (stages + spread) * common - spread * m)

    least = at(t_max)
    if spread > 0:
        crossing = ((stages + spread) * common - t_sum) / spread
        if crossing > t_max:
            least = min(least, at(crossing))
    return least


def _stage_groups(figures, counts, first: float, last: float, any_order: bool) -> list[tuple[int, float, float]]:
    """The stages of runs as groups of equal ones, (stages, time per layer, fixed time), for _whole_layer_time: in
    their order, the first stage and the last apart; in any order, each stage's fixed time its sends less the most an
    end takes off (whichever stages hold the ends, none is faster)."""
    if any_order:
        return [(count, per_layer, sent + min(to_first, to_last, 0.0))
                for count, (per_layer, sent, to_first, to_last) in zip(counts, figures, strict=True)]
    groups = []
    for index, (count, (per_layer, sent, _first, _last)) in enumerate(zip(counts, figures, strict=True)):
        if index == 0:
            groups.append((1, per_layer, sent + first))
            count -= 1
        if index == len(figures) - 1:
            groups.append((1, per_layer, sent + last))
            count -= 1
        if count > 0:
            groups.append((count, per_layer, sent))
    return groups


def _could_hold(layer_bytes, counts, layers: int, micro: int) -> bool:
    """Whether pools' parts of a mixed pipeline of ``counts`` stages each, with these ``_Search._layer_bytes``, could
    hold ``layers`` in some order, on some rung: in any order the stages of a part hold, from its first to its last,
    at least k, k - 1, ..., 1 micro-batches in flight (1F1B; k its stages, none more than ``micro``), as they would at
    the end of the pipeline; each stage's memory cap there, summed, bounds what the part holds, and a part whose
    first stage cannot hold one layer there holds nothing."""
    if any(state + stored * min(count, micro) > usable
           for (usable, state, stored), count in zip(layer_bytes, counts, strict=True)):
        return False
    held = 0
    for (usable, state, stored), count in zip(layer_bytes, counts, strict=True):
        for in_flight in range(count, 0, -1):
            held += math.floor(usable / (state + stored * min(in_flight, micro)))
            if held >= layers:
                return True
    return False


def _whole_layer_time(groups: list[tuple[int, float, float]], layers: int, start: float) -> float:
    """The least time per micro-batch within which stages holding whole layers, at least one each, hold ``layers``:
    ``groups`` are (stages, time per layer, fixed time) of equal stages, a few of them; ``start`` a lower bound on it
    (the continuous optimum). From there each group holds what runs within ``start``; the next layer goes to the
    group that stays fastest with it until all are held (the greedy of _balance's rounding, without memory caps)."""
    eaches = [max(1, math.floor((start - fixed) / per_layer + 1e-9)) for _, per_layer, fixed in groups]
    held = sum(group[0] * each for group, each in zip(groups, eaches, strict=True))
    slowest = max(fixed + each * per_layer for (_, per_layer, fixed), each in zip(groups, eaches, strict=True))
    while held < layers:
        after, index = min((fixed + (each + 1) * per_layer, index)
                           for index, ((_, per_layer, fixed), each) in enumerate(zip(groups, eaches, strict=True)))
        eaches[index] += 1
        held += groups[index][0]
        slowest = max(slowest, after)
    return slowest


def _boundary_moves(slots: list[tuple[DevicePool, int]], layers: list[int]) -> list[list[int]]:
    """``layers`` with one layer moved across each boundary between stages of different pools, either way (a stage
    keeps at least one layer)."""
    moves = []
    for i in range(len(slots) - 1):
        if slots[i][0].name == slots[i + 1][0].name:
            continue
        for give, take in ((i, i + 1), (i + 1, i)):
            if layers[give] > 1:
                moved = list(layers)
                moved[give] -= 1
                moved[take] += 1
                moves.append(moved)
    return moves


def _memory_kinds(split: tuple[int, ...]) -> tuple[int, ...]:
    """The stages that can hold the most memory: the first of each run of equal stages (most micro-batches
    in flight within the run) and the last (the logits)."""
    kinds = [i for i in range(len(split)) if i == 0 or split[i] != split[i - 1]]
    if len(split) - 1 not in kinds:
        kinds.append(len(split) - 1)
    return tuple(kinds)


def balance_layers(cost: CostModel, slots: list[tuple[DevicePool, int]], dp: int, mbs: int, recompute: str,
                   sequence_parallel: bool, zero: bool) -> list[int] | None:
    """Layers per stage for a pipeline of ``slots`` (pool, tp), or None when the model cannot fit (see
    ``_balance``)."""
    return _balance(cost, slots, dp, mbs, recompute, sequence_parallel, zero)[0]


def _state_bytes_per_parameter(dp: int, zero: bool) -> float:
    """Bytes of weights, gradients and optimizer state per parameter of a stage whose layers _balance splits (its
    pipelines stop at ZeRO-1: with ``zero``, the optimizer state is sharded over DP)."""
    return WEIGHT_BYTES + GRAD_BYTES + (OPTIMIZER_BYTES / dp if zero else OPTIMIZER_BYTES)


def _balance(cost: CostModel, slots: list[tuple[DevicePool, int]], dp: int, mbs: int, recompute: str,
             sequence_parallel: bool, zero: bool) -> tuple[list[int] | None, bool, list[int] | None]:
    """Layers per stage for a pipeline of ``slots`` (pool, tp), or None when the model cannot fit; whether
    memory held a stage back (a stage got as many layers as fit in its memory, fewer than the model has); and the
    split whose pipeline is shorter still (``_shorten_bubble``), or None when there is none. The step also holds
    each stage's gradient sync and optimizer step, which the shorter split may lengthen: the caller weighs both.

    Each stage's time per micro-batch and memory are linear in its layer count (a per-layer part plus a
    fixed part: embedding, output layer, point-to-point sends). Find the smallest common time T such that
    the stages, each taking min(layers that run within T, layers that fit in memory), hold the whole
    model; then take surplus layers off the slowest stages."""
    req = cost.request
    total = req.model.layers
    p = len(slots)
    if p > total:
        return None, False, None
    micro = req.global_batch_size // (dp * mbs)
    state_bytes = _state_bytes_per_parameter(dp, zero)
    per_layer, fixed, caps = [], [], []
    profiles: dict[tuple, tuple] = {}
    heterogeneous = len({pool.name for pool, _tp in slots}) > 1
    for index, (pool, tp) in enumerate(slots):
        first, last = index == 0, index == p - 1
        profile = profiles.get((pool.name, tp, first, last))
        if profile is None:
            layer = cost.layer_cost(pool, tp, mbs, recompute, sequence_parallel, 1)
            extra_s, _f, extra_params, extra_act = cost.stage_extras(pool, tp, mbs, first, last, sequence_parallel)
            base_bytes = extra_params * state_bytes + extra_act
            if recompute == "full":
                base_bytes += layer.working_bytes
            profile = (layer.time_s, extra_s + cost.pp_comm_s(pool, tp, dp, mbs, p, first, last, 1, heterogeneous),
                       (layer.dense_params + layer.expert_params) * state_bytes, layer.stored_bytes,
                       pool.device.memory_bytes * MEMORY_USABLE_FRACTION - base_bytes)
            profiles[(pool.name, tp, first, last)] = profile
        c, f, static_bytes, stored_bytes, room = profile
        per_layer.append(c)
        fixed.append(f)
        cap = math.floor(room / (static_bytes + stored_bytes * min(p - index, micro)))
        if cap < 1:
            return None, False, None
        caps.append(min(cap, total))
    if sum(caps) < total:
        return None, False, None
    # The continuous optimum, stage caps included: stages whose share would exceed their cap are held at it.
    free = set(range(p))
    held = 0
    while True:
        inverse = sum(1 / per_layer[i] for i in free)
        target = (total - held + sum(fixed[i] / per_layer[i] for i in free)) / inverse
        over = [i for i in free if (target - fixed[i]) / per_layer[i] > caps[i]]
        if not over:
            break
        for i in over:
            free.discard(i)
            held += caps[i]
        if not free:
            target = max(fixed[i] + caps[i] * per_layer[i] for i in range(p))
            break
    target = max(target, max(f + c for f, c in zip(fixed, per_layer, strict=True)))
    floor = math.floor
    counts = [max(0, min(cap, floor((target - f) / c + 1e-9)))
              for f, c, cap in zip(fixed, per_layer, caps, strict=True)]
    # Rounding down left a few layers over: give each to the stage that stays fastest with it.
    deficit = total - sum(counts)
    if deficit > 0:
        heap = [(fixed[i] + (counts[i] + 1) * per_layer[i], i) for i in range(p) if counts[i] < caps[i]]
        heapq.heapify(heap)
        while deficit > 0:
            if not heap:
                return None, False, None
            _, i = heapq.heappop(heap)
            counts[i] += 1
            deficit -= 1
            if counts[i] < caps[i]:
                heapq.heappush(heap, (fixed[i] + (counts[i] + 1) * per_layer[i], i))
    # Rounding up to the common time can leave too many: take them off the slowest stages.
    surplus = -deficit if deficit < 0 else 0
    if surplus:
        heap = [(-(fixed[i] + counts[i] * per_layer[i]), i) for i in range(p) if counts[i] > 1]
        heapq.heapify(heap)
        while surplus and heap:
            _, i = heapq.heappop(heap)
            counts[i] -= 1
            surplus -= 1
            if counts[i] > 1:
                heapq.heappush(heap, (-(fixed[i] + counts[i] * per_layer[i]), i))
    if min(counts) < 1:
        return None, False, None
    shorter = list(counts)
    _shorten_bubble(shorter, per_layer, fixed, caps, micro)
    return (counts, any(count >= cap and cap < total for count, cap in zip(counts, caps, strict=True)),
            shorter if shorter != counts else None)


def _shorten_bubble(counts: list[int], per_layer: list[float], fixed: list[float], caps: list[int],
                    micro: int) -> None:
    """Move layers from stages of slower layers to stages of faster ones while the pipeline, (micro - 1) x t_max +
    sum t_i, gets shorter. Even stage times minimise t_max, not the pipeline: a layer moved from a slow chip to a fast
    one saves c_slow - c_fast of the bubble every step, and costs (micro - 1) x what it adds to the widest stage, which
    is nothing where the fast stage had that much time to spare. With few micro-batches per replica the bubble
    decides: before, 8 sequences on DP 4 of H100 + A100 + L40S ran their L40S stage at 6 layers where 1 was faster
    (the search without bounds reached 2 by refine_boundaries' one-layer moves). Each step takes the best one-layer
    move, then repeats it in doubling batches while the pipeline keeps getting shorter (a 1,000-layer model moves
    hundreds of layers)."""
    kinds = sorted(set(per_layer))
    if len(kinds) < 2:
        return
    members = [[i for i, c in enumerate(per_layer) if c == kind] for kind in kinds]
    times = [f + n * c for f, n, c in zip(fixed, counts, per_layer, strict=True)]
    current = (micro - 1) * max(times) + sum(times)
    while True:
        widest = max(times)
        best_gain, best_move = 1e-12 * current, None
        for fast in range(len(kinds) - 1):
            receivers = [i for i in members[fast] if counts[i] < caps[i]]
            if not receivers:
                continue
            receiver = min(receivers, key=times.__getitem__)
            for slow in range(fast + 1, len(kinds)):
                givers = [i for i in members[slow] if counts[i] > 1]
                if not givers:
                    continue
                giver = max(givers, key=times.__getitem__)
                rest = max((t for i, t in enumerate(times) if i != receiver and i != giver), default=0.0)
                after = max(rest, times[receiver] + kinds[fast], times[giver] - kinds[slow])
                gain = (micro - 1) * (widest - after) + kinds[slow] - kinds[fast]
                if gain > best_gain:
                    best_gain, best_move = gain, (receiver, giver)
        if best_move is None:
            return
        receiver, giver = best_move
        batch = 1
        while True:
            moved = min(batch, caps[receiver] - counts[receiver], counts[giver] - 1)
            if moved < 1:
                break
            times[receiver] += moved * per_layer[receiver]
            times[giver] -= moved * per_layer[giver]
            pipeline = (micro - 1) * max(times) + sum(times)
            if pipeline >= current * (1 - 1e-12):  # too far: undo, and look for the best move again
                times[receiver] -= moved * per_layer[receiver]
                times[giver] += moved * per_layer[giver]
                if batch == 1:  # (the move's gain was within rounding: stop, or it would be chosen again forever)
                    return
                break
            counts[receiver] += moved
            counts[giver] -= moved
            current = pipeline
            if moved < batch:
                break
            batch *= 2


# Recomputation modes whose step is never slower than another's (the same layout otherwise): none before all,
# all before full; norms and selective are not comparable (selective may be faster without FlashAttention).
_NEVER_SLOWER = {("none", "norms"), ("none", "selective"), ("none", "full"), ("norms", "full"), ("selective", "full")}


def _dominated(rung, fitted) -> bool:
    """Whether a rung that already fits is never slower than `rung`: the same or a cheaper recomputation with no
    more ZeRO (ZeRO-2's reduce-scatter per micro-batch may cost time, ZeRO-1 never does), so `rung` need not be
    tried. What is left after a fit: the rungs that may be faster (more recomputation with less ZeRO, selective
    after norms)."""
    recompute, _sp, zero = rung
    return any((done[0] == recompute or (done[0], recompute) in _NEVER_SLOWER) and int(done[2]) <= int(zero)
               for done in fitted)


def _ladder_note(skipped, chosen, fitted=()) -> str:
    """Why the chosen layout recomputes, or shards its gradients: what the last cheaper rung with less
    recomputation, and the one with the same recomputation but ZeRO-1, would have needed; and which rungs tried
    before it fit too (``fitted``: it is shown only if it is faster than they are)."""

    def need(used):
        return f"it would need {used:.0f} GB per device" if used is not None else "its layers do not fit in memory"

    notes = []
    lighter = [rung for rung in skipped if rung[0] != chosen[0]]
    if lighter:
        recompute, _sp, _zero, used = lighter[-1]
        previous = "without recomputation" if recompute == "none" else f"with {RECOMPUTE_LABELS[recompute]}"
        note = f"{RECOMPUTE_LABELS[chosen[0]]} because {previous} {need(used)}"
        if any(done[0] == recompute for done in fitted):  # it fits with ZeRO-2, and is slower so
            note += " with ZeRO-1, and with ZeRO-2 it is slower"
        notes.append(note)
    named = {chosen[0], *(rung[0] for rung in lighter[-1:])}
    for other in dict.fromkeys(done[0] for done in fitted if done[0] not in named):  # (norms, before selective)
        notes.append(f"{RECOMPUTE_LABELS[other]} fits too, and is slower")
    if chosen[2] == 2:
        zero1 = [rung for rung in skipped if rung[0] == chosen[0] and rung[2] != 2]
        if zero1:
            notes.append(f"gradients sharded (ZeRO-2) because with ZeRO-1 {need(zero1[-1][3])}")
    return "; ".join(notes)


def _with_reason(prediction: Prediction, note: str) -> Prediction:
    return replace(prediction, reason=note)


# -- explanation ---------------------------------------------------------------------------------------------


def _share(value: float, total: float) -> str:
    return f"{100 * value / total:.0f}%"


def explain(best: Prediction, others: Iterable[Prediction], request: PlanRequest, evaluated: int) -> str:
    layout = best.layout
    b = best.breakdown
    step = best.step_time_s
    parts = [f"{layout.describe()}: {best.tokens_per_s:,.0f} tokens/s, step {step:.3g} s, MFU {100 * best.mfu:.1f}%"]
    others = list(others)
    if others:
        runner = others[0]
        gain = runner.step_time_s / step - 1
        parts.append(f"the fastest of {evaluated} layouts tried, {100 * gain:.1f}% faster than the next best "
                     f"({runner.layout.describe()})")
    else:
        # The search keeps one layout per shape: other micro-batch sizes, recomputation or ZeRO levels of this shape
        # may fit too (it said "the only layout ... that fits" of one device, where every micro-batch size fitted; QA).
        parts.append(f"the only DP x TP x PP shape that fits of {evaluated} layouts tried")
    why = [f"compute {_share(b['compute'], step)} of the step"]
    if layout.tp > 1:
        why.append(f"TP{layout.tp} all-reduces stay inside a node ({_share(b['tp_comm'], step)})")
    if layout.pp > 1:
        bubble = f"{layout.pp} stages with {best.num_micro_batches} micro-batches"
        if layout.virtual_stages > 1:
            bubble += f", interleaved x{layout.virtual_stages}"
        why.append(f"pipeline bubble {_share(b['bubble'], step)} ({bubble})")
    if layout.dp > 1:
        hidden = ("fully hidden behind the backward pass" if b["dp_comm_exposed"] <= 0
                  else f"{b['dp_comm_exposed']:.3g} s of it not hidden behind the backward pass")
        why.append(f"DP{layout.dp} gradient all-reduce {b['dp_comm_total']:.3g} s, {hidden}")
    if b.get("ep_comm"):
        why.append(f"EP all-to-all {_share(b['ep_comm'], step)}")
    parts.append("; ".join(why))
    if layout.heterogeneous:
        by_pool: dict[str, int] = {}
        for stage in layout.stages:
            by_pool[stage.pool] = by_pool.get(stage.pool, 0) + stage.layers
        split = ", ".join(f"{layers} layers on {pool}" for pool, layers in by_pool.items())
        parts.append(f"uneven pipeline split to match each chip's speed and memory: {split}")
    parts.append(f"peak memory {best.memory_gb:.1f} GB of {best.memory_limit_gb:.1f} GB usable per device")
    if best.reason:
        parts.append(best.reason)
    left_out = _left_out(request)
    if left_out:
        parts.append(left_out)
    return "; ".join(parts) + "."


def _left_out(request: PlanRequest) -> str:
    """The pools the search left out because their chip has no peak for the model's precision, or "" (before, an
    infeasible fp8 plan said "the pools have 1.4 TB" of a request of 2.7 TB, silently without the A100s; QA)."""
    m = request.model
    left = [p for p in request.pools if p.device.peak(m.precision) is None]
    if not left:
        return ""
    slugs = ", ".join(sorted({p.device.slug for p in left}))
    return (f"{', '.join(p.name for p in left)} left out: no published {m.precision} peak for {slugs}")


def infeasible_reason(request: PlanRequest, search: _Search | None) -> str:
    reason = _infeasible(request, search)
    left_out = _left_out(request)
    return f"{reason} ({left_out})" if left_out and not reason.startswith("no pool can run") else reason


def _infeasible(request: PlanRequest, search: _Search | None) -> str:
    m = request.model
    capable = [p for p in request.pools if p.device.peak(m.precision) is not None]
    if not capable:
        slugs = ", ".join(sorted({p.device.slug for p in request.pools}))
        return f"no pool can run {m.precision}: no published {m.precision} peak for {slugs}"
    # Floats, as every size the cost model computes (ModelSpec's limits keep them finite).
    params = float(m.parameters())
    need = params * BYTES_PER_PARAMETER
    have = sum(p.memory_bytes * MEMORY_USABLE_FRACTION for p in capable)
    raw = sum(p.memory_bytes for p in capable)
    if need > have:
        need_text, have_text = _sizes_apart(need, have)
        return (f"needs at least {need_text} of device memory ({BYTES_PER_PARAMETER} bytes per parameter for "
                f"weights, gradients and Adam state of {params / 1e9:.1f}B parameters, before activations); "
                f"the {'pools' if len(capable) == len(request.pools) else 'pools that can run ' + m.precision} "
                f"have {_size(raw)} ({have_text} usable)")
    if search is not None and search.closest_miss is not None:
        share, layout, used, limit = search.closest_miss
        used_text, limit_text = _sizes_apart(used, limit, unit=GB)
        return (f"no layout fits in device memory: the closest, {layout.describe()}, needs {used_text} "
                f"per device where {limit_text} is usable ({100 * share:.0f}%)")
    return (f"no layout divides the work: global batch {request.global_batch_size}, {m.layers} layers, "
            f"{m.heads} heads on pools of {', '.join(str(p.devices) for p in capable)} devices")


def _size(nbytes: float, decimals: int | None = None, unit: float | None = None) -> str:
    """Bytes as TB (from 1e12 on) or GB; `unit` (1e12 or 1e9) fixes the unit."""
    nbytes = float(nbytes)
    unit = unit or (1e12 if nbytes >= 1e12 else 1e9)
    if unit >= 1e12:
        return f"{nbytes / 1e12:.{1 if decimals is None else decimals}f} TB"
    return f"{nbytes / 1e9:.{0 if decimals is None else decimals}f} GB"


def _sizes_apart(need: float, have: float, unit: float | None = None) -> tuple[str, str]:
    """`need` and `have` (need > have), when close in one unit (that of `need`, or `unit`) with as many decimals as it
    takes for them to read differently (at most 6): "needs 1.2 TB, 1.2 TB usable" read as if it fitted, and so did
    "needs 1.0 TB ... 1000 GB usable"."""
    if unit is None and need >= 1.5 * have:  # far apart: each in its own unit reads well ("3.1 TB", "618 GB")
        return _size(need), _size(have)
    unit = unit or (1e12 if need >= 1e12 else 1e9)
    decimals = None
    need_text, have_text = _size(need, decimals, unit), _size(have, decimals, unit)
    decimals = 1 if unit < 1e12 else 2
    while need_text == have_text and decimals <= 6:
        need_text, have_text = _size(need, decimals, unit), _size(have, decimals, unit)
        decimals += 1
    return need_text, have_text


def _ranked(predictions: list[Prediction], keep: int) -> list[Prediction]:
    """The first ``keep`` (at least 2: the explanation names the runner-up) of ``predictions`` in ``_rank_key``
    order. A prediction whose rounded step time is above the keep-th smallest has that many before it, so only
    the others need their (stage-walking) keys built."""
    keep = max(keep, 2)
    if len(predictions) <= keep:
        return sorted(predictions, key=_rank_key)
    cut = heapq.nsmallest(keep, (round(p.step_time_s, 9) for p in predictions))[-1]
    return sorted((p for p in predictions if round(p.step_time_s, 9) <= cut), key=_rank_key)[:keep]


def plan(request: PlanRequest) -> PlanResult:
    """Search the layouts for ``request`` and return the fastest that fits, ranked alternatives (one per
    shape: pool(s), DP, TP, PP), and a plain-language reason; or, when nothing fits, why not."""
    started = time.perf_counter()
    m = request.model
    capable = tuple(p for p in request.pools if p.device.peak(m.precision) is not None)
    search = None
    if capable and m.parameters() * BYTES_PER_PARAMETER <= sum(
            p.memory_bytes * MEMORY_USABLE_FRACTION for p in capable):
        search = _Search(request)
        for pool in capable:
            search.homogeneous(pool)
        if request.options.allow_heterogeneous and len(capable) > 1:
            search.heterogeneous(capable)
            search.refine_boundaries()
    ranked = _ranked(list(search.best_per_shape.values()), request.options.max_alternatives + 1) if search else []
    elapsed = time.perf_counter() - started
    evaluated = search.evaluated if search else 0
    if not ranked:
        return PlanResult(best=None, alternatives=(), reason=infeasible_reason(request, search),
                          candidates_evaluated=evaluated, search_time_s=elapsed)
    best, others = ranked[0], ranked[1:]
    reason = explain(best, others, request, evaluated)
    best = _with_reason(best, reason)
    alternatives = tuple(others[: request.options.max_alternatives])
    return PlanResult(best=best, alternatives=alternatives, reason=reason, candidates_evaluated=evaluated,
                      search_time_s=time.perf_counter() - started)

