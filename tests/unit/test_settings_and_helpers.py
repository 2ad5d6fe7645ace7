"""Settings parsing fails early and clearly; the per-installation secret; dataset references."""

from __future__ import annotations

import os
import stat

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane import settings as fy_settings
from controlplane.common.secret_file import read_or_create_secret


def test_env_helpers_reject_bad_values(monkeypatch):
    monkeypatch.setenv("FY_TEST_BOOL", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FY_TEST_BOOL"):
        fy_settings.env_bool("FY_TEST_BOOL", False)
    monkeypatch.setenv("FY_TEST_INT", "ten")
    with pytest.raises(ImproperlyConfigured, match="FY_TEST_INT"):
        fy_settings.env_int("FY_TEST_INT", 1)
    monkeypatch.setenv("FY_TEST_BOOL", "Yes")
    assert fy_settings.env_bool("FY_TEST_BOOL", False) is True
    monkeypatch.setenv("FY_TEST_LIST", "a, b,,c")
    assert fy_settings.env_list("FY_TEST_LIST", []) == ["a", "b", "c"]


def test_database_urls():
    pg = fy_settings.database_from_url("postgres://fy:p%40ss@db.internal:5433/fleetyard")
    assert (pg["ENGINE"], pg["NAME"], pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"]) == (
        "django.db.backends.postgresql", "fleetyard", "fy", "p@ss", "db.internal", "5433")
    lite = fy_settings.database_from_url("sqlite:///tmp/x.sqlite3")
    assert lite["NAME"] == "/tmp/x.sqlite3" and lite["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    with pytest.raises(ImproperlyConfigured, match="mysql"):
        fy_settings.database_from_url("mysql://x/y")


def test_secret_file_is_private_and_stable(tmp_path):
    path = tmp_path / "sub" / "secret"
    first = read_or_create_secret(path)
    assert len(first) > 40 and read_or_create_secret(path) == first
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_settings_module_fails_at_import_on_a_bad_backend(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, FLEETYARD_COMPUTE_BACKEND="kubernetes", FLEETYARD_DATA_DIR=str(tmp_path),
               PYTHONPATH=f"{root}:{root / 'platform'}")
    result = subprocess.run([sys.executable, "-c", "import controlplane.settings"], env=env, capture_output=True,
                            text=True, cwd=root, check=False)
    assert result.returncode != 0 and "FLEETYARD_COMPUTE_BACKEND='kubernetes'" in result.stderr
    env = dict(env, FLEETYARD_COMPUTE_BACKEND="memory", FLEETYARD_EMBEDDED="false")
    env.pop("FLEETYARD_SECRET_KEY", None)
    result = subprocess.run([sys.executable, "-c", "import controlplane.settings"], env=env, capture_output=True,
                            text=True, cwd=root, check=False)
    assert result.returncode != 0 and "FLEETYARD_SECRET_KEY is required" in result.stderr


def test_settings_module_fails_at_import_on_a_bad_replica_kv_limit(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for value, message in (("lots", "is not a number of GiB"), ("0", "must be a finite number"),
                           ("inf", "must be a finite number")):
        env = dict(os.environ, FLEETYARD_REPLICA_KV_LIMIT_GIB=value, FLEETYARD_DATA_DIR=str(tmp_path),
                   PYTHONPATH=f"{root}:{root / 'platform'}")
        result = subprocess.run([sys.executable, "-c", "import controlplane.settings"], env=env, capture_output=True,
                                text=True, cwd=root, check=False)
        assert result.returncode != 0 and f"FLEETYARD_REPLICA_KV_LIMIT_GIB={value!r} {message}" in result.stderr
