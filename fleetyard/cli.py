"""The `fleetyard` command: launch and follow training jobs, deploy, upload datasets, see queues and quota.

    fleetyard login --url http://127.0.0.1:8000 --token fy_...
    fleetyard jobs launch train.yaml            # plan, confirm, launch, follow logs, exit with the result
    fleetyard jobs launch train.yaml -y -d      # no prompt, detach: print the job id and return
    fleetyard jobs launch train.yaml --dry-run  # only the plan: type, cost, quota, queue position
    fleetyard jobs queue | jobs status [ID] | jobs logs ID -f | jobs cancel ID | jobs retry ID
    fleetyard deploy serve.yaml | endpoints | scale ID --min N | undeploy ID | datasets upload NAME FILE | quota
    fleetyard plan llama2-70b --batch 512 --devices nvidia-h100:64 --devices nvidia-a100:64 --compare

Every command takes --json (one JSON document on stdout, for scripts; `jobs logs` one per log line). Exit codes:
0 ok; 1 the job ended FAILED or CANCELLED, or the deployment FAILED (in the create's answer, or while --wait
waited); 2 usage or spec error (nothing was submitted); 3 API error (unreachable, auth, rejected by the server,
conflict); 130 interrupted; 141 the reader of the output went away (`fleetyard jobs status --json | head -1`),
quietly, as other commands do.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import getpass
import itertools
import json
import math
import os
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from fleetyard.client import Client, Deployment, check_upload_file, plan_devices, plan_pool, save_config
from fleetyard.errors import ApiError, ConfigError, FleetyardError, NotFound, SpecError, TimeoutExpired
from fleetyard.spec import DEPLOYMENT, JOB, parse_spec

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_API, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `seq 1000000 | head -1` leaves seq with


_COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # SGR colour codes (a training script's coloured log lines)
# C0 and C1 control characters but tab and newline, and the bidi marks, embeddings, overrides and isolates
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def escape(text: str) -> str:
    """Text from the server (names, reasons, descriptions, log lines, error messages) for the terminal: rich markup
    escaped, colour codes dropped, and every other control character shown as \\x1b, \\u202e, ..., not obeyed.
    Before, a dataset description or a cancel reason any team member wrote reached the terminal as it was: an ESC
    sequence could write the clipboard (OSC 52), set the title or clear the screen, a bidi override reorder the
    line (QA)."""
    text = _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), _COLOURS.sub("", str(text)))
    return _markup_escape(text)


class UsageError(FleetyardError):
    """A user mistake found before anything was sent (exit 2)."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich's own answer to a closed pipe is SystemExit(1), the exit code of a failed job: main() handles it."""
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


class _Cli:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.json = bool(getattr(args, "json", False))
        self.out = _Console(highlight=False, soft_wrap=True, emoji=False)
        self.err = _Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
        if not self.out.is_terminal:  # piped or captured: wide tables, never cut to 80 columns
            self.out = _Console(highlight=False, soft_wrap=True, width=240, emoji=False)
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(url=self.args.url, token=self.args.token)
        return self._client

    def emit(self, data) -> None:
        print(json.dumps(data, indent=2, default=str))

    def info(self, text: str) -> None:
        """Progress notes: stdout for people, stderr under --json so stdout stays one JSON document."""
        (self.err if self.json else self.out).print(text)

    # ---------------------------------------------------------------------------- login

    def login(self) -> int:
        url = self.args.url or os.environ.get("FLEETYARD_URL") or _ask("Fleetyard URL", "http://127.0.0.1:8000")
        token = self.args.token or os.environ.get("FLEETYARD_TOKEN")
        if not token:
            if not sys.stdin.isatty():
                raise UsageError("give --token (or FLEETYARD_TOKEN) when not on a terminal")
            token = getpass.getpass("API token (fy_...): ").strip()
        if not token.startswith("fy_"):
            raise UsageError("an API token starts with fy_ (create one in the console or POST /api/v1/api-tokens/)")
        me = Client(url=url, token=token).me()
        path = save_config(url=url.rstrip("/"), token=token)
        if self.json:
            self.emit({"url": url.rstrip("/"), "username": me["username"], "team": me.get("token_team"),
                       "config": str(path)})
        else:
            self.out.print(f"Logged in to {url} as [bold]{escape(me['username'])}[/] (team "
                           f"{escape(str(me.get('token_team')))}); saved to {path}")
        return EXIT_OK

    # ---------------------------------------------------------------------------- specs

    def _read_spec(self, kind: str):
        path = Path(self.args.spec)
        try:
            text = _read_small(path).decode("utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:  # (a UnicodeDecodeError traceback before; QA)
            line = exc.object.count(b"\n", 0, exc.start) + 1
            raise UsageError(f"{path.name}:{line}: not UTF-8 text (a spec is a YAML file); byte "
                             f"{exc.object[exc.start]:#04x} at offset {exc.start}") from None
        spec = parse_spec(text, filename=path.name)  # mistakes are found here, before anything is sent
        if spec.kind != kind:
            command = "fleetyard deploy" if spec.kind == DEPLOYMENT else "fleetyard jobs launch"
            raise UsageError(f"{path.name} describes a {spec.kind.replace('_', ' ')}; use {command}")
        secrets = {}
        for item in self.args.secret or []:
            name, sep, value = item.partition("=")
            if not sep:
                raise UsageError(f"--secret takes NAME=VALUE, got {item!r}")
            secrets[name] = value
        for name in spec.secrets:
            if name not in secrets:
                if name not in os.environ:
                    raise UsageError(f"{path.name}: secrets: {name} is not set in your environment "
                                     f"(export {name}=... or pass --secret {name}=...)")
                secrets[name] = os.environ[name]
        return path, text, spec, secrets

    def _dry_run(self, path: Path, text: str, secrets: dict, what: str) -> int:
        """--dry-run: the plan (the JSON document under --json), and nothing submitted (before, the README named the
        flag and argparse refused it; found by QA)."""
        result = self.client.apply_spec(text, dry_run=True, secrets=secrets, filename=path.name)
        if self.json:
            self.emit(result)
        else:
            self._print_plan(result)
            self.out.print(f"Dry run: nothing was {what}.")
        return EXIT_OK

    def _plan_and_confirm(self, path: Path, text: str, secrets: dict, what: str) -> bool:
        result = self.client.apply_spec(text, dry_run=True, secrets=secrets, filename=path.name)
        if not self.json:
            self._print_plan(result)
        if self.args.yes:
            return True
        if not sys.stdin.isatty():
            raise UsageError(f"not on a terminal: pass -y to {what} without confirming")
        answer = _prompt(f"{what.capitalize()}? [y/N] ").strip().lower()
        return answer in ("y", "yes")

    def _print_plan(self, result: dict) -> None:
        plan = result["plan"]
        for warning in result.get("warnings", []):
            self.out.print(f"[yellow]note:[/] {escape(warning)}")
        table = Table(title=f"Plan for {escape(plan['name'])} ({plan['kind'].replace('_', ' ')})", title_justify="left")
        for column in ("type", "needs", "$/h", "free now", "quota left", "fits now"):
            table.add_column(column)
        chosen = (plan.get("chosen") or {}).get("accelerator_type")
        for option in plan["options"]:
            mark = "[bold green]*[/] " if option["accelerator_type"] == chosen else "  "
            table.add_row(mark + escape(option["accelerator_type"]), f"{option['units']:g} {option['unit']}",
                          _money(option["cost_per_hour_usd"]), f"{option['free_units']:g}",
                          "-" if option["quota_left"] is None else f"{option['quota_left']:g}",
                          "yes" if option["fits_now"] else "no")
        self.out.print(table)
        for slug, layout in (plan.get("parallel_plan") or {}).items():
            self.out.print(f"Parallel plan on {escape(slug)}: {escape(layout['description'])}, "
                           f"{layout['tokens_per_s']:,.0f} tokens/s, {layout['memory_gb']:g} GB per device")
        for slug, why in (plan.get("parallel_plan_cannot_run") or {}).items():  # (left unsaid before; QA)
            self.out.print(f"[yellow]Cannot run the model on {escape(slug)}:[/] {escape(why)}")
        if plan.get("chosen"):
            self.out.print(f"Chosen: [bold]{escape(chosen)}[/] - {escape(plan['chosen']['reason'])}")
            self.out.print(f"Cost: {_money(plan['chosen']['cost_per_hour_usd'])} per hour")
        queue = plan.get("queue") or {}
        if queue.get("position") is not None:
            self.out.print(f"Queue: {escape(queue['local_queue'])} -> cluster queue "
                           f"{escape(queue['cluster_queue'])}, position {queue['position']} "
                           f"({queue['waiting_ahead']} waiting ahead)")
        for note in plan.get("notes", []):
            self.out.print(f"[dim]{escape(note)}[/]")

    # ---------------------------------------------------------------------------- jobs

    def jobs_launch(self) -> int:
        path, text, _spec, secrets = self._read_spec(JOB)
        if self.args.dry_run:
            return self._dry_run(path, text, secrets, "launched")
        if not self._plan_and_confirm(path, text, secrets, "launch"):
            self.info("Not launched.")
            return EXIT_OK
        result = self.client.apply_spec(text, secrets=secrets, filename=path.name)
        job = result["object"]
        self.info(f"Launched training job [bold]{job['id']}[/] ({escape(job['name'])}): "
                  f"{escape(job['status']['state'])} - {escape(job['status']['reason'])}")
        if self.args.detach:
            if self.json:
                self.emit({"plan": result["plan"], "job": job})
            else:
                self.out.print(f"Follow it with: fleetyard jobs logs {job['id']} -f")
            return EXIT_OK
        self._follow(job["id"])
        final = self.client.training_job(job["id"])
        if self.json:
            self.emit({"plan": result["plan"], "job": final.raw})
        return self._job_exit(final)

    def _follow(self, job_id: int) -> None:
        target = self.err if self.json else self.out
        for line in self.client.logs(job_id, follow=True):
            prefix = f"[w{line.worker}] " if line.worker is not None else ""
            target.print(escape(prefix + line.line))

    def _job_exit(self, job) -> int:
        if not self.json:
            color = "green" if job.state == "SUCCEEDED" else "red"
            self.out.print(f"Job {job.id} [bold {color}]{job.state}[/]: {escape(job.reason)}")
        return EXIT_OK if job.state == "SUCCEEDED" else EXIT_JOB_FAILED

    def jobs_queue(self) -> int:
        jobs = list(self.client.training_jobs(state="QUEUED"))
        jobs.sort(key=lambda j: (j.queue, j.queue_position or 10**9, j.id))
        if self.json:
            self.emit([j.raw for j in jobs])
            return EXIT_OK
        table = Table(title="Waiting jobs", title_justify="left")
        for column in ("id", "name", "queue", "position", "accelerators", "why it waits"):
            table.add_column(column)
        for j in jobs:
            table.add_row(str(j.id), escape(j.name), escape(j.queue), str(j.queue_position or "-"),
                          escape(", ".join(j.accelerator_types)), escape(j.reason))
        self.out.print(table if jobs else "No jobs are waiting.")
        return EXIT_OK

    def jobs_status(self) -> int:
        if self.args.job_id is not None:
            job = self.client.training_job(self.args.job_id)
            if self.json:
                self.emit(job.raw)
                return EXIT_OK
            status = job.raw["status"]
            table = Table(show_header=False, title=f"Training job {job.id}: {escape(job.name)}", title_justify="left")
            table.add_column("field", style="bold")
            table.add_column("value")
            rows = [("state", job.state), ("reason", job.reason), ("team", job.team), ("queue", job.queue),
                    ("queue position", status.get("queue_position")),
                    ("accepted types", ", ".join(job.accelerator_types)),
                    ("admitted type", status.get("admitted_accelerator_type") or "-"),
                    ("workers", status.get("workers")), ("step", _step(status.get("step"))),
                    ("last checkpoint", _step(status.get("last_checkpoint_step"))),
                    ("restarts", status.get("restarts")),
                    ("ETTR", (status.get("goodput") or {}).get("ettr"))]
            for name, value in rows:
                table.add_row(name, escape("-" if value in (None, "") else str(value)))
            self.out.print(table)
            return EXIT_OK
        # The first `limit` jobs only: list() of the whole iterator fetched every page of the team's jobs for them
        # (300 requests for `--limit 3` of 900 jobs; QA).
        jobs = list(itertools.islice(self.client.training_jobs(ordering="-created_at", page_size=self.args.limit),
                                     self.args.limit))
        if self.json:
            self.emit([j.raw for j in jobs])
            return EXIT_OK
        table = Table(title="Training jobs", title_justify="left")
        for column in ("id", "name", "team", "queue", "state", "type", "step", "reason"):
            table.add_column(column)
        for j in jobs:
            table.add_row(str(j.id), escape(j.name), escape(j.team), escape(j.queue), _state(j.state),
                          escape(j.admitted_accelerator_type or "-"), _step(j.step), escape(j.reason))
        self.out.print(table if jobs else "No training jobs.")
        return EXIT_OK

    def jobs_logs(self) -> int:
        if self.args.follow:
            if self.json:
                for line in self.client.logs(self.args.job_id, follow=True):
                    print(json.dumps(line.__dict__), flush=True)
            else:
                self._follow(self.args.job_id)
            return self._job_exit(self.client.training_job(self.args.job_id))  # (under --json too: it said 0; QA)
        lines = list(self.client.logs(self.args.job_id))
        if self.json:
            self.emit([line.__dict__ for line in lines])
        else:
            for line in lines:
                prefix = f"[w{line.worker}] " if line.worker is not None else ""
                self.out.print(escape(prefix + line.line))
        return EXIT_OK

    def jobs_cancel(self) -> int:
        job = self.client.cancel_training_job(self.args.job_id, reason=self.args.reason or "")
        if self.json:
            self.emit(job.raw)
        else:
            self.out.print(f"Job {job.id} {job.state}: {escape(job.reason)}")
        return EXIT_OK

    def jobs_retry(self) -> int:
        job = self.client.retry_training_job(self.args.job_id)
        if self.json:
            self.emit(job.raw)
        else:
            self.out.print(f"Job {job.id} ({escape(job.name)}) submitted as a retry of job {self.args.job_id}: "
                           f"{job.state}")
        return EXIT_OK

    # ---------------------------------------------------------------------------- deployments

    def deploy(self) -> int:
        path, text, _spec, secrets = self._read_spec(DEPLOYMENT)
        if self.args.dry_run:
            return self._dry_run(path, text, secrets, "deployed")
        if not self._plan_and_confirm(path, text, secrets, "deploy"):
            self.info("Not deployed.")
            return EXIT_OK
        result = self.client.apply_spec(text, secrets=secrets, filename=path.name)
        deployment = result["object"]
        self.info(f"Created deployment [bold]{deployment['id']}[/] ({escape(deployment['name'])}): "
                  f"{escape(deployment['status']['state'])} - {escape(deployment['status']['reason'])}")
        if self.args.wait:
            try:
                deployment = self.client.wait_for_deployment(deployment["id"], timeout=self.args.wait).raw
            except TimeoutExpired as exc:
                # The deployment as last seen (no further request: the time given has run out; QA)
                if self.json:
                    self.emit({"plan": result["plan"], "deployment": exc.last.raw if exc.last else deployment})
                self.err.print(f"[red]error:[/] {escape(str(exc))}")
                return EXIT_JOB_FAILED
            self.info(f"Serving: call model {escape(deployment['name'])!r} at {self.client.url}/v1/chat/completions")
        if self.json:
            self.emit({"plan": result["plan"], "deployment": deployment})
        if deployment["status"]["state"] == "FAILED":  # refused at once: exit 1 as --wait does (it said 0; QA)
            self.err.print(f"[red]error:[/] deployment {deployment['id']} ended FAILED "
                           f"({escape(deployment['status']['reason'])})")
            return EXIT_JOB_FAILED
        return EXIT_OK

    def endpoints(self) -> int:
        deployments = [d for d in self.client.deployments(ordering="name") if d.state != "DELETED"]
        if self.json:
            self.emit([{**d.raw, "endpoint": f"{self.client.url}/v1", "model": d.name} for d in deployments])
            return EXIT_OK
        table = Table(title=f"Endpoints (OpenAI-compatible at {self.client.url}/v1)", title_justify="left")
        for column in ("id", "model", "team", "state", "replicas", "type", "SLA p95 ttft/tpot", "reason"):
            table.add_column(column)
        for d in deployments:
            spec, status = d.raw["spec"], d.raw["status"]
            table.add_row(str(d.id), escape(d.name), escape(d.team), _state(d.state),
                          f"{status.get('replicas_ready', 0)}/{status.get('replicas_target', 0)}",
                          escape(status.get("accelerator_type") or "-"),
                          f"{spec['sla']['ttft_p95_ms']} / {spec['sla']['tpot_p95_ms']} ms", escape(d.reason))
        self.out.print(table if deployments else "No deployments.")
        return EXIT_OK

    def scale(self) -> int:
        """`fleetyard scale ID --min N [--max M]`: the SDK's scale_deployment (before 2026-11-29 only the SDK, the
        API and the console could)."""
        if self.args.min == 0 and self.args.max is None:  # (the API then got max 0 and refused it: review)
            raise UsageError("--min 0 runs as 1 (scaling to zero is not built: one replica stays up while the "
                             "deployment is): give --max too (at least 1), the most it may scale out to")
        deployment = self.client.scale_deployment(self.args.deployment_id, replicas_min=self.args.min,
                                                  replicas_max=self.args.max)
        if self.json:
            self.emit(deployment.raw)
        else:
            spec = deployment.raw.get("spec", {})
            self.out.print(f"Deployment {deployment.id} ({escape(deployment.name)}) {deployment.state}: replicas "
                           f"{spec.get('replicas_min')}-{spec.get('replicas_max')}")
        return EXIT_OK

    def undeploy(self) -> int:
        """`fleetyard undeploy ID`: delete a deployment (asks first on a terminal; -y does not)."""
        deployment = self.client.deployment(self.args.deployment_id)
        if not self.args.yes:
            if not sys.stdin.isatty():
                raise UsageError("not on a terminal: pass -y to delete the deployment without confirming")
            answer = _prompt(f"Delete deployment {deployment.id} ({deployment.name}, {deployment.state})? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                self.info("Not deleted.")
                return EXIT_OK
        self.client.delete_deployment(deployment.id)
        try:
            after = self.client.deployment(deployment.id)
        except NotFound:  # a deployment that never served (e.g. FAILED) is removed at once
            after = Deployment.from_dict({**deployment.raw, "status": {"state": "DELETED", "reason": "removed"}})
        if self.json:
            self.emit(after.raw)
        else:
            self.out.print(f"Deployment {after.id} ({escape(after.name)}) {after.state}: {escape(after.reason)}")
        return EXIT_OK

    # ---------------------------------------------------------------------------- datasets

    def datasets_upload(self) -> int:
        path = Path(self.args.file)
        try:
            size = check_upload_file(path)  # before anything is created: a bad file leaves nothing behind
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        show = not self.json and self.err.is_terminal
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), console=self.err, disable=not show) as progress:
            task = progress.add_task(f"uploading {path.name}", total=size)
            # (a dataset this command creates is deleted again if the upload fails)
            version = self.client.upload_dataset(
                self.args.name, path, fmt=self.args.format or "", description=self.args.description or "",
                progress=lambda sent, total: progress.update(task, completed=sent))
        if self.json:
            self.emit(version)
        else:
            self.out.print(f"Uploaded {path.name} as [bold]{escape(version['reference'])}[/] "
                           f"({version['size_bytes']} bytes, sha256 {version.get('checksum_sha256', '')[:12]})")
        return EXIT_OK

    def datasets_list(self) -> int:
        datasets = list(self.client.datasets())
        if self.json:
            self.emit(datasets)
            return EXIT_OK
        table = Table(title="Datasets", title_justify="left")
        for column in ("id", "name", "team", "versions", "latest", "description"):
            table.add_column(column)
        for d in datasets:
            latest = d.get("latest_version")
            latest_text = latest.get("reference", "") if isinstance(latest, dict) else str(latest or "-")
            table.add_row(str(d["id"]), escape(d["name"]), escape(str(d["team"])), str(d.get("version_count", "")),
                          escape(latest_text), escape(d.get("description", "")))
        self.out.print(table if datasets else "No datasets.")
        return EXIT_OK

    # ---------------------------------------------------------------------------- parallel plans

    def plan(self) -> int:
        model = self._plan_model(self.args.model)
        pools = [_plan_pool_arg(text) for text in self.args.pool or []]
        devices = [_plan_devices_arg(text) for text in self.args.devices or []]
        if not pools and not devices:
            raise UsageError("name what to plan on: --pool NAME[:DEVICES] and/or --devices TYPE:COUNT[:PER_NODE]")
        options = {}
        for item in self.args.option or []:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise UsageError(f"--option takes NAME=VALUE, got {item!r}")
            options[name] = _option_value(value)
        result = self.client.plan(model, self.args.batch, pools=pools, devices=devices, options=options,
                                  compare=self.args.compare)
        if self.json:
            self.emit(result)
            return EXIT_OK
        self._print_parallel_plan(result)
        return EXIT_OK

    def _plan_model(self, text: str):
        """A preset name, or a JSON/YAML file of model fields (read and checked here: a mistake in it is a usage
        error, exit 2, before anything is sent)."""
        path = Path(text)
        looks_like_path = os.sep in text or path.suffix.lower() in (".json", ".yaml", ".yml")
        if not (looks_like_path or path.exists()):
            return text  # a preset name; the server knows them
        if path.exists() and not path.is_file():
            raise UsageError(f"{text}: not a file (give a model preset or a JSON/YAML file of the model's fields)")
        try:
            raw = _read_small(path).decode("utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UsageError(f"{path.name}: not UTF-8 text (a JSON or YAML file of the model's fields)") from None
        fields = _parse_fields(raw, path.name, as_json=path.suffix.lower() == ".json")
        if not isinstance(fields, dict):
            raise UsageError(f"{path.name}: give the model's fields as a mapping (layers: 32, hidden: 4096, ...)")
        try:
            json.dumps(fields, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{path.name}: a value cannot be sent as JSON ({exc}); write numbers as numbers and "
                             "anything else in quotes") from None
        return fields

    def _print_parallel_plan(self, result: dict) -> None:
        model = result["model"]
        pools = ", ".join(f"{escape(p['name'])} ({p['devices']} {escape(p['accelerator_type'])}"
                          f"{', SIMULATED' if p.get('simulated') else ''}"
                          f"{', hypothetical' if p['source'] == 'hypothetical' else ''})" for p in result["pools"])
        self.out.print(f"Plan for [bold]{escape(model.get('name') or model.get('preset') or 'model')}[/] "
                       f"({model['parameters'] / 1e9:.2f}B parameters), global batch {result['global_batch_size']} "
                       f"on {pools}")
        simulated = {p["name"] for p in result["pools"] if p.get("simulated")}
        if simulated:
            self.out.print(f"[yellow]SIMULATED[/] pool(s) {escape(', '.join(sorted(simulated)))}: the predictions use "
                           "the real chips' published figures; no such chip ran anything here.")
        if not result["feasible"]:
            self.out.print(f"[red]No plan:[/] {escape(result['reason'])}")
        else:
            table = Table(title="Best plan and alternatives (predicted by the cost model, not measured)",
                          title_justify="left")
            for column in ("", "layout", "devices", "step s", "tokens/s", "MFU", "memory GB", "$/h", "$/M tokens"):
                table.add_column(column)
            for rank, option in enumerate([result["best"], *result["alternatives"]]):
                table.add_row("best" if rank == 0 else str(rank), escape(option["description"]),
                              str(option["layout"]["devices"]), f"{option['step_time_s']:.3g}",
                              f"{option['tokens_per_s']:,.0f}", f"{option['mfu']:.1%}",
                              f"{option['memory_gb']:.1f} / {option['memory_limit_gb']:.1f}",
                              _money(option["cost_per_hour_usd"]), _money(option["cost_per_million_tokens_usd"]))
            self.out.print(table)
            self.out.print(f"Why: {escape(result['best']['reason'] or result['reason'])}")
        comparison = result.get("compare")
        if comparison:
            table = Table(title="Each accelerator type alone", title_justify="left")
            for column in ("type", "devices", "best layout", "tokens/s", "$/M tokens", "step time vs the mix"):
                table.add_column(column)
            for row in comparison["by_type"]:
                best = row["best"]
                ratio = row["step_time_ratio_to_mix"]
                label = row["accelerator_type"] + (" (SIMULATED)" if row["pools"] and simulated.issuperset(row["pools"])
                                                   else "")
                table.add_row(escape(label), str(row["devices"]),
                              escape(best["description"]) if best else f"[red]{escape(row['reason'])}[/]",
                              f"{best['tokens_per_s']:,.0f}" if best else "-",
                              _money(best["cost_per_million_tokens_usd"]) if best else "-",
                              "-" if ratio is None else f"{ratio:.2f}x")
            self.out.print(table)
            speedup = comparison.get("mix_speedup_over_fastest_single_type")
            if speedup is not None and len(comparison["by_type"]) > 1:
                self.out.print(f"The mix is {speedup:.2f}x the fastest single type "
                               f"({escape(str(comparison['fastest_single_type']))}).")
        self.out.print(f"[dim]{result['candidates_evaluated']:,} layouts evaluated in "
                       f"{result['search_time_s']:.2f} s[/]")
        for note in result.get("assumptions", []):
            self.out.print(f"[dim]assumed: {escape(note)}[/]")

    # ---------------------------------------------------------------------------- quota

    def quota(self) -> int:
        local = self.client.local_queues()
        clusters = {q["name"]: q for q in self.client.cluster_queues()}
        rows = []
        for queue in local:
            cq = clusters.get(queue["cluster_queue"], {})
            for quota in cq.get("quotas", []):
                rows.append({"team": queue["team"], "queue": queue["name"], "cluster_queue": queue["cluster_queue"],
                             "cohort": cq.get("cohort", ""), **quota})
        if self.json:
            self.emit(rows)
            return EXIT_OK
        table = Table(title="Quota", title_justify="left")
        for column in ("team", "queue", "cluster queue", "cohort", "type", "nominal", "borrowing limit",
                       "lending limit"):
            table.add_column(column)
        for r in rows:
            table.add_row(escape(r["team"]), escape(r["queue"]), escape(r["cluster_queue"]), escape(r["cohort"]),
                          escape(r["accelerator_type"]), f"{r['nominal_quota']:g}", _limit(r["borrowing_limit"]),
                          _limit(r["lending_limit"]))
        self.out.print(table if rows else "No queues.")
        return EXIT_OK


MAX_FILE_BYTES = 16 << 20  # a spec or a model file: a few KB (the server takes a spec of 64 KiB unless told otherwise)


def _read_small(path: Path) -> bytes:
    """A spec or model file's bytes, read no further than MAX_FILE_BYTES: a checkpoint or a disk image given by
    mistake (or /dev/zero) was read whole into memory before anything was said about it (QA). OSError passes."""
    with path.open("rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{path.name}: larger than {MAX_FILE_BYTES >> 20} MiB; a spec or model file is a few KB of "
                         "YAML or JSON (is it the right file?)")
    return data


def _parse_fields(raw: str, name: str, *, as_json: bool):
    """A model file's fields: JSON for a .json file (tabs allowed), else YAML; a mistake names its line and column."""
    if as_json:
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"{name}: not valid JSON: {exc}") from None
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{name}: not valid YAML: {where}{problem}") from None


def _plan_pool_arg(text: str) -> dict:
    """--pool NAME or NAME:DEVICES."""
    try:
        return plan_pool(text)
    except ValueError as exc:
        raise UsageError(f"--pool: {exc}") from None


def _plan_devices_arg(text: str) -> dict:
    """--devices TYPE:COUNT or TYPE:COUNT:DEVICES_PER_NODE."""
    try:
        return plan_devices(text)
    except ValueError as exc:
        raise UsageError(f"--devices: {exc}") from None


def _option_value(text: str):
    """--option values: true/false, whole numbers, or text as given."""
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def _seconds(text: str) -> float:
    """--wait SECONDS: a finite number, not below 0 (before, -5 created the deployment and then failed the wait at
    once, and nan waited for good; QA). An argparse type: a mistake is a usage error before anything is sent."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {text!r}")
    return value


def _whole_number(minimum: int):
    """An argparse type: a whole number from `minimum` (--limit N from 1: before, 0 or -1 went to the server and came
    back as a 400 about `page_size`, a parameter the user never wrote; QA. scale --min N from 0, which runs as
    1: scaling to zero is not built)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number from {minimum}, got {text!r}")
        return value

    return parse


_positive_int = _whole_number(1)
_replicas = _whole_number(0)


def _given(text: str) -> str:
    """--url / --token: an empty value is refused (before, `--token ''` quietly fell back to FLEETYARD_TOKEN or the
    saved token: QA)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a value, or leave the option out to use the environment or "
                                         "the login config")
    return text


def _ask(prompt: str, default: str) -> str:
    if not sys.stdin.isatty():
        return default
    answer = _prompt(f"{prompt} [{default}]: ").strip()
    return answer or default


def _prompt(text: str) -> str:
    """A question on stderr, the answer from stdin. input() wrote its prompt to stdout: under --json it went into the
    JSON document (`fleetyard undeploy 5 --json > out.json` wrote "Delete deployment ...? [y/N] {...}") and, with
    stdout redirected, the question was never seen while the command waited for its answer (QA)."""
    sys.stderr.write(text)
    sys.stderr.flush()
    return input()


def _money(value) -> str:
    if value is None:
        return "unknown"
    if 0 < abs(value) < 0.01:  # "$0.00" read as free
        return f"${value:.2g}"
    return f"${value:,.2f}"


def _limit(value) -> str:
    return "unlimited" if value is None else f"{value:g}"


def _step(value) -> str:
    """A step for people: "-" before the first one (the API says -1 then; QA saw "step -1", "last checkpoint -1")."""
    return "-" if value is None or value == "" or int(value) < 0 else str(value)


def _state(state: str) -> str:
    color = {"SUCCEEDED": "green", "RUNNING": "cyan", "SERVING": "green", "FAILED": "red", "CANCELLED": "yellow",
             "QUEUED": "magenta", "DEGRADED": "yellow"}.get(state)
    return f"[{color}]{state}[/]" if color else escape(state)


def build_parser() -> argparse.ArgumentParser:
    # The shared options work before or after the command. The subcommands' copies default to SUPPRESS so
    # that they do not reset what was given before the command (two parsers: argparse shares actions).
    def shared(default_json, default_none) -> argparse.ArgumentParser:
        options = argparse.ArgumentParser(add_help=False)
        options.add_argument("--json", action="store_true", default=default_json,
                             help="print JSON for scripts: one document (`jobs logs` prints one per log line)")
        options.add_argument("--url", default=default_none, type=_given,
                             help="server URL (default: FLEETYARD_URL or the login config)")
        options.add_argument("--token", default=default_none, type=_given,
                             help="API token (default: FLEETYARD_TOKEN or the login config)")
        return options

    common = shared(argparse.SUPPRESS, argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="fleetyard", parents=[shared(False, None)],
        description="Fleetyard: train and serve on your team's accelerators.",
        epilog="exit codes: 0 ok, 1 job failed or cancelled, or deployment failed, 2 usage or spec error, 3 API error, "
               "130 interrupted, 141 the output's reader went away (| head)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    login = commands.add_parser("login", parents=[common], help="save the server URL and an API token")
    login.set_defaults(run=_Cli.login)

    jobs = commands.add_parser("jobs", help="training jobs").add_subparsers(dest="jobs_command", metavar="ACTION",
                                                                           required=True)
    launch = jobs.add_parser("launch", parents=[common], help="plan, confirm and launch a job from a YAML spec")
    launch.add_argument("spec", help="the job's YAML spec")
    launch.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    launch.add_argument("-d", "--detach", action="store_true", help="return once launched; do not follow logs")
    launch.add_argument("--dry-run", action="store_true", help="print the plan and exit; nothing is launched")
    launch.add_argument("--secret", action="append", metavar="NAME=VALUE", help="a secret the spec names")
    launch.set_defaults(run=_Cli.jobs_launch)
    queue = jobs.add_parser("queue", parents=[common], help="waiting jobs, their positions and why they wait")
    queue.set_defaults(run=_Cli.jobs_queue)
    status = jobs.add_parser("status", parents=[common], help="one job in detail, or the latest jobs")
    status.add_argument("job_id", type=int, nargs="?")
    status.add_argument("--limit", type=_positive_int, default=20, metavar="N", help="how many of the latest jobs")
    status.set_defaults(run=_Cli.jobs_status)
    logs = jobs.add_parser("logs", parents=[common], help="a job's log lines")
    logs.add_argument("job_id", type=int)
    logs.add_argument("-f", "--follow", action="store_true", help="stream until the job ends, exit with its result")
    logs.set_defaults(run=_Cli.jobs_logs)
    cancel = jobs.add_parser("cancel", parents=[common], help="cancel a job")
    cancel.add_argument("job_id", type=int)
    cancel.add_argument("--reason", default="")
    cancel.set_defaults(run=_Cli.jobs_cancel)
    retry = jobs.add_parser("retry", parents=[common], help="submit an ended job again, with the same spec")
    retry.add_argument("job_id", type=int)
    retry.set_defaults(run=_Cli.jobs_retry)

    deploy = commands.add_parser("deploy", parents=[common], help="plan, confirm and create a deployment")
    deploy.add_argument("spec", help="the deployment's YAML spec")
    deploy.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    deploy.add_argument("--dry-run", action="store_true", help="print the plan and exit; nothing is deployed")
    deploy.add_argument("--wait", type=_seconds, default=0, metavar="SECONDS",
                        help="wait until it is SERVING (exit 1 if it fails or the time runs out; without "
                             "--wait, exit 1 if the create's answer already says FAILED)")
    deploy.add_argument("--secret", action="append", metavar="NAME=VALUE")
    deploy.set_defaults(run=_Cli.deploy)
    endpoints = commands.add_parser("endpoints", parents=[common], help="deployments and their endpoints")
    endpoints.set_defaults(run=_Cli.endpoints)
    scale = commands.add_parser("scale", parents=[common], help="set a deployment's replica range")
    scale.add_argument("deployment_id", type=int)
    scale.add_argument("--min", type=_replicas, required=True, metavar="N",
                       help="replicas it keeps at least (0: none when idle, with --max)")
    scale.add_argument("--max", type=_positive_int, default=None, metavar="M",
                       help="replicas it may scale out to (default: as many as --min)")
    scale.set_defaults(run=_Cli.scale)
    undeploy = commands.add_parser("undeploy", parents=[common], help="delete a deployment")
    undeploy.add_argument("deployment_id", type=int)
    undeploy.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    undeploy.set_defaults(run=_Cli.undeploy)

    datasets = commands.add_parser("datasets", help="datasets").add_subparsers(dest="datasets_command",
                                                                               metavar="ACTION", required=True)
    upload = datasets.add_parser("upload", parents=[common], help="upload a file as a dataset's next version")
    upload.add_argument("name", help="the dataset (created if it does not exist)")
    upload.add_argument("file")
    upload.add_argument("--format", default="",
                        help="text, jsonl, csv, parquet, arrow, tar or other (default: the server's, other)")
    upload.add_argument("--description", default="")
    upload.set_defaults(run=_Cli.datasets_upload)
    dlist = datasets.add_parser("list", parents=[common], help="datasets of your teams")
    dlist.set_defaults(run=_Cli.datasets_list)

    plan = commands.add_parser("plan", parents=[common],
                               help="plan a training run's parallel layout, speed and cost without submitting it")
    plan.add_argument("model", help="a model preset (llama2-70b, gpt3-175b, ...) or a JSON/YAML file of its fields")
    plan.add_argument("--batch", "--global-batch-size", dest="batch", type=int, required=True, metavar="N",
                      help="sequences per optimizer step")
    plan.add_argument("--pool", action="append", metavar="NAME[:DEVICES]",
                      help="a node pool (its healthy nodes), or that many of its devices; repeatable")
    plan.add_argument("--devices", action="append", metavar="TYPE:COUNT[:PER_NODE]",
                      help="hypothetical devices of an accelerator type (8 per node unless given); repeatable")
    plan.add_argument("--compare", action="store_true", help="also plan each accelerator type alone")
    plan.add_argument("--option", action="append", metavar="NAME=VALUE",
                      help="a search option (allow_heterogeneous=true, max_alternatives=5, ...); repeatable")
    plan.set_defaults(run=_Cli.plan)

    quota = commands.add_parser("quota", parents=[common], help="your queues and their quota per accelerator type")
    quota.set_defaults(run=_Cli.quota)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 0 for --help, 2 for usage errors
        return int(exc.code or 0)
    cli = _Cli(args)
    try:
        return args.run(cli)
    except SpecError as exc:
        for message in exc.messages:
            cli.err.print(escape(message))
        return EXIT_USAGE
    except UsageError as exc:
        cli.err.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_USAGE
    except (ApiError, ConfigError, TimeoutExpired) as exc:
        body = getattr(exc, "body", None)
        if isinstance(body, dict) and isinstance(body.get("spec"), list):  # the server found a spec mistake
            for message in body["spec"]:
                cli.err.print(escape(str(message)))
            return EXIT_USAGE
        cli.err.print(f"[red]error:[/] {escape(str(exc))}")
        for note in getattr(exc, "__notes__", ()):  # e.g. a dataset an upload created that could not be undone
            cli.err.print(escape(str(note)))
        return EXIT_API
    except EOFError:  # Ctrl-D at a prompt (login's URL or token, a launch or deploy confirmation): a traceback before
        cli.err.print("\n[red]error:[/] no answer (end of input); nothing was changed")
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        cli.err.print("interrupted")
        for note in getattr(exc, "__notes__", ()):
            cli.err.print(escape(str(note)))
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (`fleetyard jobs status --json | head -1`): stop quietly, as other commands
        # do. Before, a BrokenPipeError traceback (found by QA). Stdout is pointed at /dev/null so that the
        # interpreter's last flush of what is left in its buffer does not fail again on the way out.
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):  # (not a real file: in-process tests)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
