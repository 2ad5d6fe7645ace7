# Shared by scripts/up and scripts/test: create or refresh the virtual environment in .venv.
# Reinstalls only when pyproject.toml changed since the last install (a stamp file records its hash).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

ensure_venv() {
  local python="${FLEETYARD_PYTHON:-python3}"
  if [ ! -x "$PY" ]; then
    echo "[fleetyard] creating the virtual environment in .venv"
    "$python" -m venv "$VENV"
  fi
  # The interpreter's bundled pip is old (23.2 on these machines, with published advisories): every install
  # starts from a current one (scripts/audit checks it with the rest).
  if ! "$PY" -m pip --version 2>/dev/null | grep -qE '^pip (2[5-9]|[3-9][0-9])\.'; then
    "$PY" -m pip install --disable-pip-version-check -q --upgrade "pip>=25.3" > /dev/null 2>&1 \
      || echo "[fleetyard] could not upgrade pip; the dependency audit will say so" >&2
  fi
  local stamp="$VENV/.fleetyard-installed" want
  want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[fleetyard] installing dependencies (first run takes a few minutes)"
    local log="$VENV/pip-install.log"
    # The CPU build of torch first: a looser requirement would pull GBs of CUDA packages.
    if ! { "$PY" -m pip install --disable-pip-version-check "torch==2.13.0" \
           && "$PY" -m pip install --disable-pip-version-check -e "$ROOT[dev]"; } > "$log" 2>&1; then
      echo "[fleetyard] installing dependencies failed; the last lines of $log:" >&2
      tail -n 30 "$log" >&2
      exit 1
    fi
    echo "$want" > "$stamp"
  fi
}
