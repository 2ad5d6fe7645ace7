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

# FLEETYARD_EMBEDDED=false is the production profile: it refuses to start with settings that are unsafe on a
# network (below, after ALLOWED_HOSTS) and serves over HTTPS unless told otherwise (FLEETYARD_HTTPS).
EMBEDDED = env_bool("FLEETYARD_EMBEDDED", True)
DEBUG = env_bool("FLEETYARD_DEBUG", False)
_secret = os.environ.get("FLEETYARD_SECRET_KEY")
if not _secret:
    if not EMBEDDED:
        raise ImproperlyConfigured("FLEETYARD_SECRET_KEY is required outside the embedded profile")
    # Embedded profile: a per-installation random key kept in the data folder, never in the code.
    from controlplane.common.secret_file import read_or_create_secret

    _secret = read_or_create_secret(DATA_DIR / "secret_key")
SECRET_KEY = _secret
ALLOWED_HOSTS = env_list("FLEETYARD_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("FLEETYARD_CSRF_TRUSTED_ORIGINS", [])


def weak_secret_reason(secret: str) -> str | None:
    """Why a secret key is not fit for production, or None: Django's own test (security.W009: at least 50
    characters, 5 distinct ones, not django-insecure-) plus words that mark a placeholder copied from a sample."""
    if secret.startswith("django-insecure-"):
        return "is Django's generated insecure development key"
    if len(secret) < 50:
        return f"is {len(secret)} characters long; use at least 50 random characters"
    if len(set(secret)) < 5:
        return "has fewer than 5 distinct characters"
    placeholder = next((word for word in WEAK_SECRET_WORDS if word in secret.lower()), None)
    if placeholder:
        return f"contains {placeholder!r}, which marks a placeholder, not a random key"
    return None


WEAK_SECRET_WORDS = ("changeme", "change-me", "change_me", "insecure", "default", "example", "placeholder",
                     "secret-key", "secret_key", "test-only", "your-", "xxxxx")

if not EMBEDDED:
    if DEBUG:
        raise ImproperlyConfigured(
            "FLEETYARD_DEBUG=true is refused outside the embedded profile: debug pages show settings, code and "
            "queries to anyone who triggers an error")
    _weak = weak_secret_reason(SECRET_KEY)
    if _weak:
        raise ImproperlyConfigured(f"FLEETYARD_SECRET_KEY {_weak}; make one with: "
                                   "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'")
    _open = [host for host in ALLOWED_HOSTS if "*" in host]
    if _open:
        raise ImproperlyConfigured(
            f"FLEETYARD_ALLOWED_HOSTS contains {', '.join(_open)}: outside the embedded profile name the hosts the "
            "platform answers to (a leading dot, .example.com, allows a domain's subdomains)")

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
    "controlplane.common",  # the task delivery ledger (dead letters)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Before anything that could read the body: an oversized one is refused from its Content-Length.
    "controlplane.common.limits.RequestBodyLimitMiddleware",
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
FILE_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FLEETYARD_MAX_DATASET_UPLOAD_BYTES = env_int("FLEETYARD_MAX_DATASET_UPLOAD_BYTES", 2 * 1024**3)


def env_limit(name: str, default: int, *, minimum: int = 1) -> int:
    value = env_int(name, default)
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


# Limits on what one request may ask for (common/limits.py enforces them; each refusal names the field):
# - a request body longer than this is refused with 413 before any of it is read (dataset uploads, multipart,
#   have FLEETYARD_MAX_DATASET_UPLOAD_BYTES instead); Django's own form-data limit is the same number.
FLEETYARD_MAX_REQUEST_BODY_BYTES = env_limit("FLEETYARD_MAX_REQUEST_BODY_BYTES", 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = FLEETYARD_MAX_REQUEST_BODY_BYTES
# - a YAML spec (POST /api/v1/specs/apply/) longer than this is a 400 (fleetyard.spec also refuses one of more than
#   4,000 lines and flow items: YAML parsing in Python costs about 0.1 ms for each).
FLEETYARD_MAX_SPEC_BYTES = env_limit("FLEETYARD_MAX_SPEC_BYTES", 64 * 1024)
# - a list's ?page_size= above this is capped to it.
FLEETYARD_MAX_PAGE_SIZE = env_limit("FLEETYARD_MAX_PAGE_SIZE", 500)
# - the size of one training job (workers_max, devices per worker, workers x devices) and one deployment.
FLEETYARD_MAX_WORKERS_PER_JOB = env_limit("FLEETYARD_MAX_WORKERS_PER_JOB", 1024)
FLEETYARD_MAX_DEVICES_PER_WORKER = env_limit("FLEETYARD_MAX_DEVICES_PER_WORKER", 64)
FLEETYARD_MAX_DEVICES_PER_JOB = env_limit("FLEETYARD_MAX_DEVICES_PER_JOB", 8192)
FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT = env_limit("FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT", 256)
# - training jobs and deployments a team may submit per minute (API, retry, spec apply; counted in the database
#   so every web process agrees); more get 429 with Retry-After. 0 turns the limit off.
FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE = env_limit("FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE", 120,
                                                          minimum=0)
# Exact host:port pairs the platform may fetch datasets from although they are internal (a mirror in your
# network). Everything else internal is refused (common/netguard.py).
FLEETYARD_FETCH_ALLOW_HOSTS = env_list("FLEETYARD_FETCH_ALLOW_HOSTS", [])
# Folders a deployment's model_uri may name (a model directory: config.json + model.pt). Anything else on the
# platform's hosts (another team's checkpoints, the database, system files) is refused; a team deploys its
# own training job's checkpoint by naming the job instead.
FLEETYARD_MODEL_DIRS = env_list("FLEETYARD_MODEL_DIRS", [str(DATA_DIR / "models")])
# FLEETYARD_REPLICA_KV_LIMIT_GIB (default 8): the keys and values one serving replica may hold. Read where it is
# used (inference/runtime/engine_config.py: the deploy check here, the engine in each replica); checked now so that
# a bad value fails at start-up.
try:
    from inference.runtime.engine_config import replica_kv_limit_bytes

    replica_kv_limit_bytes()
except ValueError as _exc:
    raise ImproperlyConfigured(str(_exc)) from None

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# HTTPS (on by default in production): TLS ends at a reverse proxy that sets X-Forwarded-Proto; plain-http
# requests are redirected (except the health check, which probes the web process directly), cookies are sent
# only over HTTPS and browsers are told to use nothing else (HSTS). compose.yaml sets FLEETYARD_HTTPS=false
# because it serves plain http on 127.0.0.1 with no proxy; put a TLS proxy in front and set it true.
# Trust X-Forwarded-Proto only where every request comes through that proxy (the web port is not reachable
# otherwise), as a client could send the header itself.
FLEETYARD_HTTPS = env_bool("FLEETYARD_HTTPS", not EMBEDDED)
if FLEETYARD_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("FLEETYARD_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_limit("FLEETYARD_HSTS_SECONDS", 365 * 24 * 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("FLEETYARD_HSTS_INCLUDE_SUBDOMAINS", True)
    # Preloading is the domain owner's one-way submission to the browsers' lists, not the software's choice:
    # off unless asked for, and Django's reminder about it (security.W021) is silenced.
    SECURE_HSTS_PRELOAD = env_bool("FLEETYARD_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.tenancy.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.common.api.StandardPagination",
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.common.parsers.BoundedJSONParser",  # a 400, not a 500, for JSON nested too deeply
        "rest_framework.parsers.FormParser",
        "controlplane.common.parsers.StrictMultiPartParser",  # a file part Django would drop unread is a 400
    ],
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "controlplane.common.filters.StrictFilterBackend",
        # All three refuse their parameters on a detail route (they do not narrow its lookup); the last two also what
        # they cannot act on (an unknown ordering field; search where a view has no search fields), and every
        # paginated list refuses unknown query parameters (controlplane.common.filters).
        "controlplane.common.filters.StrictOrderingFilter",
        "controlplane.common.filters.StrictSearchFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "controlplane.common.openapi.FleetyardAutoSchema",
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
        "ReclaimPolicyEnum": "controlplane.quotas.models.ReclaimPolicy",
    },
}

# Celery: the embedded profile uses kombu's file-system transport (no server), production sets
# CELERY_BROKER_URL. Tasks carry plain ids; the database row is the truth of each operation.
_broker_dir = DATA_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
# A message a killed worker had in hand comes back: the file-system broker keeps it in the worker's in-hand
# folder until the ack (common/filesystem_broker.py; kombu's own transport deleted it on read); Redis restores
# it once unacknowledged for FLEETYARD_BROKER_VISIBILITY_SECONDS (longer than any task runs, or a slow task
# is delivered twice), checked every FLEETYARD_BROKER_RESTORE_SECONDS; RabbitMQ redelivers it at once.
FLEETYARD_BROKER_VISIBILITY_SECONDS = env_int("FLEETYARD_BROKER_VISIBILITY_SECONDS", 3600)
FLEETYARD_BROKER_RESTORE_SECONDS = env_int("FLEETYARD_BROKER_RESTORE_SECONDS", 10)
if CELERY_BROKER_URL.startswith("filesystem"):
    from controlplane.common.filesystem_broker import register as _register_durable_filesystem_broker

    _register_durable_filesystem_broker()
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "in_hand_folder": str(_broker_dir / "in_hand"),
        "store_processed": False,
        # A worker holding its one prefetched message polls again after this; kombu's 1 s made every task of
        # the embedded profile wait up to a second.
        "polling_interval": env_float("FLEETYARD_BROKER_POLL_SECONDS", 0.1),
    }
elif CELERY_BROKER_URL.startswith(("redis", "rediss")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": FLEETYARD_BROKER_VISIBILITY_SECONDS,
                                       "unacked_restore_interval": FLEETYARD_BROKER_RESTORE_SECONDS,
                                       "unacked_restore_throttle": 1}
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
# A message whose worker was lost this many deliveries in a row (it kills its worker, or runs out of memory
# every time) is dead-lettered instead of re-queued forever (common/deliveries.py; admin: Task deliveries).
FLEETYARD_TASK_MAX_WORKER_LOSSES = env_int("FLEETYARD_TASK_MAX_WORKER_LOSSES", 3)
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# How long a worker waits for the result of a pool process that died before it re-queues the message (Celery's
# default 10 s). Results are ignored and tasks idempotent, so it re-queues sooner.
CELERY_WORKER_LOST_WAIT = env_float("FLEETYARD_WORKER_LOST_WAIT_SECONDS", 2.0)
# Keep the real stdout/stderr in workers: ray.init needs their file descriptors (Celery's logging
# proxy has none, and connecting to Ray from a task failed with "no attribute 'fileno'").
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
FLEETYARD_NODE_SYNC_SECONDS = env_int("FLEETYARD_NODE_SYNC_SECONDS", 10)
FLEETYARD_SCHEDULING_SECONDS = env_int("FLEETYARD_SCHEDULING_SECONDS", 5)
# Task outbox: a message no worker took for this long (since it was last sent) is sent again with the same id.
FLEETYARD_OUTBOX_RESEND_SECONDS = env_int("FLEETYARD_OUTBOX_RESEND_SECONDS", 300)
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
    "resend-undelivered": {"task": "common.resend_undelivered", "schedule": 30.0},
}
