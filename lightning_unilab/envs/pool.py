"""BatchEnvPool: N environments of one MuJoCo model, stepped by C++ worker threads.

The state of every environment is one mjSTATE_INTEGRATION row held in C++ (warm start included);
``qpos``, ``qvel``, ``ctrl`` ... are live zero-copy views of those rows. Worker threads (the calling
thread among them) step the selected environments with the GIL released; only the final state
comes back, plus the derived fields named in ``outputs``, gathered into dense ``(N, ...)`` arrays.

    pool = BatchEnvPool(model, num_envs=4096, outputs={"sensordata": None, "xpos": ["pelvis"]})
    pool.reset(keyframe=0)
    pool.ctrl[:] = policy(pool.qpos)
    pool.step(nstep=10)                 # final state + pool.outputs["xpos"], shape (4096, 1, 3)
    pool.reset(ids=done_ids, keyframe=0, randomization={"body_mass": masses})

Results are bit-identical for any thread count and equal to a serial ``mj_step`` loop over one
MjData per environment. An environment that goes unstable keeps its last good state and is
flagged in ``status``; the others finish.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from mujoco import batch as mjbatch

from lightning_omnilab.validate import number, positive_int
from lightning_unilab import _core

__all__ = ["BatchEnvPool", "STATUS_ERROR", "STATUS_TOO_FAST", "broadcast_real", "describe_status",
           "load_model"]

STATUS_ERROR: int = _core.STATUS_ERROR
# a substep left some |qvel| above the step's max_speed; the env was rolled back
STATUS_TOO_FAST: int = _core.STATUS_TOO_FAST

# MjData fields stored in the state rows, by mjtState component
_STATE_FIELDS: dict[str, mujoco.mjtState] = {
    "time": mujoco.mjtState.mjSTATE_TIME,
    "qpos": mujoco.mjtState.mjSTATE_QPOS,
    "qvel": mujoco.mjtState.mjSTATE_QVEL,
    "act": mujoco.mjtState.mjSTATE_ACT,
    "history": mujoco.mjtState.mjSTATE_HISTORY,
    "qacc_warmstart": mujoco.mjtState.mjSTATE_WARMSTART,
    "ctrl": mujoco.mjtState.mjSTATE_CTRL,
    "qfrc_applied": mujoco.mjtState.mjSTATE_QFRC_APPLIED,
    "xfrc_applied": mujoco.mjtState.mjSTATE_XFRC_APPLIED,
    "eq_active": mujoco.mjtState.mjSTATE_EQ_ACTIVE,
    "mocap_pos": mujoco.mjtState.mjSTATE_MOCAP_POS,
    "mocap_quat": mujoco.mjtState.mjSTATE_MOCAP_QUAT,
    "userdata": mujoco.mjtState.mjSTATE_USERDATA,
    "plugin_state": mujoco.mjtState.mjSTATE_PLUGIN,
    "plastic": mujoco.mjtState.mjSTATE_PLASTIC,
}

# state fields with one row per object: their row widths
_ROW_FIELDS = {"mocap_pos": 3, "mocap_quat": 4, "xfrc_applied": 6}

_STAGES = {
    "none": mujoco.mjtStage.mjSTAGE_NONE.value,
    "pos": mujoco.mjtStage.mjSTAGE_POS.value,
    "vel": mujoco.mjtStage.mjSTAGE_VEL.value,
    "acc": mujoco.mjtStage.mjSTAGE_ACC.value,
}

# output field prefix -> the mujoco object type whose names select its rows
_ROW_OBJECTS: list[tuple[tuple[str, ...], mujoco.mjtObj]] = [
    (("site_",), mujoco.mjtObj.mjOBJ_SITE),
    (("geom_",), mujoco.mjtObj.mjOBJ_GEOM),
    (("cam_",), mujoco.mjtObj.mjOBJ_CAMERA),
    (("light_",), mujoco.mjtObj.mjOBJ_LIGHT),
    (("xanchor", "xaxis"), mujoco.mjtObj.mjOBJ_JOINT),
    (("ten_",), mujoco.mjtObj.mjOBJ_TENDON),
    (("actuator_",), mujoco.mjtObj.mjOBJ_ACTUATOR),
    (("x", "subtree_", "cvel", "cacc", "cfrc_", "cinert", "crb"), mujoco.mjtObj.mjOBJ_BODY),
]

# randomization names that are not MjModel fields
_ALIASES = {"gravity": "opt.gravity"}
_GAINS = ("actuator_kp", "actuator_kd")
_NONNEGATIVE = ("body_mass", "body_inertia", "geom_friction", "dof_damping", "dof_armature",
                "actuator_kp", "actuator_kd", "dof_frictionloss")
_SETCONST_INPUTS = frozenset(mujoco.MjModel._setconst_inputs)
# what mj_setConst computes and the batch can hold per env
_SETCONST_OUTPUTS = [f for f in mujoco.MjModel._setconst_outputs if f in mjbatch.MODEL_FIELDS]

ModelLike = mujoco.MjModel | str | os.PathLike
Ids = np.ndarray | Sequence[int] | None


def describe_status(bits: int) -> list[str]:
    """Names of what one status entry recorded: MuJoCo warnings, 'too_fast' (a substep passed
    ``max_speed``), 'bad_action' (a non-finite action) and 'error' (a MuJoCo error)."""
    warnings = mujoco.mjtWarning.__members__.values()
    names = [w.name for w in warnings if int(w) < _core.NUM_WARNINGS and bits & (1 << int(w))]
    for bit, name in ((STATUS_TOO_FAST, "too_fast"), (_core.STATUS_BAD_ACTION, "bad_action"),
                      (STATUS_ERROR, "error")):
        if bits & bit:
            names.append(name)
    return names


def _check_count(name: str, value: Any) -> None:
    positive_int(name, value, below=2**31, why="the C++ side takes a 32-bit int")


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 2**62


def _check_fits(model: mujoco.MjModel, num_envs: int) -> None:
    """Refuse a pool whose MjData buffers alone exceed this machine's memory, before
    building one env of it (it would swap or fail after minutes, not at once)."""
    per_env = int(mujoco.MjData(model).nbuffer)  # the fixed buffer every env fills
    need = int(num_envs) * per_env
    have = _physical_memory()
    if need > have:
        raise ValueError(f"num_envs: {num_envs} envs need at least {need / 2**30:.1f} GiB of "
                         f"MjData ({per_env} bytes each, before their arenas); this machine "
                         f"has {have / 2**30:.1f} GiB")


def _close(name: str, names: Any) -> str:
    close = difflib.get_close_matches(str(name), list(names), n=3)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def load_model(model: ModelLike) -> mujoco.MjModel:
    """An MjModel from an MjModel, an MJCF path, or an MJCF string."""
    if isinstance(model, mujoco.MjModel):
        return model
    if isinstance(model, str) and model.lstrip().startswith("<"):
        try:
            return mujoco.MjModel.from_xml_string(model)
        except ValueError as err:
            raise ValueError(f"model: the MJCF string does not load: {err}") from None
    if isinstance(model, str | os.PathLike):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"model: no MJCF file at {str(path)!r}")
        try:
            return mujoco.MjModel.from_xml_path(str(path))
        except ValueError as err:
            raise ValueError(f"model: {str(path)!r} does not load: {err}") from None
    raise TypeError(
        f"model: expected a mujoco.MjModel, an MJCF path or an MJCF string, "
        f"got {type(model).__name__}"
    )


def broadcast_real(name: str, values: Any, shape: tuple[int, ...]) -> np.ndarray:
    """values as finite float64 of shape, or an error naming the argument name."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{name}: expected real numbers, got dtype {arr.dtype}")
    try:
        arr = np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(
            f"{name}: expected shape {shape} or one that broadcasts to it, got {arr.shape}"
        ) from None
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return np.ascontiguousarray(arr, dtype=np.float64)


def _stage(stage: str | int, argument: str = "stage") -> int:
    if isinstance(stage, str) and stage in _STAGES:
        return _STAGES[stage]
    if isinstance(stage, int | np.integer) and int(stage) in _STAGES.values():
        return int(stage)
    raise ValueError(
        f"{argument}: expected one of {sorted(_STAGES)} or an mjtStage value, got {stage!r}"
    )


def _state_array(state: Mapping[str, Any], key: str, shape: tuple[int, ...],
                 dtype: type) -> np.ndarray:
    """state[key] as an array of exactly this shape and dtype, else ValueError naming it."""
    arr = np.asarray(state.get(key))
    if arr.shape != shape or arr.dtype != np.dtype(dtype):
        raise ValueError(f"state[{key!r}]: expected {np.dtype(dtype)}{list(shape)}, got "
                         f"{arr.dtype}{list(arr.shape)}")
    return arr


class BatchEnvPool:
    """num_envs environments of a copy of model, on num_threads threads.

    Args:
        model: an MjModel, a path to an MJCF file, or an MJCF string.
        num_envs: number of environments.
        num_threads: worker threads including the caller's; default: the CPUs this process may
            use (its affinity mask).
        outputs: derived mjData fields to copy out after every call, each mapped to the names
            (or ids) of the objects whose rows to keep, or None for all rows. Sensor names select
            their entries of ``sensordata``; body names the rows of ``xpos``, ``xquat`` ...;
            site names ``site_xpos`` ...; joint names the dofs of ``qacc``, ``qfrc_*``.
        stage: forward stages computed at the final state after each step, so that outputs
            describe it: "acc" (mj_forward, default when there are outputs), "vel" or "pos"
            (cheaper; acceleration-based sensors then keep their last-substep values) or "none"
            (outputs are one substep behind, as with mj_step; the default without outputs).
    """

    def __init__(
        self,
        model: ModelLike,
        num_envs: int,
        num_threads: int | None = None,
        *,
        outputs: Mapping[str, Sequence[str | int] | None] | None = None,
        stage: str | int | None = None,
    ) -> None:
        self._core: _core.BatchEnvPool | None = None
        self._model = load_model(model)
        _check_count("num_envs", num_envs)
        _check_fits(self._model, num_envs)
        if num_threads is None:
            num_threads = len(os.sched_getaffinity(0))
        _check_count("num_threads", num_threads)
        if outputs is not None and not isinstance(outputs, Mapping):
            raise TypeError(f"outputs: expected a mapping {{field: names or None}}, e.g. "
                            f"{{'xpos': ['torso']}}, got {type(outputs).__name__}")
        sleep = mujoco.mjtEnableBit.mjENBL_SLEEP
        if self._model.opt.enableflags & sleep:
            raise ValueError("model: sleeping bodies (<flag sleep=\"enable\"/>) are not "
                             "supported: their bookkeeping is not part of the state rows; "
                             "disable the flag")
        specs = [(name, self._output_rows(name, objects)) for name, objects in
                 (outputs or {}).items()]
        try:
            self._core = _core.BatchEnvPool(self._model._address, int(num_envs),
                                            int(num_threads), specs)
        except RuntimeError as err:
            raise ValueError(f"model: MuJoCo cannot batch this model: {err}") from None
        self._stage = _stage(stage if stage is not None else ("acc" if specs else "none"))
        self._state = self._core.state()
        self._status = self._core.status()
        self._status.flags.writeable = False
        self._outputs = self._core.outputs()
        for view in self._outputs.values():
            view.flags.writeable = False
        self._views: dict[str, np.ndarray] = {}
        self._expanded: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ properties

    @property
    def model(self) -> mujoco.MjModel:
        """The model the pool was made from (per-env values are in ``model_field``).

        The pool steps a copy taken at construction: later edits of this MjModel do not reach
        it (change per-env fields through ``reset(randomization=...)``)."""
        return self._model

    @property
    def num_envs(self) -> int:
        return self.core.num_envs

    @property
    def num_threads(self) -> int:
        return self.core.num_threads

    @property
    def state_size(self) -> int:
        """Length of one mjSTATE_INTEGRATION row."""
        return self.core.state_size

    @property
    def state(self) -> np.ndarray:
        """Live (num_envs, state_size) rows, in mj_getState order."""
        self.core  # noqa: B018 - raises once closed
        return self._state

    @property
    def status(self) -> np.ndarray:
        """Read-only (num_envs,) uint32: warning bits, STATUS_TOO_FAST and STATUS_ERROR since each
        env's reset (``describe_status`` names them)."""
        self.core  # noqa: B018
        return self._status

    @property
    def outputs(self) -> dict[str, np.ndarray]:
        """Read-only live (num_envs, rows, cols) arrays of the fields named at construction."""
        self.core  # noqa: B018
        return self._outputs

    def field(self, name: str) -> np.ndarray:
        """Live (num_envs, ...) view of a state field: qpos, qvel, ctrl, time, mocap_pos ..."""
        if name in self._views:
            return self._views[name]
        if name not in _STATE_FIELDS:
            raise ValueError(
                f"name: expected a state field, one of {sorted(_STATE_FIELDS)}, got {name!r}"
                + _close(name, _STATE_FIELDS)
            )
        offset, size = self.core.state_component(int(_STATE_FIELDS[name]))
        view = self._state[:, offset : offset + size]
        if name == "time":
            view = view[:, 0]
        elif name in _ROW_FIELDS:
            view = view.reshape(self.num_envs, -1, _ROW_FIELDS[name])
        self._views[name] = view
        return view

    qpos = property(lambda self: self.field("qpos"), doc="Live (num_envs, nq) positions.")
    qvel = property(lambda self: self.field("qvel"), doc="Live (num_envs, nv) velocities.")
    act = property(lambda self: self.field("act"), doc="Live (num_envs, na) activations.")
    ctrl = property(lambda self: self.field("ctrl"), doc="Live (num_envs, nu) controls.")
    time = property(lambda self: self.field("time"), doc="Live (num_envs,) simulation times.")
    qacc_warmstart = property(lambda self: self.field("qacc_warmstart"),
                              doc="Live (num_envs, nv) solver warm starts.")
    qfrc_applied = property(lambda self: self.field("qfrc_applied"),
                            doc="Live (num_envs, nv) applied generalized forces.")
    xfrc_applied = property(lambda self: self.field("xfrc_applied"),
                            doc="Live (num_envs, nbody, 6) applied Cartesian forces.")
    mocap_pos = property(lambda self: self.field("mocap_pos"),
                         doc="Live (num_envs, nmocap, 3) mocap positions.")
    mocap_quat = property(lambda self: self.field("mocap_quat"),
                          doc="Live (num_envs, nmocap, 4) mocap orientations.")

    # ------------------------------------------------------------------ calls

    def step(self, ids: Ids = None, nstep: int = 1, stage: str | int | None = None,
             max_speed: float = 0.0) -> None:
        """Advance the selected envs by nstep substeps with their controls held.

        Only the final state is kept; outputs describe it (see ``stage``). Envs that go
        unstable keep the state they had before the call and get their warning bits in
        ``status``; envs not selected are untouched. ``max_speed`` > 0 also counts as unstable
        a substep that leaves some ``|qvel|`` above it (bit ``STATUS_TOO_FAST``): a finite
        blow-up, which raises no MuJoCo warning.
        """
        nstep = positive_int("nstep", nstep)
        stage = self._stage if stage is None else _stage(stage)
        number("max_speed", max_speed, low=0)
        self.core.step(self.select(ids), int(nstep), stage, float(max_speed))

    def forward(self, ids: Ids = None, stage: str | int = "acc") -> None:
        """Compute outputs at the current state without advancing it."""
        self.core.forward(self.select(ids), _stage(stage))

    def reset(
        self,
        ids: Ids = None,
        initial_state: np.ndarray | None = None,
        keyframe: int | str | Sequence[int] | np.ndarray | None = None,
        randomization: Mapping[str, Any] | None = None,
    ) -> None:
        """Reset the selected envs; the others stay bit-identical.

        Args:
            ids: sorted unique env ids, a boolean mask, or None for all.
            initial_state: state rows to start from, (n, state_size) or (state_size,).
            keyframe: a keyframe (index or name) for all, or one per env; default: the model's
                defaults (mj_resetData).
            randomization: model fields to give new per-env values, applied before the reset:
                any expandable MjModel field (body_mass, body_ipos, geom_friction, dof_damping,
                dof_armature, actuator_gainprm, ...), "opt.<field>" (opt.gravity), and
                "actuator_kp" / "actuator_kd" for position actuators. Values broadcast to
                (n, *field_shape); they replace the env's values and persist until the next
                randomization. Constants derived by mj_setConst are refreshed for these envs.
        """
        sel = self.select(ids)
        n = self.num_envs if sel is None else len(sel)
        if initial_state is not None and keyframe is not None:
            raise ValueError("initial_state and keyframe: give one or neither, not both")
        if randomization is not None and not isinstance(randomization, Mapping):
            raise TypeError(f"randomization: expected a mapping {{field: values}}, e.g. "
                            f"{{'body_mass': masses}}, got {type(randomization).__name__}")
        keys = None if keyframe is None else self._keys(keyframe, n)
        rows = None
        if initial_state is not None:
            rows = broadcast_real("initial_state", initial_state, (n, self.state_size))
        if randomization:
            self._randomize(sel, n, randomization)
        stage = self._stage if self._outputs else _STAGES["none"]
        self.core.reset(sel, keys, rows, stage)

    def model_field(self, name: str) -> np.ndarray:
        """Read-only (num_envs, ...) per-env values of a model field (randomized or not).

        Values are the simulated ones: randomized fields and the constants mj_setConst derived
        from them per env, else the pool's copy of the model taken at construction. bvh_aabb
        holds the bodies' bounding volumes only (the rows before the meshes') once a
        randomization changed them, as mujoco.batch.Batch.expanded."""
        name = _ALIASES.get(name, name)
        template = self._template(name, "name")
        raw = self.core.expand(name, False)
        if raw is None:
            out = np.broadcast_to(template, (self.num_envs, *template.shape))
        else:
            out = self._typed(raw, template).copy()
            out.flags.writeable = False
        return out

    def error(self, env: int) -> str:
        """Message of the MuJoCo error env raised in its last call, or ''."""
        if not 0 <= int(env) < self.num_envs:
            raise IndexError(f"env: expected an id in [0, {self.num_envs}), got {env}")
        return self.core.error(int(env))

    def unstable(self) -> np.ndarray:
        """Ids of the envs flagged in status since their last reset."""
        return np.flatnonzero(self._status)

    def get_state(self) -> dict[str, Any]:
        """Copies of everything that makes the envs step as they will: the state rows
        (mjSTATE_INTEGRATION: warm starts included), the status bits, the raw bytes of every
        model field that has per-env values (randomized fields and the constants mj_setConst
        derived from them) and the outputs (a numpy task may read them before its next step).
        Plain numpy arrays; :meth:`set_state` restores them."""
        fields = {}
        for name in sorted(mjbatch.MODEL_FIELDS):
            raw = self.core.expand(name, False)
            if raw is not None:
                fields[name] = raw.copy()
        return {"state": self.state.copy(), "status": self.status.copy(),
                "model_fields": fields,
                "outputs": {name: view.copy() for name, view in self.outputs.items()}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s copies (of a pool of the same model and num_envs); a
        field with per-env values here that the state has not gets the model's values back.
        Everything is checked before anything is written: ValueError naming the entry."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state: expected the mapping of get_state(), got "
                            f"{type(state).__name__}")
        rows = _state_array(state, "state", (self.num_envs, self.state_size), np.float64)
        status = _state_array(state, "status", (self.num_envs,), np.uint32)
        outputs = state.get("outputs")
        if not isinstance(outputs, Mapping) or set(outputs) != set(self.outputs):
            raise ValueError(f"state['outputs']: expected the outputs {sorted(self.outputs)}, "
                             f"got {sorted(outputs) if isinstance(outputs, Mapping) else outputs}")
        for name, view in self.outputs.items():
            _state_array(outputs, name, view.shape, np.float64)
        fields = state.get("model_fields")
        if not isinstance(fields, Mapping):
            raise ValueError("state['model_fields']: expected a mapping {field: bytes per env}")
        writes = {}
        for name, values in fields.items():
            if name not in mjbatch.MODEL_FIELDS:
                raise ValueError(f"state['model_fields']: {name!r} is not a per-env model field")
            raw = self.core.expand(name, False)
            width = raw.shape[1] if raw is not None else None
            arr = np.asarray(values)
            if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[0] != self.num_envs or (
                    width is not None and arr.shape[1] != width):
                raise ValueError(f"state['model_fields'][{name!r}]: expected uint8 bytes of "
                                 f"shape ({self.num_envs}, {width or 'field bytes'}), got "
                                 f"{arr.dtype}{list(arr.shape)}")
            writes[name] = arr
        for name in sorted(mjbatch.MODEL_FIELDS - set(writes)):  # back to the shared values
            raw = self.core.expand(name, False)
            if raw is not None:
                raw[:] = self.core.model_bytes(name)[: raw.shape[1]]
        for name, arr in writes.items():
            raw = self.core.expand(name, True)
            if raw.shape != arr.shape:
                raise ValueError(f"state['model_fields'][{name!r}]: expected {raw.shape[1]} "
                                 f"bytes per env, got {arr.shape[1]}")
            raw[:] = arr
        self._state[:] = rows
        self.core.status()[:] = status
        for name, view in self.core.outputs().items():
            view[:] = outputs[name]

    def close(self) -> None:
        """Release the pool; views already handed out keep their memory until dropped. Later
        calls raise RuntimeError; closing twice is harmless."""
        self._core = None

    def __enter__(self) -> BatchEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._core is None:
            return "BatchEnvPool(closed)"
        return (f"BatchEnvPool(num_envs={self.num_envs}, num_threads={self.num_threads}, "
                f"nq={self._model.nq}, nu={self._model.nu}, outputs={list(self._outputs)})")

    # ------------------------------------------------------------------ internals

    @property
    def core(self) -> _core.BatchEnvPool:
        """The C++ pool, for extensions that run their own kernels on it (task environments)."""
        if self._core is None:
            raise RuntimeError("the BatchEnvPool is closed")
        return self._core

    def select(self, ids: Ids) -> np.ndarray | None:
        """Validated int32 ids (None for all), checked before narrowing: for code built on the
        pool, such as task environments, that takes ids of its own."""
        if ids is None:
            return None
        arr = np.asarray(ids)
        n = self.num_envs
        if arr.dtype == bool:
            if arr.shape != (n,):
                raise ValueError(f"ids: a boolean mask must have shape ({n},), got {arr.shape}")
            return None if arr.all() else np.flatnonzero(arr).astype(np.int32)
        if arr.ndim != 1:
            raise ValueError(f"ids: expected a 1-D array of env ids, got shape {arr.shape}")
        if arr.size == 0:
            return np.zeros(0, np.int32)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"ids: expected integers or a boolean mask, got dtype {arr.dtype}")
        if arr.size > 1 and not (arr[1:] > arr[:-1]).all():
            k = int(np.flatnonzero(arr[:-1] >= arr[1:])[0])
            kind = "duplicate" if arr[k] == arr[k + 1] else "unsorted"
            raise ValueError(
                f"ids: expected sorted unique env ids, got {kind} {arr[k]} before {arr[k + 1]}"
            )
        if arr[0] < 0 or arr[-1] >= n:
            bad = arr[0] if arr[0] < 0 else arr[-1]
            raise IndexError(f"ids: expected env ids in [0, {n}), got {bad}")
        return np.ascontiguousarray(arr, dtype=np.int32)

    def _keys(self, keyframe: Any, n: int) -> np.ndarray:
        nkey = self._model.nkey
        if isinstance(keyframe, str):
            k = mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_KEY, keyframe)
            if k < 0:
                names = [self._model.key(i).name for i in range(nkey)]
                raise ValueError(f"keyframe: the model has no keyframe {keyframe!r}; it has "
                                 f"{names}" + _close(keyframe, names))
            keyframe = k
        arr = np.asarray(keyframe)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"keyframe: expected an int, a name or int array, got {arr.dtype}")
        if arr.ndim not in (0, 1) or (arr.ndim == 1 and arr.shape != (n,)):
            raise ValueError(f"keyframe: expected a scalar or shape ({n},), got {arr.shape}")
        bad = arr[(arr < -1) | (arr >= nkey)]
        if bad.size:
            raise IndexError(f"keyframe: expected -1 (defaults) or a keyframe in [0, {nkey}), "
                             f"got {bad.flat[0]}")
        return np.ascontiguousarray(np.broadcast_to(arr, (n,)), dtype=np.int32)

    def _output_rows(self, name: str, objects: Sequence[str | int] | None) -> list[int]:
        names = [n for n in _core.data_field_names() if n not in _STATE_FIELDS]
        if name in _STATE_FIELDS:
            raise ValueError(f"outputs: {name!r} is part of the state: use pool.field({name!r})")
        if name not in names:
            raise ValueError(f"outputs: {name!r} is not an mjData array of derived values"
                             + _close(name, names))
        if objects is None:
            return []
        if isinstance(objects, str | int):
            objects = [objects]
        m = self._model
        if name == "sensordata":
            return self._ranges(objects, mujoco.mjtObj.mjOBJ_SENSOR, m.nsensor,
                                m.sensor_adr, m.sensor_dim, name)
        if name.startswith(("q", "cdof")):
            return self._ranges(objects, mujoco.mjtObj.mjOBJ_JOINT, m.njnt, m.jnt_dofadr,
                                np.diff(np.append(m.jnt_dofadr, m.nv)), name)
        objtype = next((t for prefixes, t in _ROW_OBJECTS if name.startswith(prefixes)), None)
        if objtype is None:
            raise ValueError(f"outputs: rows of {name!r} cannot be chosen by name; pass None")
        return [self._object_id(o, objtype, name) for o in objects]

    def _object_id(self, obj: str | int, objtype: mujoco.mjtObj, field: str) -> int:
        kind = objtype.name[len("mjOBJ_"):].lower()
        if isinstance(obj, int | np.integer):
            return int(obj)
        i = mujoco.mj_name2id(self._model, objtype, obj)
        if i < 0:
            count = getattr(self._model, {"camera": "ncam", "joint": "njnt"}.get(kind, "n" + kind))
            known = [mujoco.mj_id2name(self._model, objtype, j) or "" for j in range(count)]
            raise ValueError(f"outputs[{field!r}]: the model has no {kind} named {obj!r}"
                             + _close(obj, known))
        return i

    def _ranges(self, objects: Sequence[str | int], objtype: mujoco.mjtObj, count: int,
                adr: np.ndarray, dim: np.ndarray, field: str) -> list[int]:
        rows: list[int] = []
        for obj in objects:
            i = self._object_id(obj, objtype, field)
            if not 0 <= i < count:
                raise IndexError(f"outputs[{field!r}]: id {i} is outside [0, {count})")
            rows.extend(range(int(adr[i]), int(adr[i]) + int(dim[i])))
        return rows

    def _template(self, name: str, argument: str = "randomization") -> np.ndarray:
        """The field's shared value in the pool's own model copy (not the caller's MjModel,
        which the caller may edit after construction), read-only."""
        if name in _GAINS:
            return np.zeros(self._model.nu)
        if name not in mjbatch.MODEL_FIELDS:
            known = sorted(mjbatch.MODEL_FIELDS | set(_GAINS) | set(_ALIASES))
            raise ValueError(f"{argument}: {name!r} is not a per-env model field"
                             + _close(name, known))
        return self._base(name)

    def _base(self, name: str) -> np.ndarray:
        if name.startswith("opt."):
            like = np.asarray(getattr(self._model.opt, name[4:]))
            if like.dtype.kind == "f":
                like = like.astype(np.float64)
            elif like.dtype.kind in "iu":
                like = like.astype(np.int32)
        else:
            like = getattr(self._model, name)
        raw = self.core.model_bytes(name)
        out = raw.view(like.dtype).reshape(like.shape)
        out.flags.writeable = False
        return out

    def _typed(self, raw: np.ndarray, template: np.ndarray) -> np.ndarray:
        dtype = template.dtype
        if dtype.kind == "f":
            dtype = np.dtype(np.float64)
        elif dtype.kind in "iu" and template.ndim == 0:
            dtype = np.dtype(np.int32)
        values = raw.view(dtype).reshape(self.num_envs, -1)
        if values.shape[1] == template.size:
            return values.reshape(self.num_envs, *template.shape)
        # bvh_aabb: per env only the bodies' hierarchies, a prefix of the model's rows
        row = int(np.prod(template.shape[1:]))
        return values.reshape(self.num_envs, values.shape[1] // row, *template.shape[1:])

    def _expand(self, name: str) -> np.ndarray:
        if name not in self._expanded:
            template = self._template(name)
            self._expanded[name] = self._typed(self.core.expand(name, True), template)
        return self._expanded[name]

    def _randomize(self, sel: np.ndarray | None, n: int, fields: Mapping[str, Any]) -> None:
        """Validate every field first, then write: a bad field leaves the model untouched."""
        writes: list[tuple[str, np.ndarray]] = []
        for raw_name, values in fields.items():
            name = _ALIASES.get(raw_name, raw_name)
            template = self._template(name)
            if template.dtype.kind != "f" and name not in _GAINS:
                raise ValueError(f"randomization: {name!r} holds integers (structure), "
                                 "which cannot differ between envs")
            arr = broadcast_real(f"randomization[{raw_name!r}]", values, (n, *template.shape))
            if name in _NONNEGATIVE and (arr < 0).any():
                raise ValueError(f"randomization[{raw_name!r}]: expected values >= 0, "
                                 f"got {arr.min()}")
            writes.append((name, arr))
        if any(name in _GAINS for name, _ in writes):
            self._check_position_actuators()
        rows = slice(None) if sel is None else sel
        touched = {"actuator_gainprm", "actuator_biasprm"} if any(
            name in _GAINS for name, _ in writes) else set()
        touched |= {name for name, _ in writes if name not in _GAINS}
        saved = {name: self._expand(name)[rows].copy() for name in touched}
        needs_const = False
        for name, arr in writes:
            if name == "actuator_kp":
                self._expand("actuator_gainprm")[rows, :, 0] = arr
                self._expand("actuator_biasprm")[rows, :, 1] = -arr
            elif name == "actuator_kd":
                self._expand("actuator_biasprm")[rows, :, 2] = -arr
            else:
                self._expand(name)[rows] = arr
            needs_const |= name in _SETCONST_INPUTS or name.startswith("opt.")
        if needs_const and self.core.set_const(sel, _SETCONST_OUTPUTS):
            env = next(int(i) for i in (range(self.num_envs) if sel is None else sel)
                       if self.core.error(int(i)))
            message = self.core.error(env)
            for name, values in saved.items():
                self._expand(name)[rows] = values
            self.core.set_const(sel, _SETCONST_OUTPUTS)
            raise ValueError(
                f"randomization: MuJoCo rejects the new model of env {env}: {message}; "
                "the model fields of every env were left as they were"
            )

    def _check_position_actuators(self) -> None:
        # the pool's own model never changes: decide once (this runs on every randomized reset)
        if getattr(self, "_servos_ok", False):
            return
        m = self._model
        fixed = self._base("actuator_gaintype") == mujoco.mjtGain.mjGAIN_FIXED
        affine = self._base("actuator_biastype") == mujoco.mjtBias.mjBIAS_AFFINE
        servo = np.isclose(self._base("actuator_biasprm")[:, 1],
                           -self._base("actuator_gainprm")[:, 0])
        bad = np.flatnonzero(~(fixed & affine & servo))
        self._servos_ok = not bad.size
        if bad.size:
            name = m.actuator(int(bad[0])).name or f"#{bad[0]}"
            raise ValueError(
                "randomization: actuator_kp/actuator_kd need position actuators "
                f"(fixed gain, affine bias with biasprm[1] = -kp); actuator {name!r} is not one"
            )
