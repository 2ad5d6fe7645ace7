"""The fleetyard YAML spec: parsing into REST bodies, errors with line + field + reason, and property
tests for the resource strings (`H100:8`, `8+`, `any_of`). Also: the SDK imports no Django/Ray/torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetyard.errors import SpecError
from fleetyard.spec import (
    ACCELERATOR_SLUGS,
    DEPLOYMENT,
    JOB,
    SHORT_NAMES,
    accelerator_slug,
    parse_accelerator,
    parse_at_least,
    parse_duration,
    parse_memory,
    parse_spec,
)

JOB_YAML = textwrap.dedent("""\
    name: train-lm
    queue: default
    priority: standard
    workers: {min: 1, max: 4}
    resources:
      accelerators: H100:8
      any_of:
        - accelerators: A100:8
      cpus: 8+
      memory: 64+
    workdir: /srv/code
    setup: pip install -r requirements.txt
    run: python train.py
    envs: {WANDB_MODE: offline, SEED: 7}
    secrets: [HF_TOKEN]
    dataset: dataset://tiny-tales@1
    checkpoint: {interval_steps: 25, keep_last: 2}
    retry: {max_restarts: 5}
    max_duration: 1h30m
""")

SERVE_YAML = textwrap.dedent("""\
    name: chat
    queue: default
    resources:
      accelerators: [A100:0.5, H100:0.5]
    service:
      model: file:///checkpoints/lm/step-100
      replicas: {min: 1, max: 3}
      sla: {ttft_p95: 500ms, tpot_p95: 0.05s, min_throughput: 100}
      router: pow2
""")


def issues(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    return info.value.messages


def test_a_job_spec_becomes_the_rest_create_body():
    spec = parse_spec(JOB_YAML)
    assert spec.kind == JOB and spec.secrets == ["HF_TOKEN"]
    assert spec.body == {
        "name": "train-lm", "queue": "default", "priority": "standard",
        "accelerator_types": ["nvidia-h100", "nvidia-a100"], "devices_per_worker": 8, "cpus_per_worker": 8.0,
        "workers_min": 1, "workers_max": 4, "trainer": "entrypoint",
        "entrypoint": "(\npip install -r requirements.txt\n) || exit $?\npython train.py", "working_dir": "/srv/code",
        "envs": {"WANDB_MODE": "offline", "SEED": "7"}, "dataset": "dataset://tiny-tales@1",
        "checkpoint": {"interval_steps": 25, "keep_last": 2}, "max_restarts": 5, "max_duration_seconds": 5400,
    }
    assert any("memory" in w for w in spec.warnings)
    assert spec.locate("accelerator_types") == ("resources.accelerators", 6)


def test_the_built_in_trainer_takes_hyperparameters_and_num_nodes():
    spec = parse_spec("name: a\nqueue: default\nnum_nodes: 2\nresources: {accelerators: nvidia-a100:1}\n"
                      "hyperparameters: {steps: 50}\n")
    assert spec.body["trainer"] == "builtin-transformer-lm" and spec.body["hyperparameters"] == {"steps": 50}
    assert spec.body["workers_min"] == spec.body["workers_max"] == 2 and spec.body["devices_per_worker"] == 1


def test_a_cpu_job_takes_no_devices():
    spec = parse_spec("name: a\nqueue: default\nresources: {accelerators: cpu, cpus: 2}\nrun: echo hi\n")
    assert spec.body["accelerator_types"] == ["cpu"] and spec.body["devices_per_worker"] == 0
    assert spec.body["cpus_per_worker"] == 2.0


def test_a_deployment_spec_becomes_the_rest_create_body():
    spec = parse_spec(SERVE_YAML)
    assert spec.kind == DEPLOYMENT
    assert spec.body == {
        "name": "chat", "queue": "default", "accelerator_types": ["nvidia-a100", "nvidia-h100"],
        "devices_per_replica": 0.5, "model_uri": "file:///checkpoints/lm/step-100", "replicas_min": 1,
        "replicas_max": 3, "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50, "min_throughput_tps": 100.0},
        "router": "pow2",
    }


def test_a_deployment_can_serve_a_jobs_checkpoint_with_skypilot_replica_policy():
    spec = parse_spec("name: chat\nqueue: default\nresources: {accelerators: A100:1}\nservice:\n"
                      "  checkpoint: job:12\n  replica_policy: {min_replicas: 2, max_replicas: 4}\n"
                      "  sla: {ttft_p95_ms: 400, tpot_p95_ms: 40}\n")
    assert spec.body["source_job"] == 12 and (spec.body["replicas_min"], spec.body["replicas_max"]) == (2, 4)


def test_errors_name_the_line_the_field_and_the_reason():
    text = textwrap.dedent("""\
        name: train-lm
        queue: default
        workers: 2
        resources:
          cpus: 8+
          memory: 64+
          accelerators: H900:8
        max_duration: soon
        wokers: 3
    """)
    messages = issues(text)
    assert messages[0].startswith("spec.yaml:7: resources.accelerators: unknown accelerator 'H900'")
    assert "known: H100 (nvidia-h100)" in messages[0]
    assert messages[1].startswith("spec.yaml:8: max_duration: expected a duration")
    assert messages[2] == ("spec.yaml:9: wokers: unknown field; did you mean 'workers'? expected one of: "
                           + messages[2].split("expected one of: ")[1])


@pytest.mark.parametrize(("text", "expected"), [
    ("name: a\nqueue: default\n", "spec.yaml:1: resources: required"),
    ("name: A_b\nqueue: default\nresources: {accelerators: H100}\n", "spec.yaml:1: name: must be lowercase"),
    ("name: a\nqueue: default\nresources:\n  accelerators: H100:eight\n",
     "spec.yaml:4: resources.accelerators: count 'eight'"),
    ("name: a\nqueue: default\nresources:\n  accelerators: H100:1.5\n",
     "spec.yaml:4: resources.accelerators: a training worker takes whole devices"),
    ("name: a\nqueue: default\nresources:\n  any_of:\n    - accelerators: H100:8\n    - accelerators: A100:4\n",
     "spec.yaml:6: resources.any_of[1].accelerators: every acceptable type needs the same device count"),
    ("name: a\nqueue: default\nresources: {accelerators: H100}\nworkers: {min: 3, max: 2}\n",
     "spec.yaml:4: workers.max: must be at least min (3)"),
    ("name: a\nqueue: default\nresources: {accelerators: H100}\nsecrets: {HF_TOKEN: abc}\n",
     "spec.yaml:4: secrets.HF_TOKEN: do not put secret values in a spec"),
    ("name: a\nqueue: default\nresources: {accelerators: H100}\nname: b\n", "spec.yaml:4: name: given twice"),
    ("name: a\nqueue: default\nresources: {accelerators: H100}\nrun: [1\n", "invalid YAML"),
    ("name: chat\nqueue: default\nresources: {accelerators: A100}\nservice:\n  model: file:///m\n"
     "  sla: {ttft_p95: 5}\n",
     "spec.yaml:6: service.sla: tpot_p95 is required"),
    ("name: chat\nqueue: default\nresources: {accelerators: A100}\nworkers: 2\nservice: {model: x, sla: {}}\n",
     "spec.yaml:4: workers: a deployment does not take this field"),
    ("- a\n- b\n", "spec.yaml:1: a spec is a YAML mapping"),
])
def test_each_mistake_is_reported_where_it_is(text, expected):
    assert any(message.startswith(expected) or expected in message for message in issues(text)), issues(text)


def test_slugs_match_the_platforms_accelerator_facts():
    from controlplane.cluster.accelerator_facts import ACCELERATOR_FACTS

    assert set(ACCELERATOR_SLUGS) == {fact["slug"] for fact in ACCELERATOR_FACTS}


# ------------------------------------------------------------------------------------ property tests

names = st.sampled_from(sorted({alias for slug, aliases in ACCELERATOR_SLUGS.items() for alias in (slug, *aliases)}))
cases = st.sampled_from([str.lower, str.upper, lambda s: s])
counts = st.integers(min_value=1, max_value=64)


@given(name=names, case=cases, count=counts)
def test_any_spelling_of_a_known_type_with_a_count_parses(name, case, count):
    request = parse_accelerator(f"{case(name)}:{count}")
    assert request.slug in ACCELERATOR_SLUGS and request.count == count
    assert parse_accelerator(str(request)) == request  # H100:8 round-trips


@given(name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12))
def test_unknown_names_are_refused_with_the_known_list(name):
    if name.lower() in {a for slug, aliases in ACCELERATOR_SLUGS.items() for a in (slug, *aliases)}:
        return
    with pytest.raises(ValueError, match="known: H100"):
        accelerator_slug(name)


@given(count=st.one_of(st.integers(max_value=0), st.floats(max_value=0), st.just(float("nan")),
                       st.integers(min_value=65)))
def test_bad_counts_are_refused(count):
    with pytest.raises(ValueError):
        parse_accelerator(f"H100:{count}")


@given(number=st.integers(min_value=1, max_value=10**6), plus=st.booleans(), spaces=st.sampled_from(["", " "]))
def test_at_least_strings(number, plus, spaces):
    text = f"{number}{spaces}{'+' if plus else ''}"
    assert parse_at_least(text) == number
    assert parse_memory(text) == number
    assert parse_memory(f"{number}GB{'+' if plus else ''}") == number


@given(text=st.text(max_size=8))
def test_at_least_never_crashes_on_garbage(text):
    try:
        value = parse_at_least(text)
    except ValueError:
        return
    assert value > 0


@given(slugs=st.lists(st.sampled_from([s for s in ACCELERATOR_SLUGS if s != "cpu"]), min_size=1, max_size=4,
                      unique=True), count=counts, nested=st.booleans())
def test_any_of_accepts_every_listed_type_in_order(slugs, count, nested):
    options = "\n".join(
        f"    - accelerators: {SHORT_NAMES[s]}:{count}" if nested else f"    - {SHORT_NAMES[s]}:{count}" for s in slugs)
    spec = parse_spec(f"name: a\nqueue: default\nresources:\n  any_of:\n{options}\n")
    assert spec.body["accelerator_types"] == slugs and spec.body["devices_per_worker"] == count


@given(hours=st.integers(0, 48), minutes=st.integers(0, 59), seconds=st.integers(0, 59))
def test_durations(hours, minutes, seconds):
    total = hours * 3600 + minutes * 60 + seconds
    text = "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (seconds, "s")) if v)
    if total == 0:
        return
    assert parse_duration(text) == total == parse_duration(total)


# ------------------------------------------------------------------------------------ no heavy imports

def test_the_sdk_imports_no_django_ray_or_torch():
    code = ("import sys, fleetyard, fleetyard.cli, fleetyard.client, fleetyard.spec, fleetyard.errors;"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'ray', 'torch', 'rest_framework'));"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_max_duration_has_an_upper_bound_named_at_its_line():
    """99999999999999999999h reached the server and came back as a bare `max_duration_seconds` body (the
    database column's range), and the CLI exited 3 instead of 2."""
    head = "name: long\nqueue: default\nresources: {accelerators: cpu}\n"
    (message,) = issues(head + "max_duration: 99999999999999999999h\n")
    assert message.startswith("spec.yaml:4: max_duration: at most 366d (31622400 seconds)")
    assert parse_spec(head + "max_duration: 366d\n").body["max_duration_seconds"] == 31622400


@pytest.mark.parametrize("name", ["A\\n", "A=B", "", "1ST", "A B"])
def test_env_names_are_matched_whole(name):
    (message,) = issues(f'name: e\nqueue: default\nresources: {{accelerators: cpu}}\nenvs: {{"{name}": x}}\n')
    assert message.startswith("spec.yaml:4: envs.") and "is not a valid environment variable name" in message


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x7f", "\ufffe"])
def test_a_control_character_is_a_spec_error_not_a_crash(char):
    """PyYAML's reader refuses these when the loader is built; that ReaderError escaped parse_spec (a CLI traceback
    and an API 500; QA)."""
    with pytest.raises(SpecError) as caught:
        parse_spec(JOB_YAML.replace("name: train-lm", f"name: train-lm{char}"), filename="train.yaml")
    (message,) = caught.value.messages
    assert message.startswith("train.yaml:1: invalid YAML: character U+") and "is not allowed" in message


def test_a_bad_max_restarts_names_the_field_once():
    """QA: it read "retry.max_restarts: max_restarts must be a whole number ..."."""
    line = JOB_YAML.splitlines().index(next(x for x in JOB_YAML.splitlines() if x.startswith("retry:"))) + 1
    nested = issues(JOB_YAML.replace("retry: {max_restarts: 5}", "retry: {max_restarts: -1}"))
    assert nested == [f"spec.yaml:{line}: retry.max_restarts: must be a whole number from 0 to 1000, got -1"]
    short = issues(JOB_YAML.replace("retry: {max_restarts: 5}", "retry: lots"))
    assert short == [f"spec.yaml:{line}: retry: max_restarts must be a whole number from 0 to 1000, got 'lots'"]


def test_a_spec_without_workers_points_errors_about_them_at_workers():
    """Neither `workers` nor `num_nodes` given: errors about the gang named `num_nodes`, a key the spec never wrote
    (QA); it is `workers`, the spec's own word, and num_nodes where the spec wrote that."""
    spec = parse_spec("name: a\nqueue: default\nresources: {accelerators: nvidia-a100:1}\n")
    assert spec.origins["workers_min"] == spec.origins["workers_max"] == ("workers", None)
    spec = parse_spec("name: a\nqueue: default\nnum_nodes: 2\nresources: {accelerators: nvidia-a100:1}\n")
    assert spec.origins["workers_min"] == ("num_nodes", 3)
