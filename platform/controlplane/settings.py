"""Django settings for Fleetyard, read from the environment.

Two profiles share this file (DESIGN.md, "Profiles"):
- embedded (default): SQLite and a file-system Celery broker under FLEETYARD_DATA_DIR, and a local
  Ray cluster that scripts/up starts;
- production: FLEETYARD_DATABASE_URL=postgres://..., CELERY_BROKER_URL=redis://... or amqp://...,
  RAY_ADDRESS of an external cluster.
Bad values fail at import time with the variable's name, never later at first use.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

ROOT_DIR = Path(__file__).resolve().parents[2]


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise ImproperlyConfigured(f"environment variable {name} is required")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ImproperlyConfigured(f"{name}={raw!r} must be positive")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme in {"postgres", "postgresql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    if parsed.scheme == "sqlite":
        return sqlite_database(Path(unquote(parsed.path)))
    raise ImproperlyConfigured(
        f"FLEETYARD_DATABASE_URL scheme {parsed.scheme!r} is not supported (use postgres:// or sqlite://)"
    )


def sqlite_database(path: Path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        # A file, not memory, so a real Celery worker started by a test sees the same data.
        "TEST": {"NAME": str(path.with_name(f"test-{path.stem}-{os.getpid()}.sqlite3"))},
        # Web, Celery worker and beat share the file: WAL lets readers run beside one writer, and
        # IMMEDIATE transactions take the write lock up front instead of failing on upgrade.
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }


DATA_DIR = Path(env_str("FLEETYARD_DATA_DIR", str(ROOT_DIR / "var"))).resolve()

DEBUG = env_bool("FLEETYARD_DEBUG", False)
_secret = os.environ.get("FLEETYARD_SECRET_KEY")
if not _secret:
    if not env_bool("FLEETYARD_EMBEDDED", True):
        raise ImproperlyConfigured("FLEETYARD_SECRET_KEY is required outside the embedded profile")
    # Embedded profile: a per-installation random key kept in the data folder, never in the code.
    from controlplane.common.secret_file import read_or_create_secret

    _secret = read_or_create_secret(DATA_DIR / "secret_key")
SECRET_KEY = _secret
ALLOWED_HOSTS = env_list("FLEETYARD_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("FLEETYARD_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "controlplane.tenancy",
    "controlplane.cluster",
    "controlplane.quotas",
    "controlplane.datasets",
    "jobs",
    "inference",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = os.environ.get("FLEETYARD_DATABASE_URL", "")
DATABASES = {
    "default": database_from_url(_database_url)
    if _database_url
    else sqlite_database(DATA_DIR / "fleetyard.sqlite3")
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
MEDIA_ROOT = Path(env_str("FLEETYARD_STORAGE_DIR", str(DATA_DIR / "storage"))).resolve()
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FLEETYARD_MAX_DATASET_UPLOAD_BYTES = env_int("FLEETYARD_MAX_DATASET_UPLOAD_BYTES", 2 * 1024**3)
# Exact host:port pairs the platform may fetch datasets from although they are internal (a mirror in your
# network). Everything else internal is refused (common/netguard.py).
FLEETYARD_FETCH_ALLOW_HOSTS = env_list("FLEETYARD_FETCH_ALLOW_HOSTS", [])
# Folders a deployment's model_uri may name (a model directory: config.json + model.pt). Anything else on the
# platform's hosts (another team's checkpoints, the database, system files) is refused; a team deploys its
# own training job's checkpoint by naming the job instead.
FLEETYARD_MODEL_DIRS = env_list("FLEETYARD_MODEL_DIRS", [str(DATA_DIR / "models")])

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.tenancy.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.common.api.StandardPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.common.api.exception_handler",
    "DEFAULT_THROTTLE_RATES": {},
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Fleetyard API",
    "DESCRIPTION": (
        "Self-hosted AI compute platform: teams, quotas, node pools, datasets, training jobs and "
        "deployments. Authenticate with `Authorization: Bearer <token>` (team API token) or a "
        "console session. Node pools marked `simulated` advertise logical accelerators on CPU hosts."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "TrainingJobStateEnum": "jobs.states.JobState",
        "DeploymentStateEnum": "inference.states.DeploymentState",
        "RoleEnum": "controlplane.tenancy.models.Role",
        "PreemptionPolicyEnum": "controlplane.quotas.models.PreemptionPolicy",
    },
}

# Celery: the embedded profile uses kombu's file-system transport (no server), production sets
# CELERY_BROKER_URL. Tasks carry plain ids; the database row is the truth of each operation.
_broker_dir = DATA_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    else {}
)
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep the real stdout/stderr in workers: ray.init needs their file descriptors (Celery's logging
# proxy has none, and connecting to Ray from a task failed with "no attribute 'fileno'").
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
FLEETYARD_NODE_SYNC_SECONDS = env_int("FLEETYARD_NODE_SYNC_SECONDS", 10)
FLEETYARD_SCHEDULING_SECONDS = env_int("FLEETYARD_SCHEDULING_SECONDS", 5)
FLEETYARD_TRAINING_SYNC_SECONDS = env_float("FLEETYARD_TRAINING_SYNC_SECONDS", 2.0)
# Serving: how often services are observed and autoscaled, and the request window the SLA is measured over.
FLEETYARD_SERVING_SYNC_SECONDS = env_float("FLEETYARD_SERVING_SYNC_SECONDS", 5.0)
FLEETYARD_SERVING_WINDOW_SECONDS = env_int("FLEETYARD_SERVING_WINDOW_SECONDS", 60)
# Overrides of jobs.runtime.faults.DetectionPolicy (hang_factor, hang_floor_s, heartbeat_timeout_s ...).
FLEETYARD_FAULT_DETECTION: dict = {}

# Compute backend: "ray" talks to the cluster at RAY_ADDRESS (scripts/up starts a local one and
# writes its address); "memory" is the in-process fake for unit tests.
FLEETYARD_COMPUTE_BACKEND = env_str("FLEETYARD_COMPUTE_BACKEND", "memory")
if FLEETYARD_COMPUTE_BACKEND not in {"memory", "ray"}:
    raise ImproperlyConfigured(
        f"FLEETYARD_COMPUTE_BACKEND={FLEETYARD_COMPUTE_BACKEND!r} must be 'memory' or 'ray'"
    )
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("FLEETYARD_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

CELERY_BEAT_SCHEDULE = {
    "sync-nodes": {"task": "cluster.sync_nodes", "schedule": float(FLEETYARD_NODE_SYNC_SECONDS)},
    "scheduling-cycle": {"task": "jobs.run_scheduling_cycle", "schedule": float(FLEETYARD_SCHEDULING_SECONDS)},
    "sync-training-jobs": {"task": "jobs.sync_training_jobs", "schedule": FLEETYARD_TRAINING_SYNC_SECONDS},
    "sync-deployments": {"task": "inference.sync_deployments", "schedule": FLEETYARD_SERVING_SYNC_SECONDS},
}
