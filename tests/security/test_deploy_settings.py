"""S8 (issue 8): the production profile (FLEETYARD_EMBEDDED=false) passes `manage.py check --deploy` with no
warning, and refuses to start with DEBUG, a missing, short or placeholder secret key, or open hosts ('*').

Each case runs `manage.py check --deploy --fail-level WARNING` in a fresh process with that environment, as a
deployment would start. Then the HTTPS behaviour itself is checked in a production process: plain http is
redirected (not the health check), a request the TLS proxy marks https is served with HSTS, and the session and
CSRF cookies are Secure. compose.yaml serves plain http on 127.0.0.1 and turns HTTPS off (FLEETYARD_HTTPS=false):
`check --deploy` then lists exactly the HTTPS warnings, which is what that switch is for.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD_SECRET = secrets.token_urlsafe(50)


def production_env(tmp_path: Path, **changes: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("FLEETYARD_", "CELERY_", "DJANGO_")) and key != "RAY_ADDRESS"}
    env.update(FLEETYARD_EMBEDDED="false", FLEETYARD_SECRET_KEY=GOOD_SECRET, FLEETYARD_DATA_DIR=str(tmp_path),
               FLEETYARD_ALLOWED_HOSTS="fleetyard.example.com", PYTHONPATH=f"{ROOT}:{ROOT / 'platform'}")
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_production_settings_pass_check_deploy(tmp_path):
    result = check_deploy(production_env(tmp_path))
    print(f"\n[S8] manage.py check --deploy --fail-level WARNING (production): exit {result.returncode}: "
          f"{result.stdout.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


REFUSALS = [
    ("DEBUG", {"FLEETYARD_DEBUG": "true"}, "FLEETYARD_DEBUG=true is refused outside the embedded profile"),
    ("no secret", {"FLEETYARD_SECRET_KEY": None}, "FLEETYARD_SECRET_KEY is required"),
    ("empty secret", {"FLEETYARD_SECRET_KEY": ""}, "FLEETYARD_SECRET_KEY is required"),
    ("short secret", {"FLEETYARD_SECRET_KEY": "s3cr3t-but-short"}, "16 characters long; use at least 50"),
    ("django's insecure key", {"FLEETYARD_SECRET_KEY": "django-insecure-" + "k" * 10 + GOOD_SECRET},
     "Django's generated insecure development key"),
    ("placeholder secret", {"FLEETYARD_SECRET_KEY": "change-me-" + "x1y2z3" * 10}, "'change-me'"),
    ("one repeated character", {"FLEETYARD_SECRET_KEY": "a" * 64}, "fewer than 5 distinct characters"),
    ("open hosts", {"FLEETYARD_ALLOWED_HOSTS": "*"}, "FLEETYARD_ALLOWED_HOSTS contains *"),
    ("open hosts among others", {"FLEETYARD_ALLOWED_HOSTS": "fleetyard.example.com,*"},
     "FLEETYARD_ALLOWED_HOSTS contains *"),
]


@pytest.mark.parametrize(("label", "changes", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_production_refuses_to_start_with_an_unsafe_setting(tmp_path, label, changes, message):
    result = check_deploy(production_env(tmp_path, **changes))
    assert result.returncode != 0, f"{label}: started anyway\n{result.stdout}"
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr[-2000:]
    reason = result.stderr.strip().splitlines()[-1]
    print(f"\n[S8] {label}: exit {result.returncode}: {reason}")


def test_the_embedded_profile_still_starts_with_its_defaults(tmp_path):
    env = production_env(tmp_path, FLEETYARD_EMBEDDED=None, FLEETYARD_SECRET_KEY=None, FLEETYARD_ALLOWED_HOSTS=None)
    result = subprocess.run([sys.executable, "manage.py", "check", "--fail-level", "WARNING"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]


def test_plain_http_without_a_proxy_lists_exactly_the_https_warnings(tmp_path):
    """compose.yaml's setting: FLEETYARD_HTTPS=false. Everything else stays refused or clean."""
    result = check_deploy(production_env(tmp_path, FLEETYARD_HTTPS="false"))
    assert result.returncode != 0
    warnings = sorted({line.split("(")[1].split(")")[0] for line in (result.stdout + result.stderr).splitlines()
                       if line.startswith("?: (security.")})
    assert warnings == ["security.W004", "security.W008", "security.W012", "security.W016"], result.stderr


HTTPS_PROBE = """
import json, django
django.setup()
from django.test import Client
from django.conf import settings
client = Client(HTTP_HOST="fleetyard.example.com")
plain = client.get("/api/v1/me/")
health = client.get("/healthz")
proxied = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location", "")],
    "health": health.status_code,
    "proxied": [proxied.status_code, proxied.get("Strict-Transport-Security", "")],
    "csrf_cookie_secure": bool(proxied.cookies.get("csrftoken") and proxied.cookies["csrftoken"]["secure"]),
    "session_cookie_secure": settings.SESSION_COOKIE_SECURE,
}))
"""


def test_production_redirects_to_https_and_marks_cookies_secure(tmp_path):
    env = production_env(tmp_path, DJANGO_SETTINGS_MODULE="controlplane.settings")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    result = subprocess.run([sys.executable, "-c", HTTPS_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"\n[S8] production over http/https: {seen}")
    assert seen["plain"] == [301, "https://fleetyard.example.com/api/v1/me/"]
    assert seen["health"] == 200  # the container health check probes http directly
    assert seen["proxied"][0] == 200
    assert seen["proxied"][1] == "max-age=31536000; includeSubDomains"
    assert seen["csrf_cookie_secure"] and seen["session_cookie_secure"]
