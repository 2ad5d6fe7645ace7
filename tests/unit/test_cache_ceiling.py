"""The cache-ceiling benchmark's parts: one engine run per cache setting, the ratio table, the arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from benchmarks.cache_ceiling import ceiling_table, parse_args, run_engine
from benchmarks.mooncake import BenchRequest
from benchmarks.serving import REPO_ROOT
from jobs.runtime.lm import LMConfig, build_model

SHAPE = {"context": 128, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return build_model(LMConfig.from_dict(SHAPE), seed=3).eval()


def requests() -> list[BenchRequest]:
    shared = list(range(1, 33))  # two 16-token blocks every prompt starts with
    return [BenchRequest(arrival_s=0.0, prompt_tokens=shared + [40 + i] * 5, max_tokens=3, hash_ids=())
            for i in range(4)]


def test_the_unbounded_cache_reuses_every_repeated_prefix_and_no_cache_none(model, tmp_path):
    off = run_engine(model, requests(), slots=2, block_size=16, device_blocks=0, cache_dir=str(tmp_path))
    on = run_engine(model, requests(), slots=2, block_size=16, device_blocks=10_000, cache_dir=str(tmp_path))
    assert off["errors"] == on["errors"] == 0
    assert off["output_tokens"] == on["output_tokens"] == 12 and off["prompt_tokens"] == on["prompt_tokens"] == 148
    assert off["cached_tokens"] == 0 and off["hit_rate"] == 0.0
    assert on["cached_tokens"] == 3 * 32  # the three requests after the first find both shared blocks
    assert 0 < on["prefill_share"] < 1  # both kinds of work were timed


def test_the_table_gives_each_run_its_ratio_to_no_cache():
    runs = {"no cache": {"output_tokens_per_s": 100.0, "errors": 0},
            "unbounded cache": {"output_tokens_per_s": 112.0, "errors": 0}}
    rows = ceiling_table(runs)
    assert [(r["config"], r["throughput_vs_no_cache"]) for r in rows] == [("no cache", 1.0), ("unbounded cache", 1.12)]


def test_bad_arguments_are_refused_with_a_clear_message_and_exit_2():
    assert parse_args([]).requests == 1000
    result = subprocess.run([sys.executable, "-m", "benchmarks.cache_ceiling", "--slots", "0", "--no-write"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "argument --slots: must be >= 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("argv", [["--block-tokens", "256"], ["--max-prompt-blocks", "64"], ["--slots", "300"],
                                  ["--requests", "200000"], ["--block-tokens", "2000"]])
def test_arguments_the_engine_would_refuse_are_refused_up_front(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and "error:" in capsys.readouterr().err
