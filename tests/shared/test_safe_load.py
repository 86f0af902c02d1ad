"""Checkpoints load weights-only: a pickle naming code is refused before anything runs, by the
evaluation command and by OmniStrategy's resume, naming the file; the project's plain types
load, also under the module paths older checkpoints name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_omnilab import safe_load


class _Payload:
    """Pickles as a call of ``Path.touch`` on ``marker``: loading it would create the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _evil(path: Path, marker: Path) -> Path:
    torch.save({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": _Payload(marker)}, path)
    return path


def test_plain_tensors_load_and_a_pickled_callable_is_refused_unrun(tmp_path):
    good = tmp_path / "good.ckpt"
    torch.save({"w": torch.arange(3.0), "n": 3, "name": "x"}, good)
    assert torch.equal(safe_load.load(good)["w"], torch.arange(3.0))
    marker = tmp_path / "ran"
    bad = _evil(tmp_path / "bad.ckpt", marker)
    with pytest.raises(safe_load.UnsafeCheckpointError, match=f"{bad}: refused to load"):
        safe_load.load(bad)
    assert not marker.exists()  # the callable never ran
    torch.load(bad, weights_only=False)  # the protection is what stops it: unprotected, it runs
    assert marker.exists()


def test_a_randomization_loads_also_under_its_old_module_path(tmp_path):
    from lightning_unilab.envs.randomization import G1Randomization

    path = tmp_path / "rand.ckpt"
    torch.save({"randomization": G1Randomization(friction=(0.5, 0.9))}, path,
               _use_new_zipfile_serialization=False)  # protocol 2: module names as text
    assert safe_load.load(path)["randomization"].ranges["friction"] == (0.5, 0.9)
    old = tmp_path / "old.ckpt"
    old.write_bytes(path.read_bytes().replace(b"lightning_unilab.envs.randomization",
                                              b"lightning_unilab.randomization"))
    loaded = safe_load.load(old)["randomization"]
    assert isinstance(loaded, G1Randomization) and loaded.ranges["friction"] == (0.5, 0.9)


def test_the_evaluation_command_refuses_it_naming_the_file(tmp_path, capsys):
    from lightning_unilab.evaluate import _main

    marker = tmp_path / "ran"
    bad = _evil(tmp_path / "last.ckpt", marker)
    with pytest.raises(SystemExit) as exit_:
        _main(["checkpoint", str(bad), "--out", str(tmp_path), "--no-video"])
    assert exit_.value.code == 2
    assert f"{bad}: refused to load" in capsys.readouterr().err
    assert not marker.exists()


def test_omni_resume_refuses_a_shard_naming_code(tmp_path):
    from lightning_omni import OmniStrategy
    from lightning_omni.runtime import checkpoint as ckpt

    marker = tmp_path / "ran"
    directory = tmp_path / "omni.ckpt"
    directory.mkdir()
    shard = _evil(Path(ckpt.shard_path(directory, 0)), marker)
    ckpt.write_marker(directory, 1)
    with pytest.raises(safe_load.UnsafeCheckpointError, match=f"{shard}: refused to load"):
        OmniStrategy(pipeline_parallel=1).load_checkpoint(directory)
    with pytest.raises(safe_load.UnsafeCheckpointError, match=f"{shard}: refused"):
        ckpt.consolidate(directory)
    assert not marker.exists()
