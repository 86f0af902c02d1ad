"""Read and validate an omni-plan workload YAML into planning objects.

The schema is a set of pydantic models (schema: docs/omni/planning.md). Every problem becomes
one ``WorkloadError`` whose lines each name the key path, what was expected and what came;
unknown keys are rejected with the closest known key as a suggestion.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .plan.costs import (
    HARDWARE,
    MODELS,
    CostModel,
    Hardware,
    TransformerConfig,
    load_profile,
)
from .plan.run import Phase, Run
from .plan.systems import DEFAULT_GRID, SYSTEMS, Grid, Scenario, candidate_configs
from .plan.workload import audio_mixture, image_text_mixture

MIXTURE_KINDS = ("image_text", "audio")


class WorkloadError(ValueError):
    """The YAML names something unknown or gives a value of the wrong kind."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    """A preset name (``preset``), or TransformerConfig fields, or a preset with overrides."""

    preset: str | None = None
    name: str | None = None
    layers: int | None = Field(None, ge=1)
    hidden: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)
    ffn_hidden: int | None = Field(None, ge=1)
    kv_heads: int | None = Field(None, ge=0)
    vocab: int | None = Field(None, ge=0)
    gated_mlp: bool | None = None
    causal: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _preset_name(cls, value: Any) -> Any:
        return {"preset": value} if isinstance(value, str) else value

    @field_validator("preset")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in MODELS:
            raise ValueError(f"expected one of {sorted(MODELS)}{_suggest(value, MODELS)}")
        return value

    def build(self) -> TransformerConfig:
        fields = self.model_dump(exclude_none=True, exclude={"preset"})
        if self.preset is not None:
            return replace(MODELS[self.preset], **fields)
        missing = [k for k in ("name", "layers", "hidden", "heads", "ffn_hidden")
                   if k not in fields]
        if missing:
            raise ValueError(f"expected a preset name or the fields name, layers, hidden, "
                             f"heads, ffn_hidden; missing {missing}")
        return TransformerConfig(**fields)


class Models(_Strict):
    encoder: ModelSpec
    llm: ModelSpec


class HardwareSpec(_Strict):
    """A preset name, or a preset (default H100-SXM-80G) with fields overridden."""

    preset: str = "H100-SXM-80G"
    peak_flops: float | None = Field(None, gt=0)
    hbm_bytes: float | None = Field(None, gt=0)
    nvlink_bytes_per_s: float | None = Field(None, gt=0)
    ib_bytes_per_s: float | None = Field(None, gt=0)
    gpus_per_node: int | None = Field(None, ge=1)
    max_efficiency: float | None = Field(None, gt=0, le=1)
    half_efficiency_tokens: float | None = Field(None, ge=0)
    nvlink_latency_s: float | None = Field(None, ge=0)
    ib_latency_s: float | None = Field(None, ge=0)
    usable_memory_fraction: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _preset_name(cls, value: Any) -> Any:
        return {"preset": value} if isinstance(value, str) else value

    @field_validator("preset")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in HARDWARE:
            raise ValueError(f"expected one of {sorted(HARDWARE)}{_suggest(value, HARDWARE)}")
        return value

    def build(self) -> Hardware:
        return replace(HARDWARE[self.preset], **self.model_dump(exclude_none=True,
                                                                exclude={"preset"}))


class Cluster(_Strict):
    gpus: int = Field(ge=1)
    hardware: HardwareSpec = HardwareSpec()


class Batch(_Strict):
    global_batch: int = Field(ge=1)
    seq_len: int = Field(ge=16)


class Mixture(_Strict):
    kind: Literal["image_text", "audio"] = "image_text"
    ratios: list[float] = Field(default=[0.1, 0.5, 0.9], min_length=1)
    timeline_ratio: float | None = Field(None, ge=0, le=1)
    long_max: int = Field(0, ge=0)
    long_share: float = Field(0.02, ge=0, le=1)
    audio_to_text_length: float = Field(17.6, gt=0)

    @field_validator("ratios")
    @classmethod
    def _in_unit(cls, value: list[float]) -> list[float]:
        bad = [x for x in value if not 0 <= x <= 1]
        if bad:
            raise ValueError(f"expected shares in [0, 1]; out of range: {bad}")
        return value


class PhaseSpec(_Strict):
    share: float = Field(ge=0, le=1)
    steps: int = Field(1, ge=1)
    share_end: float | None = Field(None, ge=0, le=1)
    share_sd: float = Field(0.0, ge=0, le=0.5)
    name: str = ""


class RunSpec(_Strict):
    """Run-level prediction: the run's phases and how many steps to sample."""

    phases: list[PhaseSpec] = Field(min_length=1)
    sampled_steps: int = Field(16, ge=1, le=1000)


class GridSpec(_Strict):
    """Layout dimensions the search may choose from (defaults: ``plan.search.DEFAULT_GRID``)."""

    tp: list[int] | None = Field(None, min_length=1)
    pp: list[int] | None = Field(None, min_length=1)
    vpp: list[int] | None = Field(None, min_length=1)

    @field_validator("tp", "pp", "vpp")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(x < 1 for x in value):
            raise ValueError(f"expected ints >= 1, got {value}")
        return value

    def build(self) -> Grid:
        fields = {k: tuple(sorted(set(v))) for k, v in self.model_dump(exclude_none=True).items()}
        return replace(DEFAULT_GRID, **fields)


class Workload(_Strict):
    name: str = "workload"
    models: Models
    cluster: Cluster
    batch: Batch
    mixture: Mixture = Mixture()
    run: RunSpec | None = None
    seed: int = Field(0, ge=0)
    systems: list[Literal["megatron", "disaggregated", "omni"]] = Field(
        default=list(SYSTEMS), min_length=1)
    disaggregated_encoder_gpus: list[int] | None = Field(None, min_length=1)
    profile: str | None = None
    grid: GridSpec = GridSpec()

    @model_validator(mode="after")
    def _consistent(self) -> Workload:
        gpus = self.cluster.gpus
        if "disaggregated" in self.systems and gpus < 2:
            raise ValueError(f"cluster.gpus: expected >= 2 when 'disaggregated' is in systems "
                             f"(the encoder pool needs GPUs of its own), got {gpus}")
        pools = self.disaggregated_encoder_gpus or []
        bad = [x for x in pools if not 1 <= x < gpus]
        if bad:
            raise ValueError(f"disaggregated_encoder_gpus: expected sizes in [1, {gpus}) "
                             f"(cluster.gpus={gpus}), got {bad}")
        if self.run is not None and self.run.sampled_steps < len(self.run.phases):
            raise ValueError(f"run.sampled_steps: expected >= {len(self.run.phases)} (one per "
                             f"phase), got {self.run.sampled_steps}")
        return self


@dataclass(frozen=True)
class PlanRequest:
    """Everything omni-plan needs: one scenario per swept ratio, systems and a cost model,
    and optionally a run to predict as a whole."""

    name: str
    scenarios: tuple[tuple[float, Scenario], ...]
    systems: tuple[str, ...]
    cost: CostModel
    timeline_ratio: float
    encoder_pools: tuple[int, ...] | None = None
    run: Run | None = None
    sampled_steps: int = 16
    grid: Grid = DEFAULT_GRID


def _suggest(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema model that holds the key at ``loc`` (for did-you-mean on unknown keys)."""
    model: Any = Workload
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        for c in list(candidates):
            candidates += list(getattr(c, "__args__", ()))
        model = next((c for c in candidates if isinstance(c, type)
                      and issubclass(c, BaseModel)), None)
    return model


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc)
        path = path.replace(".[", "[") or "workload"
        got = e.get("input")
        if e["type"] == "extra_forbidden":
            model = _model_at(loc)
            known = sorted(model.model_fields) if model else []
            lines.append(f"{path}: unknown key; expected one of {known}, got {loc[-1]!r}"
                         f"{_suggest(str(loc[-1]), known)}")
            continue
        if e["type"] == "missing":
            lines.append(f"{path}: expected a value, got nothing")
            continue
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
            if ": expected" in msg and not msg.startswith("expected"):
                lines.append(msg)  # already names its key path
                continue
        elif msg.startswith("Input should be "):
            msg = "expected " + msg[len("Input should be "):]
        else:
            msg = "expected a valid value (" + msg[0].lower() + msg[1:] + ")"
        if "got " not in msg:
            msg += f", got {got!r}"
        lines.append(f"{path}: {msg}")
    return "\n".join(lines)


def parse_workload(data: Any, base_dir: Path | None = None) -> PlanRequest:
    """Turn a parsed YAML mapping into a PlanRequest (raises WorkloadError on bad input)."""
    if not isinstance(data, dict):
        raise WorkloadError(f"workload: expected a mapping at the top level, got {data!r}")
    try:
        w = Workload.model_validate(data)
    except ValidationError as err:
        raise WorkloadError(_format(err)) from None
    try:
        encoder = w.models.encoder.build()
    except (TypeError, ValueError) as err:
        raise WorkloadError(f"models.encoder: {err}") from None
    try:
        llm = w.models.llm.build()
    except (TypeError, ValueError) as err:
        raise WorkloadError(f"models.llm: {err}") from None
    hardware = w.cluster.hardware.build()
    cost = CostModel(hardware)
    if w.profile is not None:
        path = Path(w.profile)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise WorkloadError(f"profile: expected an existing JSON file, got {str(path)!r}")
        try:
            cost = CostModel(hardware, fitted=load_profile(path))
        except json.JSONDecodeError as err:
            raise WorkloadError(f"profile: expected valid JSON in {str(path)!r}, got a syntax "
                                f"error at line {err.lineno} column {err.colno}: {err.msg}"
                                ) from None
        except (ValueError, TypeError, KeyError) as err:
            raise WorkloadError(f"profile: {err}") from None
    ratios = w.mixture.ratios
    timeline = w.mixture.timeline_ratio
    timeline = float(ratios[len(ratios) // 2] if timeline is None else timeline)
    run = None
    try:
        if w.run is not None:
            phases = tuple(Phase(p.share, p.steps, p.share_end, p.share_sd, p.name)
                           for p in w.run.phases)
            run = Run(w.name, encoder, llm, hardware, w.cluster.gpus, w.batch.global_batch,
                      w.batch.seq_len, phases, w.mixture.kind, w.mixture.long_max,
                      w.mixture.long_share, w.mixture.audio_to_text_length, w.seed)
        scenarios = []
        for r in sorted({float(x) for x in ratios} | {timeline}):
            m = w.mixture
            mix = (audio_mixture(r, m.audio_to_text_length) if m.kind == "audio" else
                   image_text_mixture(r, long_max=m.long_max, long_share=m.long_share))
            scenarios.append((r, Scenario(f"{w.name}@{r:.2f}", encoder, llm, hardware,
                                          w.cluster.gpus, w.batch.global_batch,
                                          w.batch.seq_len, mix, seed=w.seed)))
    except ValueError as err:
        raise WorkloadError(str(err)) from None
    pools = tuple(w.disaggregated_encoder_gpus) if w.disaggregated_encoder_gpus else None
    sc = scenarios[0][1]
    grid = w.grid.build()
    for system in w.systems:
        if not candidate_configs(system, sc, pools if system == "disaggregated" else None,
                                 grid):
            key = "disaggregated_encoder_gpus" if system == "disaggregated" and pools \
                else "cluster.gpus"
            got = list(pools) if key != "cluster.gpus" else w.cluster.gpus
            raise WorkloadError(
                f"{key}: expected a GPU count that some layout of {system} divides (TP from "
                f"{list(grid.tp)}, PP from {list(grid.pp)}, at most {w.batch.global_batch} "
                f"replicas), got {got}")
    return PlanRequest(w.name, tuple(scenarios), tuple(w.systems), cost, timeline, pools, run,
                       w.run.sampled_steps if w.run else 16, grid)


def load_workload(path: str | Path) -> PlanRequest:
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"workload: expected an existing YAML file, got {str(path)!r}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise WorkloadError(f"workload: expected valid YAML, got a syntax error{where}: "
                            f"{problem}") from None
    except UnicodeDecodeError as err:
        raise WorkloadError(f"workload: expected a UTF-8 text file, got {err}") from None
    return parse_workload(data, path.parent)
