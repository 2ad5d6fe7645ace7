"""The Fleetyard YAML spec: one format for training jobs and deployments, in the words SkyPilot, dstack
and Ray Jobs users already know, turned into the REST API's create bodies.

    name: train-lm
    queue: default
    priority: standard
    workers: 2                   # or num_nodes: 2, or {min: 1, max: 4} for an elastic gang
    resources:
      accelerators: H100:8       # or a list / any_of of acceptable types; `cpu` for CPU workers
      cpus: 8+
      memory: 64+
    workdir: /data/code          # a directory on the cluster's workers
    setup: pip install -r requirements.txt
    run: python train.py         # or leave run out and set hyperparameters for the built-in trainer
    envs: {WANDB_MODE: offline}
    secrets: [HF_TOKEN]          # values come from your environment, never from the file
    dataset: dataset://tiny-tales@1
    checkpoint: {interval_steps: 100, keep_last: 3}
    retry: {max_restarts: 3}
    max_duration: 2h

A deployment adds a `service` block (model or a training job's checkpoint, SLA targets, replicas).

`parse_spec` reads the text into a YAML node tree first, so every error names its line, the dotted
field path and the reason (`spec.yaml:7: resources.accelerators: unknown accelerator 'H900' ...`).
Pure Python: imports no Django, Ray or torch; the server parses submitted specs with this module too.
"""

from __future__ import annotations

import difflib
import math
import re
import reprlib
from dataclasses import dataclass, field

import yaml

from fleetyard.errors import SpecError, SpecIssue

# The platform's accelerator slugs (platform/controlplane/cluster/accelerator_facts.py; a test keeps them
# in step) and the short names users type (SkyPilot's `H100:8`).
ACCELERATOR_SLUGS: dict[str, tuple[str, ...]] = {
    "nvidia-h100": ("h100", "h100-sxm", "h100-80gb"),
    "nvidia-h200": ("h200",),
    "nvidia-a100": ("a100", "a100-80gb", "a100-sxm"),
    "nvidia-l40s": ("l40s",),
    "amd-mi300x": ("mi300x",),
    "kunlun-p800": ("p800", "kunlun-p800"),
    "ascend-910b": ("910b", "ascend910b", "ascend-910b"),
    "cpu": ("cpu", "cpus"),
}
_ALIASES = {alias: slug for slug, aliases in ACCELERATOR_SLUGS.items() for alias in (slug, *aliases)}
SHORT_NAMES = {"nvidia-h100": "H100", "nvidia-h200": "H200", "nvidia-a100": "A100", "nvidia-l40s": "L40S",
               "amd-mi300x": "MI300X", "kunlun-p800": "P800", "ascend-910b": "910B", "cpu": "cpu"}

JOB = "training_job"
DEPLOYMENT = "deployment"
BUILTIN_TRAINER = "builtin-transformer-lm"
ENTRYPOINT_TRAINER = "entrypoint"
ROUTERS = ("prefix", "pow2", "round_robin")

TOP_LEVEL = {
    "kind", "name", "team", "queue", "priority", "workers", "num_nodes", "resources", "image", "workdir",
    "setup", "run", "trainer", "hyperparameters", "envs", "secrets", "dataset", "datasets", "checkpoint",
    "retry", "max_duration", "parallelism", "service", "description",
}
JOB_ONLY = {"workers", "num_nodes", "setup", "run", "trainer", "hyperparameters", "dataset", "datasets",
            "checkpoint", "retry", "max_duration", "parallelism", "workdir", "secrets", "envs", "image"}
RESOURCE_KEYS = {"accelerators", "any_of", "cpus", "memory"}
SERVICE_KEYS = {"model", "checkpoint", "replicas", "replica_policy", "sla", "router", "engine"}
SLA_KEYS = {"ttft_p95", "tpot_p95", "min_throughput", "ttft_p95_ms", "tpot_p95_ms", "min_throughput_tps"}
# Lines plus flow-collection marks a spec may have (the parser's cost grows with them; see _Reader.load).
MAX_SPEC_STRUCTURE = 4000
MAX_SPEC_NESTING = 32
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# The platform's bound on max_duration (jobs.models.MAX_DURATION_SECONDS; tests/api/test_api_strictness.py
# holds them equal): refused here, the CLI stops before sending, with the line.
MAX_DURATION_SECONDS = 366 * 86400
# The platform's bounds on a checkpoint policy (jobs.models.MAX_CHECKPOINT_INTERVAL_STEPS, the job serializer's
# keep_last): the spec allowed at most 4096 for both, so `interval_steps: 5000` was refused here and by the API.
CHECKPOINT_BOUNDS = {"interval_steps": 1_000_000_000, "keep_last": 1000}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: "^...$" let "A\n" through
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_AT_LEAST = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(\+)?\s*$")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gb|gib|g)?\s*(\+)?\s*$", re.IGNORECASE)
_SHORT = reprlib.Repr()  # a value in a message, cut short (a key may alias a tree of millions of items)
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60


# ------------------------------------------------------------------------------------ resource strings

@dataclass(frozen=True)
class AcceleratorRequest:
    """`H100:8` -> AcceleratorRequest("nvidia-h100", 8.0)."""

    slug: str
    count: float

    def __str__(self) -> str:
        count = int(self.count) if self.count == int(self.count) else self.count
        return f"{SHORT_NAMES.get(self.slug, self.slug)}:{count}"


def accelerator_slug(name: str) -> str:
    """`H100`, `h100`, `nvidia-h100` -> `nvidia-h100`; ValueError naming the known types otherwise."""
    key = str(name).strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    known = ", ".join(f"{SHORT_NAMES[slug]} ({slug})" for slug in ACCELERATOR_SLUGS)
    close = difflib.get_close_matches(key, list(_ALIASES), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown accelerator {name!r}; {hint}known: {known}")


def parse_accelerator(text) -> AcceleratorRequest:
    """`H100:8`, `A100` (one device), `L40S:0.5` (a fraction, for serving), `cpu`."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected TYPE:COUNT such as H100:8, got {text!r}")
    name, sep, count_text = text.strip().partition(":")
    slug = accelerator_slug(name)
    count = 1.0
    if sep:
        try:
            count = float(count_text.strip())
        except ValueError:
            raise ValueError(f"count {count_text.strip()!r} in {text!r} is not a number (use TYPE:COUNT such as "
                             "H100:8)") from None
        if not math.isfinite(count) or count <= 0:
            raise ValueError(f"count in {text!r} must be a positive number")
        if count > 64:
            raise ValueError(f"count in {text!r} is more than 64 devices per worker")
    return AcceleratorRequest(slug, count)


def parse_at_least(value, *, what: str = "value") -> float:
    """`8+`, `8`, 8, 8.5 -> 8.0 (a minimum: SkyPilot's `8+` means at least 8)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number such as 8 or 8+, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    else:
        match = _AT_LEAST.match(str(value))
        if match is None:
            raise ValueError(f"expected a number such as 8 or 8+ ({what}), got {value!r}")
        number = float(match[1])
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a positive number, got {value!r}")
    return number


def parse_memory(value) -> float:
    """`64+`, `64`, `64GB`, `64GB+` -> 64.0 (GB of host memory, a minimum)."""
    if isinstance(value, bool):
        raise ValueError(f"expected gigabytes such as 64 or 64+, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    else:
        match = _MEMORY.match(str(value))
        if match is None:
            raise ValueError(f"expected gigabytes such as 64, 64+ or 64GB, got {value!r}")
        number = float(match[1])
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a positive number of GB, got {value!r}")
    return number


def parse_duration(value) -> int:
    """`2h`, `90m`, `1h30m`, `45s`, or a number of seconds -> whole seconds (at least 1)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 2h, 90m or 3600, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        else:
            parts = _DURATION_PART.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"expected a duration such as 2h, 90m, 1h30m or 3600 (seconds), got {value!r}")
            unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
            seconds = sum(float(n) * unit[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 1:
        raise ValueError(f"must be at least 1 second, got {value!r}")
    return int(math.ceil(seconds))


def parse_milliseconds(value) -> int:
    """`500ms`, `0.5s`, or a number of milliseconds -> whole milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected milliseconds such as 500 or 500ms, got {value!r}")
    if isinstance(value, int | float):
        ms = float(value)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*", str(value).lower())
        if match is None:
            raise ValueError(f"expected milliseconds such as 500, 500ms or 0.5s, got {value!r}")
        ms = float(match[1]) * (1000 if match[2] == "s" else 1)
    if not math.isfinite(ms) or ms < 1:
        raise ValueError(f"must be at least 1 ms, got {value!r}")
    return int(round(ms))


# ------------------------------------------------------------------------------------ parsed spec

@dataclass
class Spec:
    """A parsed spec: the REST create body of its kind, plus what the platform does not act on."""

    kind: str                     # JOB or DEPLOYMENT
    body: dict
    warnings: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)      # names whose values the client supplies
    origins: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # REST field -> (spec path, line)
    filename: str = "spec.yaml"

    def locate(self, rest_field: str) -> tuple[str, int | None]:
        """Where a REST field came from in the spec, for server-side errors."""
        head = rest_field.split(".")[0]
        return self.origins.get(rest_field) or self.origins.get(head) or (rest_field, None)


class _Reader:
    """Walks the composed YAML node tree, keeping each value's line, and collects issues."""

    def __init__(self, filename: str):
        self.filename = filename
        self.lines: dict[str, int] = {}
        self.issues: list[SpecIssue] = []
        self.values = 0  # nodes converted, an alias counted each time it is used

    def load(self, text: str):
        structure = text.count("\n") + sum(text.count(mark) for mark in "[]{},")
        if structure > MAX_SPEC_STRUCTURE:
            # PyYAML's pure-Python parser costs about 0.1 ms per line or flow item: a 256 KiB flow list took
            # 29 s of CPU on the server. A spec is a few dozen lines.
            raise SpecError([SpecIssue(None, "", f"too large to parse: {structure} lines and flow-collection marks "
                                                 f"([ ] {{ }} ,), at most {MAX_SPEC_STRUCTURE}")],
                            filename=self.filename)
        depth = deepest = 0
        for mark in re.finditer(r"[\[\]{}]", text):  # counted in strings too: a spec needs 3 or 4 levels
            depth = depth + 1 if mark.group() in "[{" else max(0, depth - 1)
            deepest = max(deepest, depth)
        if deepest > MAX_SPEC_NESTING:
            raise SpecError([SpecIssue(None, "", f"nested {deepest} levels deep in [ ] and {{ }}, at most "
                                                 f"{MAX_SPEC_NESTING}")], filename=self.filename)
        try:
            loader = yaml.SafeLoader(text)
        except yaml.reader.ReaderError as exc:  # a control character (NUL, BEL, ...): found before parsing starts
            line = text.count("\n", 0, exc.position) + 1  # (before, it escaped: a CLI traceback, an API 500; QA)
            raise SpecError([SpecIssue(line, "", f"invalid YAML: character U+{exc.character:04X} is not allowed "
                                                 "(a control character; write it as an escape in a quoted string)")],
                            filename=self.filename) from None
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            return self._convert(loader, node, "")
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            reason = " ".join(part for part in (exc.context, exc.problem) if part) or "invalid YAML"
            raise SpecError([SpecIssue(mark.line + 1 if mark else None, "", f"invalid YAML: {reason}")],
                            filename=self.filename) from None
        except yaml.YAMLError as exc:
            raise SpecError([SpecIssue(None, "", f"invalid YAML: {exc}")], filename=self.filename) from None
        except RecursionError:  # `[[[[...`: deeper than Python's recursion limit
            raise SpecError([SpecIssue(None, "", "invalid YAML: nested too deeply")], filename=self.filename) from None
        finally:
            loader.dispose()

    def _convert(self, loader, node, path: str):
        self.values += 1
        if self.values > MAX_SPEC_STRUCTURE:
            # An alias repeats its anchor's whole tree: eight lines of `b: &b [*a, *a, ...]` (a "billion laughs") are
            # 43 million values, which took minutes of CPU and gigabytes here before this bound (QA).
            head = re.split(r"[.\[]", path, maxsplit=1)[0]  # the aliased node's own line is its anchor's: the top
            raise SpecError([SpecIssue(self.lines.get(head), head, f"the spec holds more than {MAX_SPEC_STRUCTURE} "
                                       "values (an alias counts each time it is used): write it out plainly")],
                            filename=self.filename)
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            result = {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    self.add(key_node.start_mark.line + 1, path, f"keys must be strings, got {_SHORT.repr(key)}")
                    continue
                child = f"{path}.{key}" if path else key
                if key in result:
                    self.add(key_node.start_mark.line + 1, child, "given twice")
                    continue
                self.lines[child] = value_node.start_mark.line + 1
                self.lines.setdefault(child + "@key", key_node.start_mark.line + 1)
                result[key] = self._convert(loader, value_node, child)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self._convert(loader, item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        return loader.construct_object(node, deep=True)

    def line(self, path: str) -> int | None:
        return self.lines.get(path)

    def add(self, line: int | None, path: str, reason: str) -> None:
        self.issues.append(SpecIssue(line, path, reason))

    def error(self, path: str, reason: str) -> None:
        self.add(self.line(path), path, reason)

    def unknown_keys(self, mapping: dict, allowed: set[str], prefix: str) -> None:
        for key in mapping:
            if key not in allowed:
                path = f"{prefix}.{key}" if prefix else key
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.add(self.lines.get(path + "@key", self.line(path)), path,
                         f"unknown field; {hint}expected one of: {', '.join(sorted(allowed))}")


def parse_spec(text: str, *, filename: str = "spec.yaml", kind: str | None = None) -> Spec:
    """Parse a spec (YAML text) into the REST create body of a training job or a deployment.

    Raises SpecError listing every issue found (line, dotted field path, reason)."""
    reader = _Reader(filename)
    data = reader.load(text)
    if not isinstance(data, dict):
        raise SpecError([SpecIssue(1, "", "a spec is a YAML mapping (name: ..., queue: ..., resources: ...)")],
                        filename=filename)
    reader.unknown_keys(data, TOP_LEVEL, "")
    kind = kind or _kind(reader, data)
    spec = Spec(kind=kind, body={}, filename=filename)
    body = spec.body

    def origin(rest: str, path: str) -> None:
        spec.origins[rest] = (path, reader.line(path))

    for key in ("name", "queue"):
        value = data.get(key)
        origin(key, key)
        if value is None:
            reader.add(1, key, "required")
        elif not isinstance(value, str) or not _NAME.match(value):
            reader.error(key, f"must be lowercase letters, digits and dashes (at most 63), got {value!r}")
        else:
            body[key] = value
    for key in ("team", "priority"):
        if data.get(key) is not None:
            origin(key, key)
            if not isinstance(data[key], str) or not _NAME.match(data[key]):
                reader.error(key, f"must be a name such as 'alpha', got {data[key]!r}")
            else:
                body[key] = data[key]
    if "description" in data and not isinstance(data["description"], str):
        reader.error("description", "must be text")

    accelerators, count = _resources(reader, data.get("resources"), spec, kind)
    if accelerators:
        body["accelerator_types"] = accelerators
    if kind == JOB:
        _job(reader, data, spec, count)
    else:
        for key in sorted(JOB_ONLY & set(data)):
            reader.error(key, "a deployment does not take this field (it belongs to training jobs)")
        _service(reader, data.get("service"), spec, count)
    if reader.issues:
        raise SpecError(sorted(reader.issues, key=lambda i: (i.line or 0, i.field)), filename=filename)
    return spec


def _kind(reader: _Reader, data: dict) -> str:
    kind = data.get("kind")
    if kind is None:
        return DEPLOYMENT if "service" in data else JOB
    aliases = {"job": JOB, "training_job": JOB, "training-job": JOB, "task": JOB,
               "deployment": DEPLOYMENT, "service": DEPLOYMENT}
    if not isinstance(kind, str) or kind not in aliases:  # (a list or mapping: TypeError, an API 500; QA)
        reader.error("kind", f"expected job or deployment, got {kind!r}")
        return DEPLOYMENT if "service" in data else JOB
    if aliases[kind] == JOB and "service" in data:
        reader.error("service", "a training job has no service block (use kind: deployment)")
    return aliases[kind]


def _resources(reader: _Reader, resources, spec: Spec, kind: str) -> tuple[list[str], float]:
    """-> (accepted accelerator slugs, devices per worker or replica)."""
    path = "resources"
    spec.origins["accelerator_types"] = ("resources.accelerators", reader.line("resources.accelerators"))
    if resources is None:
        reader.add(1, path, "required: say which accelerators to use, e.g. resources: {accelerators: H100:8}")
        return [], 0
    if not isinstance(resources, dict):
        reader.error(path, "must be a mapping with accelerators, any_of, cpus, memory")
        return [], 0
    reader.unknown_keys(resources, RESOURCE_KEYS, path)
    requests: list[tuple[str, AcceleratorRequest]] = []
    if "accelerators" in resources:
        requests += _accelerator_list(reader, resources["accelerators"], f"{path}.accelerators")
    if "any_of" in resources:
        options = resources["any_of"]
        if not isinstance(options, list) or not options:
            reader.error(f"{path}.any_of", "must be a non-empty list of acceptable choices, "
                                           "e.g. [{accelerators: H100:8}, {accelerators: A100:8}]")
        else:
            for i, option in enumerate(options):
                item = f"{path}.any_of[{i}]"
                if isinstance(option, dict):
                    reader.unknown_keys(option, {"accelerators"}, item)
                    if "accelerators" not in option:
                        reader.error(item, "each choice needs accelerators, e.g. {accelerators: H100:8}")
                        continue
                    requests += _accelerator_list(reader, option["accelerators"], f"{item}.accelerators")
                else:
                    requests += _accelerator_list(reader, option, item)
    if not requests and "accelerators" not in resources and "any_of" not in resources:
        reader.error(path, "say which accelerators to use: accelerators: H100:8 (or any_of, or cpu)")
        return [], 0
    slugs: list[str] = []
    counts: dict[float, str] = {}
    for where, request in requests:
        if request.slug in slugs:
            reader.error(where, f"{SHORT_NAMES[request.slug]} is listed twice")
            continue
        slugs.append(request.slug)
        if request.slug != "cpu":
            counts.setdefault(request.count, where)
    if len(counts) > 1:
        first, *rest = counts.items()
        for count, where in rest:
            reader.error(where, f"every acceptable type needs the same device count per worker ({first[0]:g} at "
                                f"{first[1]}, {count:g} here): a gang has one shape")
    count = next(iter(counts), 0.0)
    if kind == JOB and count and count != int(count):
        where = next(iter(counts.values()))
        reader.error(where, f"a training worker takes whole devices, got {count:g}")
    if "cpus" in resources:
        try:
            spec.body["cpus_per_worker" if kind == JOB else "_cpus"] = parse_at_least(resources["cpus"], what="cpus")
            spec.origins["cpus_per_worker"] = (f"{path}.cpus", reader.line(f"{path}.cpus"))
        except ValueError as exc:
            reader.error(f"{path}.cpus", str(exc))
        if kind == DEPLOYMENT:
            spec.body.pop("_cpus", None)
            spec.warnings.append("resources.cpus is not used by deployments (replicas get the engine's threads)")
    if "memory" in resources:
        try:
            memory = parse_memory(resources["memory"])
            spec.warnings.append(f"resources.memory ({memory:g}+ GB) is recorded but not scheduled on: the "
                                 "platform places by devices and CPUs")
        except ValueError as exc:
            reader.error(f"{path}.memory", str(exc))
    return slugs, count


def _accelerator_list(reader: _Reader, value, path: str) -> list[tuple[str, AcceleratorRequest]]:
    """`H100:8`, `[H100:8, A100:8]`, `{H100: 8, A100: 8}` (SkyPilot's forms) -> requests."""
    found = []
    if isinstance(value, str):
        items = [(path, value)]
    elif isinstance(value, list):
        items = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
        if not items:
            reader.error(path, "must name at least one accelerator type")
    elif isinstance(value, dict):
        items = [(f"{path}.{name}", f"{name}:{count}" if count is not None else str(name))
                 for name, count in value.items()]
    else:
        reader.error(path, f"expected TYPE:COUNT such as H100:8, got {value!r}")
        return []
    for where, text in items:
        try:
            found.append((where, parse_accelerator(text if isinstance(text, str) else str(text))))
        except ValueError as exc:
            reader.add(reader.line(where) or reader.line(path), where, str(exc))
    return found


def _job(reader: _Reader, data: dict, spec: Spec, count: float) -> None:
    body = spec.body
    if "cpu" in body.get("accelerator_types", []) and len(body["accelerator_types"]) == 1:
        body["devices_per_worker"] = 0
    elif count:
        body["devices_per_worker"] = int(count)
    spec.origins["devices_per_worker"] = ("resources.accelerators", reader.line("resources.accelerators"))
    _workers(reader, data, spec)
    trainer = data.get("trainer")
    run = data.get("run")
    if trainer is not None and trainer not in (BUILTIN_TRAINER, ENTRYPOINT_TRAINER, "builtin"):
        reader.error("trainer", f"expected {BUILTIN_TRAINER} (or builtin) or {ENTRYPOINT_TRAINER}, got {trainer!r}")
    for key in ("setup", "run", "workdir", "image"):
        if key in data and not isinstance(data[key], str):
            reader.error(key, "must be text (a shell command or a path)")
    where = "trainer" if "trainer" in data else "run" if "run" in data else "hyperparameters"
    spec.origins["trainer"] = (where, reader.line(where))
    if run is not None and isinstance(run, str):
        if trainer in (BUILTIN_TRAINER, "builtin"):
            reader.error("run", "the built-in trainer runs no command; drop run or trainer")
        if "hyperparameters" in data:
            reader.error("hyperparameters", "hyperparameters are for the built-in trainer; a run command reads "
                                            "its own settings (use envs)")
        setup = data.get("setup") if isinstance(data.get("setup"), str) else ""
        body["trainer"] = ENTRYPOINT_TRAINER
        # setup runs first and a failing setup fails the job, as SkyPilot does.
        body["entrypoint"] = f"(\n{setup.strip()}\n) || exit $?\n{run.strip()}" if setup.strip() else run.strip()
        spec.origins["entrypoint"] = ("run", reader.line("run"))
        if len(body["entrypoint"]) > 2000:
            reader.error("run", "setup and run together must stay under 2000 characters")
    else:
        if trainer == ENTRYPOINT_TRAINER or "setup" in data:
            reader.error("run" if "setup" not in data else "setup", "give the command to run (run: python train.py)")
        body["trainer"] = BUILTIN_TRAINER
        hyper = data.get("hyperparameters", {})
        if not isinstance(hyper, dict):
            reader.error("hyperparameters", "must be a mapping, e.g. {steps: 100, lr: 0.001}")
        else:
            body["hyperparameters"] = hyper
            spec.origins["hyperparameters"] = ("hyperparameters", reader.line("hyperparameters"))
    if isinstance(data.get("workdir"), str):
        body["working_dir"] = data["workdir"]
        spec.origins["working_dir"] = ("workdir", reader.line("workdir"))
    if isinstance(data.get("image"), str):
        spec.warnings.append(f"image {data['image']!r} is recorded but not pulled: workers run in the cluster's "
                             "Python environment")
    envs = _envs(reader, data.get("envs"))
    secrets = _secrets(reader, data.get("secrets"))
    for name in secrets:
        if name in envs:
            reader.error(f"secrets.{name}" if isinstance(data.get("secrets"), dict) else "secrets",
                         f"{name} is both an env and a secret")
    spec.secrets = secrets
    spec.origins["secrets"] = spec.origins["secret_envs"] = ("secrets", reader.line("secrets"))
    body["envs"] = envs
    spec.origins["envs"] = ("envs", reader.line("envs"))
    dataset = _dataset(reader, data, spec)
    if dataset:
        body["dataset"] = dataset
    if "checkpoint" in data:
        spec.origins["checkpoint"] = ("checkpoint", reader.line("checkpoint"))
        policy = data["checkpoint"]
        if not isinstance(policy, dict):
            reader.error("checkpoint", "must be a mapping: {interval_steps: 100, keep_last: 3}")
        else:
            reader.unknown_keys(policy, {"interval_steps", "keep_last"}, "checkpoint")
            checkpoint = {}
            for key, most in CHECKPOINT_BOUNDS.items():
                if key in policy and _positive_int(reader, policy[key], f"checkpoint.{key}", most=most):
                    checkpoint[key] = policy[key]
            body["checkpoint"] = checkpoint
    if "retry" in data:
        spec.origins["max_restarts"] = ("retry", reader.line("retry"))
        retry = data["retry"]
        value, where = retry, "retry"
        if isinstance(retry, dict):
            reader.unknown_keys(retry, {"max_restarts"}, "retry")
            value, where = retry.get("max_restarts", 3), "retry.max_restarts"
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 1000:
            what = "must be" if where.endswith("max_restarts") else "max_restarts must be"  # (said once: QA)
            reader.error(where, f"{what} a whole number from 0 to 1000, got {value!r}")
        else:
            body["max_restarts"] = value
    if "max_duration" in data:
        spec.origins["max_duration_seconds"] = ("max_duration", reader.line("max_duration"))
        try:
            seconds = parse_duration(data["max_duration"])
        except ValueError as exc:
            reader.error("max_duration", str(exc))
        else:
            if seconds > MAX_DURATION_SECONDS:
                reader.error("max_duration", f"at most {MAX_DURATION_SECONDS // 86400}d ({MAX_DURATION_SECONDS} "
                                             f"seconds), got {data['max_duration']!r}")
            else:
                body["max_duration_seconds"] = seconds
    if "parallelism" in data:
        if not isinstance(data["parallelism"], dict):
            reader.error("parallelism", "must be a mapping: {mode: auto, model: llama2-7b, global_batch_size: 256}")
        else:
            body["parallelism"] = data["parallelism"]
            spec.origins["parallelism"] = ("parallelism", reader.line("parallelism"))


def _workers(reader: _Reader, data: dict, spec: Spec) -> None:
    if "workers" in data and "num_nodes" in data:
        reader.error("num_nodes", "give workers or num_nodes, not both")
    # (left out, it is `workers`, the spec's own word: errors named `num_nodes`, a field the spec never wrote; QA)
    key = "num_nodes" if "num_nodes" in data else "workers"
    spec.origins["workers_min"] = (key, reader.line(key))
    spec.origins["workers_max"] = (key, reader.line(key))
    value = data.get(key, 1)
    if isinstance(value, dict):
        reader.unknown_keys(value, {"min", "max"}, key)
        low, high = value.get("min", 1), value.get("max", value.get("min", 1))
        ok = _positive_int(reader, low, f"{key}.min") & _positive_int(reader, high, f"{key}.max")
        if ok and high < low:
            reader.error(f"{key}.max", f"must be at least min ({low})")
        elif ok:
            spec.body["workers_min"], spec.body["workers_max"] = low, high
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*(-|\.\.)\s*\d+\s*", value):
        low, high = (int(x) for x in re.split(r"-|\.\.", value.replace(" ", "")) if x)
        if low < 1 or high < low:
            reader.error(key, f"expected MIN-MAX with 1 <= MIN <= MAX, got {value!r}")
        else:
            spec.body["workers_min"], spec.body["workers_max"] = low, high
    elif _positive_int(reader, value, key):
        spec.body["workers_min"] = spec.body["workers_max"] = value


def _positive_int(reader: _Reader, value, path: str, *, most: int = 4096) -> bool:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > most:
        reader.error(path, f"must be a whole number from 1 to {most}, got {value!r}")
        return False
    return True


def _envs(reader: _Reader, envs) -> dict:
    if envs is None:
        return {}
    if not isinstance(envs, dict):
        reader.error("envs", "must be a mapping of NAME: value")
        return {}
    result = {}
    for name, value in envs.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            reader.error(f"envs.{name}", "is not a valid environment variable name")
        elif isinstance(value, dict | list) or value is None:
            reader.error(f"envs.{name}", "must be a plain value (text or a number)")
        else:
            result[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return result


def _secrets(reader: _Reader, secrets) -> list[str]:
    """Names only: values come from the submitter's environment, so a spec file never holds a secret."""
    if secrets is None:
        return []
    names = list(secrets) if isinstance(secrets, dict) else secrets
    if not isinstance(names, list):
        reader.error("secrets", "must be a list of names (values come from your environment)")
        return []
    result = []
    for i, name in enumerate(names):
        path = f"secrets.{name}" if isinstance(secrets, dict) else f"secrets[{i}]"
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            reader.error(path, f"{name!r} is not a valid environment variable name")
        elif isinstance(secrets, dict) and secrets[name] is not None:
            reader.error(path, "do not put secret values in a spec; leave it empty (NAME: null) and set it in "
                               "your environment or pass --secret NAME=VALUE")
        else:
            result.append(name)
    return result


def _dataset(reader: _Reader, data: dict, spec: Spec) -> str:
    if "dataset" in data and "datasets" in data:
        reader.error("datasets", "give dataset or datasets, not both")
        return ""
    if "dataset" in data:
        refs = [("dataset", data["dataset"])]
    elif "datasets" in data:
        value = data["datasets"]
        if isinstance(value, dict):  # mount point -> reference, as SkyPilot's file_mounts
            refs = [(f"datasets.{k}", v) for k, v in value.items()]
        elif isinstance(value, list):
            refs = [(f"datasets[{i}]", v) for i, v in enumerate(value)]
        else:
            reader.error("datasets", "must be a list of dataset://name@version references")
            return ""
        if len(refs) > 1:
            reader.error("datasets", "a training job reads one dataset; give one reference")
            return ""
    else:
        return ""
    path, ref = refs[0] if refs else ("datasets", None)
    if not isinstance(ref, str) or not re.fullmatch(r"(dataset://)?[a-z0-9][a-z0-9-]*(@(\d+|latest))?", ref):
        reader.error(path, f"expected dataset://name@version, got {ref!r}")
        return ""
    # where the server's findings (no such dataset or version in the team) point: they had no line (QA)
    spec.origins["dataset"] = (path, reader.line(path))
    return ref


def _service(reader: _Reader, service, spec: Spec, count: float) -> None:
    body = spec.body
    body["devices_per_replica"] = count or 1.0
    spec.origins["devices_per_replica"] = ("resources.accelerators", reader.line("resources.accelerators"))
    if not isinstance(service, dict):
        reader.error("service", "a deployment needs a service block: {model: ..., sla: {...}, replicas: ...}")
        return
    reader.unknown_keys(service, SERVICE_KEYS, "service")
    if "model" in service and "checkpoint" in service:
        reader.error("service.checkpoint", "give model or checkpoint, not both")
    if "model" in service:
        spec.origins["model_uri"] = ("service.model", reader.line("service.model"))
        if not isinstance(service["model"], str) or not service["model"].strip():
            reader.error("service.model", "must be a model URI such as file:///checkpoints/lm/step-100")
        else:
            body["model_uri"] = service["model"]
    elif "checkpoint" in service:
        spec.origins["source_job"] = ("service.checkpoint", reader.line("service.checkpoint"))
        value = service["checkpoint"]
        match = re.fullmatch(r"(?:job[:/]+)?(\d+)", str(value).strip()) if not isinstance(value, bool) else None
        if match is None:
            reader.error("service.checkpoint", f"expected a training job id (job:12 or 12), got {value!r}")
        else:
            body["source_job"] = int(match[1])
    else:
        reader.error("service", "say what to serve: model: <uri> or checkpoint: job:<id>")
    _replicas(reader, service, spec)
    sla = service.get("sla")
    spec.origins["sla"] = ("service.sla", reader.line("service.sla"))
    if not isinstance(sla, dict):
        reader.error("service.sla" if "sla" in service else "service",
                     "needs SLA targets: sla: {ttft_p95: 500ms, tpot_p95: 50ms}")
    else:
        reader.unknown_keys(sla, SLA_KEYS, "service.sla")
        out = {}
        for short, rest in (("ttft_p95", "ttft_p95_ms"), ("tpot_p95", "tpot_p95_ms")):
            key = short if short in sla else rest
            if key not in sla:
                reader.error("service.sla", f"{short} is required (e.g. {short}: 500ms)")
                continue
            try:
                out[rest] = parse_milliseconds(sla[key])
            except ValueError as exc:
                reader.error(f"service.sla.{key}", str(exc))
        key = "min_throughput" if "min_throughput" in sla else "min_throughput_tps"
        if sla.get(key) is not None:
            value = sla[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                reader.error(f"service.sla.{key}", f"must be tokens per second (a number >= 0), got {value!r}")
            else:
                out["min_throughput_tps"] = float(value)
        body["sla"] = out
    if "router" in service:
        if service["router"] not in ROUTERS:
            reader.error("service.router", f"expected one of {', '.join(ROUTERS)}, got {service['router']!r}")
        else:
            body["router"] = service["router"]
            spec.origins["router"] = ("service.router", reader.line("service.router"))
    if "engine" in service:
        if not isinstance(service["engine"], dict):
            reader.error("service.engine", "must be a mapping of engine settings")
        else:
            body["engine"] = service["engine"]
            spec.origins["engine"] = ("service.engine", reader.line("service.engine"))


def _replicas(reader: _Reader, service: dict, spec: Spec) -> None:
    low = high = 1
    if "replicas" in service and "replica_policy" in service:
        reader.error("service.replica_policy", "give replicas or replica_policy, not both")
        return
    if "replica_policy" in service:  # SkyPilot's names
        policy = service["replica_policy"]
        if not isinstance(policy, dict):
            reader.error("service.replica_policy", "must be a mapping: {min_replicas: 1, max_replicas: 3}")
            return
        reader.unknown_keys(policy, {"min_replicas", "max_replicas"}, "service.replica_policy")
        low = policy.get("min_replicas", 1)
        high = policy.get("max_replicas", low)
        where = "service.replica_policy"
    elif isinstance(service.get("replicas"), dict):
        reader.unknown_keys(service["replicas"], {"min", "max"}, "service.replicas")
        low = service["replicas"].get("min", 1)
        high = service["replicas"].get("max", low)
        where = "service.replicas"
    else:
        low = high = service.get("replicas", 1)
        where = "service.replicas"
    spec.origins["replicas_min"] = spec.origins["replicas_max"] = (where, reader.line(where))
    for value in (low, high):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 1024:
            reader.error(where, f"replicas must be whole numbers from 0 to 1024, got {value!r}")
            return
    if high < max(low, 1):
        reader.error(where, f"max must be at least min ({low}) and at least 1")
        return
    spec.body["replicas_min"], spec.body["replicas_max"] = low, high

