"""The two file formats of an exported actor: bytes out of torch, and a runner back in.

ONNX (``torch.onnx.export``, run by onnxruntime) is what most robot stacks load; TorchScript is
what libtorch's ``torch::jit::load`` (unitree_rl_gym's deploy programs, C++ robot code) loads.
Both runners take and return numpy float32 ``[batch, ...]`` arrays, so the export's own check
and the MuJoCo deploy loop (:mod:`.mujoco_loop`) run either file the same way.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["FORMATS", "Runner", "load_runner", "runtime_name", "serialize"]

# format -> file suffix
FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
INPUT, OUTPUT = "obs", "action"

Runner = Callable[[np.ndarray], np.ndarray]


def serialize(module: torch.nn.Module, fmt: str, example: torch.Tensor) -> bytes:
    """``module`` (obs -> action, float32) as the bytes of a ``fmt`` file, batch size free."""
    import torch

    module = module.eval()
    if fmt == "onnx":
        batch = torch.export.Dim("batch")
        program = torch.onnx.export(module, (example,), dynamo=True, verbose=False,
                                    input_names=[INPUT], output_names=[OUTPUT],
                                    dynamic_shapes={"obs": {0: batch}})
        return program.model_proto.SerializeToString()
    with warnings.catch_warnings():
        # torch 2.13 marks TorchScript deprecated in favour of torch.export, whose files
        # libtorch's torch::jit::load (the robots' C++ deploy programs) cannot read
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(module, example)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer)
    return buffer.getvalue()


def load_runner(fmt: str, source: bytes | str | os.PathLike) -> Runner:
    """A function ``obs [batch, obs] float32 -> actions [batch, action] float32`` running the
    ``fmt`` file at ``source`` (a path, or its bytes) on one CPU thread."""
    if fmt == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        where = source if isinstance(source, bytes) else os.fspath(source)
        session = ort.InferenceSession(where, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name

        def run_onnx(obs: np.ndarray) -> np.ndarray:
            return session.run(None, {name: np.ascontiguousarray(obs, np.float32)})[0]

        return run_onnx
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # see serialize
        module = torch.jit.load(io.BytesIO(source) if isinstance(source, bytes)
                                else os.fspath(source), map_location="cpu")
    module.eval()

    def run_torchscript(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(np.ascontiguousarray(obs, np.float32))).numpy()

    return run_torchscript


def runtime_name(fmt: str) -> str:
    """What runs a ``fmt`` file here, with its version (the JSON's verification record)."""
    if fmt == "onnx":
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"
    import torch

    return f"torch.jit {torch.__version__}"
