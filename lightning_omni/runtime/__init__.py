"""Runtime for Omni plans: executes per-rank action lists over torch.distributed.

``parallel_dims.ParallelDims`` describes a run's layout once; ``parallelize.parallelize``
turns a spec and its dims into this process's engine; ``engine.OmniEngine`` runs one pipelined
step; ``executor.StageExecutor`` executes one rank's actions; ``checkpoint`` writes and
consolidates per-stage shards; ``metrics`` measures a step and prices the same plan in the
simulator.
"""

from .checkpoint import consolidate
from .engine import OmniEngine, build_plan
from .executor import OmniRuntimeError, StageExecutor, split_microbatches
from .layout import Layout, make_layout, partition_blocks
from .parallel_dims import ParallelDims
from .parallelize import Parallelized, parallelize

__all__ = ["Layout", "OmniEngine", "OmniRuntimeError", "ParallelDims", "Parallelized",
           "StageExecutor", "build_plan", "consolidate", "make_layout", "parallelize",
           "partition_blocks", "split_microbatches"]
