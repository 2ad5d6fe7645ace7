"""Dependency audit from PyPI's JSON API, for machines where pip-audit cannot look packages up (issue 8, S8).

pip-audit asks PyPI for each installed release (`/pypi/<name>/<version>/json`) or asks OSV. The registry these
machines reach answers only the project record (`/pypi/<name>/json`), whose `vulnerabilities` are the known
advisories (OSV's, as PyPI publishes them) that affect the project's LATEST release. So:

- a package whose per-version record answers is judged from it, exactly as pip-audit would;
- a package installed at its latest release is judged exactly from the project record;
- a package behind its latest release cannot be judged here: an advisory fixed between the installed release and
  the latest is not in the project record. It is UNAUDITED, and fails the audit unless `.dependency-holds` says why
  the project stays on that release (one `name  # reason` per line). A hold explains; it does not make it clean.

Any advisory that applies and is not in `.pip-audit-ignore` (with its reason) fails the audit. Run by
`scripts/audit --deps` after pip-audit when pip-audit could not look the packages up; by hand:

    .venv/bin/python scripts/dependency_audit.py [--json PATH]

Standard library plus `packaging` (a pip-audit dependency, in the dev extra); no Django.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
PYPI = "https://pypi.org/pypi"
PROJECT = "fleetyard"  # installed editable from the checkout; not on PyPI

Fetch = Callable[[str], "dict | None"]  # URL -> parsed JSON, or None for a 404


@dataclass(frozen=True)
class Verdict:
    name: str
    installed: str
    latest: str | None
    status: str  # clean | vulnerable | unaudited | held (unaudited, with a reason in .dependency-holds)
    source: str  # where the verdict comes from
    advisories: list[str] = field(default_factory=list)  # ids that apply and are not ignored
    ignored: list[str] = field(default_factory=list)  # ids that apply and are in .pip-audit-ignore
    reason: str = ""


def _public(version: str) -> str:
    """torch's `2.13.0+cpu` is the public release 2.13.0 as far as advisories go."""
    return version.split("+", 1)[0]


def latest_release(project: dict) -> str | None:
    """The newest final release with files that are not all yanked (pre-releases only when nothing else)."""
    versions = []
    for text, files in (project.get("releases") or {}).items():
        if not files or all(f.get("yanked") for f in files):
            continue
        try:
            versions.append(Version(text))
        except InvalidVersion:
            continue
    finals = [v for v in versions if not v.is_prerelease] or versions
    if finals:
        return str(max(finals))
    return (project.get("info") or {}).get("version")


def _ids(advisories: Iterable[dict]) -> list[str]:
    return sorted({str(a.get("id")) for a in advisories if a.get("id") and not a.get("withdrawn")})


def judge(name: str, installed: str, *, project: dict | None, version_record: dict | None,
          ignore: set[str], holds: dict[str, str]) -> Verdict:
    """One package's verdict (pure: the records are given)."""
    public = _public(installed)
    if version_record is not None:
        found, source = _ids(version_record.get("vulnerabilities") or []), f"PyPI record of {public}"
        latest = latest_release(project) if project else None
    elif project is None:
        return Verdict(name, installed, None, "unaudited", "PyPI has no record of the project",
                       reason=holds.get(canonicalize_name(name), ""))
    else:
        latest = latest_release(project)
        if latest is None or Version(public) != Version(latest):
            hold = holds.get(canonicalize_name(name), "")
            # advisories against the latest release most likely hit an older one too: they fail a hold
            against_latest = [i for i in _ids(project.get("vulnerabilities") or []) if i not in ignore]
            status = "vulnerable" if against_latest else ("held" if hold else "unaudited")
            return Verdict(name, installed, latest, status,
                           f"behind the latest release {latest}: advisories fixed since {public} are not listed",
                           advisories=against_latest, reason=hold)
        found, source = _ids(project.get("vulnerabilities") or []), "PyPI project record (installed = latest)"
    applies = [i for i in found if i not in ignore]
    return Verdict(name, installed, latest, "vulnerable" if applies else "clean", source,
                   advisories=applies, ignored=[i for i in found if i in ignore])


def read_ignore(path: Path) -> set[str]:
    """Advisory ids from .pip-audit-ignore (the same file pip-audit's --ignore-vuln options come from)."""
    ids = set()
    if path.exists():
        for line in path.read_text().splitlines():
            head = line.split("#", 1)[0].strip()
            if head:
                ids.add(head)
    return ids


HOLD = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s+#\s*(?P<reason>\S.*)$")


def read_holds(path: Path) -> dict[str, str]:
    """`name  # reason` lines; a line that does not match is an error, so a hold never goes silently unread."""
    holds: dict[str, str] = {}
    if not path.exists():
        return holds
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = HOLD.match(line)
        if not match or len(match["reason"].strip()) < 10:
            raise ValueError(f"{path.name}:{number}: expected `name  # reason (why this release)`, got {line!r}")
        holds[canonicalize_name(match["name"])] = match["reason"].strip()
    return holds


def installed_distributions() -> list[tuple[str, str]]:
    seen: dict[str, tuple[str, str]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonicalize_name(name) != PROJECT:
            seen[canonicalize_name(name)] = (name, dist.version)
    return sorted(seen.values(), key=lambda item: canonicalize_name(item[0]))


def fetch_json(url: str, *, timeout: float = 30.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - fixed https PyPI URLs  # nosec B310
            return json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def audit(packages: list[tuple[str, str]], *, fetch: Fetch, ignore: set[str], holds: dict[str, str],
          base: str = PYPI, workers: int = 8) -> list[Verdict]:
    def one(item: tuple[str, str]) -> Verdict:
        name, installed = item
        version_record = fetch(f"{base}/{name}/{_public(installed)}/json")
        project = fetch(f"{base}/{name}/json")
        return judge(name, installed, project=project, version_record=version_record, ignore=ignore, holds=holds)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, packages))


def failed(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.status in ("vulnerable", "unaudited")]


def render(verdicts: list[Verdict]) -> str:
    counts = {s: sum(v.status == s for v in verdicts) for s in ("clean", "vulnerable", "held", "unaudited")}
    lines = [f"{len(verdicts)} packages: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    for v in verdicts:
        if v.status == "clean" and not v.ignored:
            continue
        extra = f" advisories: {', '.join(v.advisories)}" if v.advisories else ""
        extra += f" ignored: {', '.join(v.ignored)}" if v.ignored else ""
        extra += f" hold: {v.reason}" if v.reason else ""
        lines.append(f"  {v.status:<10} {v.name} {v.installed} (latest {v.latest}): {v.source}.{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the verdicts here")
    parser.add_argument("--index", default=PYPI, help="PyPI JSON API base (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        holds = read_holds(ROOT / ".dependency-holds")
    except ValueError as exc:
        print(f"[audit] {exc}", file=sys.stderr)
        return 2
    try:
        verdicts = audit(installed_distributions(), fetch=fetch_json, ignore=read_ignore(ROOT / ".pip-audit-ignore"),
                         holds=holds, base=args.index.rstrip("/"))
    except (OSError, ValueError) as exc:
        print(f"[audit] could not reach {args.index}: {exc}", file=sys.stderr)
        return 2
    print(render(verdicts))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                                         "index": args.index, "verdicts": [asdict(v) for v in verdicts]}, indent=2))
    return 1 if failed(verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
