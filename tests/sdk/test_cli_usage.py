"""CLI usage mistakes found before anything is sent (exit 2, one line, no traceback): a spec file that is not UTF-8,
and --wait / --limit values the command cannot honour (QA: a UnicodeDecodeError traceback; --wait -5 created the
deployment and then failed at once, --wait nan would have waited for good; --limit 0 came back as a 400 about
`page_size`). No server here: a mistake that reached the client would exit 3 (no server configured)."""

from __future__ import annotations

import pytest

from fleetyard.cli import main

SERVE = """\
name: chat
queue: default
resources: {accelerators: A100:1}
service:
  model: /models/lm
  replicas: {min: 1, max: 1}
"""


@pytest.fixture(autouse=True)
def no_server(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.delenv("FLEETYARD_URL", raising=False)
    monkeypatch.delenv("FLEETYARD_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("command", [["jobs", "launch"], ["deploy"]])
def test_a_spec_that_is_not_utf8_is_a_usage_error_at_its_line(tmp_path, capsys, command):
    (tmp_path / "train.yaml").write_bytes(b"name: a\nqueue: default\ndescription: caf\xe9\n")
    assert main([*command, "train.yaml", "-y"]) == 2
    err = capsys.readouterr().err
    assert err == "error: train.yaml:3: not UTF-8 text (a spec is a YAML file); byte 0xe9 at offset 39\n"


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "-inf", "1e400", "soon", ""])
def test_deploy_wait_takes_a_finite_number_of_seconds(tmp_path, capsys, value):
    (tmp_path / "serve.yaml").write_text(SERVE)
    assert main(["deploy", "serve.yaml", "-y", f"--wait={value}"]) == 2
    err = capsys.readouterr().err
    assert f"argument --wait: expected a number of seconds, 0 or more, got {value!r}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_jobs_status_limit_is_a_whole_number_from_1(capsys, value):
    assert main(["jobs", "status", "--limit", value]) == 2
    assert f"argument --limit: expected a whole number from 1, got {value!r}" in capsys.readouterr().err


def test_end_of_input_at_a_prompt_changes_nothing_and_says_so(monkeypatch, capsys):
    """Ctrl-D at login's token prompt (or a launch confirmation, the same `input`) raised an EOFError traceback."""
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)

    def end_of_input(*_args, **_kwargs):
        raise EOFError

    monkeypatch.setattr("builtins.input", end_of_input)
    monkeypatch.setattr("getpass.getpass", end_of_input)
    assert main(["login", "--url", "http://127.0.0.1:8000"]) == 2
    err = capsys.readouterr().err
    assert "no answer (end of input); nothing was changed" in err and "Traceback" not in err


@pytest.mark.parametrize("option", ["--url", "--token"])
def test_an_empty_url_or_token_is_a_usage_error_not_a_quiet_fallback(monkeypatch, capsys, option):
    monkeypatch.setenv("FLEETYARD_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("FLEETYARD_TOKEN", "fy_from_the_environment")
    assert main(["quota", option, " "]) == 2
    assert f"{option}: is empty" in capsys.readouterr().err


def test_upload_format_help_lists_every_format_the_server_takes(capsys):
    from controlplane.datasets.models import DatasetFormat

    main(["datasets", "upload", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(value in help_text for value in DatasetFormat.values), help_text
