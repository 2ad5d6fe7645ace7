"""The long-prompt TTFT benchmark's parts at a tiny size: every case runs, cached cases reuse the prefix from the
tier they name, cached outputs equal uncached ones (and a wrong reload is caught), the table and files."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from benchmarks.long_prompt import (
    CASES,
    format_table,
    main,
    measure,
    parse_args,
    summarize,
    tier_sizes,
    window_for,
)
from inference.runtime.kv_cache import TieredPrefixCache
from jobs.runtime.lm import LMConfig, build_model

PROMPT, SUFFIX, OUTPUT, BLOCK, FILLER = 256, 16, 8, 16, 64
SHAPE = {"context": window_for(PROMPT, SUFFIX, OUTPUT), "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}


@pytest.fixture(scope="module")
def model():
    """Weights scaled up: a small random model repeats one byte whatever attention reads, a sharp one does not,
    so a wrong key or value read back from the cache changes the output."""
    torch.set_num_threads(1)
    model = build_model(LMConfig.from_dict(SHAPE), seed=11).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(8.0)
    return model


def run(model, tmp_path, reps=2):
    return measure(model, prompt_tokens=PROMPT, suffix_tokens=SUFFIX, output_tokens=OUTPUT, reps=reps,
                   block_size=BLOCK, filler_tokens=FILLER, threads=1, verify_reps=1, cache_root=str(tmp_path))


def test_every_case_runs_and_each_cached_case_finds_the_whole_prefix_in_its_tier(model, tmp_path):
    result = run(model, tmp_path)
    samples = result["samples"]
    assert [s["case"] for s in samples] == list(CASES) * 2
    blocks = PROMPT // BLOCK
    for s in samples:
        assert s["ttft_s"] > 0 and s["output_tokens"] == OUTPUT
        if s["case"] == "cold":
            assert s["prompt_tokens"] == PROMPT and s["cached_tokens"] == 0
            assert sum(s["cached_blocks_by_tier"].values()) == 0
        else:
            assert s["prompt_tokens"] == PROMPT + SUFFIX and s["cached_tokens"] == PROMPT
            tier = "device" if s["case"] == "device" else "host" if s["case"] == "host" else "disk"
            assert s["cached_blocks_by_tier"] == {**{"device": 0, "host": 0, "disk": 0}, tier: blocks}, s
        assert s["as_expected"]
    assert all(s["page_cache_dropped_files"] > 0 for s in samples if s["case"] == "disk, not in page cache")
    # the cached follow-ups of the first repetition were rerun with every tier off: the same greedy output
    assert [v["case"] for v in result["verification"]] == list(CASES[1:])
    assert all(v["same_output"] for v in result["verification"])
    assert all(v["prompt_tokens"] == PROMPT + SUFFIX for v in result["verification"])
    for s in samples:  # every generated token is compared, not only those the stream could show yet
        assert len(s["output_token_ids"]) == OUTPUT
    assert len({t for s in samples for t in s["output_token_ids"]}) > 5  # varied output: a wrong reload would show
    assert result["engine"]["device_cache_blocks"] == (PROMPT + SUFFIX) // BLOCK


def test_a_cache_that_reloads_wrong_values_is_caught(model, tmp_path, monkeypatch):
    bring = TieredPrefixCache._bring_to_device
    monkeypatch.setattr(TieredPrefixCache, "_bring_to_device", lambda self, node: bring(self, node) * 0.5)
    result = run(model, tmp_path, reps=1)
    assert not any(v["same_output"] for v in result["verification"])


def test_the_summary_has_one_row_per_case_with_p50_max_and_the_verdict(model, tmp_path):
    samples = run(model, tmp_path, reps=1)["samples"]
    rows = summarize(samples)
    assert [r["case"] for r in rows] == list(CASES)
    for row in rows:
        assert row["runs"] == 1 and row["ttft_p50_s"] <= row["ttft_max_s"]
        assert row["meets_target"] in ("yes", "p50 only", "no") and row["as_expected"] is True
    assert rows[0]["computed_tokens_per_s_p50"] == pytest.approx(PROMPT / samples[0]["ttft_s"], abs=0.1)
    assert rows[1]["found_in"] == f"device {PROMPT // BLOCK}"
    fake = [{**samples[0], "ttft_s": t} for t in (0.3, 0.4, 0.7)]
    assert summarize(fake)[0]["meets_target"] == "p50 only"
    assert summarize(fake, target_s=1.0)[0]["meets_target"] == "yes"
    assert summarize(fake, target_s=0.2)[0]["meets_target"] == "no"
    table = format_table(rows)
    assert table.splitlines()[0].startswith("case") and len(table.splitlines()) == 1 + len(CASES)


def test_tiers_are_sized_so_fillers_push_the_prefix_down_exactly_one_tier():
    sizes = tier_sizes(16_384, 64, 16, 1024)
    assert sizes["device"] == 1028 and sizes["host"] == 1028 + 64
    assert sizes["fillers_to_host"] * 64 >= sizes["device"]  # the conversation leaves the device tier ...
    assert sizes["fillers_to_host"] * 64 - sizes["device"] < 64  # ... and host DRAM keeps all of it
    assert sizes["fillers_to_disk"] * 64 >= sizes["device"] + sizes["host"]


def test_main_writes_json_and_csv_with_the_table(tmp_path, capsys):
    out_json, out_csv = tmp_path / "long_prompt.json", tmp_path / "long_prompt.csv"
    code = main(["--prompt-tokens", "64", "--suffix-tokens", "16", "--output-tokens", "2", "--filler-tokens", "32",
                 "--reps", "1", "--json", str(out_json), "--csv", str(out_csv)])
    assert code == 0
    report = json.loads(out_json.read_text())
    assert report["benchmark"] == "long_prompt" and report["target_ttft_s"] == 0.5
    assert report["model"]["context"] == 64 + 16 + 2 and report["model"]["n_layers"] == 4
    assert "random" in report["model"]["weights"] and "no accelerator" in report["host"]
    assert [r["case"] for r in report["rows"]] == list(CASES)
    assert all("output_text" not in s for s in report["samples"]) and len(report["samples"]) == len(CASES)
    with open(out_csv, newline="") as handle:
        assert [r["case"] for r in csv.DictReader(handle)] == list(CASES)
    assert "TTFT p50 s" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--prompt-tokens", "32000", "--suffix-tokens", "1000"], "window can be at most 32768"),
    (["--filler-tokens", "8"], "at least --block-size"),
    (["--reps", "0"], "argument --reps: must be >= 1"),
    (["--threads", "999"], "torch_threads"),
])
def test_bad_arguments_are_refused_up_front(argv, message, capsys):
    assert parse_args([]).prompt_tokens == 16_384
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
