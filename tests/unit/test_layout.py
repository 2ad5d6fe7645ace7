"""Guards on the repository layout that DESIGN.md asks for."""

import platform as stdlib_platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_platform_is_a_source_root_never_a_package():
    assert not (ROOT / "platform" / "__init__.py").exists(), "platform/__init__.py shadows the stdlib module"
    # The standard module still resolves: a package would break platform.system().
    assert stdlib_platform.system()


def test_top_level_layout():
    for name in ("manage.py", "pyproject.toml", "README.md", "platform", "jobs", "inference", "frontend",
                 "tests", "compose.yaml", ".ci/run"):
        assert (ROOT / name).exists(), name


def test_no_top_level_names_that_shadow_popular_modules():
    for name in ("datasets", "queue", "resource", "types", "logging"):
        assert not (ROOT / name).exists() and not (ROOT / f"{name}.py").exists(), name
        assert not (ROOT / "platform" / name).exists(), name
