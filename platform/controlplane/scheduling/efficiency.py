"""Baige's efficiency matrix: how fast each workload class runs on each accelerator type, and cost-aware type choice.

The scheduler uses it to pick the accelerator type for a job that accepts several ("which chip gives the
most work per dollar?") and the heterogeneity-aware simulator policy (benchmarks/gavel.py) uses it to
estimate run times on each chip type. Pure Python: no Django, no Ray.

- ``EfficiencyMatrix``: throughput in *units of work per second per device* (training steps, tokens,
  samples: whatever the workload class counts) for ``(workload_class, accelerator_type)``. Each entry
  is "published" (given when the matrix was built, e.g. Gavel's measured matrix), "measured" (refined
  from our own step times with ``observe``), or a "prior" derived from chip facts (relative dense BF16
  TFLOPS): a guess, not a measurement. ``source`` says which.
- ``rank_accelerator_types``: the accepted types ordered by cost per unit of work.
- ``load_gavel_matrix``: Gavel's ``simulation_throughputs.json`` as an ``EfficiencyMatrix``.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# The chip whose BF16 TFLOPS define "1.0" for a workload class we know nothing about.
REFERENCE_CHIP = "nvidia-h100"
# Weight of a new observation in the exponentially weighted average (the first one replaces the entry).
DEFAULT_ALPHA = 0.3

SOURCE_MEASURED = "measured"
SOURCE_PUBLISHED = "published"
SOURCE_PRIOR = "prior"
SOURCE_UNKNOWN = "unknown"  # nothing known: throughput() returns 0.0


@dataclass(frozen=True)
class ChipFacts:
    slug: str
    bf16_dense_tflops: float | None
    memory_gb: float | None
    price_per_hour_usd: float | None


def chip_facts_from_accelerator_facts(facts: Iterable[Mapping] | None = None) -> dict[str, ChipFacts]:
    """``ChipFacts`` keyed by slug, from ``controlplane.cluster.accelerator_facts.ACCELERATOR_FACTS`` by default."""
    if facts is None:
        from controlplane.cluster.accelerator_facts import ACCELERATOR_FACTS

        facts = ACCELERATOR_FACTS
    return {
        fact["slug"]: ChipFacts(
            slug=fact["slug"],
            bf16_dense_tflops=fact.get("bf16_dense_tflops"),
            memory_gb=fact.get("memory_gb"),
            price_per_hour_usd=fact.get("price_per_hour_usd"),
        )
        for fact in facts
    }


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


class EfficiencyMatrix:
    """Throughput (units per second per device) of each workload class on each accelerator type.

    ``known`` holds published throughputs ``{(workload_class, accelerator_type): units_per_second}``;
    a value of 0.0 means "published as unable to run" (e.g. out of memory), not "unknown".
    ``chips`` holds chip facts by slug; they are used only for priors and prices.
    """

    def __init__(
        self,
        known: Mapping[tuple[str, str], float] | None = None,
        chips: Mapping[str, ChipFacts] | Iterable[ChipFacts] | None = None,
        *,
        reference_chip: str = REFERENCE_CHIP,
        alpha: float = DEFAULT_ALPHA,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if chips is None:
            chips = {}
        elif not isinstance(chips, Mapping):
            chips = {chip.slug: chip for chip in chips}
        self._chips: dict[str, ChipFacts] = dict(chips)
        self._values: dict[tuple[str, str], float] = {}
        self._published: set[tuple[str, str]] = set()
        self._observations: dict[tuple[str, str], int] = {}
        self.reference_chip = reference_chip
        self.alpha = alpha
        for (workload_class, accelerator_type), value in (known or {}).items():
            if value is None or not math.isfinite(value) or value < 0:
                raise ValueError(f"throughput for {(workload_class, accelerator_type)} must be >= 0, got {value}")
            key = (workload_class, accelerator_type)
            self._values[key] = float(value)
            self._published.add(key)

    # -- facts -------------------------------------------------------------------------------------------

    def chip(self, accelerator_type: str) -> ChipFacts | None:
        return self._chips.get(accelerator_type)

    def price_per_hour(self, accelerator_type: str) -> float | None:
        chip = self._chips.get(accelerator_type)
        return chip.price_per_hour_usd if chip is not None else None

    def workload_classes(self) -> list[str]:
        return sorted({workload_class for workload_class, _ in self._values})

    def accelerator_types(self) -> list[str]:
        return sorted({accelerator_type for _, accelerator_type in self._values} | set(self._chips))

    def _tflops(self, accelerator_type: str) -> float | None:
        chip = self._chips.get(accelerator_type)
        return chip.bf16_dense_tflops if chip is not None and _positive(chip.bf16_dense_tflops) else None

    # -- lookups -----------------------------------------------------------------------------------------

    def throughput(self, workload_class: str, accelerator_type: str) -> float:
        """Units per second per device: the published or measured value, else a prior, else 0.0."""
        value = self._values.get((workload_class, accelerator_type))
        if value is not None:
            return value
        return self.prior(workload_class, accelerator_type)

    def prior(self, workload_class: str, accelerator_type: str) -> float:
        """A default from chip facts: a prior, not a measurement.

        If the class has non-zero throughputs on other chips with known BF16 TFLOPS, scale them by the
        TFLOPS ratio (averaged over those chips). Otherwise return the chip's TFLOPS relative to the
        reference chip (the reference chip counts as 1.0 unit per second). Real speed-ups differ
        widely from TFLOPS ratios (memory-bound models, small batches), so measure as soon as possible.
        Returns 0.0 when the chip's TFLOPS are unknown.
        """
        target = self._tflops(accelerator_type)
        if target is None:
            return 0.0
        estimates = []
        for (known_class, known_type), value in self._values.items():
            if known_class != workload_class or known_type == accelerator_type or value <= 0:
                continue
            known_tflops = self._tflops(known_type)
            if known_tflops is not None:
                estimates.append(value * target / known_tflops)
        if estimates:
            return sum(estimates) / len(estimates)
        reference = self._tflops(self.reference_chip)
        return target / reference if reference is not None else 0.0

    def source(self, workload_class: str, accelerator_type: str) -> str:
        """"measured", "published", "prior" (derived from chip facts) or "unknown" (throughput is 0.0)."""
        key = (workload_class, accelerator_type)
        if self._observations.get(key, 0) > 0:
            return SOURCE_MEASURED
        if key in self._published:
            return SOURCE_PUBLISHED
        return SOURCE_PRIOR if self.prior(workload_class, accelerator_type) > 0 else SOURCE_UNKNOWN

    def observations(self, workload_class: str, accelerator_type: str) -> int:
        """How many measurements back this entry (0 for published values and priors)."""
        return self._observations.get((workload_class, accelerator_type), 0)

    # -- refinement --------------------------------------------------------------------------------------

    def observe(self, workload_class: str, accelerator_type: str, units_per_second: float) -> float:
        """Fold in a measured throughput (per device) and return the new estimate.

        The first measurement replaces a published value or prior (it is of our own hardware and
        software); later ones are averaged with weight ``alpha`` on the new value.
        """
        if not _positive(units_per_second):
            raise ValueError(f"units_per_second must be a positive number, got {units_per_second}")
        key = (workload_class, accelerator_type)
        count = self._observations.get(key, 0)
        if count == 0:
            value = float(units_per_second)
        else:
            value = (1.0 - self.alpha) * self._values[key] + self.alpha * units_per_second
        self._values[key] = value
        self._observations[key] = count + 1
        return value

    def observe_step_time(
        self,
        workload_class: str,
        accelerator_type: str,
        seconds_per_step: float,
        *,
        units_per_step: float = 1.0,
        devices: float = 1.0,
    ) -> float:
        """``observe`` from a measured step time of a job on ``devices`` devices."""
        if not _positive(seconds_per_step) or not _positive(devices):
            raise ValueError("seconds_per_step and devices must be positive")
        return self.observe(workload_class, accelerator_type, units_per_step / seconds_per_step / devices)


@dataclass(frozen=True)
class TypeChoice:
    accelerator_type: str
    throughput: float  # units per second on `devices` devices
    price_per_hour: float | None  # USD per hour for `devices` devices
    cost_per_unit: float | None  # USD per unit of work
    reason: str


def _rate(value: float) -> str:
    return f"{value:.3g}"


def rank_accelerator_types(
    *,
    workload_class: str,
    accepted: Sequence[str],
    matrix: EfficiencyMatrix,
    devices: float = 1.0,
    unit: str = "steps",
) -> list[TypeChoice]:
    """The accepted types, best first: lowest cost per unit of work (price per hour / (3600 * throughput)).

    Types with an unknown price follow the priced ones, fastest first; types with no known (or zero)
    throughput come last. Ties: higher throughput first, then name.
    """
    if devices <= 0:
        raise ValueError(f"devices must be positive, got {devices}")
    seen: list[str] = []
    for accelerator_type in accepted:
        if accelerator_type not in seen:
            seen.append(accelerator_type)
    rows = []
    for accelerator_type in seen:
        throughput = matrix.throughput(workload_class, accelerator_type) * devices
        unit_price = matrix.price_per_hour(accelerator_type)
        price = unit_price * devices if unit_price is not None else None
        cost = price / (3600.0 * throughput) if price is not None and throughput > 0 else None
        rows.append((accelerator_type, throughput, price, cost))

    priced = sorted((r for r in rows if r[1] > 0 and r[3] is not None), key=lambda r: (r[3], -r[1], r[0]))
    unpriced = sorted((r for r in rows if r[1] > 0 and r[3] is None), key=lambda r: (-r[1], r[0]))
    dead = sorted((r for r in rows if r[1] <= 0), key=lambda r: r[0])

    choices: list[TypeChoice] = []
    for index, (accelerator_type, throughput, price, cost) in enumerate(priced):
        per_k = f"${cost * 1000:.4g} per 1k {unit}"
        if index == 0:
            if len(priced) > 1:
                other = priced[1]
                reason = (f"lowest cost per unit of work: {per_k}, {throughput / other[1]:.2g}x the throughput "
                          f"of {other[0]}")
            else:
                reason = f"lowest cost per unit of work: {per_k} (the only priced type that can run it)"
        else:
            best = priced[0]
            reason = (f"{per_k}, {cost / best[3]:.2g}x the cost per unit of {best[0]}, "
                      f"{throughput / best[1]:.2g}x its throughput")
        choices.append(TypeChoice(accelerator_type, throughput, price, cost, reason))
    for accelerator_type, throughput, price, cost in unpriced:
        reason = f"price unknown, so ranked after priced types by throughput ({_rate(throughput)} {unit}/s)"
        choices.append(TypeChoice(accelerator_type, throughput, price, cost, reason))
    for accelerator_type, throughput, price, cost in dead:
        if matrix.source(workload_class, accelerator_type) == SOURCE_UNKNOWN:
            reason = "no known throughput for this workload on this type"
        else:
            reason = "cannot run this workload (throughput 0)"
        choices.append(TypeChoice(accelerator_type, throughput, price, cost, reason))
    for index, choice in enumerate(choices):
        source = matrix.source(workload_class, choice.accelerator_type)
        if source == SOURCE_PRIOR:
            choices[index] = TypeChoice(choice.accelerator_type, choice.throughput, choice.price_per_hour,
                                        choice.cost_per_unit, choice.reason + "; throughput is a prior from chip "
                                        "TFLOPS, not a measurement")
    return choices


# -- Gavel's throughput matrix -------------------------------------------------------------------------------

GAVEL_CHIPS = ("k80", "p100", "v100")


def gavel_workload_class(job_type: str, scale: int) -> str:
    """The workload class of a Gavel job type run on `scale` GPUs, e.g. "ResNet-18 (batch size 32) x4"."""
    return f"{job_type} x{scale}"


def load_gavel_matrix(path: str | Path, *, chips: Sequence[str] = GAVEL_CHIPS) -> EfficiencyMatrix:
    """Gavel's ``simulation_throughputs.json`` as a matrix of published throughputs.

    The file is ``{chip: {"(job_type, scale)": {"null": steps_per_second, "(other job)": [...]}}}``;
    "null" is the job running alone (the other keys are co-located pairs, ignored here). Gavel's value is
    steps per second of the whole ``scale``-GPU job; the matrix stores it per device (divided by
    ``scale``) under ``gavel_workload_class(job_type, scale)``, so a job's rate is
    ``matrix.throughput(cls, chip) * scale``. Only the consolidated chips are read by default. No chip facts
    are attached (K80/P100/V100 have no BF16 figures), so unknown classes get 0.0, not a prior.
    """
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    known: dict[tuple[str, str], float] = {}
    for chip in chips:
        if chip not in data:
            raise ValueError(f"{path}: no throughputs for chip {chip!r}")
        for key, entry in data[chip].items():
            job_type, scale = ast.literal_eval(key)
            if not isinstance(job_type, str) or not isinstance(scale, int) or scale < 1:
                raise ValueError(f"{path}: bad key {key!r} for chip {chip!r}")
            steps_per_second = float(entry["null"])
            known[(gavel_workload_class(job_type, scale), chip)] = steps_per_second / scale
    return EfficiencyMatrix(known, chips={}, reference_chip="v100")
