"""Price one training step of each system on a scenario, and grid-search its parallel layout.

A facade over ``scenario`` (what is predicted), ``step_data`` (the sampled step),
``pricing`` (schedules and their prices per system) and ``search`` (the layout grid).
"""

from .pricing import StepPricer, predict
from .scenario import SYSTEM_LABELS, SYSTEMS, ParallelConfig, Prediction, Scenario
from .search import (
    CONVENTIONAL_PIPELINE_GRID,
    DEFAULT_GRID,
    Grid,
    SearchResult,
    candidate_configs,
    encoder_pool_choices,
    estimate,
    search,
    speedup,
    static_memory_fits,
)
from .step_data import StepData

__all__ = [
    "CONVENTIONAL_PIPELINE_GRID", "DEFAULT_GRID", "SYSTEMS", "SYSTEM_LABELS", "Grid",
    "ParallelConfig", "Prediction", "Scenario", "SearchResult", "StepData", "StepPricer",
    "candidate_configs", "encoder_pool_choices", "estimate", "predict", "search", "speedup",
    "static_memory_fits",
]
