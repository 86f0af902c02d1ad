"""Read and validate an omni-plan workload YAML into planning objects (schema:
docs/omni/planning.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from .plan.costs import (
    CostModel,
    Hardware,
    TransformerConfig,
    hardware_preset,
    load_profile,
    model_preset,
)
from .plan.systems import SYSTEMS, Scenario
from .plan.workload import Mixture, audio_mixture, image_text_mixture

MIXTURE_KINDS = ("image_text", "audio")


class WorkloadError(ValueError):
    """The YAML names something unknown or gives a value of the wrong kind."""


@dataclass(frozen=True)
class PlanRequest:
    """Everything omni-plan needs: one scenario per swept ratio, systems and a cost model."""

    name: str
    scenarios: tuple[tuple[float, Scenario], ...]
    systems: tuple[str, ...]
    cost: CostModel
    timeline_ratio: float
    encoder_pools: tuple[int, ...] | None = None


def _get(section: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
         default: Any = ...) -> Any:
    if key not in section:
        if default is ...:
            raise WorkloadError(f"{where}.{key}: expected a value, got nothing")
        return default
    value = section[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float):
        raise WorkloadError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, "
                            f"got {value!r}")
    return value


def _model(value: Any, where: str) -> TransformerConfig:
    if isinstance(value, str):
        try:
            return model_preset(value)
        except ValueError as err:
            raise WorkloadError(f"{where}: {err}") from None
    if isinstance(value, dict):
        try:
            return TransformerConfig(**value)
        except (TypeError, ValueError) as err:
            raise WorkloadError(f"{where}: expected a preset name or TransformerConfig fields "
                                f"(name, layers, hidden, heads, ffn_hidden, ...): {err}") from None
    raise WorkloadError(f"{where}: expected a preset name or a mapping, got {value!r}")


def _hardware(value: Any) -> Hardware:
    if isinstance(value, str):
        try:
            return hardware_preset(value)
        except ValueError as err:
            raise WorkloadError(f"cluster.hardware: {err}") from None
    if isinstance(value, dict):
        base = hardware_preset(value.get("preset", "H100-SXM-80G"))
        fields = {k: v for k, v in value.items() if k != "preset"}
        try:
            return replace(base, **fields)
        except TypeError as err:
            raise WorkloadError(f"cluster.hardware: {err}") from None
    raise WorkloadError(f"cluster.hardware: expected a preset name or a mapping, got {value!r}")


def _mixture(section: dict[str, Any], ratio: float) -> Mixture:
    kind = _get(section, "kind", str, "mixture", "image_text")
    if kind == "image_text":
        return image_text_mixture(ratio, long_max=_get(section, "long_max", int, "mixture", 0),
                                  long_share=float(_get(section, "long_share", (int, float),
                                                        "mixture", 0.02)))
    if kind == "audio":
        return audio_mixture(ratio, float(_get(section, "audio_to_text_length", (int, float),
                                                "mixture", 17.6)))
    raise WorkloadError(f"mixture.kind: expected one of {MIXTURE_KINDS}, got {kind!r}")


def parse_workload(data: Any, base_dir: Path | None = None) -> PlanRequest:
    """Turn a parsed YAML mapping into a PlanRequest (raises WorkloadError on bad input)."""
    if not isinstance(data, dict):
        raise WorkloadError(f"workload: expected a mapping at the top level, got {data!r}")
    name = _get(data, "name", str, "workload", "workload")
    models = _get(data, "models", dict, "workload")
    encoder = _model(models.get("encoder"), "models.encoder")
    llm = _model(models.get("llm"), "models.llm")
    cluster = _get(data, "cluster", dict, "workload")
    gpus = _get(cluster, "gpus", int, "cluster")
    hardware = _hardware(cluster.get("hardware", "H100-SXM-80G"))
    batch = _get(data, "batch", dict, "workload")
    global_batch = _get(batch, "global_batch", int, "batch")
    seq_len = _get(batch, "seq_len", int, "batch")
    mixture = _get(data, "mixture", dict, "workload")
    ratios = _get(mixture, "ratios", list, "mixture", [0.1, 0.5, 0.9])
    for r in ratios:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
            raise WorkloadError(f"mixture.ratios: expected numbers in [0, 1], got {ratios!r}")
    if not ratios:
        raise WorkloadError("mixture.ratios: expected at least one ratio, got []")
    systems = tuple(_get(data, "systems", list, "workload", list(SYSTEMS)))
    for s in systems:
        if s not in SYSTEMS:
            raise WorkloadError(f"systems: expected names from {SYSTEMS}, got {s!r}")
    seed = _get(data, "seed", int, "workload", 0)
    pools = _get(data, "disaggregated_encoder_gpus", list, "workload", None)
    if pools is not None and (not pools or not all(
            isinstance(x, int) and not isinstance(x, bool) and 1 <= x < gpus for x in pools)):
        raise WorkloadError(f"disaggregated_encoder_gpus: expected a list of ints in "
                            f"[1, {gpus}), got {pools!r}")
    cost = CostModel(hardware)
    profile = data.get("profile")
    if profile is not None:
        path = Path(profile)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.exists():
            raise WorkloadError(f"profile: expected an existing JSON file, got {str(path)!r}")
        cost = CostModel(hardware, fitted=load_profile(path))
    timeline_ratio = float(_get(mixture, "timeline_ratio", (int, float), "mixture",
                                ratios[len(ratios) // 2]))
    scenarios = []
    for r in sorted({float(x) for x in ratios} | {timeline_ratio}):
        try:
            sc = Scenario(f"{name}@{r:.2f}", encoder, llm, hardware, gpus, global_batch, seq_len,
                          _mixture(mixture, r), seed=seed)
        except ValueError as err:
            raise WorkloadError(str(err)) from None
        scenarios.append((r, sc))
    return PlanRequest(name, tuple(scenarios), systems, cost, timeline_ratio,
                       tuple(pools) if pools else None)


def load_workload(path: str | Path) -> PlanRequest:
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"workload: expected an existing YAML file, got {str(path)!r}")
    return parse_workload(yaml.safe_load(path.read_text()), path.parent)
