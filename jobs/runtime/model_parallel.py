"""Tensor, pipeline and data parallelism for the built-in language model (Megatron-LM's layout, on torch.distributed).

Ray-side code: imports torch, never Django or Ray. One process per rank (one gang worker per rank); the grid is
``tp x dp x pp`` with the tensor-parallel rank varying fastest, then the data-parallel rank, then the pipeline stage
(Megatron's order), so a tensor-parallel group is a run of consecutive ranks.

- Tensor parallel (Megatron-LM, Shoeybi et al. 2019): in each block, attention heads and the MLP's hidden units are
  split over the ``tp`` ranks. ``qkv`` and ``fc`` are column-parallel (each rank holds its heads' / units' rows), the
  attention output projection and ``fc_proj`` are row-parallel (each rank holds the matching columns, partial sums
  are all-reduced, the bias is added once after the sum). The "f" operator (identity forward, all-reduce backward)
  sits before each column-parallel layer and the "g" operator (all-reduce forward, identity backward) after each
  row-parallel one. LayerNorms and embeddings are replicated; their gradients come out identical on every rank.
- Pipeline parallel: the blocks are split into ``pp`` contiguous stages (as even as possible). Stage 0 holds the
  token and position embeddings, the last stage the final LayerNorm and the output head, which is tied to the token
  embedding: the last stage keeps a copy of the embedding and the two copies' gradients are summed over the
  embedding group before every update, so they stay equal (Megatron's solution). A step runs ``micro_batches``
  micro-batches with the GPipe schedule (every forward, then every backward); activations go forward and their
  gradients backward with point-to-point sends.
- Data parallel: gradients are averaged over the ``dp`` replicas of each shard.
- Gradient clipping uses the norm of the whole model's gradient (sharded parameters summed over the tensor-parallel
  group, replicated ones counted once, the tied embedding once), so a step is the same step the single-process
  trainer takes on the same global batch, up to float rounding (tested).

Checkpoints keep the single-process format (``lm.model_state_bytes``: the whole model and AdamW state): the shards
are gathered on rank 0, which assembles the full model; a run resumes under any layout by slicing its shard out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from jobs.runtime.lm import TinyTransformerLM, build_model, learning_rate, make_optimizer
from jobs.runtime.lm_config import LMConfig, TrainHyperparameters, stage_layers

# --------------------------------------------------------------------------------------------------- the grid


@dataclass
class ParallelGrid:
    """This rank's coordinates and its process groups (None where the group would hold one rank)."""

    rank: int
    world_size: int
    tp: int
    pp: int
    dp: int
    tp_group: object = None
    dp_group: object = None
    pp_group: object = None
    model_group: object = None  # the tp x pp ranks of one data-parallel replica (the gradient norm)
    embedding_group: object = None  # first and last stage of this rank's pipeline (the tied embedding)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def dp_rank(self) -> int:
        return (self.rank // self.tp) % self.dp

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.tp * self.dp)

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def stage_stride(self) -> int:
        """Rank distance between neighbouring pipeline stages of the same (tp, dp) coordinates."""
        return self.tp * self.dp

    def pipeline_ranks(self) -> list[int]:
        base = self.rank % self.stage_stride
        return [base + stage * self.stage_stride for stage in range(self.pp)]

    @classmethod
    def create(cls, *, rank: int, world_size: int, tp: int, pp: int) -> ParallelGrid:
        """The grid for this rank; every rank of the default process group must call it (new_group is collective).
        Without a process group (world size 1) no group is made."""
        if tp < 1 or pp < 1 or world_size % (tp * pp):
            raise ValueError(f"tensor_parallel x pipeline_parallel = {tp * pp} must divide the world size {world_size}")
        grid = cls(rank=rank, world_size=world_size, tp=tp, pp=pp, dp=world_size // (tp * pp))
        if world_size == 1:
            return grid
        stride = tp * grid.dp
        tp_groups = [[s * stride + d * tp + t for t in range(tp)] for s in range(pp) for d in range(grid.dp)]
        dp_groups = [[s * stride + d * tp + t for d in range(grid.dp)] for s in range(pp) for t in range(tp)]
        pp_groups = [[s * stride + d * tp + t for s in range(pp)] for d in range(grid.dp) for t in range(tp)]
        model_groups = [[s * stride + d * tp + t for s in range(pp) for t in range(tp)] for d in range(grid.dp)]
        embedding_groups = [[ranks[0], ranks[-1]] for ranks in pp_groups] if pp > 1 else []
        for attr, groups in (("tp_group", tp_groups), ("dp_group", dp_groups), ("pp_group", pp_groups),
                             ("model_group", model_groups), ("embedding_group", embedding_groups)):
            for ranks in groups:
                if len(ranks) < 2:
                    continue
                group = dist.new_group(ranks)  # collective: every rank creates every group, in the same order
                if rank in ranks:
                    setattr(grid, attr, group)
        return grid


# --------------------------------------------------------------------------------------------------- tensor parallel

# How the tensor-parallel all-reduces inside forward and backward wait: through the step's `wait` hook (set by
# parallel_train_step for its thread), so a rank blocked on a hung peer reports that it waits, not that it computes,
# and the supervisor blames the rank that really hangs.
_hook = threading.local()


def _collective(fn: Callable[[], None]) -> None:
    run = getattr(_hook, "wait", None)
    if run is None:
        fn()
    else:
        run(fn)



class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        _collective(lambda: dist.all_reduce(grad, group=ctx.group))
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        _collective(lambda: dist.all_reduce(x, group=group))
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _copy_to(x: torch.Tensor, group) -> torch.Tensor:
    return x if group is None else _CopyToTensorParallel.apply(x, group)


def _reduce_from(x: torch.Tensor, group) -> torch.Tensor:
    return x if group is None else _ReduceFromTensorParallel.apply(x, group)


class _ParallelAttention(nn.Module):
    def __init__(self, config: LMConfig, tp: int, group) -> None:
        super().__init__()
        self.group = group
        self.local_heads = config.n_heads // tp
        self.local_width = config.d_model // tp
        self.qkv = nn.Linear(config.d_model, 3 * self.local_width)  # column-parallel
        self.proj = nn.Linear(self.local_width, config.d_model)  # row-parallel: bias added after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(_copy_to(x, self.group)).split(self.local_width, dim=2)
        head = self.local_width // self.local_heads
        q, k, v = (z.view(b, t, self.local_heads, head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, self.local_width)
        return _reduce_from(F.linear(y, self.proj.weight), self.group) + self.proj.bias


class _ParallelBlock(nn.Module):
    def __init__(self, config: LMConfig, tp: int, group) -> None:
        super().__init__()
        self.group = group
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = _ParallelAttention(config, tp, group)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.fc = nn.Linear(config.d_model, config.d_ff // tp)  # column-parallel
        self.fc_proj = nn.Linear(config.d_ff // tp, config.d_model)  # row-parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        hidden = F.gelu(self.fc(_copy_to(self.ln2(x), self.group)))
        return x + _reduce_from(F.linear(hidden, self.fc_proj.weight), self.group) + self.fc_proj.bias


class StageLM(nn.Module):
    """This rank's shard of ``TinyTransformerLM``: its pipeline stage's blocks, each cut to its tensor-parallel part.

    Parameter names are the full model's (``blocks.<global index>...``), so shards map onto the full state by name.
    """

    def __init__(self, config: LMConfig, grid: ParallelGrid) -> None:
        super().__init__()
        self.config = config
        self.grid = grid
        first, count = stage_layers(config.n_layers, grid.pp)[grid.pp_rank]
        self.layer_ids = list(range(first, first + count))
        if grid.first_stage or grid.last_stage:
            self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        if grid.first_stage:
            self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleDict({str(i): _ParallelBlock(config, grid.tp, grid.tp_group) for i in self.layer_ids})
        if grid.last_stage:
            self.ln_f = nn.LayerNorm(config.d_model)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok_emb(idx) + self.pos_emb(pos)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.layer_ids:
            x = self.blocks[str(i)](x)
        return x

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.ln_f(x), self.tok_emb.weight)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --------------------------------------------------------------------------------------------------- shards

_ROW_PARALLEL = ("attn.proj.weight", "fc_proj.weight")


def _split_kind(name: str) -> str:
    if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        return "qkv"  # rows [q; k; v], each split by heads
    if name.endswith(("fc.weight", "fc.bias")):
        return "rows"
    if name.endswith(_ROW_PARALLEL):
        return "columns"
    return "replicated"


def shard_tensor(name: str, full: torch.Tensor, *, tp_rank: int, tp: int) -> torch.Tensor:
    """The part of the full model's parameter (or optimizer moment) ``name`` that tensor-parallel rank holds."""
    kind = _split_kind(name)
    if tp == 1 or kind == "replicated":
        return full.clone()
    if kind == "qkv":
        return torch.cat([part.chunk(tp, dim=0)[tp_rank] for part in full.chunk(3, dim=0)], dim=0).clone()
    if kind == "rows":
        return full.chunk(tp, dim=0)[tp_rank].clone()
    return full.chunk(tp, dim=1)[tp_rank].clone()


def unshard_tensor(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from the tensor-parallel shards, in tensor-parallel rank order (inverse of shard_tensor)."""
    kind = _split_kind(name)
    if len(shards) == 1 or kind == "replicated":
        return shards[0].clone()
    if kind == "qkv":
        parts = [shard.chunk(3, dim=0) for shard in shards]
        return torch.cat([torch.cat([p[i] for p in parts], dim=0) for i in range(3)], dim=0)
    return torch.cat(shards, dim=0 if kind == "rows" else 1)


def stage_from_full(full: TinyTransformerLM, grid: ParallelGrid, full_optimizer: torch.optim.Optimizer | None,
                    hp: TrainHyperparameters) -> tuple[StageLM, torch.optim.Optimizer]:
    """This rank's shard of a full model (and of its AdamW state, when the optimizer has any)."""
    stage = StageLM(full.config, grid)
    full_params = dict(full.named_parameters())
    with torch.no_grad():
        for name, param in stage.named_parameters():
            param.copy_(shard_tensor(name, full_params[name].detach(), tp_rank=grid.tp_rank, tp=grid.tp))
    optimizer = make_optimizer(stage, hp)
    if full_optimizer is not None:
        for name, param in stage.named_parameters():
            state = full_optimizer.state.get(full_params[name])
            if state:
                optimizer.state[param] = {
                    key: (value.clone() if key == "step" or not torch.is_tensor(value)
                          else shard_tensor(name, value, tp_rank=grid.tp_rank, tp=grid.tp))
                    for key, value in state.items()}
    return stage, optimizer


def _shard_payload(stage: StageLM, optimizer: torch.optim.Optimizer) -> dict:
    params = {}
    for name, param in stage.named_parameters():
        state = optimizer.state.get(param) or {}
        params[name] = {"param": param.detach().clone(),
                        "state": {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in state.items()}}
    return {"tp_rank": stage.grid.tp_rank, "pp_rank": stage.grid.pp_rank, "params": params}


def assemble_full(config: LMConfig, hp: TrainHyperparameters, payloads: list[dict]) -> tuple[TinyTransformerLM,
                                                                                              torch.optim.Optimizer]:
    """The full model and AdamW state from every (pipeline stage, tensor rank) shard of one data-parallel replica."""
    full = build_model(config, seed=hp.seed)
    optimizer = make_optimizer(full, hp)
    by_name: dict[str, dict[int, dict]] = {}
    for payload in payloads:
        for name, entry in payload["params"].items():
            # The tied embedding lives on the first and the last stage; the first stage's copy is the one kept.
            by_name.setdefault(name, {}).setdefault(payload["tp_rank"], entry)
    with torch.no_grad():
        for name, param in full.named_parameters():
            entries = by_name.get(name)
            if not entries or sorted(entries) != list(range(len(entries))):
                raise ValueError(f"{name}: shards missing from the gathered model state")
            ordered = [entries[r] for r in range(len(entries))]
            param.copy_(unshard_tensor(name, [e["param"] for e in ordered]))
            if ordered[0]["state"]:
                optimizer.state[param] = {
                    key: (value if key == "step" or not torch.is_tensor(value)
                          else unshard_tensor(name, [e["state"][key] for e in ordered]))
                    for key, value in ordered[0]["state"].items()}
    return full, optimizer


def gather_full_state(stage: StageLM, optimizer: torch.optim.Optimizer, hp: TrainHyperparameters
                      ) -> tuple[TinyTransformerLM, torch.optim.Optimizer] | None:
    """Collective over every rank: rank 0 gets the full model and optimizer (None elsewhere). Only data-parallel
    replica 0 sends its shards (the replicas are identical)."""
    grid = stage.grid
    payload = _shard_payload(stage, optimizer) if grid.dp_rank == 0 else None
    if grid.world_size == 1:
        return assemble_full(stage.config, hp, [payload])
    gathered: list | None = [None] * grid.world_size if grid.rank == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    if grid.rank != 0:
        return None
    return assemble_full(stage.config, hp, [p for p in gathered if p is not None])


# --------------------------------------------------------------------------------------------------- one step


def _norm_share(stage: StageLM) -> torch.Tensor:
    """This rank's share of the squared gradient norm of the whole model: replicated parameters are counted on
    tensor rank 0 only, and the tied embedding on the first stage only."""
    grid = stage.grid
    total = torch.zeros((), dtype=torch.float64)
    for name, param in stage.named_parameters():
        if param.grad is None:
            continue
        if _split_kind(name) == "replicated" and grid.tp_rank != 0:
            continue
        if name == "tok_emb.weight" and not grid.first_stage:
            continue
        total += param.grad.detach().double().pow(2).sum()
    return total


def parallel_train_step(stage: StageLM, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
                        step: int, hp: TrainHyperparameters, micro_batches: int,
                        wait: Callable[[Callable[[], None]], None] | None = None) -> float:
    """One optimizer step on this rank's shard at 0-based ``step``; returns the replica's loss before the update.

    ``x``, ``y``: this data-parallel replica's batch (every rank of a replica gets the same one). ``wait(fn)`` runs
    ``fn`` (every collective and point-to-point transfer, the tensor-parallel all-reduces inside forward and
    backward included) so the caller can time it as waiting on the gang, not computing.
    """
    run = wait or (lambda fn: fn())
    _hook.wait = run
    try:
        return _train_step(stage, optimizer, x, y, step=step, hp=hp, micro_batches=micro_batches, run=run)
    finally:
        _hook.wait = None


def _train_step(stage: StageLM, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *, step: int,
                hp: TrainHyperparameters, micro_batches: int, run: Callable[[Callable[[], None]], None]) -> float:
    grid = stage.grid
    stage.train()
    optimizer.zero_grad(set_to_none=True)
    xs, ys = x.chunk(micro_batches, dim=0), y.chunk(micro_batches, dim=0)
    prev_rank, next_rank = grid.rank - grid.stage_stride, grid.rank + grid.stage_stride
    shape = (xs[0].shape[0], xs[0].shape[1], stage.config.d_model)
    inputs: list[torch.Tensor | None] = []
    outputs: list[torch.Tensor] = []
    loss_total = torch.zeros(())
    for mb in range(micro_batches):  # GPipe: every forward first
        if grid.first_stage:
            inp = None
            hidden = stage.embed(xs[mb])
        else:
            inp = torch.empty(shape)
            run(lambda buf=inp: dist.recv(buf, src=prev_rank))
            inp.requires_grad_(True)
            hidden = inp
        out = stage.body(hidden)
        if grid.last_stage:
            out = stage.head_loss(out, ys[mb]) / micro_batches
            loss_total += out.detach()
        else:
            run(lambda out=out: dist.send(out.detach().contiguous(), dst=next_rank))
        inputs.append(inp)
        outputs.append(out)
    for mb in range(micro_batches):  # then every backward
        if grid.last_stage:
            outputs[mb].backward()
        else:
            grad = torch.empty(shape)
            run(lambda buf=grad: dist.recv(buf, src=next_rank))
            outputs[mb].backward(grad)
        if not grid.first_stage:
            run(lambda inp=inputs[mb]: dist.send(inp.grad.contiguous(), dst=prev_rank))
    params = [p for p in stage.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if grid.embedding_group is not None and (grid.first_stage or grid.last_stage):
        run(lambda: dist.all_reduce(stage.tok_emb.weight.grad, group=grid.embedding_group))
    if grid.dp_group is not None:
        run(lambda: average_grads([p.grad for p in params], grid.dp_group, grid.dp))
    share = _norm_share(stage)
    if grid.model_group is not None:
        run(lambda: dist.all_reduce(share, group=grid.model_group))
    total_norm = float(share.sqrt())
    clip = min(1.0, hp.grad_clip / (total_norm + 1e-6))  # torch.nn.utils.clip_grad_norm_'s rule
    if clip < 1.0:
        for p in params:
            p.grad.mul_(clip)
    lr = learning_rate(step, hp)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    if grid.pp_group is not None:  # every stage reports the replica's loss
        src = grid.pipeline_ranks()[-1]
        run(lambda: dist.broadcast(loss_total, src=src, group=grid.pp_group))
    return float(loss_total)


def average_grads(grads: list[torch.Tensor], group, size: int) -> None:
    """Average ``grads`` in place over ``group`` (None: every rank) of ``size`` ranks, in one flat all-reduce."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for grad in grads:
        count = grad.numel()
        grad.copy_(flat[offset:offset + count].view_as(grad))
        offset += count


def broadcast_flag(flag: bool, grid: ParallelGrid) -> bool:
    """Rank 0's ``flag`` on every rank (a checkpoint asked of rank 0 must be taken by all: gathering is collective)."""
    if grid.world_size == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.broadcast(value, src=0)
    return bool(value.item())


def describe(grid: ParallelGrid, config: LMConfig, micro_batches: int, source: str) -> str:
    first, count = stage_layers(config.n_layers, grid.pp)[grid.pp_rank]
    return (f"tensor parallel {grid.tp} x pipeline parallel {grid.pp} x data parallel {grid.dp} over "
            f"{grid.world_size} worker(s) ({source}); this rank: stage {grid.pp_rank} (layers {first}-"
            f"{first + count - 1}), tensor rank {grid.tp_rank}, replica {grid.dp_rank}, "
            f"{config.n_heads // grid.tp} of {config.n_heads} heads, {micro_batches} micro-batch(es) per step")


def full_model_equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], *, atol: float) -> bool:
    """Whether two state dicts hold the same tensors within ``atol`` (tests and the benchmark)."""
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


__all__ = ["ParallelGrid", "StageLM", "assemble_full", "broadcast_flag", "describe", "full_model_equal",
           "gather_full_state", "parallel_train_step", "shard_tensor", "stage_from_full", "unshard_tensor"]
