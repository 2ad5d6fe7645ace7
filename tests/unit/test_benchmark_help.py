"""Every benchmark command answers --help (a stray % in a help text once made `benchmarks.scale --help` crash)."""

import importlib
import pkgutil

import pytest

import benchmarks

COMMANDS = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.name.startswith("_"))


@pytest.mark.parametrize("name", COMMANDS)
def test_a_benchmark_command_prints_its_help(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    if not hasattr(module, "main"):
        pytest.skip(f"benchmarks.{name} is a helper module, not a command")
    with pytest.raises(SystemExit) as ended:
        module.main(["--help"])
    assert ended.value.code == 0
    assert "usage:" in capsys.readouterr().out
