"""Durable saves (docs/reliability.md, "Durable saves"): one writer, ``lightning_omnilab.durable``,
and one check, ``lightning_omnilab.digests``, under every checkpoint the project writes.

A write cut short (an exception, a SIGKILL mid-write) leaves the previous file and digest and no
temporary file; the file and the directory are ``fsync``ed, in order; a flipped byte is refused
naming the file and both digests; a unilab-train run and an OmniStrategy run (2 gloo ranks)
write a digest beside every checkpoint, ``last.ckpt`` included, and a resume checks them.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import yaml

from lightning_omnilab import digests, durable, safe_load
from lightning_omnilab.checkpoint_io import AtomicCheckpointIO
from lightning_omnilab.digests import DigestMismatchError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "omni"))  # omni_models: the toy Omni model and spawn
SHA256SUM = shutil.which("sha256sum")


def _flip(path: Path, at: int | None = None) -> bytes:
    """Flip one bit of ``path`` (in the middle by default); return the bytes it had."""
    good = path.read_bytes()
    raw = bytearray(good)
    raw[len(raw) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(raw))
    return good


def _sha256sum_ok(directory: Path) -> None:
    """coreutils agrees with every digest file in ``directory``."""
    files = sorted(p.name for p in directory.glob("*.sha256"))
    assert files, f"no digest file in {directory}"
    if SHA256SUM is not None:
        done = subprocess.run([SHA256SUM, "-c", *files], cwd=directory, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(params=["unnamed", "named"])
def temp_kind(request, monkeypatch):
    """The writer's temporary file: Linux's unnamed O_TMPFILE, or the named fallback."""
    if request.param == "named":
        def no_tmpfile(self):
            raise OSError("no O_TMPFILE (as on NFS)")

        monkeypatch.setattr(durable._Temp, "_unnamed", no_tmpfile)
    return request.param


# -- the writer ---------------------------------------------------------------------------
def test_a_save_writes_the_file_and_a_sha256sum_digest_beside_it(tmp_path, temp_kind):
    path = tmp_path / "epoch=0-step=4.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.arange(8.0)}}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, f"{path.name}.sha256"]
    line = Path(digests.digest_path(path)).read_text()
    assert line == f"{digests.file_digest(path)}  {path.name}\n"  # sha256sum's format
    _sha256sum_ok(tmp_path)
    assert torch.equal(AtomicCheckpointIO().load_checkpoint(path)["state_dict"]["w"],
                       torch.arange(8.0))


def test_fsync_reaches_the_file_then_the_directory_after_each_rename(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    safe_load.save({"v": 1}, path)
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", os.path.basename(dst)))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    safe_load.save({"v": 2}, path)
    monkeypatch.undo()
    directory = ("dir", tmp_path.stat().st_ino)
    digest = Path(digests.digest_path(path))
    replaces = [i for i, e in enumerate(events) if e[0] == "replace"]
    # the digest naming old and new, the file, the digest naming the new one only
    assert [events[i][1] for i in replaces] == [digest.name, path.name, digest.name], events
    put = replaces[1]
    assert ("file", path.stat().st_ino) in events[:put], f"no fsync before the rename: {events}"
    assert ("file", digest.stat().st_ino) in events[put:replaces[2]], events
    for i, j in zip(replaces, [*replaces[1:], len(events)], strict=True):
        assert directory in events[i + 1:j], f"no directory fsync after {events[i]}: {events}"
    assert safe_load.load(path) == {"v": 2}


def test_an_exception_mid_write_keeps_the_previous_file_and_digest(tmp_path, temp_kind):
    path = tmp_path / "clip.npz"
    durable.write_bytes(path, b"old" * 1000)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(RuntimeError, match="cut short"), durable.open_durable(path) as f:
        f.write(b"new" * 100_000)
        raise RuntimeError("cut short")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary file
    assert digests.check(path)


def test_a_lightning_save_cut_short_mid_write_keeps_the_previous_checkpoint(tmp_path,
                                                                           monkeypatch,
                                                                           temp_kind):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"version": 1, "state_dict": {"w": torch.ones(1000)}}, path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_save = torch.save

    def half_then_fail(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04" + bytes(50_000))  # the start of a zip, then the writer dies
        raise RuntimeError("cut short")

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(RuntimeError, match="cut short"):
        io.save_checkpoint({"version": 2, "state_dict": {"w": torch.zeros(1000)}}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert io.load_checkpoint(path)["version"] == 1


_KILLED_WRITER = """
import os, sys, time
from lightning_omnilab import durable
with durable.open_durable(sys.argv[1]) as f:
    for _ in range(64):  # 64 MB, written 1 MB at a time
        f.write(os.urandom(1 << 20))
    f.flush()
    print("writing", flush=True)  # the parent kills it here, in the middle of the write
    time.sleep(120)
    f.write(b"never")
"""


def test_a_writer_sigkilled_mid_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "big.ckpt"
    safe_load.save({"version": 1, "w": torch.arange(1000.0)}, path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "writing\n"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    # the unnamed temporary file went with the process: nothing but the old file and digest
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert safe_load.load(path)["version"] == 1


# -- the check ----------------------------------------------------------------------------
def test_a_flipped_byte_is_refused_naming_the_file_and_both_digests(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.arange(1000.0)}}, path)
    want = digests.file_digest(path)
    _flip(path)
    found = digests.file_digest(path)
    for load in (io.load_checkpoint, safe_load.load):
        with pytest.raises(DigestMismatchError) as err:
            load(path)
        text = str(err.value)
        assert text.startswith(f"{path}: ") and want in text and found in text, text
        assert isinstance(err.value, safe_load.CorruptCheckpointError)
    if SHA256SUM is not None:  # what a user sees checking by hand
        done = subprocess.run([SHA256SUM, "-c", "last.ckpt.sha256"], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 1 and "last.ckpt: FAILED" in done.stdout


def test_a_checkpoint_without_a_digest_loads_with_torchs_checks_only(tmp_path, caplog):
    path = tmp_path / "plain.ckpt"  # plain Lightning or an older version of the project
    torch.save({"state_dict": {"w": torch.ones(3)}}, path)
    with caplog.at_level("INFO", logger="lightning_omnilab.digests"):
        assert torch.equal(AtomicCheckpointIO().load_checkpoint(path)["state_dict"]["w"],
                           torch.ones(3))
    assert "plain.ckpt: no digest file" in caplog.text
    assert not digests.check(path)
    # a digest file of the older format (hex only) is still read
    Path(digests.digest_path(path)).write_text(digests.file_digest(path) + "\n")
    assert digests.check(path)


def test_last_ckpt_as_a_link_is_checked_against_its_target_and_replaced_not_written_through(
        tmp_path):
    """Lightning's save_last="link": last.ckpt names the periodic checkpoint."""
    step = tmp_path / "epoch=0-step=2.ckpt"
    last = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"version": 1}, last)  # a last.ckpt saved before the link: its digest
    io.save_checkpoint({"version": 2}, step)
    last.unlink()
    last.symlink_to(step.name)  # as ModelCheckpoint._link_checkpoint does
    assert io.load_checkpoint(last)["version"] == 2  # the stale last.ckpt.sha256 is not its
    io.save_checkpoint({"version": 3}, last)  # LastCheckpointAtEnd, with the link in place
    assert not last.is_symlink() and io.load_checkpoint(last)["version"] == 3
    assert io.load_checkpoint(step)["version"] == 2
    _sha256sum_ok(tmp_path)
    io.remove_checkpoint(step)  # top-k: its digest goes too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]


def test_a_directory_replaced_without_renameat2_goes_through_an_aside(tmp_path, monkeypatch):
    def no_exchange(a, b):
        raise OSError(22, "Invalid argument")  # NFS

    monkeypatch.setattr(durable, "_exchange", no_exchange)
    (tmp_path / "last.ckpt").mkdir()
    (tmp_path / "last.ckpt" / "old").write_text("1")
    (tmp_path / ".new").mkdir()
    (tmp_path / ".new" / "new").write_text("2")
    durable.replace_directory(tmp_path / ".new", tmp_path / "last.ckpt")
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert [p.name for p in (tmp_path / "last.ckpt").iterdir()] == ["new"]


# -- a unilab-train run --------------------------------------------------------------------
STEPS_PER_SLOT = 5 * 4  # the pendulum recipe's epochs x minibatches: optimizer steps a rollout


def _pendulum_args(tmp_path: Path, steps: int, *extra: str) -> list[str]:
    """The recipe as unilab-train runs it, tiny: a periodic save every rollout, top-1."""
    recipe = yaml.safe_load((ROOT / "recipes/unilab/inverted_pendulum.yaml").read_text())
    for callback in recipe["trainer"]["callbacks"]:
        if callback["class_path"].endswith("ModelCheckpoint"):
            callback["init_args"]["every_n_train_steps"] = STEPS_PER_SLOT
        else:
            callback["init_args"].update(max_steps=10, video=False)
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe))
    return ["--config", str(config), "--trainer.logger.init_args.save_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false", "--data.num_envs", "8",
            "--data.horizon", "16", "--trainer.max_steps", str(steps), *extra]


def test_unilab_train_writes_a_digest_beside_every_checkpoint_and_resume_checks_it(tmp_path):
    from lightning_unilab.train import main

    cli = main(_pendulum_args(tmp_path, 2 * STEPS_PER_SLOT))
    ckpts = Path(cli.trainer.logger.log_dir) / "checkpoints"
    periodic = f"epoch=0-step={2 * STEPS_PER_SLOT}.ckpt"
    # the first periodic checkpoint was removed by top-1 with its digest; no temporary file
    assert sorted(p.name for p in ckpts.iterdir()) == sorted(
        ["last.ckpt", "last.ckpt.sha256", periodic, f"{periodic}.sha256"])
    _sha256sum_ok(ckpts)

    good = _flip(ckpts / "last.ckpt")
    with pytest.raises(DigestMismatchError, match=r"last\.ckpt: .*SHA-256"):
        main(_pendulum_args(tmp_path, 3 * STEPS_PER_SLOT, "--ckpt_path",
                            str(ckpts / "last.ckpt")))
    (ckpts / "last.ckpt").write_bytes(good)
    resumed = main(_pendulum_args(tmp_path, 3 * STEPS_PER_SLOT, "--ckpt_path",
                                  str(ckpts / "last.ckpt")))
    assert resumed.trainer.global_step == 3 * STEPS_PER_SLOT  # one more rollout
    again = Path(resumed.trainer.logger.log_dir) / "checkpoints"
    assert (again / "last.ckpt.sha256").exists() and digests.check(again / "last.ckpt")
    _sha256sum_ok(again)


# -- an OmniStrategy run -------------------------------------------------------------------
def omni_worker(rank: int, world: int, root: str) -> dict:
    """Two ranks (PP=2): a fit saving every step (top-1 and last.ckpt); a resume from last.ckpt
    with this rank's shard damaged (refused); the resume with the shard restored."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from omni_models import _loader, _trainer, make_model

    from lightning_omni import OmniStrategy

    def fit(steps: int, ckpt_path: str | None = None):
        save = ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_last=True,
                               save_top_k=1)
        strategy = OmniStrategy(pipeline_parallel=2, num_microbatches=4,
                                timeout=timedelta(seconds=60))
        trainer = _trainer(world, strategy, steps, [save], enable_checkpointing=True)
        trainer.fit(make_model(0), _loader(rank, 2, 1, 32, 16), ckpt_path=ckpt_path)
        return trainer

    out: dict = {}
    fit(2)  # every save ends at a barrier of all ranks: each is complete here
    if rank == 0:
        out["files"] = {p.name: sorted(q.name for q in p.iterdir()) if p.is_dir() else None
                        for p in Path(root).iterdir()}
    last = Path(root) / "last.ckpt"
    shard = last / f"stage{rank}.pt"
    good = _flip(shard)
    try:
        fit(3, str(last))
    except DigestMismatchError as err:
        out["refused"] = str(err)
    shard.write_bytes(good)
    out["resumed_step"] = fit(3, str(last)).global_step
    return out


def test_omni_sharded_checkpoints_carry_digests_and_resume_checks_them(tmp_path):
    from omni_models import spawn

    ranks = spawn(omni_worker, 2, str(tmp_path), timeout=300.0)
    shard_files = ["complete.json", "complete.json.sha256", "stage0.pt", "stage0.pt.sha256",
                   "stage1.pt", "stage1.pt.sha256"]
    # top-1 kept the newest step; no staging directory or temporary file left
    assert ranks[0]["files"] == {"last.ckpt": shard_files, "epoch=0-step=2.ckpt": shard_files}
    for rank, result in enumerate(ranks):
        shard = tmp_path / "last.ckpt" / f"stage{rank}.pt"
        assert result["refused"].startswith(f"{shard}: not a readable checkpoint"), result
        assert result["resumed_step"] == 3
    # the resumed run's saves: last.ckpt replaced, the step-3 checkpoint, each with digests
    saved = {p.name: sorted(q.name for q in p.iterdir()) for p in tmp_path.iterdir()}
    assert saved == {"last.ckpt": shard_files, "epoch=1-step=3.ckpt": shard_files}, saved
    for name in saved:
        _sha256sum_ok(tmp_path / name)

