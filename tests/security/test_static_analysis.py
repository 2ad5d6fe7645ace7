"""S8 (issue 8): bandit finds nothing in Fleetyard's code that is not justified in the repository.

Runs bandit (offline) with the project's .bandit.yml over the same folders as `scripts/audit --bandit`, and
fails on any finding. Exceptions must carry their reason where they are made: each skip in .bandit.yml has a
comment, each `# nosec BXXX` line names the check and says why (ruff's `# noqa: SXXX - <reason>` beside it, or
`# nosec BXXX # <reason>`), and each id in .pip-audit-ignore has a `# reason`. A planted file shows that the
same run does report what it should (shell=True, yaml.load, md5, a bare nosec).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".bandit.yml"
# Kept in step with BANDIT_TARGETS in scripts/audit.
TARGETS = ["platform", "jobs", "inference", "frontend", "fleetyard", "benchmarks", "manage.py"]
NOSEC = re.compile(r"#\s*nosec\b(?P<rest>.*)$")
JUSTIFIED_NOSEC = re.compile(
    r"#\s*nosec\s+B\d{3}(?:\s*,\s*B\d{3})*\s*(?:#|:|-)\s*\S.{3,}"  # nosec B105 # why / nosec B105: why
)
RUFF_REASON = re.compile(r"#\s*noqa:\s*S(?P<code>\d{3})\s+-\s+\S.{3,}?#\s*nosec\s+B(?P<bandit>\d{3})")


def bandit(*targets: str, cwd: Path = ROOT) -> dict:
    pytest.importorskip("bandit", reason="bandit is in the dev extra (pip install -e '.[dev]')")
    result = subprocess.run([sys.executable, "-m", "bandit", "-c", str(CONFIG), "-r", *targets, "-f", "json", "-q"],
                            cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    return json.loads(result.stdout)


def test_bandit_finds_nothing_unjustified_in_the_project():
    report = bandit(*TARGETS)
    findings = [f"{r['filename']}:{r['line_number']}: {r['test_id']} {r['issue_text']}" for r in report["results"]]
    totals = report["metrics"]["_totals"]
    files = len([name for name in report["metrics"] if name != "_totals"])
    print(f"\n[S8] bandit over {files} files, {totals['loc']} lines: {len(findings)} findings, "
          f"{totals['skipped_tests']} justified `# nosec` lines, skips from .bandit.yml: {', '.join(_skips())}")
    assert not report["errors"], report["errors"]
    assert files > 100, "bandit scanned too little: check TARGETS and exclude_dirs"
    assert findings == [], "\n".join(findings)


def _skips() -> list[str]:
    import yaml

    return yaml.safe_load(CONFIG.read_text())["skips"]


def test_every_global_skip_is_explained_in_the_config():
    lines = CONFIG.read_text().splitlines()
    for skip in _skips():
        index = next(i for i, line in enumerate(lines) if line.strip() == f"- {skip}")
        comment = []
        while lines[index - 1].strip().startswith("#"):
            index -= 1
            comment.insert(0, lines[index].strip())
        assert comment and comment[0].startswith(f"# {skip} "), f"{skip} in .bandit.yml has no reason above it"
    assert len(_skips()) <= 5, "a long skip list hides findings: prefer `# nosec BXXX` on the line"


def _project_lines():
    for target in TARGETS:
        path = ROOT / target
        for file in ([path] if path.is_file() else sorted(path.rglob("*.py"))):
            if "migrations" in file.parts:
                continue
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
                yield file.relative_to(ROOT), number, line


def nosec_without_reason(line: str) -> bool:
    """True for a `# nosec` that names no check or gives no reason."""
    if not NOSEC.search(line):
        return False
    ruff = RUFF_REASON.search(line)
    if ruff:
        return ruff["code"] != ruff["bandit"]  # the same check in both tools' numbering
    return not JUSTIFIED_NOSEC.search(line)


def test_every_nosec_names_its_check_and_says_why():
    bare = [f"{file}:{number}: {line.strip()}" for file, number, line in _project_lines()
            if nosec_without_reason(line)]
    assert bare == [], "\n".join(bare)


def test_every_ignored_vulnerability_has_a_reason():
    for line in (ROOT / ".pip-audit-ignore").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        vuln_id, _, reason = line.partition("#")
        assert re.fullmatch(r"\s*(PYSEC|GHSA|CVE|OSV)-[\w-]+\s*", vuln_id), line
        assert len(reason.strip()) > 10, f"{vuln_id.strip()} in .pip-audit-ignore has no reason"


PLANTED = '''
import hashlib
import subprocess

import yaml


def run(command: str) -> None:
    subprocess.call(command, shell=True)


def load(path: str):
    return yaml.load(open(path))


def digest(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


TOKEN = "fy_" + "0" * 40  # nosec
'''


def test_the_same_run_reports_what_it_should(tmp_path):
    (tmp_path / "planted.py").write_text(PLANTED)
    report = bandit("planted.py", cwd=tmp_path)
    found = {r["test_id"] for r in report["results"]}
    assert {"B602", "B506", "B324"} <= found, found
    assert nosec_without_reason('TOKEN = "x"  # nosec')
    assert nosec_without_reason('TOKEN = "x"  # nosec B105')
    assert nosec_without_reason('TOKEN = "x"  # noqa: S106 - a prefix  # nosec B105')  # numbers differ
    assert not nosec_without_reason('TOKEN = "x"  # noqa: S105 - a public prefix  # nosec B105')
    assert not nosec_without_reason('TOKEN = "x"  # nosec B105 # a public prefix, not a secret')
