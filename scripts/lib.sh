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
