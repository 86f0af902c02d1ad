"""Memory per rank when each rank builds only what it hosts, with ZeRO-1: PP2 x DP2 on CPU.

The model (12 MLP blocks of width 1536, a 32k vocabulary embedding and untied head, a small
image encoder: about 1.3 GB of float32 parameters) is built in ``configure_model``, so under
OmniStrategy each rank records the build on the meta device and materializes only its stage.
Four gloo processes run one training step with ``zero_stage=1`` (Adam). Measured per rank:
parameter bytes it holds, its peak RSS up to the end of setup (``ru_maxrss`` before the first
batch, imports included), and its optimizer state after the step. Against them, one process
builds the plain module (the same imports), and steps Adam on it once: its peak RSS after the
build and its optimizer state.

    python benchmarks/omni_memory.py --out build/omni_memory.json [--hidden 1536 --blocks 12]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn

from lightning_omni import Modality, OmniSpec, OmniStrategy
from lightning_omni.runtime.zero import state_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from omni_runtime import image_text_batch  # noqa: E402

VOCAB, SEQ, IMG_DIM, IMG_ROWS, IMG_ID, PAD = 32000, 16, 32, 4, 1, 0
TARGETS = {"param_ratio_max": 0.6, "optimizer_ratio_max": 0.6, "rss_ratio_max": 0.7}


class ImageEncoder(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(IMG_DIM, hidden)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))


def loss_terms(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    labels = batch["labels"]
    total = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                        ignore_index=-100, reduction="sum")
    return total, (labels != -100).sum()


class BigModel(pl.LightningModule):
    """Built in ``configure_model``, as Lightning recommends for models too large for one
    device."""

    def __init__(self, hidden: int, blocks: int) -> None:
        super().__init__()
        self.hidden, self.num_blocks = hidden, blocks

    def configure_model(self) -> None:
        if hasattr(self, "blocks"):
            return
        self.embed = nn.Embedding(VOCAB, self.hidden)
        self.image_encoder = ImageEncoder(self.hidden)
        self.blocks = nn.ModuleList(Block(self.hidden) for _ in range(self.num_blocks))
        self.head = nn.Linear(self.hidden, VOCAB, bias=False)

    def configure_omni(self) -> OmniSpec:
        return OmniSpec(modalities=[Modality("image", self.image_encoder, "image", "image_len",
                                             IMG_ID)],
                        embedding=self.embed, blocks=list(self.blocks), head=self.head,
                        loss=loss_terms)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        raise NotImplementedError("runs under OmniStrategy only in this benchmark")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)


def make_batch(n: int) -> dict[str, Tensor]:
    return image_text_batch(n, SEQ, IMG_ROWS, IMG_DIM, VOCAB, IMG_ID, seed=0)


class _Loader(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield make_batch(4)


class _Measure(pl.Callback):
    def __init__(self) -> None:
        self.out: dict = {}

    def on_train_start(self, trainer, module) -> None:
        self.out["setup_peak_rss_mb"] = _peak_rss_mb()
        self.out["param_bytes"] = sum(p.numel() * p.element_size() for p in module.parameters())

    def on_train_end(self, trainer, module) -> None:
        self.out["optimizer_state_bytes"] = state_bytes(trainer.strategy.optimizers[0])


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _rank(rank: int, world: int, port: int, hidden: int, blocks: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    measure = _Measure()
    trainer = pl.Trainer(accelerator="cpu", devices=world, max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False,
                         callbacks=[measure],
                         strategy=OmniStrategy(pipeline_parallel=2, data_parallel=2,
                                               num_microbatches=2, zero_stage=1))
    data = torch.utils.data.DataLoader(_Loader(), batch_size=None)
    trainer.fit(BigModel(hidden, blocks), data)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(measure.out))


def _whole(_index: int, hidden: int, blocks: int, out_dir: str) -> None:
    """One process, the plain module: built, then one Adam step for its optimizer state."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = BigModel(hidden, blocks)
    model.configure_model()
    rss = _peak_rss_mb()
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = model.configure_optimizers()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    Path(out_dir, "whole.json").write_text(json.dumps(
        {"setup_peak_rss_mb": rss, "param_bytes": full,
         "optimizer_state_bytes": state_bytes(opt)}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(hidden: int, blocks: int) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_whole, args=(hidden, blocks, out_dir), nprocs=1,
                           start_method="spawn")  # a fresh process: RSS of this build only
        mp.start_processes(_rank, args=(4, _free_port(), hidden, blocks, out_dir), nprocs=4,
                           start_method="spawn")
        whole = json.loads(Path(out_dir, "whole.json").read_text())
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(4)]
    res = {
        "layout": "PP2 x DP2, zero_stage=1, configure_model on the meta device",
        "hidden": hidden, "blocks": blocks,
        "full_param_bytes": whole["param_bytes"],
        "param_bytes_per_rank": [r["param_bytes"] for r in ranks],
        "setup_peak_rss_mb_per_rank": [r["setup_peak_rss_mb"] for r in ranks],
        "setup_peak_rss_mb_whole_model": whole["setup_peak_rss_mb"],
        "optimizer_state_bytes_per_rank": [r["optimizer_state_bytes"] for r in ranks],
        "optimizer_state_bytes_unsharded": whole["optimizer_state_bytes"],
    }
    res["param_ratio"] = max(res["param_bytes_per_rank"]) / res["full_param_bytes"]
    res["optimizer_ratio"] = (max(res["optimizer_state_bytes_per_rank"])
                              / res["optimizer_state_bytes_unsharded"])
    res["rss_ratio"] = (max(res["setup_peak_rss_mb_per_rank"])
                        / res["setup_peak_rss_mb_whole_model"])
    res["targets"] = TARGETS
    res["met"] = {"param": res["param_ratio"] <= TARGETS["param_ratio_max"],
                  "optimizer": res["optimizer_ratio"] <= TARGETS["optimizer_ratio_max"],
                  "rss": res["rss_ratio"] <= TARGETS["rss_ratio_max"]}
    return res


def report(res: dict) -> None:
    gb = 1e9
    print(f"model: {res['blocks']} blocks of width {res['hidden']}, "
          f"{res['full_param_bytes'] / gb:.2f} GB of parameters; {res['layout']}")
    print(f"{'':28} {'rank 0':>9} {'rank 1':>9} {'rank 2':>9} {'rank 3':>9} {'plain':>9}")
    rows = [("parameters GB", [b / gb for b in res["param_bytes_per_rank"]],
             res["full_param_bytes"] / gb),
            ("setup peak RSS GB", [m / 1024 for m in res["setup_peak_rss_mb_per_rank"]],
             res["setup_peak_rss_mb_whole_model"] / 1024),
            ("optimizer state GB", [b / gb for b in res["optimizer_state_bytes_per_rank"]],
             res["optimizer_state_bytes_unsharded"] / gb)]
    for name, per_rank, plain in rows:
        print(f"{name:28} " + " ".join(f"{v:9.2f}" for v in per_rank) + f" {plain:9.2f}")
    for key, label in (("param", "param_ratio"), ("optimizer", "optimizer_ratio"),
                       ("rss", "rss_ratio")):
        target = res["targets"][f"{label}_max"]
        print(f"{label:18} {res[label]:.2f} (target <= {target}): "
              f"{'met' if res['met'][key] else 'MISSED'}")


# -- tensor parallelism: the same model at PP2 x TP2 against PP2 x TP1 ----------------------------
TP_TARGET = {"tp_param_ratio_max": 0.55}  # max TP2 rank / max TP1 rank, parameter bytes


class TPBigModel(BigModel):
    """BigModel with a tensor-parallel plan: vocabulary-parallel embedding and head (the loss
    on vocabulary shards), column- then row-parallel MLP blocks; the encoder stays plain."""

    def configure_omni(self) -> OmniSpec:
        from dataclasses import replace

        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return replace(super().configure_omni(), tp_plan={
            "embedding": {"": RowwiseParallel(input_layouts=Replicate())},
            "blocks": {"up": ColwiseParallel(), "down": RowwiseParallel()},
            "head": {"": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}})


def _tp_rank(rank: int, world: int, port: int, hidden: int, blocks: int, out_dir: str,
             tp: int) -> None:
    """One rank of PP2 x TP``tp``: parameter bytes it holds (local shards) after setup."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    measure = _Measure()
    trainer = pl.Trainer(accelerator="cpu", devices=world, max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False,
                         callbacks=[measure],
                         strategy=OmniStrategy(pipeline_parallel=2, data_parallel=1,
                                               tensor_parallel=tp, num_microbatches=2))
    data = torch.utils.data.DataLoader(_Loader(), batch_size=None)
    trainer.fit(TPBigModel(hidden, blocks), data)
    local = [getattr(p, "_local_tensor", p) for p in trainer.lightning_module.parameters()]
    measure.out["param_bytes"] = sum(t.numel() * t.element_size() for t in local)
    Path(out_dir, f"tp{tp}_rank{rank}.json").write_text(json.dumps(measure.out))


def run_tp(hidden: int, blocks: int) -> dict:
    """Parameter bytes per rank of the model at PP2 x TP2 (4 processes) and PP2 x TP1 (2)."""
    out: dict = {"tp_layout": "PP2 x TP2 against PP2 x TP1, configure_model on the meta "
                              "device (each rank materializes its stage, then shards it)"}
    with tempfile.TemporaryDirectory() as out_dir:
        for tp in (2, 1):
            world = 2 * tp
            mp.start_processes(_tp_rank, args=(world, _free_port(), hidden, blocks, out_dir,
                                               tp), nprocs=world, start_method="spawn")
            ranks = [json.loads(Path(out_dir, f"tp{tp}_rank{r}.json").read_text())
                     for r in range(world)]
            key = "tp_param_bytes_per_rank" if tp == 2 else "tp1_param_bytes_per_rank"
            out[key] = [r["param_bytes"] for r in ranks]
            out[key.replace("param_bytes", "setup_peak_rss_mb")] = [r["setup_peak_rss_mb"]
                                                                    for r in ranks]
    out["tp_param_ratio"] = (max(out["tp_param_bytes_per_rank"])
                             / max(out["tp1_param_bytes_per_rank"]))
    out["tp_targets"] = TP_TARGET
    out["tp_met"] = out["tp_param_ratio"] <= TP_TARGET["tp_param_ratio_max"]
    return out


def report_tp(res: dict) -> None:
    gb = 1e9
    print(f"tensor parallel: {res['tp_layout']}")
    for key, label in (("tp1_param_bytes_per_rank", "TP1 parameters GB"),
                       ("tp_param_bytes_per_rank", "TP2 parameters GB")):
        print(f"{label:28} " + " ".join(f"{b / gb:9.2f}" for b in res[key]))
    print(f"{'tp_param_ratio':18} {res['tp_param_ratio']:.2f} (target <= "
          f"{res['tp_targets']['tp_param_ratio_max']}): "
          f"{'met' if res['tp_met'] else 'MISSED'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.blocks < 8 or args.hidden < 1:
        p.error(f"--blocks: expected >= 8 (the issue's model size), got {args.blocks}")
    res = run(args.hidden, args.blocks)
    report(res)
    res.update(run_tp(args.hidden, args.blocks))
    report_tp(res)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
