"""Tensor / pipeline / data parallelism of the built-in trainer (jobs.runtime.model_parallel).

The decisive test runs real torch.distributed (gloo) ranks in separate processes and checks that a model-parallel
run takes the same steps as the single-process trainer on the same global batch: the same losses and, after a
checkpoint round trip through the full (single-process) format and a resume under the layout, the same weights.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path

import pytest
import torch

from jobs.runtime import lm
from jobs.runtime import model_parallel as mp
from jobs.runtime.lm_config import TrainHyperparameters, stage_layers, trainer_layout

HP = {"steps": 6, "batch_size": 4, "context": 16, "d_model": 32, "n_heads": 4, "n_layers": 4, "d_ff": 64,
      "lr": 3e-2, "warmup_steps": 1, "grad_clip": 0.5, "seed": 3}
FIRST_STEPS, ALL_STEPS = 3, 6


def _tokens() -> torch.Tensor:
    text = ("the quick brown fox jumps over the lazy dog; " * 40).encode()
    return lm.tokens_from_bytes(text)


def _replica_batch(tokens, hp: TrainHyperparameters, step: int, dp_rank: int, dp: int):
    return lm.batch_for_step(tokens, step=step, rank=dp_rank, world_size=dp, batch_size=hp.batch_size,
                             context=hp.context, seed=hp.seed)


def _reference(hp: TrainHyperparameters, dp: int) -> tuple[list[float], dict]:
    """The single-process trainer on the global batch (every replica's batch, concatenated)."""
    tokens = _tokens()
    model = lm.build_model(hp.model_config(), seed=hp.seed)
    optimizer = lm.make_optimizer(model, hp)
    losses = []
    for step in range(ALL_STEPS):
        batches = [_replica_batch(tokens, hp, step, d, dp) for d in range(dp)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        losses.append(lm.train_step(model, optimizer, x, y, step=step, hp=hp))
    return losses, model.state_dict()


def _rank_main(rank: int, world: int, tp: int, pp: int, micro: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        hp = TrainHyperparameters.from_dict(HP)
        tokens = _tokens()
        grid = mp.ParallelGrid.create(rank=rank, world_size=world, tp=tp, pp=pp)
        full = lm.build_model(hp.model_config(), seed=hp.seed)
        stage, optimizer = mp.stage_from_full(full, grid, None, hp)
        losses, wait_counts = [], []
        for step in range(ALL_STEPS):
            if step == FIRST_STEPS:  # checkpoint in the single-process format, then resume from it under the layout
                gathered = mp.gather_full_state(stage, optimizer, hp)
                path = Path(out_dir) / "mid.pt"
                if rank == 0:
                    files = lm.model_state_bytes(gathered[0], gathered[1], step=step, hp=hp)
                    torch.save(files, path)
                dist.barrier()
                files = torch.load(path, weights_only=False)
                resumed = lm.build_model(hp.model_config(), seed=99)  # different init: the checkpoint must win
                resumed_opt = lm.make_optimizer(resumed, hp)
                assert lm.load_model_state(files, resumed, resumed_opt) == step
                stage, optimizer = mp.stage_from_full(resumed, grid, resumed_opt, hp)
            x, y = _replica_batch(tokens, hp, step, grid.dp_rank, grid.dp)
            waits: list[int] = []
            losses.append(mp.parallel_train_step(stage, optimizer, x, y, step=step, hp=hp, micro_batches=micro,
                                                 wait=lambda fn, waits=waits: (waits.append(1), fn())))
            wait_counts.append(len(waits))
        gathered = mp.gather_full_state(stage, optimizer, hp)
        torch.save({"losses": losses, "waits": wait_counts, "state": gathered[0].state_dict() if gathered else None},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_layout(tp: int, pp: int, dp: int, micro: int) -> list[dict]:
    world = tp * pp * dp
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as out:
        init_file = os.path.join(out, "init")
        procs = [ctx.Process(target=_rank_main, args=(r, world, tp, pp, micro, init_file, out)) for r in range(world)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join(timeout=240)
        finally:
            for p in procs:  # never leave a rank behind
                if p.is_alive():
                    p.kill()
                    p.join()
        assert [p.exitcode for p in procs] == [0] * world, "a rank failed"
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.mark.parametrize(("tp", "pp", "dp", "micro"), [(2, 2, 1, 2), (2, 1, 2, 1), (1, 2, 2, 4)],
                         ids=["tp2-pp2", "tp2-dp2", "pp2-dp2-4micro"])
def test_model_parallel_run_takes_the_single_process_steps(tp, pp, dp, micro):
    hp = TrainHyperparameters.from_dict(HP)
    ref_losses, ref_state = _reference(hp, dp)
    results = _run_layout(tp, pp, dp, micro)
    assert all(len(result["losses"]) == ALL_STEPS for result in results)
    # The replicas' mean loss is the global-batch loss the single process sees.
    for step in range(ALL_STEPS):
        replica_losses = [results[d * tp]["losses"][step] for d in range(dp)]
        assert sum(replica_losses) / dp == pytest.approx(ref_losses[step], rel=1e-4, abs=1e-5)
    # Every rank of a replica reports the same loss (the last stage broadcasts it).
    for rank, result in enumerate(results):
        same_replica = results[(rank // tp) % dp * tp]
        assert result["losses"] == pytest.approx(same_replica["losses"], rel=1e-6)
    state = results[0]["state"]
    assert state.keys() == ref_state.keys()
    for name in state:
        got, want = state[name], ref_state[name]
        if name.endswith("attn.qkv.bias"):
            # The key bias's gradient is zero in exact arithmetic (it shifts every score of a query by the same
            # amount, which softmax ignores); AdamW turns its float noise into steps of about lr, in any layout.
            got, want = (torch.cat([t.chunk(3)[0], t.chunk(3)[2]]) for t in (got, want))
        # AdamW normalises each gradient, so an element whose gradient is close to float noise (summed in another
        # order here) can move by up to lr: a few elements of the key projection differ by ~2e-4 after 6 steps.
        # A wrong shard, reduction or clip moves whole tensors by ~lr (3e-2): the mean catches it, the max bounds it.
        diff = (got - want).abs()
        assert diff.mean() < 2e-5 and diff.max() < 2e-3, (name, float(diff.mean()), float(diff.max()))
    assert all(r["state"] is None for r in results[1:])
    assert results[0]["losses"][-1] < results[0]["losses"][0] - 0.5  # and it learns (a repeated sentence)
    # Every wait on a peer goes through the hook (so a rank blocked on a hung peer does not look busy): with tensor
    # parallelism that includes 2 all-reduces forward and 2 backward per block and micro-batch.
    layers_per_stage = HP["n_layers"] // pp
    if tp > 1:
        assert min(min(r["waits"]) for r in results) >= 4 * layers_per_stage * micro


# --------------------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize("name", ["blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.bias", "blocks.0.fc.weight",
                                  "blocks.0.fc.bias", "blocks.0.attn.proj.weight", "blocks.0.fc_proj.weight",
                                  "blocks.0.ln1.weight", "tok_emb.weight"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_reassemble_to_the_full_tensor(name, tp):
    model = lm.build_model(lm.LMConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64), seed=1)
    full = dict(model.named_parameters())[name].detach()
    shards = [mp.shard_tensor(name, full, tp_rank=r, tp=tp) for r in range(tp)]
    assert torch.equal(mp.unshard_tensor(name, shards), full)


def test_qkv_shard_holds_its_heads_of_q_k_and_v():
    full = torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8)
    shard = mp.shard_tensor("blocks.0.attn.qkv.weight", full, tp_rank=1, tp=2)
    assert torch.equal(shard[:4], full[4:8])     # q rows of heads 2-3
    assert torch.equal(shard[4:8], full[12:16])  # k rows of heads 2-3
    assert torch.equal(shard[8:], full[20:24])   # v rows of heads 2-3


def test_stage_layers_are_contiguous_and_even():
    assert stage_layers(5, 2) == [(0, 3), (3, 2)]
    assert stage_layers(4, 4) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert sum(count for _, count in stage_layers(126, 16)) == 126


def test_explicit_degrees_are_validated_with_the_field():
    with pytest.raises(ValueError, match="tensor_parallel: 3 must divide n_heads"):
        TrainHyperparameters.from_dict({"tensor_parallel": 3})
    with pytest.raises(ValueError, match="pipeline_parallel: 4 stages need at least 4 layers"):
        TrainHyperparameters.from_dict({"pipeline_parallel": 4, "n_layers": 2})
    with pytest.raises(ValueError, match="micro_batches: must divide batch_size"):
        TrainHyperparameters.from_dict({"micro_batches": 3, "batch_size": 16})
    hp = TrainHyperparameters.from_dict({"tensor_parallel": 2, "pipeline_parallel": 2})
    with pytest.raises(ValueError, match="must divide the gang's 6 worker"):
        trainer_layout(hp, world_size=6)
    layout = trainer_layout(hp, world_size=8)
    assert (layout.tp, layout.pp, layout.dp, layout.model_parallel) == (2, 2, 2, True)
    assert layout.micro_batches == 8  # the largest divisor of batch 16 up to 4 per stage


def test_layout_from_the_plan_one_device_per_worker():
    hp = TrainHyperparameters.from_dict({"n_layers": 4})
    plan = {"accelerator_type": "nvidia-a100", "tp": 2, "pp": 2, "dp": 2}
    layout = trainer_layout(hp, world_size=8, plan=plan, devices_per_worker=1)
    assert (layout.tp, layout.pp, layout.dp) == (2, 2, 2)
    assert "parallel plan for nvidia-a100" in layout.source


def test_layout_from_the_plan_keeps_tensor_parallel_inside_a_multi_device_worker():
    hp = TrainHyperparameters.from_dict({"n_layers": 4})
    plan = {"accelerator_type": "nvidia-h100", "tp": 8, "pp": 2, "dp": 1}
    layout = trainer_layout(hp, world_size=2, plan=plan, devices_per_worker=8)
    assert (layout.tp, layout.pp, layout.dp) == (1, 2, 1)
    plan = {"accelerator_type": "nvidia-h100", "tp": 8, "pp": 1, "dp": 1}
    layout = trainer_layout(hp, world_size=2, plan=plan, devices_per_worker=4)
    assert (layout.tp, layout.pp, layout.dp) == (2, 1, 1)


def test_layout_from_the_plan_falls_back_to_data_parallel_with_the_reason():
    hp = TrainHyperparameters.from_dict({"n_layers": 2})
    plan = {"accelerator_type": "nvidia-h100", "tp": 1, "pp": 4, "dp": 1}
    layout = trainer_layout(hp, world_size=4, plan=plan, devices_per_worker=1)
    assert (layout.tp, layout.pp, layout.dp) == (1, 1, 4)
    assert "4 stages need at least 4 layers" in layout.source
    plan = {"accelerator_type": "nvidia-h100", "tp": 2, "pp": 1, "dp": 1}
    layout = trainer_layout(hp, world_size=3, plan=plan, devices_per_worker=1)
    assert layout.dp == 3 and "do not divide the 3 workers" in layout.source


def test_no_plan_no_degrees_is_data_parallel():
    layout = trainer_layout(TrainHyperparameters.from_dict({}), world_size=3)
    assert (layout.tp, layout.pp, layout.dp, layout.micro_batches, layout.model_parallel) == (1, 1, 3, 1, False)
