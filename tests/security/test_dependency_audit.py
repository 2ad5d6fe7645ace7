"""S8 (issue 8): the dependency audit that stands in for pip-audit where PyPI answers only project records.

The verdict logic is pure and tested with fake PyPI records: a release with its own record is judged from it (what
pip-audit does); a release that is the latest is judged from the project record; an older one is UNAUDITED unless
`.dependency-holds` says why the project stays on it, and an advisory in `.pip-audit-ignore` is reported as ignored.
No network: the live audit is `scripts/audit --deps` (its last figures are in the README).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("dependency_audit", ROOT / "scripts" / "dependency_audit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


audit = _load()


def project(latest: str, *older: str, vulns=(), yanked=()) -> dict:
    releases = {v: [{"filename": f"x-{v}.whl", "yanked": v in yanked}] for v in (*older, latest)}
    releases["9.0rc1"] = [{"filename": "x-9.0rc1.whl", "yanked": False}]  # a pre-release is never "latest"
    releases["0.0.1"] = []  # a release without files is ignored
    return {"info": {"version": latest}, "releases": releases,
            "vulnerabilities": [{"id": v, "withdrawn": None} for v in vulns]}


def test_latest_release_skips_prereleases_yanked_and_empty_releases():
    assert audit.latest_release(project("2.0", "1.9", "10.0", yanked=("10.0",))) == "2.0"
    assert audit.latest_release({"info": {"version": "3"}, "releases": {"3": []}}) == "3"


def test_a_release_with_its_own_record_is_judged_from_it():
    verdict = audit.judge("lib", "1.0", project=project("2.0", "1.0"),
                          version_record={"vulnerabilities": [{"id": "PYSEC-1"}, {"id": "GHSA-2"}]},
                          ignore={"GHSA-2"}, holds={})
    assert verdict.status == "vulnerable"
    assert verdict.advisories == ["PYSEC-1"] and verdict.ignored == ["GHSA-2"]
    assert "record of 1.0" in verdict.source


def test_the_latest_release_is_judged_from_the_project_record():
    clean = audit.judge("lib", "2.0", project=project("2.0", "1.0"), version_record=None, ignore=set(), holds={})
    assert (clean.status, clean.advisories) == ("clean", [])
    bad = audit.judge("lib", "2.0", project=project("2.0", vulns=("PYSEC-9",)), version_record=None,
                      ignore=set(), holds={})
    assert (bad.status, bad.advisories) == ("vulnerable", ["PYSEC-9"])
    ignored = audit.judge("lib", "2.0", project=project("2.0", vulns=("PYSEC-9",)), version_record=None,
                          ignore={"PYSEC-9"}, holds={})
    assert (ignored.status, ignored.ignored) == ("clean", ["PYSEC-9"])


def test_a_local_version_label_is_the_public_release():
    verdict = audit.judge("torch", "2.0+cpu", project=project("2.0"), version_record=None, ignore=set(), holds={})
    assert verdict.status == "clean"


def test_an_older_release_is_unaudited_unless_held_with_a_reason():
    unaudited = audit.judge("lib", "1.0", project=project("2.0", "1.0"), version_record=None, ignore=set(),
                            holds={})
    assert unaudited.status == "unaudited" and "behind the latest release 2.0" in unaudited.source
    held = audit.judge("Lib_Name", "1.0", project=project("2.0", "1.0"), version_record=None, ignore=set(),
                       holds={"lib-name": "pinned by a framework"})
    assert (held.status, held.reason) == ("held", "pinned by a framework")
    assert audit.failed([unaudited, held]) == [unaudited]


def test_a_hold_does_not_excuse_advisories_against_the_latest_release():
    verdict = audit.judge("lib", "1.0", project=project("2.0", "1.0", vulns=("GHSA-x",)), version_record=None,
                          ignore=set(), holds={"lib": "pinned by a framework"})
    assert (verdict.status, verdict.advisories) == ("vulnerable", ["GHSA-x"])


def test_a_package_pypi_does_not_know_is_unaudited():
    verdict = audit.judge("private", "1.0", project=None, version_record=None, ignore=set(), holds={})
    assert verdict.status == "unaudited"


def test_audit_asks_for_the_release_record_then_the_project_record():
    records = {"https://x/pypi/lib/2.0/json": None, "https://x/pypi/lib/json": project("2.0"),
               "https://x/pypi/old/1.0/json": None, "https://x/pypi/old/json": project("3.0", "1.0")}
    asked = []

    def fetch(url):
        asked.append(url)
        return records[url]

    verdicts = audit.audit([("lib", "2.0"), ("old", "1.0")], fetch=fetch, ignore=set(), holds={},
                           base="https://x/pypi", workers=1)
    assert [v.status for v in verdicts] == ["clean", "unaudited"]
    assert asked == list(records)
    assert "2 packages: 1 clean, 0 vulnerable, 0 held, 1 unaudited" in audit.render(verdicts)


def test_holds_need_a_reason_and_malformed_lines_are_errors(tmp_path):
    path = tmp_path / ".dependency-holds"
    path.write_text("# comment\n\nDjango  # the LTS line, newest patch release\n")
    assert audit.read_holds(path) == {"django": "the LTS line, newest patch release"}
    path.write_text("numpy\n")
    with pytest.raises(ValueError, match="dependency-holds:1"):
        audit.read_holds(path)
    path.write_text("numpy  # short\n")
    with pytest.raises(ValueError, match="reason"):
        audit.read_holds(path)


def test_the_repository_holds_parse_and_each_names_a_reason():
    holds = audit.read_holds(ROOT / ".dependency-holds")
    assert holds, "the holds file is read"
    assert all(len(reason) > 20 for reason in holds.values())


def test_the_environment_runs_a_current_pip():
    """scripts/lib.sh upgrades the interpreter's bundled pip (23.2 here, with published advisories)."""
    from importlib import metadata

    from packaging.version import Version

    assert Version(metadata.version("pip")) >= Version("25.3")
