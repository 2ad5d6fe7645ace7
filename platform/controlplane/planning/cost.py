"""The planner's cost model: FLOPs, memory and communication of one training layout, and its step time.

Everything here is closed-form, so one layout costs microseconds and the search can try thousands.

FLOPs (per micro-batch of b sequences of s tokens, hidden h, FFN width f, per layer, forward):
  2 b s (h (h + 2 kv_width) + h^2 + k m h f) matrix FLOPs (QKV, output projection, MLP with m = 2 or 3
  matrices, k = top_k experts) plus 4 b s^2 h for attention scores and attention over values. Backward is
  twice the forward; full recomputation runs the forward once more, selective recomputation only the
  attention core. The output layer costs 2 b s h V forward. For GPT (f = 4h, no GQA) with full
  recomputation this is exactly Eq. 3 of Narayanan et al. (SC'21): 96 B s l h^2 (1 + s/6h + V/16lh).

Compute time: matrix FLOPs / (dense peak x ``achievable_fraction``) plus the memory-bound work between
  the matrix multiplies (layer norm, GeLU, softmax, dropout, residual adds): ``ACTIVATION_TRAFFIC`` bytes
  of HBM traffic per byte of stored activation, at the chip's memory bandwidth, plus a fixed kernel
  launch cost per layer. That second term is why small models reach a lower fraction of peak than big
  ones (1.7B GPT: 44% vs 1T: 52% in SC'21 Table 1) without any per-model constant.

Memory per device: weights (2 bytes/param), gradients (4: fp32, as 16-bit mixed precision accumulates them;
  under ZeRO-2 divided by the data-parallel size, plus one layer's unsharded gradients waiting for their
  reduce-scatter), Adam state (fp32 master + 2 moments, 12 bytes, divided by the data-parallel size under
  ZeRO-1 and ZeRO-2): 18 bytes per parameter without ZeRO and 6 + 12/DP with ZeRO-1, as Megatron-LM's
  megatron/training/theoretical_memory_usage.py counts them (compute_weight_and_optimizer_memory). The device's
  capacity is what its driver reports (``DeviceType.memory_bytes``: an "80GB" H100 or A100 has 80 GiB), of which
  ``MEMORY_USABLE_FRACTION`` is usable. Activations after Korthikanti et al. 2022 ("Reducing activation
  recomputation in large transformer models", Table 2): per layer and micro-batch
  s b h (10 + 24/t) + 5 a s^2 b / t bytes (generalised to GQA, other FFN widths and gated MLPs; the 10 part
  divided by t under sequence parallelism; the s^2 part gone with FlashAttention, which keeps only its fp32
  softmax statistics, 4 a s b / t bytes, or with selective recompute; only the 2 s b h layer input under full
  recompute; without the two layer norms' outputs, 4 s b h of the 10, under layer-norm recompute, which reads and
  writes them again before the backward pass). Of the 10, 2 are the two dropout masks (1 byte each) and of the
  5 a s^2 b, 3 are the attention dropout's mask and output: a model without dropout (Llama, ``ModelSpec.dropout``)
  stores s b h (8 + ...) and 2 a s^2 b / t. Times the micro-batches in flight on the stage (p - i on stage i under
  1F1B; p + (p-1)/v on the first stage when interleaved: Narayanan et al. SC'21 section 2.2.2, and Megatron-LM's
  compute_activation_memory, interleaved_schedule_memory_penalty = 1 + (p-1)/(p v) times p), plus the output logits.

Communication (ring collectives at ``LINK_EFFICIENCY`` of the link bandwidth):
  TP: 2 all-reduces of 2 b s h bytes per layer forward, 2 backward (+2 under full recompute), over NVLink;
    never overlapped with compute (as in Megatron-LM). TP never spans nodes.
  PP: 2 b s h bytes per micro-batch each way between neighbouring stages (divided by t: Megatron's
    scatter/gather), v times under interleaving.
  DP: gradient all-reduce, 2(n-1)/n x bytes / bandwidth, hierarchical (inside the node first, then 1/k of
    the bytes per device across nodes); it overlaps the backward pass of the last micro-batch only.
    ZeRO-2: a reduce-scatter ((n-1)/n x bytes / bandwidth) of every micro-batch's gradients, each overlapping
    that micro-batch's backward pass, and one all-gather of the updated weights after the last.
  EP: 2 all-to-alls of the routed tokens per MoE layer forward, 2 backward.
Pipeline: 1F1B step time m t_max + (sum_i t_i - t_max) / v, i.e. a bubble of (p - 1)/(v m) for equal stages.
  The interleaved schedule (v > 1) needs each stage's layers to split into v chunks; as in Llama 3's
  schedule (Grattafiori et al. 2024), the embedding and the output layer may each take a layer's place in
  the first and last stage's chunks (126 layers on 16 stages: 7, 8 x 14, 7 with v = 2, 4 or 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.planning.model import DevicePool, Layout, ModelSpec, PlanRequest, Prediction, Stage

BYTES_PER_VALUE = 2  # bf16 / fp16 activations, weights and gradients
WEIGHT_BYTES = 2
# fp32 gradients: Megatron-LM keeps fp32 main gradients for bf16 (its memory estimator counts 4 bytes of the 18 per
# parameter, theoretical_memory_usage.py); Llama 3 used FP32 gradient accumulation (Grattafiori et al. 2024, 3.3.2).
GRAD_BYTES = 4
# Bytes per gradient value the data-parallel collectives move (16-bit; not changed with GRAD_BYTES: the
# communication model and the calibrations fitted through it assume 16-bit gradient traffic).
GRAD_COMM_BYTES = 2
OPTIMIZER_BYTES = 12  # fp32 master weights + Adam's two moments
OPTIMIZER_TRAFFIC_BYTES = 28  # HBM bytes per parameter the optimizer step reads and writes
ACTIVATION_TRAFFIC = 2.0  # HBM bytes moved per stored activation byte (written once, read once)
KERNEL_OVERHEAD_S = 120e-6  # per layer per forward pass: ~30 kernels at ~4 us of launch/tail each
LINK_EFFICIENCY = 0.8  # NCCL bus bandwidth reached as a share of the link's
COLLECTIVE_LATENCY_S = 20e-6
# Of the capacity the driver reports (DeviceType.memory_bytes), the share a training step may fill; the rest: CUDA
# context, NCCL buffers, allocator fragmentation. An assumption, not fitted: no run's peak memory is published.
MEMORY_USABLE_FRACTION = 0.9
# Bytes per value of FlashAttention's saved softmax statistics (the log-sum-exp per query and head, fp32).
FLASH_STATS_BYTES = 4

GB = 1e9


@dataclass(frozen=True)
class LayerCost:
    """One layer, one micro-batch, on one device of a stage."""

    fwd_s: float  # forward compute
    bwd_s: float  # backward compute
    recompute_s: float  # extra forward under recomputation
    tp_comm_s: float  # all TP collectives (forward, backward, recompute)
    ep_comm_s: float  # all EP all-to-alls
    gemm_flops_fwd: float  # per device
    recompute_flops: float  # per device
    stored_bytes: float  # activations kept per in-flight micro-batch
    working_bytes: float  # a full layer's activations (needed while recomputing one layer)
    dense_params: float  # per device
    expert_params: float  # per device

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s + self.tp_comm_s + self.ep_comm_s


@dataclass(frozen=True, slots=True)
class StageFigures:
    """One device of one pipeline stage, per micro-batch (times) and at its peak (bytes)."""

    time_s: float  # compute + TP + EP + PP communication
    compute_s: float
    tp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    bwd_s: float  # the backward share, behind which the gradient all-reduce can hide
    hardware_flops: float
    weights: float
    grads: float
    optimizer: float
    activations: float
    memory_limit: float
    sync_s: float  # gradient all-reduce over the stage's DP group (ZeRO-2: all reduce-scatters + all-gather)
    optimizer_s: float  # the optimizer step
    sync_exposed_s: float = 0.0  # the part of sync_s not hidden behind backward passes

    @property
    def memory(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations


def micro_batches_in_flight(p: int, index: int, virtual_stages: int, micro: int) -> float:
    """Micro-batches whose activations stage ``index`` of ``p`` holds at its peak, in whole-stage units.

    1F1B (PipeDream-Flush, Narayanan et al. SC'21 section 2.2.1): stage i runs p - i - 1 warm-up forwards, so it
    holds p - i. Interleaved (section 2.2.2; Megatron-LM's forward_backward_pipelining_with_interleaving): rank i
    runs 2 (p - i - 1) + (v - 1) p warm-up forward chunks, so it holds v p + p - 2 i - 1 chunks of 1/v of its
    layers each: p + (p - 1 - 2 i)/v stages' worth; for the first stage p + (p - 1)/v, Megatron-LM's
    compute_activation_memory (interleaved_schedule_memory_penalty 1 + (p - 1)/(p v), times p). Never more than the
    micro-batches of the step (all forwards then run first)."""
    if virtual_stages > 1:
        in_flight = p + (p - 1 - 2 * index) / virtual_stages
    else:
        in_flight = p - index
    return micro if in_flight > micro else in_flight


def zero_level(layout: Layout) -> int:
    """0: no ZeRO; 1: optimizer state sharded over DP; 2: gradients too."""
    return 2 if layout.zero and layout.shard_gradients else int(bool(layout.zero))


def ring_allreduce_s(nbytes: float, ranks: int, gbps: float) -> float:
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (gbps * GB * LINK_EFFICIENCY) + COLLECTIVE_LATENCY_S


def ring_reduce_scatter_s(nbytes: float, ranks: int, gbps: float) -> float:
    """Reduce-scatter (or all-gather) of ``nbytes`` over a ring: half an all-reduce's traffic."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / (gbps * GB * LINK_EFFICIENCY) + COLLECTIVE_LATENCY_S


def hierarchical_reduce_scatter_s(nbytes: float, ranks: int, per_node: int, intra_gbps: float,
                                  inter_gbps: float) -> float:
    """Reduce-scatter (or all-gather) over ``ranks`` devices, ``per_node`` in each node: inside the node
    first, then 1/per_node of the bytes per device across nodes."""
    if ranks <= 1:
        return 0.0
    per_node = max(1, min(per_node, ranks))
    nodes = -(-ranks // per_node)
    return (ring_reduce_scatter_s(nbytes, per_node, intra_gbps)
            + ring_reduce_scatter_s(nbytes / per_node, nodes, inter_gbps))


def hierarchical_allreduce_s(nbytes: float, ranks: int, per_node: int, intra_gbps: float, inter_gbps: float) -> float:
    """All-reduce over ``ranks`` devices, ``per_node`` of them in each node: reduce-scatter/all-gather inside
    the node, then each device all-reduces 1/per_node of the bytes across nodes on its own link."""
    if ranks <= 1:
        return 0.0
    per_node = max(1, min(per_node, ranks))
    nodes = -(-ranks // per_node)
    inside = ring_allreduce_s(nbytes, per_node, intra_gbps)
    across = ring_allreduce_s(nbytes / per_node, nodes, inter_gbps)
    return inside + across


class CostModel:
    """The cost model for one request. ``evaluate(layout)`` returns a ``Prediction``; ``problem(layout)``
    says why a layout cannot run at all (None when it can)."""

    def __init__(self, request: PlanRequest):
        self.request = request
        self.model = request.model
        self.flash = request.options.flash_attention
        self.pools = {pool.name: pool for pool in request.pools}
        self._layer_cache: dict[tuple, LayerCost] = {}
        self._extras_cache: dict[tuple, tuple[float, float, float, float]] = {}
        # The last stages tuple walked by _kinds and what it gave: the search evaluates many layouts of one split
        # (the same tuple object) in a row, and a deep model's split has hundreds of stages.
        self._kinds_last: tuple[tuple, list] | None = None
        m = self.model
        h, s = m.hidden, m.seq_len
        self.kv_width = m.kv * m.head_dim
        matrices = 3 if m.gated_mlp else 2
        # Forward matrix FLOPs per token of one layer, without the attention core.
        self.attn_linear_flops_token = 2 * (h * (h + 2 * self.kv_width) + h * h)
        self.mlp_flops_token = 2 * matrices * h * m.ffn * m.active_experts + (2 * h * m.experts if m.is_moe else 0)
        self.attn_core_flops_token = 4 * s * h
        self.logits_flops_token = 2 * h * m.vocab
        self.model_flops_per_token = model_flops_per_token(m)

    # -- validity ------------------------------------------------------------------------------------------

    def problem(self, layout: Layout) -> str | None:
        m, gbs = self.model, self.request.global_batch_size
        if sum(s.layers for s in layout.stages) != m.layers:
            return f"the stages hold {sum(s.layers for s in layout.stages)} layers, the model has {m.layers}"
        if any(s.layers < 1 for s in layout.stages):
            return "every pipeline stage needs at least one layer"
        if gbs % (layout.dp * layout.micro_batch_size):
            return (f"global batch {gbs} is not a multiple of data-parallel size x micro-batch "
                    f"({layout.dp} x {layout.micro_batch_size})")
        used = layout.devices_by_pool()
        for name, count in used.items():
            pool = self.pools.get(name)
            if pool is None:
                return f"no pool named {name!r}"
            if count > pool.devices:
                return f"needs {count} devices of pool {name}, it has {pool.devices}"
            if pool.device.peak(m.precision) is None:
                return f"{pool.device.slug} has no {m.precision} peak (cannot run {m.precision})"
        last = len(layout.stages) - 1
        for index, stage in enumerate(layout.stages):
            pool = self.pools[stage.pool]
            if stage.tp > pool.devices_per_node or pool.devices_per_node % stage.tp:
                return f"TP{stage.tp} does not fit inside one {pool.devices_per_node}-device node of {pool.name}"
            within = self.request.options.tensor_parallel_within
            if within and within % stage.tp:
                return f"TP{stage.tp} does not stay inside a worker's {within} devices"
            if m.heads % stage.tp or (m.kv % stage.tp and stage.tp % m.kv):
                return f"TP{stage.tp} does not divide {m.heads} attention heads ({m.kv} KV heads)"
            if m.ffn % stage.tp:
                return f"TP{stage.tp} does not divide the FFN width {m.ffn}"
            if layout.virtual_stages > 1 and stage.layers % layout.virtual_stages:
                # Llama 3's schedule (Grattafiori et al. 2024, section 3.3.2): the first and last stages hold one
                # layer fewer, the embedding and the output layer taking the place of a layer in their chunks.
                slots = stage.layers + (index == 0) + (index == last)
                if slots % layout.virtual_stages:
                    return (f"{stage.layers} layers per stage cannot be split into {layout.virtual_stages} "
                            f"virtual stages")
        if layout.ep > 1:
            if not m.is_moe:
                return "expert parallelism needs a mixture-of-experts model"
            if m.experts % layout.ep or layout.dp % layout.ep:
                return f"EP{layout.ep} must divide both the {m.experts} experts and DP{layout.dp}"
        if layout.virtual_stages > 1:
            micro = gbs // (layout.dp * layout.micro_batch_size)
            if layout.pp <= 2 or micro % layout.pp:
                return "the interleaved schedule needs PP > 2 and a micro-batch count that is a multiple of PP"
        if layout.sequence_parallel and layout.tp == 1:
            return "sequence parallelism needs TP > 1"
        if layout.shard_gradients and not layout.zero:
            return "gradient sharding (ZeRO-2) also shards the optimizer state: set zero"
        return None

    # -- per layer -----------------------------------------------------------------------------------------

    def layer_cost(self, pool: DevicePool, tp: int, mbs: int, recompute: str, sequence_parallel: bool,
                   ep: int = 1) -> LayerCost:
        key = (pool.name, tp, mbs, recompute, sequence_parallel, ep)
        cached = self._layer_cache.get(key)
        if cached is not None:
            return cached
        m, flash = self.model, self.flash
        device = pool.device
        h, s, b = m.hidden, m.seq_len, mbs
        tokens = b * s
        flops_per_s = device.peak(m.precision) * 1e12 * device.achievable_fraction
        bandwidth = device.memory_bandwidth_gbps * GB

        gemm_linear = tokens * (self.attn_linear_flops_token + self.mlp_flops_token) / tp
        gemm_core = tokens * self.attn_core_flops_token / tp
        gemm_fwd = gemm_linear + gemm_core

        # Korthikanti et al. activation bytes for one layer and micro-batch, on one device (Table 2).
        # Split by TP: Q, K, V (the QK^T and attention-over-values inputs, GQA-sized) and the output projection's
        # input, 2 bytes each; the MLP: a GeLU MLP keeps the GeLU input and output (2 x 2f bytes per token), a
        # gated one the gate and up projections (Megatron's fused SwiGLU saves its input [gate, up] and
        # recomputes SiLU) and their product, the down projection's input (3 x 2f).
        mlp_width = (6 if m.gated_mlp else 4) * m.ffn * m.active_experts
        split = BYTES_PER_VALUE * tokens * (h + 2 * self.kv_width + h) / tp + tokens * mlp_width / tp
        # Replicated without sequence parallelism: the two LayerNorm inputs (4 bytes per token and hidden unit),
        # the QKV and first-MLP inputs (4), and with dropout the two dropout masks after the attention and the
        # MLP (1 byte each; the dropout outputs feed residual adds, which keep nothing).
        replicated = (10 if m.dropout else 8) * tokens * h / (tp if sequence_parallel else 1)
        if flash:
            # FlashAttention never stores the s x s scores; its backward needs Q, K, V, the output (counted in
            # ``split``) and the softmax log-sum-exp, one fp32 value per query token and head.
            scores = FLASH_STATS_BYTES * m.heads * s * b / tp
        else:
            # Softmax output (2 bytes), and with dropout its mask (1) and output (2): 5 a s^2 b, else 2 a s^2 b.
            scores = (5 if m.dropout else 2) * m.heads * s * s * b / tp
        full_bytes = split + replicated + scores
        # The two layer norms' outputs (the QKV and first-MLP inputs, 2 bytes each, part of ``replicated``):
        # what layer-norm recompute drops and rebuilds from the norms' inputs, which stay stored.
        norm_outputs = 2 * BYTES_PER_VALUE * tokens * h / (tp if sequence_parallel else 1)
        if recompute == "full":
            stored = BYTES_PER_VALUE * tokens * h / (tp if sequence_parallel else 1)
        elif recompute == "selective":
            stored = split + replicated + (scores if flash else 0.0)
        elif recompute == "norms":
            stored = full_bytes - norm_outputs
        else:
            stored = full_bytes

        traffic_fwd = ACTIVATION_TRAFFIC * full_bytes / bandwidth
        fwd = gemm_fwd / flops_per_s + traffic_fwd + KERNEL_OVERHEAD_S
        bwd = 2 * fwd
        if recompute == "full":
            recompute_s, recompute_flops = fwd, gemm_fwd
        elif recompute == "selective" and not flash:
            recompute_s = gemm_core / flops_per_s + ACTIVATION_TRAFFIC * scores / bandwidth
            recompute_flops = gemm_core
        elif recompute == "norms":
            # Memory-bound: each norm reads its input and writes its output again before the backward pass.
            recompute_s, recompute_flops = ACTIVATION_TRAFFIC * norm_outputs / bandwidth, 0.0
        else:
            recompute_s, recompute_flops = 0.0, 0.0

        tp_comm = 0.0
        if tp > 1:
            collectives = 6 if recompute == "full" else 4
            tp_comm = collectives * ring_allreduce_s(BYTES_PER_VALUE * tokens * h, tp, pool.intra_node_gbps)
        ep_comm = 0.0
        if m.is_moe and ep > 1:
            passes = 6 if recompute == "full" else 4
            routed = BYTES_PER_VALUE * tokens * h * m.top_k / (tp if sequence_parallel else 1)
            gbps = pool.intra_node_gbps if ep * tp <= pool.devices_per_node else pool.inter_node_gbps
            ep_comm = passes * ((ep - 1) / ep * routed / (gbps * GB * LINK_EFFICIENCY) + COLLECTIVE_LATENCY_S)

        norms = 4 * h if m.bias else 2 * h
        if m.is_moe:
            dense_params = (m.attention_parameters() + h * m.experts) / tp + norms
            expert_params = m.experts * m.expert_parameters() / (tp * ep)
        else:
            dense_params = (m.attention_parameters() + m.mlp_parameters()) / tp + norms
            expert_params = 0.0
        cost = LayerCost(fwd, bwd, recompute_s, tp_comm, ep_comm, gemm_fwd, recompute_flops, stored, full_bytes,
                         dense_params, expert_params)
        self._layer_cache[key] = cost
        return cost

    # -- per stage -----------------------------------------------------------------------------------------

    def stage_extras(self, pool: DevicePool, tp: int, mbs: int, first: bool, last: bool,
                     sequence_parallel: bool) -> tuple[float, float, float, float]:
        """(time per micro-batch, matrix FLOPs per micro-batch, parameters, activation bytes) of the
        embedding (first stage) and output layer + loss (last stage) on one device."""
        key = (pool.name, tp, mbs, first, last, sequence_parallel)
        cached = self._extras_cache.get(key)
        if cached is not None:
            return cached
        m = self.model
        device = pool.device
        tokens = mbs * m.seq_len
        time_s = flops = params = act = 0.0
        if first:
            params += (m.vocab * m.hidden) / tp + (m.seq_len * m.hidden if m.learned_positions else 0)
            act += BYTES_PER_VALUE * tokens * m.hidden / (tp if sequence_parallel else 1)
        if last:
            if not first or not m.tied_embeddings:
                params += m.vocab * m.hidden / tp
            params += 2 * m.hidden if m.bias else m.hidden  # final norm
            flops = 3 * tokens * self.logits_flops_token / tp
            logits_bytes = 4 * tokens * m.vocab / tp  # fp32 logits for the loss
            act += logits_bytes
            time_s = (flops / (device.peak(m.precision) * 1e12 * device.achievable_fraction)
                      + 3 * ACTIVATION_TRAFFIC * logits_bytes / (device.memory_bandwidth_gbps * GB))
        result = (time_s, flops, params, act)
        self._extras_cache[key] = result
        return result

    def pp_comm_s(self, pool: DevicePool, tp: int, dp: int, mbs: int, p: int, first: bool, last: bool,
                  virtual_stages: int, heterogeneous: bool = False) -> float:
        """Point-to-point sends of one micro-batch: activations forward and gradients backward to each
        neighbouring stage, 1/tp of them per device (Megatron's scatter/gather), v times when interleaved.
        Ranks are ordered TP, then DP, then PP, so neighbouring stages share a node only when DP x TP
        is smaller than a node, and all of them only when the whole pipeline (DP x TP x PP) is: otherwise a stage
        boundary crosses nodes, as every pipeline over two pools does, and the pipeline runs at the pace of the
        stage that sends over it (before, 16 stages of DP1 x TP1 on two 8-device nodes, or a pipeline from H100 to
        A100 nodes, sent at NVLink speed whatever the inter-node bandwidth; QA)."""
        if p <= 1:
            return 0.0
        crosses = heterogeneous or dp * tp * p > pool.devices_per_node
        gbps = pool.inter_node_gbps if crosses else pool.intra_node_gbps
        boundary = BYTES_PER_VALUE * mbs * self.model.seq_len * self.model.hidden / tp
        sends = (1 if first or last else 2) * 2 * virtual_stages
        return sends * (boundary / (gbps * GB * LINK_EFFICIENCY) + COLLECTIVE_LATENCY_S)

    def stage_memory(self, pool: DevicePool, tp: int, layers: int, index: int, p: int, dp: int, mbs: int,
                     micro: int, recompute: str, sequence_parallel: bool, zero: bool, ep: int,
                     virtual_stages: int) -> float:
        """Peak bytes on one device of stage ``index``: the memory half of ``stage_figures``, cheaper.
        ``zero``: 0 (or False) none, 1 (or True) ZeRO-1, 2 ZeRO-2."""
        layer = self.layer_cost(pool, tp, mbs, recompute, sequence_parallel, ep)
        _t, _f, extra_params, extra_act = self.stage_extras(pool, tp, mbs, index == 0, index == p - 1,
                                                            sequence_parallel)
        dense = layers * layer.dense_params + extra_params
        experts = layers * layer.expert_params
        if zero:
            sharded = dense / dp + experts / max(1, dp // ep)
        else:
            sharded = dense + experts
        if zero == 2:
            grads = GRAD_BYTES * (sharded + layer.dense_params + layer.expert_params)
        else:
            grads = GRAD_BYTES * (dense + experts)
        in_flight = micro_batches_in_flight(p, index, virtual_stages, micro)
        activations = layers * layer.stored_bytes * in_flight + extra_act
        if recompute == "full":
            activations += layer.working_bytes
        return (dense + experts) * WEIGHT_BYTES + grads + OPTIMIZER_BYTES * sharded + activations

    # -- one stage -----------------------------------------------------------------------------------------

    def stage_figures(self, pool: DevicePool, tp: int, layers: int, index: int, p: int, dp: int, mbs: int,
                      micro: int, recompute: str, sequence_parallel: bool, zero: bool, ep: int,
                      virtual_stages: int, heterogeneous: bool = False) -> StageFigures:
        """Time per micro-batch, memory and gradient sync of one device of stage ``index`` (of ``p``);
        ``heterogeneous``: the pipeline's stages run on more than one pool."""
        first, last = index == 0, index == p - 1
        layer = self.layer_cost(pool, tp, mbs, recompute, sequence_parallel, ep)
        extra_s, extra_flops, extra_params, extra_act = self.stage_extras(pool, tp, mbs, first, last,
                                                                          sequence_parallel)
        n = layers
        compute = n * (layer.fwd_s + layer.bwd_s + layer.recompute_s) + extra_s
        tp_comm = n * layer.tp_comm_s
        ep_comm = n * layer.ep_comm_s
        pp_comm = self.pp_comm_s(pool, tp, dp, mbs, p, first, last, virtual_stages, heterogeneous)
        bwd = n * (layer.bwd_s + layer.recompute_s + 0.5 * layer.tp_comm_s)

        dense = n * layer.dense_params + extra_params
        experts = n * layer.expert_params
        params = dense + experts
        expert_group = max(1, dp // ep)
        sharded = dense / dp + experts / expert_group if zero else params
        weights = params * WEIGHT_BYTES
        if zero == 2:  # the shard, plus one layer's gradients before their reduce-scatter
            grads = (sharded + layer.dense_params + layer.expert_params) * GRAD_BYTES
        else:
            grads = params * GRAD_BYTES
        optimizer = OPTIMIZER_BYTES * sharded
        in_flight = micro_batches_in_flight(p, index, virtual_stages, micro)
        activations = n * layer.stored_bytes * in_flight + extra_act
        if recompute == "full":
            activations += layer.working_bytes

        per_node = max(1, pool.devices_per_node // tp)
        intra, inter = pool.intra_node_gbps, pool.inter_node_gbps
        if zero == 2:
            # Every micro-batch's gradients are reduce-scattered while its backward pass runs; the updated
            # weights are all-gathered after the step (the other half of ZeRO-1's all-reduce).
            scatter = hierarchical_reduce_scatter_s(dense * GRAD_COMM_BYTES, dp, per_node, intra, inter)
            if experts:
                scatter += hierarchical_reduce_scatter_s(experts * GRAD_COMM_BYTES, expert_group, per_node, intra,
                                                         inter)
            gather = (hierarchical_reduce_scatter_s(dense * WEIGHT_BYTES, dp, per_node, intra, inter)
                      + hierarchical_reduce_scatter_s(experts * WEIGHT_BYTES, expert_group, per_node, intra, inter))
            sync = micro * scatter + gather
            sync_exposed = (micro - 1) * max(0.0, scatter - bwd) + max(0.0, scatter + gather - bwd)
        else:
            sync = hierarchical_allreduce_s(dense * GRAD_COMM_BYTES, dp, per_node, intra, inter)
            if experts:
                sync += hierarchical_allreduce_s(experts * GRAD_COMM_BYTES, expert_group, per_node, intra, inter)
            sync_exposed = max(0.0, sync - bwd)
        return StageFigures(
            time_s=compute + tp_comm + ep_comm + pp_comm, compute_s=compute, tp_comm_s=tp_comm, ep_comm_s=ep_comm,
            pp_comm_s=pp_comm, bwd_s=bwd,
            hardware_flops=n * (3 * layer.gemm_flops_fwd + layer.recompute_flops) + extra_flops,
            weights=weights, grads=grads, optimizer=optimizer, activations=activations,
            memory_limit=pool.device.memory_bytes * MEMORY_USABLE_FRACTION,
            sync_s=sync, optimizer_s=OPTIMIZER_TRAFFIC_BYTES * sharded / (pool.device.memory_bandwidth_gbps * GB),
            sync_exposed_s=sync_exposed,
        )

    def _kinds(self, layout: Layout) -> list[tuple[Stage, int, int]]:
        """The distinct stages of a layout: (stage, index, count). Stages in a run of identical ones differ
        only in being first/last and in micro-batches in flight, which falls with the index; so the first
        of a run, its middle and its last stand for all of them."""
        stages = layout.stages
        last = self._kinds_last
        if last is not None and last[0] is stages:
            return last[1]
        kinds = list(self._walk_kinds(stages))
        self._kinds_last = (stages, kinds)
        return kinds

    @staticmethod
    def _walk_kinds(stages: tuple[Stage, ...]):
        p = len(stages)
        index = 0
        while index < p:
            stage = stages[index]
            end = index
            while end + 1 < p and (stages[end + 1] is stage or stages[end + 1] == stage):
                end += 1
            yield stage, index, 1
            if end - index >= 2:
                yield stage, index + 1, end - index - 1
            if end > index:
                yield stage, end, 1
            index = end + 1

    def memory(self, layout: Layout) -> tuple[float, float, StageFigures]:
        """(peak bytes, that device's usable bytes, its figures) over the layout's stages: the stage
        whose memory is the largest share of its limit."""
        req = self.request
        micro = req.global_batch_size // (layout.dp * layout.micro_batch_size)
        worst = None
        worst_share = -1.0
        kinds = self._kinds(layout)
        heterogeneous = len({stage.pool for stage, _index, _count in kinds}) > 1  # (not walking every stage)
        for stage, index, _count in kinds:
            fig = self.stage_figures(self.pools[stage.pool], stage.tp, stage.layers, index, layout.pp, layout.dp,
                                     layout.micro_batch_size, micro, layout.recompute, layout.sequence_parallel,
                                     zero_level(layout), layout.ep, layout.virtual_stages, heterogeneous)
            share = fig.memory / fig.memory_limit
            if share > worst_share:
                worst, worst_share = fig, share
        return worst.memory, worst.memory_limit, worst

    # -- a whole layout ------------------------------------------------------------------------------------

    def evaluate(self, layout: Layout) -> Prediction:
        """Predict step time, throughput and peak memory of ``layout``. Call ``problem`` first: a layout
        with a problem gives meaningless numbers."""
        m, req = self.model, self.request
        dp, p, v, mbs = layout.dp, layout.pp, layout.virtual_stages, layout.micro_batch_size
        micro = req.global_batch_size // (dp * mbs)
        t_max = t_sum = 0.0
        worst_compute = worst_tp = worst_pp = worst_ep = 0.0
        hardware_flops = 0.0
        peak_total = 0.0
        dp_total = dp_exposed = optimizer = 0.0
        worst: StageFigures | None = None
        worst_share = -1.0
        devices_per_replica = 0
        kinds = self._kinds(layout)
        heterogeneous = len({stage.pool for stage, _index, _count in kinds}) > 1  # (not walking every stage)
        for stage, index, count in kinds:
            devices_per_replica += count * stage.tp
            pool = self.pools[stage.pool]
            fig = self.stage_figures(pool, stage.tp, stage.layers, index, p, dp, mbs, micro, layout.recompute,
                                     layout.sequence_parallel, zero_level(layout), layout.ep, v, heterogeneous)
            t_sum += count * fig.time_s
            if fig.time_s > t_max:
                t_max = fig.time_s
                worst_compute, worst_tp, worst_pp, worst_ep = fig.compute_s, fig.tp_comm_s, fig.pp_comm_s, fig.ep_comm_s
            hardware_flops += count * dp * stage.tp * micro * fig.hardware_flops
            peak_total += count * pool.device.peak(m.precision) * dp * stage.tp * 1e12
            dp_total = max(dp_total, fig.sync_s)
            dp_exposed = max(dp_exposed, fig.sync_exposed_s)
            optimizer = max(optimizer, fig.optimizer_s)
            share = fig.memory / fig.memory_limit
            if share > worst_share:
                worst, worst_share = fig, share

        pipeline = micro * t_max + (t_sum - t_max) / v
        exposed = max(0.0, dp_exposed)
        step = pipeline + exposed + optimizer
        devices = dp * devices_per_replica  # layout.devices, without walking every stage again
        tokens = req.global_batch_size * m.seq_len
        model_flops = tokens * self.model_flops_per_token
        breakdown = {
            "compute": micro * worst_compute,
            "tp_comm": micro * worst_tp,
            "pp_comm": micro * worst_pp,
            "ep_comm": micro * worst_ep,
            "bubble": pipeline - micro * t_max,
            "dp_comm_exposed": exposed,
            "optimizer": optimizer,
            "dp_comm_total": dp_total,
        }
        memory_breakdown = {"weights": worst.weights / GB, "gradients": worst.grads / GB,
                            "optimizer": worst.optimizer / GB, "activations": worst.activations / GB}
        return Prediction(
            layout=layout,
            num_micro_batches=micro,
            step_time_s=step,
            tokens_per_s=tokens / step,
            mfu=model_flops / (step * peak_total),
            model_tflops_per_device=model_flops / step / devices / 1e12,
            hardware_tflops_per_device=hardware_flops / step / devices / 1e12,
            memory_gb=worst.memory / GB,
            memory_limit_gb=worst.memory_limit / GB,
            breakdown=breakdown,
            memory_breakdown=memory_breakdown,
        )


def homogeneous_layout(pool: DevicePool | str, layers: int, dp: int, tp: int, pp: int, micro_batch_size: int,
                       **kw) -> Layout:
    """A layout with ``pp`` equal stages of ``layers / pp`` layers on one pool."""
    name = pool if isinstance(pool, str) else pool.name
    if layers % pp:
        raise ValueError(f"{layers} layers do not split evenly into {pp} stages")
    return Layout(dp=dp, stages=tuple(Stage(name, tp, layers // pp) for _ in range(pp)),
                  micro_batch_size=micro_batch_size, **kw)


def predict(request: PlanRequest, layout: Layout) -> Prediction:
    """Evaluate one layout; ValueError when it cannot run (with the reason)."""
    model = CostModel(request)
    problem = model.problem(layout)
    if problem:
        raise ValueError(problem)
    return model.evaluate(layout)


def model_flops_per_token(model: ModelSpec) -> float:
    """Model FLOPs per token of one training step (forward + backward, no recomputation): 6 x the matrix
    parameters a token passes through (the output projection included, the input embedding lookup not) plus
    12 l s h for attention scores and values. This is PaLM's MFU count 6N + 12 L H Q T (Chowdhery et al. 2022,
    Appendix B) without the input embedding's share of N."""
    m = model
    h, s = m.hidden, m.seq_len
    kv_width = m.kv * m.head_dim
    matrices = 3 if m.gated_mlp else 2
    attn_linear = 2 * (h * (h + 2 * kv_width) + h * h)
    mlp = 2 * matrices * h * m.ffn * m.active_experts + (2 * h * m.experts if m.is_moe else 0)
    return 3 * m.layers * (attn_linear + mlp + 4 * s * h) + 3 * 2 * h * m.vocab


def step_flops_megatron(model: ModelSpec, global_batch: int) -> float:
    """Narayanan et al. Eq. 3: FLOPs per iteration with full recomputation (GPT, f = 4h, no GQA)."""
    b, s, layers, h, v = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
