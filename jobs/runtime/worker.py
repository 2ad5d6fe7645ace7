"""One training worker of a gang: a threaded Ray actor that trains and answers polls while it does.

Why Fleetyard's own actors rather than Ray Train v2 workers: the platform must see each worker's
progress every half second (to notice a hang or a slow node within seconds), ask rank 0 for a
checkpoint at any step (preemption, cordon, resize), inject faults in tests, and restart the gang on
nodes the scheduler picks. Ray Train v2 owns its worker group, its restarts and its placement, and
reports only what the training function returns; the control loop Fleetyard needs would sit outside
it. So a gang here is one placement group (pinned to the scheduler's nodes) and one `TrainingWorker`
per bundle, coordinated by `supervisor.GangSupervisor`; data parallelism is torch.distributed (gloo
on CPU; NCCL where CUDA devices are present), exactly what Ray Train would set up.

The training loop runs in a background thread; `poll()` returns the progress made since the last
poll (step, loss, per-step compute time, log lines, checkpoints) and never blocks on training.
Two trainers:
- the built-in transformer language model (`jobs.runtime.lm`), trained data-parallel, or tensor x
  pipeline x data parallel (`jobs.runtime.model_parallel`) when its hyperparameters or the job's parallel
  plan ask for it, checkpointed by rank 0 (in the single-process format) every `checkpoint_interval_steps`,
  on demand and at the end;
- a user entrypoint: a shell command run in its working dir with RANK / WORLD_SIZE / MASTER_ADDR /
  MASTER_PORT / FLEETYARD_CHECKPOINT_DIR set; lines it prints like `fleetyard: step=12 loss=3.4`
  report progress, everything it prints is its log.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import subprocess
import threading
import time
import traceback
from collections import deque
from datetime import timedelta
from pathlib import Path

# Fault injection (tests and the fault benchmark): what a worker can be told to do to itself.
INJECTABLE = ("crash", "hang", "slow", "nan")
RECENT_STEP_TIMES = 20
# Rank 0's metric events of its last steps, saved with each checkpoint and replayed on resume: a worker
# that dies before the supervisor polls it takes the metrics of its last steps with it, while the run
# goes on from the checkpoint it wrote after them (found by benchmarks/churn.py: steps with no metric).
STEP_RECORD_FILE = "step_metrics.json"
STEP_RECORD_STEPS = 512


def free_port(host: str = "") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (unit tests)
        return "127.0.0.1"


class TrainingWorker:
    """A worker of one gang; `spec` is the plain dict the control plane built (see supervisor)."""

    def __init__(self, spec: dict, rank: int, world_size: int, node: str) -> None:
        self.spec = spec
        self.rank = rank
        self.world_size = world_size
        self.node = node
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._step = -1
        self._resumed_from = None
        self._last_loss: float | None = None
        self._compute_times: deque[float] = deque(maxlen=RECENT_STEP_TIMES)
        self._done = False
        self._error = ""
        self._phase = "idle"
        self._checkpoint_requested = threading.Event()
        self._stop = threading.Event()
        self._faults: dict[str, float] = {}
        self._slow_base: float | None = None
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen | None = None
        if spec.get("trainer") != "entrypoint":
            # Import torch now, while the supervisor waits for the gang to come up: imported in the
            # training thread it holds the GIL for seconds and the worker answers its polls late.
            import torch  # noqa: F401

            import jobs.runtime.lm  # noqa: F401

    # ------------------------------------------------------------------ called by the supervisor

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address for torch.distributed's TCP store."""
        ip = node_ip()
        return ip, free_port()

    def start(self, master_addr: str, master_port: int) -> str:
        if self._thread is None:
            target = self._run_entrypoint if self.spec.get("trainer") == "entrypoint" else self._run_builtin
            self._thread = threading.Thread(target=self._guard, args=(target, master_addr, master_port),
                                            name=f"train-rank{self.rank}", daemon=True)
            self._thread.start()
        return self.node

    def poll(self) -> dict:
        with self._lock:
            events, self._events = self._events, []
            return {
                "rank": self.rank, "node": self.node, "step": self._step, "loss": self._last_loss,
                "compute_times": list(self._compute_times), "phase": self._phase, "done": self._done,
                "error": self._error, "resumed_from": self._resumed_from, "events": events,
                "pid": os.getpid(),
            }

    def request_checkpoint(self) -> None:
        self._checkpoint_requested.set()

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def inject(self, fault: str, factor: float = 3.0) -> None:
        """Fault injection: crash (the process exits), hang (the loop blocks), slow (each step takes
        `factor` x its healthy compute time), nan (the next loss)."""
        if fault not in INJECTABLE:
            raise ValueError(f"fault: {fault!r} is not one of {', '.join(INJECTABLE)}")
        if fault == "crash":
            self._faults["crash"] = 1.0
        else:
            self._faults[fault] = factor

    # ------------------------------------------------------------------ training

    def _guard(self, target, master_addr: str, master_port: int) -> None:
        try:
            target(master_addr, master_port)
        except Exception as exc:  # reported through poll(); the supervisor decides what to do
            with self._lock:
                self._error = f"{type(exc).__name__}: {exc}"
                self._events.append(self._log(f"worker failed: {self._error}\n{traceback.format_exc(limit=5)}"))

    def _log(self, line: str) -> dict:
        return {"type": "log", "at": time.time(), "rank": self.rank, "line": line}

    def _emit(self, event: dict) -> None:
        with self._lock:
            self._events.append(event)

    def _run_builtin(self, master_addr: str, master_port: int) -> None:
        import torch

        from jobs.runtime import checkpoints, lm
        from jobs.runtime.corpus import corpus_bytes
        from jobs.runtime.lm_config import trainer_layout

        torch.set_num_threads(max(1, int(self.spec.get("torch_threads", 1))))
        hp = lm.TrainHyperparameters.from_dict(self.spec.get("hyperparameters") or {})
        plan = self.spec.get("parallel_plan")
        layout = trainer_layout(hp, world_size=self.world_size, plan=plan,
                                devices_per_worker=int(self.spec.get("devices_per_worker") or 1))
        group = self._init_process_group(master_addr, master_port)
        dataset_path = self.spec.get("dataset_path") or ""
        data = Path(dataset_path).read_bytes() if dataset_path else corpus_bytes(hp.seed, 20000)
        self._emit(self._log(f"rank {self.rank}: {len(data)} bytes of text from "
                             f"{dataset_path or 'the generated corpus (no dataset given)'}"))
        tokens = lm.tokens_from_bytes(data)
        if plan and self.rank == 0:
            self._emit(self._log(
                f"parallel plan on {plan['accelerator_type']}: {plan['description']} (predicted "
                f"{plan['tokens_per_s']:.0f} tokens/s)"))
        trainer = (_ModelParallelTrainer(self, hp, layout) if layout.model_parallel
                   else _DataParallelTrainer(self, hp, group))
        self._emit(self._log(f"rank {self.rank}: {trainer.description}"))
        ckpt_root = Path(self.spec["checkpoint_dir"])
        start_step = 0
        recent: deque[dict] = deque(maxlen=STEP_RECORD_STEPS)  # rank 0's metric events, for the next checkpoint
        latest = checkpoints.load_latest(ckpt_root)
        if latest is not None:
            info, files = latest
            start_step = trainer.resume(files)  # steps completed
            recorded = read_step_record(files) if self.rank == 0 else []
            self._emit(self._log(f"rank {self.rank}: resumed from checkpoint step {info.step}"))
            if recorded:
                self._emit(self._log(f"rank {self.rank}: replaying the {len(recorded)} step metric(s) recorded with "
                                     f"checkpoint step {info.step}; the control plane keeps those it has not seen"))
            for event in recorded:
                recent.append(event)
                self._emit({**event, "replayed": True})
        with self._lock:
            self._resumed_from = start_step - 1
            self._step = start_step - 1
        interval = max(1, int(self.spec.get("checkpoint_interval_steps", 100)))
        keep_last = max(1, int(self.spec.get("checkpoint_keep_last", 3)))
        # Tokens this worker accounts for: its replica's batch, shared by the replica's tensor and pipeline ranks.
        tokens_per_step = hp.batch_size * hp.context / (layout.tp * layout.pp)
        writer = AsyncCheckpointWriter(ckpt_root, keep_last=keep_last, emit=self._emit)
        for step in range(start_step, hp.steps):
            if self._stop.is_set():
                writer.wait()
                with self._lock:  # after the last event: a poll that sees "stopped" has drained them all
                    self._phase = "stopped"
                return
            started = time.perf_counter()
            self._phase = "compute"
            self._apply_injected_faults(started)
            x, y = lm.batch_for_step(tokens, step=step, rank=trainer.data_rank, world_size=layout.dp,
                                     batch_size=hp.batch_size, context=hp.context, seed=hp.seed)
            if hp.step_sleep_s:
                time.sleep(hp.step_sleep_s)
            timer = _StepTimer(self._set_phase)
            loss = trainer.step(x, y, step=step, timer=timer)
            if "nan" in self._faults:
                self._faults.pop("nan")
                loss = float("nan")
            elapsed = time.perf_counter() - started
            compute = max(0.0, elapsed - timer.waited)
            self._phase = "idle"
            finished = step == hp.steps - 1
            metric = {"type": "metric", "at": time.time(), "rank": self.rank, "step": step, "loss": loss,
                      "step_time": elapsed, "compute_time": compute,
                      "tokens_per_s": tokens_per_step / elapsed if elapsed > 0 else None}
            if self.rank == 0:
                recent.append({**metric, "attempt": self.spec.get("attempt")})
            with self._lock:
                self._step = step
                self._last_loss = loss
                self._compute_times.append(compute)
                self._events.append(metric)
            if not math.isfinite(loss):
                self._phase = "stopped"
                self._emit(self._log(f"rank {self.rank}: loss is {loss} at step {step}; stopping for recovery"))
                return
            if step % 25 == 0 or finished:
                self._emit(self._log(f"step {step} loss {loss:.4f} step_time {elapsed * 1000:.0f} ms"))
            wanted = self._checkpoint_requested.is_set()
            take = trainer.agree(finished or wanted or (step + 1) % interval == 0)
            if take:
                self._checkpoint_requested.clear()
                blocked = time.perf_counter()
                files = trainer.state_files(step + 1)  # a copy in memory; None on ranks that write nothing
                if files is not None:
                    files[STEP_RECORD_FILE] = step_record_bytes(recent)
                    writer.submit(step=step, files=files, requested=wanted,
                                  blocked_s=time.perf_counter() - blocked,
                                  metadata={"job_id": self.spec.get("job_id"), "world_size": self.world_size,
                                            "loss": loss, "trainer": "builtin-transformer-lm",
                                            "layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp}})
        writer.wait()  # the final checkpoint is complete before the run reports done
        with self._lock:
            self._done = True
            self._phase = "done"

    def _set_phase(self, phase: str) -> None:
        self._phase = phase

    def _apply_injected_faults(self, started: float) -> None:
        if "crash" in self._faults:
            os._exit(17)  # what a segfault or an OOM kill looks like from outside
        if "hang" in self._faults:
            self._phase = "compute"
            self._stop.wait()  # blocks until the gang is torn down
        if "slow" in self._faults and self._compute_times:
            if self._slow_base is None:  # the healthy step time, taken once (not the slowed ones)
                self._slow_base = sorted(self._compute_times)[len(self._compute_times) // 2]
            time.sleep((self._faults["slow"] - 1.0) * self._slow_base)

    def _init_process_group(self, master_addr: str, master_port: int):
        if self.world_size <= 1:
            return None
        import torch.distributed as dist

        backend = "nccl" if _cuda_available() else "gloo"
        dist.init_process_group(backend=backend, init_method=f"tcp://{master_addr}:{master_port}",
                                rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=float(self.spec.get("collective_timeout_s", 120))))
        return dist.group.WORLD

    def _all_reduce(self, grads) -> None:
        from jobs.runtime.model_parallel import average_grads

        average_grads(grads, None, self.world_size)

    def _run_entrypoint(self, master_addr: str, master_port: int) -> None:
        env = {**os.environ, **(self.spec.get("envs") or {})}
        env.update({"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "MASTER_ADDR": master_addr,
                    "MASTER_PORT": str(master_port), "FLEETYARD_CHECKPOINT_DIR": self.spec["checkpoint_dir"],
                    "FLEETYARD_JOB_ID": str(self.spec.get("job_id", "")), "PYTHONUNBUFFERED": "1"})
        Path(self.spec["checkpoint_dir"]).mkdir(parents=True, exist_ok=True)
        workdir = self.spec.get("working_dir") or None
        self._phase = "compute"
        # Bytes that are not UTF-8 read as U+FFFD: strict decoding raised UnicodeDecodeError at the first such line a
        # program printed (a progress bar, a binary dump), which killed the worker on every restart (QA).
        self._process = subprocess.Popen(["/bin/sh", "-c", self.spec["entrypoint"]], cwd=workdir, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         encoding="utf-8", errors="replace")
        last = time.perf_counter()
        previous_step: int | None = None
        with self._lock:
            self._resumed_from = -1
        for raw in self._process.stdout:
            line = raw.rstrip("\n")
            self._emit(self._log(line))
            fields = parse_progress_line(line)
            if "step" in fields:
                now = time.perf_counter()
                loss = fields.get("loss")
                step = int(fields["step"])
                step_time = entrypoint_step_time(fields, now - last,
                                                 1 if previous_step is None else step - previous_step)
                with self._lock:
                    self._step = step
                    self._last_loss = loss
                    self._compute_times.append(step_time)
                    self._events.append({"type": "metric", "at": time.time(), "rank": self.rank,
                                         "step": self._step, "loss": loss, "step_time": step_time,
                                         "compute_time": step_time, "tokens_per_s": None})
                last, previous_step = now, step
        code = self._process.wait()
        if code != 0 and not self._stop.is_set():
            raise RuntimeError(f"entrypoint exited with code {code}")
        with self._lock:
            self._done = True
            self._phase = "done"


class _DataParallelTrainer:
    """The built-in LM, whole on every worker; gradients averaged over the gang. Rank 0 writes checkpoints."""

    def __init__(self, worker: TrainingWorker, hp, group) -> None:
        from jobs.runtime import lm

        self.worker, self.hp = worker, hp
        self.model = lm.build_model(hp.model_config(), seed=hp.seed)
        self.optimizer = lm.make_optimizer(self.model, hp)
        self.all_reduce = worker._all_reduce if group else None
        self.data_rank = worker.rank
        self.description = f"data parallel over {worker.world_size} worker(s)"

    def resume(self, files) -> int:
        from jobs.runtime import lm

        return lm.load_model_state(files, self.model, self.optimizer)

    def step(self, x, y, *, step: int, timer: _StepTimer) -> float:
        from jobs.runtime import lm

        return lm.train_step(self.model, self.optimizer, x, y, step=step, hp=self.hp,
                             all_reduce=timer.wrap(self.all_reduce) if self.all_reduce else None)

    def agree(self, take: bool) -> bool:
        return take and self.worker.rank == 0

    def state_files(self, steps_completed: int) -> dict[str, bytes]:
        from jobs.runtime import lm

        return lm.model_state_bytes(self.model, self.optimizer, step=steps_completed, hp=self.hp)


class _ModelParallelTrainer:
    """The built-in LM split tensor x pipeline x data parallel (jobs.runtime.model_parallel). Every rank takes part
    in a checkpoint (the shards are gathered on rank 0, which writes the single-process format)."""

    def __init__(self, worker: TrainingWorker, hp, layout) -> None:
        from jobs.runtime import lm
        from jobs.runtime import model_parallel as mp

        self.worker, self.hp, self.layout = worker, hp, layout
        self.grid = mp.ParallelGrid.create(rank=worker.rank, world_size=worker.world_size, tp=layout.tp, pp=layout.pp)
        self._shard(lm.build_model(hp.model_config(), seed=hp.seed), None)
        self.data_rank = self.grid.dp_rank
        self.description = mp.describe(self.grid, hp.model_config(), layout.micro_batches, layout.source)

    def _shard(self, full, full_optimizer) -> None:
        from jobs.runtime import model_parallel as mp

        self.stage, self.optimizer = mp.stage_from_full(full, self.grid, full_optimizer, self.hp)

    def resume(self, files) -> int:
        from jobs.runtime import lm

        full = lm.build_model(self.hp.model_config(), seed=self.hp.seed)
        full_optimizer = lm.make_optimizer(full, self.hp)
        steps = lm.load_model_state(files, full, full_optimizer)
        self._shard(full, full_optimizer)
        return steps

    def step(self, x, y, *, step: int, timer: _StepTimer) -> float:
        from jobs.runtime import model_parallel as mp

        return mp.parallel_train_step(self.stage, self.optimizer, x, y, step=step, hp=self.hp,
                                      micro_batches=self.layout.micro_batches, wait=timer.run)

    def agree(self, take: bool) -> bool:
        from jobs.runtime import model_parallel as mp

        return mp.broadcast_flag(take, self.grid)  # rank 0 decides: a checkpoint request reaches rank 0 only

    def state_files(self, steps_completed: int) -> dict[str, bytes] | None:
        from jobs.runtime import lm
        from jobs.runtime import model_parallel as mp

        gathered = mp.gather_full_state(self.stage, self.optimizer, self.hp)
        if gathered is None:
            return None
        return lm.model_state_bytes(gathered[0], gathered[1], step=steps_completed, hp=self.hp)


class AsyncCheckpointWriter:
    """Writes checkpoints in a background thread, so training waits only for the state to be copied
    into memory, not for the files to be written and fsynced.

    One write at a time: a new checkpoint waits for the one before it (a slow disk slows training
    rather than piling up copies of the model). The "checkpoint" event goes out only when the
    checkpoint is complete on disk, so the supervisor and the control plane never count on one that
    is still being written; a worker that dies mid-write leaves a temp dir the loader ignores.
    """

    def __init__(self, root: Path, *, keep_last: int, emit) -> None:
        self.root = root
        self.keep_last = keep_last
        self.emit = emit
        self._thread: threading.Thread | None = None

    def submit(self, *, step: int, files: dict[str, bytes], metadata: dict, requested: bool,
               blocked_s: float) -> None:
        waited = time.perf_counter()
        self.wait()
        blocked_s += time.perf_counter() - waited
        self._thread = threading.Thread(target=self._write, args=(step, files, metadata, requested, blocked_s),
                                        name=f"checkpoint-{step}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _write(self, step: int, files: dict[str, bytes], metadata: dict, requested: bool, blocked_s: float) -> None:
        from jobs.runtime import checkpoints

        started = time.perf_counter()
        try:
            info = checkpoints.save_checkpoint(self.root, step=step, files=files, metadata=metadata)
            checkpoints.apply_retention(self.root, keep_last=self.keep_last)
        except Exception as exc:  # reported; training goes on and the next checkpoint tries again
            self.emit({"type": "log", "at": time.time(), "rank": 0,
                       "line": f"checkpoint at step {step} failed: {type(exc).__name__}: {exc}"})
            return
        self.emit({"type": "checkpoint", "at": time.time(), "rank": 0, "step": step, "size_bytes": info.size_bytes,
                   "path": str(info.path), "save_s": time.perf_counter() - started, "blocked_s": blocked_s,
                   "requested": requested})


def step_record_bytes(events) -> bytes:
    """Rank 0's recent metric events as saved with a checkpoint (JSON; a NaN loss stays NaN)."""
    return json.dumps(list(events)).encode("utf-8")


def read_step_record(files: dict[str, bytes]) -> list[dict]:
    """The metric events saved with a checkpoint; [] for a checkpoint without them or with a damaged record (the
    model state verified; losing the record loses only metrics the control plane may already have)."""
    raw = files.get(STEP_RECORD_FILE)
    if not raw:
        return []
    try:
        events = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return []
    if not isinstance(events, list):
        return []
    return [e for e in events if isinstance(e, dict) and e.get("type") == "metric"
            and isinstance(e.get("step"), int) and isinstance(e.get("rank"), int)]


def parse_progress_line(line: str) -> dict[str, float]:
    """`fleetyard: step=12 loss=3.4` -> {"step": 12.0, "loss": 3.4}; other lines -> {}. A program may also
    report its own measured `step_time=` (seconds per step)."""
    text = line.strip()
    if not text.lower().startswith("fleetyard:"):
        return {}
    fields: dict[str, float] = {}
    for part in shlex.split(text.split(":", 1)[1]):
        key, sep, value = part.partition("=")
        if sep and key in ("step", "loss", "step_time"):
            try:
                fields[key] = float(value)
            except ValueError:
                continue
    return fields


def entrypoint_step_time(fields: dict[str, float], elapsed_s: float, steps_advanced: int) -> float:
    """Seconds per step of a user program: the `step_time=` it reported, else the time since its previous
    progress line divided by the steps between the two (a program that prints every 10th step ran 10)."""
    reported = fields.get("step_time")
    if reported is not None and reported > 0 and math.isfinite(reported):
        return reported
    return elapsed_s / max(1, steps_advanced)


class _StepTimer:
    """Measures the time a step spends waiting in the gradient all-reduce (not compute)."""

    def __init__(self, set_phase) -> None:
        self.waited = 0.0
        self._set_phase = set_phase

    def wrap(self, all_reduce):
        def timed(grads):
            self.run(lambda: all_reduce(grads))
        return timed

    def run(self, wait) -> None:
        """Runs `wait` (a collective or a receive from a peer) as time spent waiting on the gang."""
        started = time.perf_counter()
        self._set_phase("allreduce")
        try:
            wait()
        finally:
            self._set_phase("compute")
            self.waited += time.perf_counter() - started


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False
