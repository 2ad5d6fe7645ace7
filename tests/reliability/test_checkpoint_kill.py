"""Issue 8, T2: SIGKILL the training checkpoint writer at random moments 100 times; 0 partial loads.

The writer is the one training uses (jobs.runtime.worker.AsyncCheckpointWriter): the training loop hands it an
in-memory copy of the state and a background thread saves it (jobs.runtime.checkpoints.save_checkpoint) and applies
retention. Each round forks a child from this process (everything is imported already, so a round costs
milliseconds) that resumes from the newest checkpoint, as a restarted worker does, and checkpoints every few
milliseconds until it is SIGKILLed at a random moment: while copying, writing, fsyncing, publishing or deleting old
checkpoints. After each kill the loader must list only complete checkpoints, `load_latest` must return the newest
complete one with exactly the content that was saved for its step, `clean_partial` must remove what the kill left
behind, and a new save must work. The child tells the parent, through shared memory, which step it submitted last
and which one the writer confirmed as complete, so the test knows which checkpoints may exist without asking the
loader.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

from jobs.runtime.checkpoints import clean_partial, list_checkpoints, load_checkpoint, load_latest
from jobs.runtime.worker import AsyncCheckpointWriter

KILLS = 100
KEEP_LAST = 3
KILL_WINDOW_S = 0.12  # a save here takes ~15 ms: a round sees several saves, retention and kills in every phase
SUBMITTED, CONFIRMED = 0, 1  # slots of the shared array


def state_for(step: int) -> dict[str, bytes]:
    """The training state saved at `step`: deterministic, different sizes per step so a mix-up shows."""
    return {"model.pt": random.Random(step).randbytes(384 * 1024 + step),
            "optim.pt": random.Random(-step - 1).randbytes(128 * 1024 + 3 * step),
            "config.json": b'{"format": 1, "step": %d}' % step}


def digests_for(step: int) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in state_for(step).items()}


def _train_until_killed(root: str, first_step: int, progress) -> None:
    """Child: the rank-0 checkpoint path of the training loop, forever: copy the state, hand it to the writer."""
    def emit(event: dict) -> None:
        if event["type"] == "checkpoint":
            progress[CONFIRMED] = event["step"]  # sent only once the checkpoint is complete on disk

    writer = AsyncCheckpointWriter(Path(root), keep_last=KEEP_LAST, emit=emit)
    step = first_step
    while True:
        time.sleep(0.002)  # a training step
        files = state_for(step)  # the in-memory copy training hands over
        progress[SUBMITTED] = step
        writer.submit(step=step, files=files, metadata={"step": step}, requested=False, blocked_s=0.0)
        step += 1


def _complete_on_disk(root: Path) -> list[int]:
    """Steps whose published directory holds exactly the state saved for that step (checked without the loader)."""
    steps = []
    for path in root.iterdir():
        if not path.name.startswith("step-"):
            continue
        step = int(path.name.removeprefix("step-"))
        expected = state_for(step)
        try:
            if all((path / name).read_bytes() == data for name, data in expected.items()):
                steps.append(step)
        except (FileNotFoundError, NotADirectoryError):
            continue
    return sorted(steps)


def test_the_training_checkpoint_writer_killed_100_times_never_yields_a_partial_load(tmp_path):
    rng = random.Random(8_2)
    ctx = multiprocessing.get_context("fork")
    root = tmp_path / "ckpt"
    writer = AsyncCheckpointWriter(root, keep_last=KEEP_LAST, emit=lambda event: None)
    writer.submit(step=0, files=state_for(0), metadata={"step": 0}, requested=False, blocked_s=0.0)
    writer.wait()
    newest = 0  # the newest checkpoint known complete before the round
    kills = found_total = partial_loads = mid_save = mid_delete = new_in_flight = 0
    started = time.perf_counter()
    for _ in range(KILLS):
        progress = ctx.RawArray("q", [newest, newest])  # no lock: the child may die at any instruction
        child = ctx.Process(target=_train_until_killed, args=(str(root), newest + 1, progress), daemon=True)
        child.start()
        time.sleep(rng.uniform(0.0, KILL_WINDOW_S))
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL
        kills += 1
        submitted, confirmed = progress[SUBMITTED], progress[CONFIRMED]

        leftovers = [p.name for p in root.iterdir() if p.name.startswith(".tmp-")]
        mid_save += any(not name.startswith(".tmp-deleting-") for name in leftovers)
        mid_delete += any(name.startswith(".tmp-deleting-") for name in leftovers)

        listed = list_checkpoints(root)
        found_total += len(listed)
        for info in listed:  # everything listed is whole and is what was saved for its step
            _, data = load_checkpoint(info)
            if data != state_for(info.step):
                partial_loads += 1
        assert [info.step for info in listed] == _complete_on_disk(root)
        # The writer confirms a checkpoint only once it is complete, and writes one at a time: the newest one is the
        # last confirmed, or the one after it when the kill came between its publication and the confirmation.
        allowed = {confirmed} | ({confirmed + 1} if confirmed + 1 <= submitted else set())
        latest = load_latest(root)
        assert latest is not None
        info, data = latest
        if data != state_for(info.step) or info.files != digests_for(info.step):
            partial_loads += 1
        assert info.step == listed[-1].step, "load_latest must pick the newest complete checkpoint"
        assert info.step in allowed, (info.step, confirmed, submitted)
        new_in_flight += info.step == confirmed + 1
        assert len(listed) <= KEEP_LAST + 1  # retention runs after each save; a kill may come before it

        clean_partial(root)
        assert [p.name for p in root.iterdir() if p.name.startswith(".tmp-")] == []
        assert [i.step for i in list_checkpoints(root)] == [i.step for i in listed]

        newest = info.step + 1  # a restarted worker saves its next checkpoint: it must work
        events: list[dict] = []
        writer = AsyncCheckpointWriter(root, keep_last=KEEP_LAST, emit=events.append)
        writer.submit(step=newest, files=state_for(newest), metadata={"step": newest}, requested=False,
                      blocked_s=0.0)
        writer.wait()
        assert [e["type"] for e in events] == ["checkpoint"] and events[0]["step"] == newest
        assert load_latest(root)[0].step == newest
    elapsed = time.perf_counter() - started
    print(f"\nT2 checkpoint writer SIGKILL: kills={kills} checkpoints_found={found_total} "
          f"partial_loads={partial_loads} killed_mid_save={mid_save} killed_mid_delete={mid_delete} "
          f"published_not_yet_confirmed={new_in_flight} newest_step={newest} seconds={elapsed:.1f}")
    assert kills == KILLS
    assert partial_loads == 0
    assert mid_save > 0, "no kill landed inside a save: the test did not exercise what it is for"
