"""The `fleetyard` CLI against the real Django app over HTTP (live_server): login, launch with the plan and
followed logs, detach, queue/status/logs/cancel, deploy and endpoints, datasets upload/list, quota,
`--json` output, exit codes, and spec errors printed as `file:line: field: reason` without a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleetyard.cli import main
from inference.models import Deployment
from jobs.models import TrainingJob, TrainingLogLine
from tests.conftest import write_model_folder

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]

JOB_SPEC = """\
name: {name}
queue: default
workers: 2
resources:
  accelerators: H100:8
hyperparameters: {{steps: 100}}
checkpoint: {{interval_steps: 25}}
"""
SERVE_SPEC = """\
name: chat
queue: default
resources:
  accelerators: A100:0.5
service:
  model: file:///checkpoints/lm/step-100
  replicas: {min: 1, max: 3}
  sla: {ttft_p95: 500ms, tpot_p95: 50ms}
"""


@pytest.fixture
def cli(live, monkeypatch, capsys):
    monkeypatch.setenv("FLEETYARD_URL", live.url)
    monkeypatch.setenv("FLEETYARD_TOKEN", live.token)

    def run(*argv) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_login_saves_the_config(live, tmp_path, monkeypatch, capsys):
    assert main(["login", "--url", live.url, "--token", live.token, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["username"] == "alpha-member" and out["team"] == "alpha"
    config = Path(os.environ["FLEETYARD_CONFIG"])
    assert json.loads(config.read_text())["token"] == live.token and (config.stat().st_mode & 0o777) == 0o600
    assert main(["quota", "--json"]) == 0  # later commands read the saved config
    assert main(["login", "--url", live.url, "--token", "fy_bad"]) == 3
    assert "401" in capsys.readouterr().err


def test_launch_prints_the_plan_follows_logs_and_exits_with_the_result(cli, live, tmp_path, capsys):
    spec = write(tmp_path, "train.yaml", JOB_SPEC.format(name="followed"))
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", main(["jobs", "launch", spec, "-y"])))
    thread.start()
    live.sync_until_done("followed")
    thread.join(timeout=60)
    assert result["code"] == 0
    out = capsys.readouterr().out
    assert "Plan for followed" in out and "Chosen: nvidia-h100" in out and "$63.84 per hour" in out
    assert "position 1" in out and "Launched training job" in out and "SUCCEEDED" in out
    job = TrainingJob.objects.get(name="followed")
    logs = TrainingLogLine.objects.filter(job=job)
    assert logs.exists() and all(line.line in out for line in logs[:5])

    code, out, _ = cli("jobs", "status", str(job.pk), "--json")
    assert code == 0 and json.loads(out)["status"]["state"] == "SUCCEEDED"
    code, out, _ = cli("--json", "jobs", "logs", str(job.pk))
    assert code == 0 and len(json.loads(out)) == logs.count()
    code, out, _ = cli("jobs", "logs", str(job.pk), "-f")
    assert code == 0 and "SUCCEEDED" in out


def test_detach_queue_status_and_cancel(cli, tmp_path):
    code, out, _ = cli("jobs", "launch", write(tmp_path, "a.yaml", JOB_SPEC.format(name="first")), "-y", "-d", "--json")
    assert code == 0
    first = json.loads(out)["job"]
    assert first["status"]["state"] in ("STARTING", "ADMITTED")
    second_spec = write(tmp_path, "b.yaml", JOB_SPEC.format(name="second"))
    code, out, _ = cli("jobs", "launch", second_spec, "-y", "-d", "--json")
    second = json.loads(out)
    assert second["plan"]["chosen"]["fits_now"] is False and "nothing fits now" in second["plan"]["chosen"]["reason"]
    code, out, _ = cli("jobs", "queue", "--json")
    waiting = json.loads(out)
    assert [j["name"] for j in waiting] == ["second"] and waiting[0]["status"]["queue_position"] == 1
    assert waiting[0]["status"]["reason"].startswith("position 1 in cluster queue shared")
    code, out, _ = cli("jobs", "queue")
    assert code == 0 and "second" in out and "position 1 in cluster" in out
    code, out, _ = cli("jobs", "status")
    assert code == 0 and "first" in out and "second" in out
    code, out, _ = cli("jobs", "status", str(second["job"]["id"]))  # before its first step: "-", not "-1" (QA)
    assert code == 0 and "-1" not in out and re.search(r"step\s+│\s+-\s", out), out
    code, out, _ = cli("jobs", "cancel", str(second["job"]["id"]))
    assert code == 0 and "CANCELLED" in out
    code, _, err = cli("jobs", "cancel", str(second["job"]["id"]))
    assert code == 3 and "nothing to cancel" in err
    code, _, err = cli("jobs", "logs", str(second["job"]["id"]), "-f")
    assert code == 1  # the job ended CANCELLED: scripts can tell
    code, out, _ = cli("jobs", "logs", str(second["job"]["id"]), "-f", "--json")
    assert code == 1 and out == ""  # under --json too (it exited 0 whatever the result; QA)


def test_a_spec_error_prints_file_line_field_reason_and_exits_2(cli, tmp_path):
    text = "name: bad\nqueue: default\nworkers: 2\n\nresources:\n  cpus: 8+\n  accelerators: H900:8\n"
    code, out, err = cli("jobs", "launch", write(tmp_path, "spec.yaml", text), "-y")
    assert code == 2 and out == ""
    assert err.startswith("spec.yaml:7: resources.accelerators: unknown accelerator 'H900'")
    assert "Traceback" not in err
    # mistakes only the server can see come back the same way
    server = "name: bad\nqueue: default\nresources:\n  accelerators: P800:8\n"
    code, _, err = cli("jobs", "launch", write(tmp_path, "p.yaml", server), "-y")
    assert code == 2 and err.startswith("p.yaml:4: resources.accelerators: queue default")
    code, _, err = cli("jobs", "launch", str(tmp_path / "missing.yaml"), "-y")
    assert code == 2 and "cannot read" in err
    code, _, err = cli("jobs", "launch")
    assert code == 2  # argparse usage error
    code, _, err = cli("deploy", write(tmp_path, "j.yaml", JOB_SPEC.format(name="x")), "-y")
    assert code == 2 and "use fleetyard jobs launch" in err
    assert not TrainingJob.objects.exists()


def test_without_a_terminal_launch_needs_yes(cli, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    code, _, err = cli("jobs", "launch", write(tmp_path, "t.yaml", JOB_SPEC.format(name="q")))
    assert code == 2 and "pass -y" in err and not TrainingJob.objects.exists()


def test_dry_run_prints_the_plan_and_submits_nothing(cli, tmp_path, monkeypatch):
    """The README's `fleetyard jobs launch --dry-run` (argparse refused it; found by QA), without a terminal too."""
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    spec = write(tmp_path, "t.yaml", JOB_SPEC.format(name="dry"))
    code, out, err = cli("jobs", "launch", spec, "--dry-run")
    assert code == 0 and "Plan for dry" in out and "Dry run: nothing was launched." in out, (out, err)
    code, out, _ = cli("jobs", "launch", spec, "--dry-run", "--json")
    assert code == 0 and json.loads(out)["plan"]["name"] == "dry"
    code, out, _ = cli("deploy", write(tmp_path, "serve.yaml", SERVE_SPEC), "--dry-run")
    assert code == 0 and "Plan for chat" in out and "Dry run: nothing was deployed." in out
    assert not TrainingJob.objects.exists() and not Deployment.objects.exists()


def test_deploy_and_endpoints(cli, tmp_path):
    spec = SERVE_SPEC.replace("file:///checkpoints/lm/step-100", f"file://{write_model_folder(tmp_path)}")
    code, out, _ = cli("deploy", write(tmp_path, "serve.yaml", spec), "-y", "--json")
    assert code == 0
    body = json.loads(out)
    assert body["deployment"]["name"] == "chat" and body["plan"]["chosen"]["accelerator_type"] == "nvidia-a100"
    assert body["deployment"]["status"]["state"] != "FAILED"
    assert Deployment.objects.get(name="chat").spec_yaml == spec
    code, out, _ = cli("endpoints", "--json")
    assert code == 0 and [d["model"] for d in json.loads(out)] == ["chat"]
    code, out, _ = cli("endpoints")
    assert "chat" in out and "500 / 50 ms" in out


def test_deploy_that_fails_at_once_exits_1(cli, tmp_path):
    """The model folder does not exist: the deploy fails the deployment before the API answers. `deploy -y --json`
    exited 0 with the FAILED deployment in its document (a script thought it deployed; QA); now 1, as --wait does."""
    code, out, err = cli("deploy", write(tmp_path, "serve.yaml", SERVE_SPEC), "-y", "--json")
    assert code == 1, (out, err)
    assert json.loads(out)["deployment"]["status"]["state"] == "FAILED"
    assert "does not exist" in err
    code, out, err = cli("deploy", write(tmp_path, "serve.yaml", SERVE_SPEC.replace("chat", "chat2")), "-y")
    assert code == 1 and "FAILED" in out and "error:" in err, (out, err)


def test_scale_and_undeploy_a_deployment(cli, tmp_path, monkeypatch):
    """The SDK, the API and the console could scale and delete a deployment; the CLI could not (QA, 2026-11-29)."""
    spec = SERVE_SPEC.replace("file:///checkpoints/lm/step-100", f"file://{write_model_folder(tmp_path)}")
    assert cli("deploy", write(tmp_path, "serve.yaml", spec), "-y")[0] == 0
    deployment = Deployment.objects.get(name="chat")
    code, out, err = cli("scale", str(deployment.pk), "--min", "2", "--max", "3")
    assert code == 0 and "replicas 2-3" in out, (out, err)
    code, out, _ = cli("scale", str(deployment.pk), "--min", "1", "--json")
    assert code == 0 and (json.loads(out)["spec"]["replicas_min"], json.loads(out)["spec"]["replicas_max"]) == (1, 1)
    code, _, err = cli("scale", str(deployment.pk), "--min", "-1")
    assert code == 2 and "whole number from 0" in err
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    code, _, err = cli("undeploy", str(deployment.pk))  # not on a terminal and no -y: nothing deleted
    assert code == 2 and "pass -y" in err
    assert Deployment.objects.get(pk=deployment.pk).state != "DELETED"
    code, out, _ = cli("undeploy", str(deployment.pk), "-y", "--json")
    assert code == 0 and json.loads(out)["status"]["state"] in ("DELETING", "DELETED"), out
    assert cli("undeploy", "999999", "-y")[0] == 3  # no such deployment: an API error, not a traceback
    code, _, err = cli("scale", str(deployment.pk), "--min", "0")  # to zero needs a most (the API refused max 0)
    assert code == 2 and "give --max too" in err


def test_undeploy_a_failed_deployment_says_deleted_and_exits_0(cli, tmp_path):
    """A deployment that never served is removed at once: the read after the delete got a 404 and the command exited
    3 although the delete had worked (review, 2026-11-29)."""
    spec = SERVE_SPEC.replace("file:///checkpoints/lm/step-100", f"file://{write_model_folder(tmp_path)}")
    assert cli("deploy", write(tmp_path, "serve.yaml", spec), "-y")[0] == 0
    deployment = Deployment.objects.get(name="chat")
    Deployment.objects.filter(pk=deployment.pk).update(state="FAILED")
    code, out, err = cli("undeploy", str(deployment.pk), "-y")
    assert code == 0 and f"Deployment {deployment.pk} (chat) DELETED" in out, (out, err)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()


def test_an_upload_sends_its_size_and_sha256_for_the_server_to_check(cli, tmp_path, monkeypatch):
    """The API refuses an upload whose bytes do not match the size and SHA-256 sent with it; the SDK and the CLI
    sent neither, so their uploads went unchecked (review, 2026-11-29)."""
    import hashlib

    import fleetyard.client as sdk

    data = tmp_path / "corpus.txt"
    data.write_text("hello world\n" * 1000)
    assert cli("datasets", "upload", "stories", str(data))[0] == 0
    from controlplane.datasets.models import DatasetVersion

    version = DatasetVersion.objects.get(dataset__name="stories", version=1)
    assert version.checksum_sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    # bytes that change after the SDK hashed them (a file rewritten during the upload) are refused, nothing stored
    monkeypatch.setattr(sdk, "_size_and_sha256", lambda path: (12000, "0" * 64))
    code, _, err = cli("datasets", "upload", "stories", str(data))
    assert code == 3 and "checksum_sha256" in err, err
    assert not DatasetVersion.objects.filter(dataset__name="stories", version=2).exists()


def test_datasets_upload_list_and_quota(cli, tmp_path):
    data = tmp_path / "corpus.txt"
    data.write_text("hello world\n" * 1000)
    code, out, _ = cli("datasets", "upload", "stories", str(data), "--json")
    assert code == 0 and json.loads(out)["reference"] == "dataset://stories@1"
    code, out, _ = cli("datasets", "upload", "stories", str(data))
    assert code == 0 and "dataset://stories@2" in out
    code, out, _ = cli("datasets", "list", "--json")
    assert [d["name"] for d in json.loads(out)] == ["stories"]
    code, out, _ = cli("quota", "--json")
    rows = json.loads(out)
    assert {(r["queue"], r["accelerator_type"], r["nominal_quota"]) for r in rows} == {
        ("default", "cpu", 8.0), ("default", "nvidia-a100", 16.0), ("default", "nvidia-h100", 16.0)}
    code, out, _ = cli("quota")
    assert code == 0 and "nvidia-h100" in out


def test_a_failed_upload_leaves_no_dataset_behind(cli, live, tmp_path):
    """`datasets upload NAME FILE` created the dataset, then the upload failed (an empty file: 400 "The submitted
    file is empty."), and `datasets list` showed the dataset with 0 versions. A file that cannot be uploaded is now
    refused before anything is created, and a dataset the command created is deleted again when the upload fails;
    an existing dataset is left as it was."""
    from controlplane.datasets.models import Dataset

    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    code, _, err = cli("datasets", "upload", "stories", str(empty))
    assert code == 2 and "empty" in err and "Traceback" not in err, err
    code, _, err = cli("datasets", "upload", "stories", str(tmp_path / "missing.txt"))
    assert code == 2 and "no such file" in err, err
    data = tmp_path / "corpus.txt"
    data.write_text("hello world\n" * 10)
    code, _, err = cli("datasets", "upload", "stories", str(data), "--format", "bogus")  # refused by the server
    assert code == 3 and "400" in err and "format" in err and "Traceback" not in err, err
    code, out, _ = cli("datasets", "list", "--json")
    assert json.loads(out) == [] and not Dataset.objects.exists()
    assert cli("datasets", "upload", "stories", str(data))[0] == 0
    code, _, err = cli("datasets", "upload", "stories", str(data), "--format", "bogus")
    assert code == 3, err
    (kept,) = json.loads(cli("datasets", "list", "--json")[1])
    assert kept["name"] == "stories" and kept["version_count"] == 1


def test_the_sdk_upload_undoes_the_dataset_it_created(live, tmp_path):
    from fleetyard import Client
    from fleetyard.errors import ApiError

    client = Client(url=live.url, token=live.token)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        client.upload_dataset("corpus", empty)
    data = tmp_path / "corpus.txt"
    data.write_text("x" * 100)

    def interrupted(sent, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        client.upload_dataset("corpus", data, progress=interrupted)
    with pytest.raises(ApiError) as failed:
        client.upload_dataset("corpus", data, fmt="bogus")
    assert failed.value.status == 400 and "format" in failed.value.body
    assert list(client.datasets()) == []
    version = client.upload_dataset("corpus", data, fmt="text")
    assert version["reference"] == "dataset://corpus@1"


def test_the_cli_runs_as_a_subprocess(live, tmp_path):
    spec = write(tmp_path, "train.yaml", JOB_SPEC.format(name="subprocess"))
    env = {**os.environ, "FLEETYARD_URL": live.url, "FLEETYARD_TOKEN": live.token}
    result = subprocess.run([sys.executable, "-m", "fleetyard", "jobs", "launch", spec, "-y", "-d", "--json"],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["job"]["name"] == "subprocess"
    bad = subprocess.run([sys.executable, "-m", "fleetyard", "jobs", "status", "12345"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=120)
    assert bad.returncode == 3 and "404" in bad.stderr and "Traceback" not in bad.stderr


def test_the_console_shows_the_submitted_spec(cli, live, tmp_path, client):
    text = JOB_SPEC.format(name="shown")
    assert cli("jobs", "launch", write(tmp_path, "s.yaml", text), "-y", "-d")[0] == 0
    job = TrainingJob.objects.get(name="shown")
    client.force_login(live.world["alpha"]["member"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Submitted spec" in page and "hyperparameters: {steps: 100}" in page


@pytest.mark.parametrize(("answer", "created"), [("n", False), ("", False), ("yes", True)])
def test_launch_asks_before_submitting_on_a_terminal(cli, tmp_path, monkeypatch, answer, created):
    spec = write(tmp_path, "train.yaml", JOB_SPEC.format(name="asked"))
    prompts: list[str] = []
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt="": prompts.append(prompt) or answer)
    code, out, err = cli("jobs", "launch", spec, "-d")
    assert len(prompts) == 1 and err.startswith("Launch? [y/N] ")  # asked on stderr (test_cli_qa2.py)
    assert "Plan for asked" in out  # the plan is printed before the question
    assert TrainingJob.objects.filter(name="asked").exists() is created
    assert code == 0


def test_plan_prints_the_best_layout_alternatives_and_the_comparison(cli, tmp_path):
    code, out, err = cli("plan", "llama2-7b", "--batch", "64", "--pool", "h100-pool", "--devices", "nvidia-a100:16",
                         "--compare", "--option", "max_alternatives=2")
    assert code == 0, err
    assert "Plan for Llama-2 7B" in out and "h100-pool (16 nvidia-h100, SIMULATED)" in out
    assert "hypothetical" in out and "Best plan and alternatives (predicted by the cost model" in out
    assert "Each accelerator type alone" in out and "layouts evaluated" in out
    code, out, _ = cli("plan", "llama2-7b", "--batch", "64", "--devices", "nvidia-h100:16", "--json")
    result = json.loads(out)
    assert code == 0 and result["feasible"] and result["best"]["layout"]["devices"] <= 16
    assert result["pools"][0]["source"] == "hypothetical"


def test_plan_takes_a_model_file_and_says_when_nothing_fits(cli, tmp_path):
    model = write(tmp_path, "model.yaml", "name: tiny\nlayers: 4\nhidden: 512\nheads: 8\nseq_len: 1024\nvocab: 32000\n")
    code, out, _ = cli("plan", model, "--batch", "8", "--devices", "nvidia-h100:1", "--json")
    assert code == 0 and json.loads(out)["model"]["name"] == "tiny"
    code, out, _ = cli("plan", "llama3-405b", "--batch", "8", "--devices", "nvidia-h100:1")
    assert code == 0 and "No plan:" in out and "memory" in out


@pytest.mark.parametrize("argv, message", [
    (("plan", "llama2-7b", "--batch", "8"), "name what to plan on"),
    (("plan", "llama2-7b", "--batch", "8", "--devices", "nvidia-h100"), "--devices: devices are TYPE:COUNT"),
    (("plan", "llama2-7b", "--batch", "8", "--devices", "nvidia-h100:0"), "not a positive whole number"),
    (("plan", "llama2-7b", "--batch", "8", "--pool", "h100-pool:x"), "not a positive whole number"),
    (("plan", "llama2-7b", "--batch", "8", "--pool", "h100-pool", "--option", "zero"), "--option takes NAME=VALUE"),
    (("plan", "missing.yaml", "--batch", "8", "--pool", "h100-pool"), "cannot read missing.yaml"),
])
def test_plan_usage_mistakes_exit_2_before_anything_is_sent(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 2 and message in err and "Traceback" not in err + out


def test_error_text_is_printed_as_written_not_as_emoji(cli):
    """Rich read ":x:" in "a100-pool:x: 'x' is not ..." as an emoji code (found by QA)."""
    code, _, err = cli("plan", "llama2-7b", "--batch", "8", "--pool", "a100-pool:x")
    assert code == 2 and "a100-pool:x: 'x' is not a positive whole number" in err, err


@pytest.mark.parametrize("argv, message", [
    (("plan", "gpt-9", "--batch", "8", "--pool", "h100-pool"), "unknown model preset"),
    (("plan", "llama2-7b", "--batch", "8", "--pool", "no-such-pool"), "no-such-pool"),
    (("plan", "llama2-7b", "--batch", "0", "--pool", "h100-pool"), "global_batch_size"),
    (("plan", "llama2-7b", "--batch", "8", "--pool", "h100-pool", "--option", "warp_speed=true"), "warp_speed"),
])
def test_plan_requests_the_server_refuses_exit_3_with_the_field(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 3 and message in err and "Traceback" not in err + out


def test_the_sdk_plans_with_pool_and_device_shorthands(live):
    from fleetyard import Client

    client = Client(url=live.url, token=live.token)
    result = client.plan("llama2-7b", 32, pools=[("h100-pool", 8)], devices=[("nvidia-a100", 16, 8)], compare=True)
    assert {p["name"]: p["devices"] for p in result["pools"]} == {"h100-pool": 8, "nvidia-a100": 16}
    assert result["pools"][0]["simulated"] is True and result["compare"]["by_type"]


def test_plan_takes_accelerator_names_as_a_spec_writes_them(cli, live):
    """QA (2026-11-28): `--devices H100:8` and Client.plan(devices=["H100:8"]) sent "H100" as is and got "unknown
    accelerator type", though a spec's `accelerators: H100:8` is accepted. A name the client does not know is still
    sent as given, for the server to judge."""
    from fleetyard import Client

    code, out, err = cli("plan", "llama2-7b", "--batch", "8", "--devices", "H100:8", "--json")
    assert code == 0, err
    assert json.loads(out)["pools"][0]["accelerator_type"] == "nvidia-h100"
    client = Client(url=live.url, token=live.token)
    result = client.plan("llama2-7b", 8, devices=["a100:8", {"accelerator_type": "H100", "count": 8}])
    assert sorted(p["accelerator_type"] for p in result["pools"]) == ["nvidia-a100", "nvidia-h100"]
    code, out, err = cli("plan", "llama2-7b", "--batch", "8", "--devices", "warp9:8")
    assert code == 3 and "unknown accelerator type 'warp9'" in err and "Traceback" not in err + out, err
    assert "known: " in err and "nvidia-h100" in err, err  # the names it could be



@pytest.mark.parametrize("name, content, message", [
    ("latin1.yaml", "name: caf\xe9\nlayers: 2\n".encode("latin-1"), "not UTF-8 text"),
    ("inf.yaml", b"layers: .inf\nhidden: 64\n", "cannot be sent as JSON"),
    ("date.yaml", b"name: 2024-05-01\nlayers: 2\n", "cannot be sent as JSON"),
    ("bad.yaml", b"layers: [1, 2\nhidden: 3\n", "not valid YAML: line 2, column 7"),
    ("bad.json", b'{"layers": 2,}', "not valid JSON"),
    ("list.json", b"[1, 2]", "give the model's fields as a mapping"),
])
def test_plan_model_file_mistakes_exit_2_without_a_traceback(cli, tmp_path, name, content, message):
    """Found by a review (2026-11-28): a Latin-1 file, `.inf` and a YAML date crashed the CLI with a traceback."""
    path = tmp_path / name
    path.write_bytes(content)
    code, out, err = cli("plan", str(path), "--batch", "8", "--devices", "nvidia-h100:1")
    assert code == 2 and message in err, err
    assert "Traceback" not in out + err


def test_plan_takes_a_tab_indented_json_model_and_refuses_a_directory(cli, tmp_path):
    model = tmp_path / "model.json"
    model.write_text('{\n\t"layers": 2,\n\t"hidden": 256,\n\t"heads": 4,\n\t"seq_len": 128,\n\t"vocab": 1000\n}')
    code, out, err = cli("plan", str(model), "--batch", "8", "--devices", "nvidia-h100:1", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["model"]["layers"] == 2
    assert 0 < result["best"]["cost_per_million_tokens_usd"] < 0.01
    code, out, _ = cli("plan", str(model), "--batch", "8", "--devices", "nvidia-h100:1")
    assert "$0.00 " not in out and "$0.00\n" not in out  # a tiny cost is not shown as free
    code, _, err = cli("plan", str(tmp_path), "--batch", "8", "--devices", "nvidia-h100:1")
    assert code == 2 and "not a file" in err


def test_the_sdk_refuses_plan_entries_it_would_misread(live):
    from fleetyard import Client

    client = Client(url=live.url, token=live.token)
    for pools, devices, message in ((("h100-pool"), (), "pools takes a list"),
                                    ((), ("nvidia-a100", 16), "devices takes a list of entries"),
                                    ((), [("nvidia-a100",)], "devices are"),
                                    ((), ["nvidia-a100:x"], "not a positive whole number")):
        with pytest.raises(ValueError, match=message):
            client.plan("llama2-7b", 8, pools=pools, devices=devices)
    result = client.plan("llama2-7b", 8, pools=["h100-pool:8"], devices=["nvidia-a100:16:8"])
    assert {p["name"]: p["devices"] for p in result["pools"]} == {"h100-pool": 8, "nvidia-a100": 16}


def test_the_readmes_example_spec_plans_on_the_demo_cluster(cli, live, tmp_path, monkeypatch):
    """The README's train.yaml, as written, on the demo cluster: it asked 8 cores per worker (`cpus: 8+`), which the
    demo's accelerator nodes (1 core each) refuse (QA). Its dataset is the demo's; its secret comes from the
    environment."""
    import re
    from pathlib import Path

    from controlplane.datasets.services import dataset_create, dataset_version_register

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## SDK and CLI"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    assert "secrets: [HF_TOKEN]" in example and "dataset://fleetyard-tiny-tales@1" in example
    alpha = live.world["alpha"]
    tales = dataset_create(actor=alpha["admin"], team=alpha["team"], name="fleetyard-tiny-tales")
    dataset_version_register(actor=alpha["admin"], dataset=tales, uri="s3://demo/tales.txt")
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_example")
    code, out, err = cli("jobs", "launch", write(tmp_path, "train.yaml", example), "--dry-run")
    assert code == 0 and "Dry run: nothing was launched." in out, (out, err)


def test_jobs_retry_submits_an_ended_job_again(cli, tmp_path):
    """The API and the console could retry a job; the CLI and SDK could not (QA, 2026-11-29)."""
    code, out, _ = cli("jobs", "launch", write(tmp_path, "a.yaml", JOB_SPEC.format(name="again")), "-y", "-d",
                       "--json")
    job_id = json.loads(out)["job"]["id"]
    code, _, err = cli("jobs", "retry", str(job_id))
    assert code == 3 and "can be retried" in err, err  # still live: the API's 409, one line
    assert cli("jobs", "cancel", str(job_id))[0] == 0
    code, out, _ = cli("jobs", "retry", str(job_id), "--json")
    retried = json.loads(out)
    assert code == 0 and retried["name"] == "again-retry-1" and retried["id"] != job_id, retried
    code, out, _ = cli("jobs", "retry", str(job_id))
    assert code == 0 and f"submitted as a retry of job {job_id}" in out and "again-retry-2" in out, out
    assert TrainingJob.objects.filter(name__startswith="again-retry-").count() == 2
    code, _, err = cli("jobs", "retry", "999999")
    assert code == 3 and "Traceback" not in err
