"""OmniStrategy on one CUDA GPU: a short check for a machine that has one (under 10 minutes).

1. The single-rank CUDA path in bf16 (``precision="bf16-mixed"``) against the CPU float64 run
   of the same model, data and steps: the first loss within 1% (one bf16 forward), every
   loss within ``--rtol`` (5%: the optimizer steps on bf16 gradients drift).
2. A model built in ``configure_model`` (the omni_memory benchmark's, 1.3 GB of float32
   parameters) on the GPU: ``torch.cuda.max_memory_allocated`` after setup and after one step.
3. Tokens per second of that model's training steps at PP1 (one rank).
4. Tokens per second of the Hugging Face LLaVA recipe (``--hf-size``, default a SigLIP-so400m
   tower with Qwen2-0.5B layers) at PP1, bf16-mixed, against the same model and data under
   Lightning's default strategy in the same run.

    python benchmarks/device_check.py --out build/device_check.json

Without CUDA it says so and exits with status 2; ``--device cpu`` runs the same script on the
CPU as a smoke test of the script itself (with a small ``--hidden``: bf16 matmuls are slow
on most CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "omni"))

from omni_memory import BigModel, make_batch  # noqa: E402

from lightning_omni import OmniStrategy  # noqa: E402

FIRST_RTOL = 0.01
SEQ = 16  # tokens per sample of parts 2-3


class _Losses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.times: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        self.losses.append(float(outputs["loss"]))
        self.times.append(time.perf_counter())


def _single_rank_env() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="1", RANK="0",
                      LOCAL_RANK="0", NODE_RANK="0")


def _fit(model, data, accelerator: str, precision: str, steps: int,
         strategy: object | None = None) -> _Losses:
    rec = _Losses()
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_steps=steps, logger=False,
                         precision=precision, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False, callbacks=[rec],
                         strategy=strategy or OmniStrategy(num_microbatches=2))
    trainer.fit(model, data)
    return rec


def check_bf16_against_f64(accelerator: str, steps: int, rtol: float) -> dict:
    """Part 1: the toy model of the equivalence tests, float64 on CPU against bf16 here."""
    from omni_models import ToyData, make_model
    from torch.utils.data import DataLoader

    def data(dtype: torch.dtype) -> DataLoader:  # autocast casts float32 inputs, not float64
        return DataLoader(ToyData(16 * steps, dtype=dtype), batch_size=16, shuffle=False)

    ref = _fit(make_model(0), data(torch.float64), "cpu", "64-true", steps).losses
    got = _fit(make_model(0, dtype=torch.float32), data(torch.float32), accelerator,
               "bf16-mixed", steps).losses
    diffs = [abs(a - b) / abs(b) for a, b in zip(got, ref, strict=True)]
    # the first loss is one forward (bf16's 8-bit mantissa: ~0.4% per rounding); later ones
    # also carry the optimizer steps taken on bf16 gradients
    return {"losses_f64_cpu": ref, f"losses_bf16_{accelerator}": got,
            "relative_differences": diffs, "rtol_first": FIRST_RTOL, "rtol": rtol,
            "met": diffs[0] <= FIRST_RTOL and max(diffs) <= rtol}


class _Repeat(torch.utils.data.IterableDataset):
    def __init__(self, n: int, batch: int) -> None:
        self.n, self.batch = n, batch

    def __iter__(self):
        for _ in range(self.n):
            yield make_batch(self.batch, SEQ)


def check_configure_model(accelerator: str, steps: int, batch: int, hidden: int,
                          blocks: int) -> dict:
    """Parts 2 and 3: a model built in configure_model (default 1.3 GB), memory, tokens/s."""
    cuda = accelerator == "gpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = BigModel(hidden, blocks)
    data = torch.utils.data.DataLoader(_Repeat(steps + 2, batch), batch_size=None)
    rec = _fit(model, data, accelerator, "bf16-mixed", steps + 2)
    out = _timed(rec, batch * SEQ)
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if cuda:
        out["cuda_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return out


# LlavaCaptioner sizes: "tiny" is the CPU recipe's; the other a SigLIP-so400m tower (384 px,
# 729 features per image) with Qwen2-0.5B decoder layers (tied embeddings)
HF_SIZES = {
    "tiny": {},
    "siglip400m-qwen2-0.5b": dict(
        vision="siglip", text="qwen2", image_size=384, patch_size=14, vision_hidden=1152,
        vision_layers=27, vision_heads=16, vision_intermediate=4304, feature_layer=-2,
        hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936,
        tie_embeddings=True),
}


def _timed(rec: _Losses, tokens: int) -> dict:
    dt = [b - a for a, b in zip(rec.times[1:], rec.times[2:], strict=False)]  # after warm-up
    return {"steps_timed": len(dt), "tokens_per_step": tokens,
            "tokens_per_s": tokens * len(dt) / sum(dt) if dt else None,
            "losses": rec.losses}


def check_hf_recipe(accelerator: str, steps: int, batch: int, size: str) -> dict:
    """Part 4: the LLaVA recipe at PP1 under OmniStrategy and under Lightning's default."""
    from lightning_omni.examples.llava_data import LlavaCaptionData
    from lightning_omni.examples.llava_model import LlavaCaptioner, LlavaShape

    out: dict = {"size": size, "batch": batch}
    for name in ("omni", "lightning_default"):
        if accelerator == "gpu":
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        model = LlavaCaptioner(LlavaShape(**HF_SIZES[size]))
        cfg = model.config.vision_config
        data = LlavaCaptionData(cfg.image_size, cfg.patch_size, model.image_tokens,
                                batch_size=batch, samples_per_epoch=batch * (steps + 2))
        strategy = None if name == "omni" else "auto"
        rec = _fit(model, data, accelerator, "bf16-mixed", steps + 2, strategy)
        out[name] = _timed(rec, batch * data.train_set.seq_len)
        out[name]["param_count"] = sum(p.numel() for p in model.parameters())
        if accelerator == "gpu":
            out[name]["cuda_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    a, b = out["omni"]["tokens_per_s"], out["lightning_default"]["tokens_per_s"]
    out["omni_over_default"] = a / b if a and b else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rtol", type=float, default=0.05,
                   help="bf16 against float64, every step's loss (the first: 0.01)")
    p.add_argument("--batch", type=int, default=8, help="samples per step in part 3")
    p.add_argument("--hidden", type=int, default=1536, help="part 2-3 model width")
    p.add_argument("--blocks", type=int, default=8, help="part 2-3 model depth (GPT layers)")
    p.add_argument("--hf-size", choices=sorted(HF_SIZES), default="siglip400m-qwen2-0.5b",
                   help="part 4 model (tiny: the CPU recipe's)")
    p.add_argument("--hf-batch", type=int, default=16, help="samples per step in part 4")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_check: no CUDA device here; nothing was checked (--device cpu runs the "
              "script on the CPU)", file=sys.stderr)
        return 2
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    _single_rank_env()
    res = {"device": torch.cuda.get_device_name() if accelerator == "gpu" else "cpu",
           "torch": torch.__version__}
    t0 = time.time()
    res["bf16_vs_f64"] = check_bf16_against_f64(accelerator, args.steps, args.rtol)
    res["configure_model"] = check_configure_model(accelerator, args.steps, args.batch,
                                                   args.hidden, args.blocks)
    res["hf_llava_pp1"] = check_hf_recipe(accelerator, args.steps, args.hf_batch, args.hf_size)
    res["seconds"] = time.time() - t0
    print(json.dumps(res, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    return 0 if res["bf16_vs_f64"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
