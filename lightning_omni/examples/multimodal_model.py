"""A small multimodal captioner: patch ViT + audio encoder + GPT, written for one device.

The parts are kept apart (encoders with their projectors, embedding, blocks, head, loss) so
that ``configure_omni`` can name them for OmniStrategy; ``training_step`` is the plain
single-device reference. The encoders are ``TokenEncoder``s, whose attention can run Ulysses
sequence parallel for long samples (LSSP) without any change to their weights.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule
from torch import Tensor, nn

from ..runtime.token_encoder import TokenEncoder
from .multimodal_data import AUD, AUDIO_DIM, IMAGE_DIM, IMG, SEQ_LEN, VOCAB


class GptBlock(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, h: Tensor) -> Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        h = h + self.out(a.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.ln2(h))


class Embedding(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Parameter(torch.randn(SEQ_LEN, hidden) * 0.02)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.tok(tokens) + self.pos[: tokens.shape[1]]


class Head(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, VOCAB)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.ln(h))


def caption_loss(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(summed next-token cross-entropy over labelled positions, their count)."""
    labels = batch["labels"]
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                            ignore_index=-100, reduction="sum")
    return total, (labels != -100).sum()


def token_accuracy(logits: Tensor, labels: Tensor, rows: Tensor) -> Tensor:
    """Share of labelled tokens in the selected rows predicted exactly (NaN if none)."""
    keep = (labels != -100) & rows[:, None]
    if not keep.any():
        return torch.tensor(float("nan"))
    return (logits.argmax(-1)[keep] == labels[keep]).float().mean()


def _scatter(h: Tensor, tokens: Tensor, token_id: int, rows: Tensor) -> Tensor:
    """Put feature rows (sample by sample) at the placeholder tokens."""
    mask = (tokens == token_id).unsqueeze(-1)
    return h.masked_scatter(mask, rows.to(h.dtype)) if rows.shape[0] else h


class MultimodalCaptioner(LightningModule):
    """Image and audio captioning plus text continuation with one small GPT."""

    def __init__(self, hidden: int = 64, layers: int = 4, heads: int = 4,
                 encoder_dim: int = 32, encoder_heads: int = 4, encoder_layers: int = 2,
                 lr: float = 3e-3, weight_decay: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        # each encoder ends in its projector to the LLM width (TokenEncoder.out)
        self.image_encoder = TokenEncoder(IMAGE_DIM, encoder_dim, encoder_heads, encoder_layers,
                                          out_dim=hidden)
        self.audio_encoder = TokenEncoder(AUDIO_DIM, encoder_dim, encoder_heads, encoder_layers,
                                          out_dim=hidden)
        self.embed = Embedding(hidden)
        self.blocks = nn.ModuleList(GptBlock(hidden, heads) for _ in range(layers))
        self.head = Head(hidden)
        # caption/text token hits and counts seen by ``omni_loss`` (a pipeline's last stage)
        self.accuracy_counts = torch.zeros(4, dtype=torch.float64)

    def modalities(self):
        return (("image", self.image_encoder, IMG), ("audio", self.audio_encoder, AUD))

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        tokens = batch["tokens"]
        h = self.embed(tokens)
        for name, encoder, token_id in self.modalities():
            x, n = batch[name], batch[f"{name}_len"]
            has = (n > 0).nonzero().squeeze(1)
            if has.numel():
                out = encoder(x[has].to(h.dtype), n[has])
                keep = torch.arange(out.shape[1], device=out.device)[None, :] < n[has][:, None]
                h = _scatter(h, tokens, token_id, out[keep])
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def _step(self, batch: dict[str, Tensor], prefix: str) -> Tensor:
        logits = self(batch)
        total, count = caption_loss(logits, batch)
        loss = total / count
        cap = token_accuracy(logits, batch["labels"], batch["is_caption"])
        txt = token_accuracy(logits, batch["labels"], ~batch["is_caption"])
        bs = batch["tokens"].shape[0]
        self.log(f"{prefix}/loss", loss, prog_bar=True, batch_size=bs)
        if not torch.isnan(cap):
            self.log(f"{prefix}/caption_acc", cap, prog_bar=True, batch_size=bs)
        if not torch.isnan(txt):
            self.log(f"{prefix}/text_acc", txt, batch_size=bs)
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "val")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr,
                                 weight_decay=self.hparams.weight_decay)

    def omni_loss(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``caption_loss``, also counting correct tokens: under OmniStrategy the step runs the
        parts, not ``training_step``, so accuracy is measured here (see ``OmniAccuracy``)."""
        with torch.no_grad():
            labels, hit = batch["labels"], logits.argmax(-1) == batch["labels"]
            for j, rows in enumerate((batch["is_caption"], ~batch["is_caption"])):
                keep = (labels != -100) & rows[:, None]
                self.accuracy_counts[2 * j] += hit[keep].sum().double().cpu()
                self.accuracy_counts[2 * j + 1] += keep.sum().double().cpu()
        return caption_loss(logits, batch)

    def configure_omni(self):
        """The parts OmniStrategy needs (see ``lightning_omni.spec``)."""
        from ..spec import Modality, OmniSpec

        return OmniSpec(
            modalities=[Modality(name, enc, name, f"{name}_len", tid)
                        for name, enc, tid in self.modalities()],
            embedding=self.embed, blocks=list(self.blocks), head=self.head, loss=self.omni_loss)


class OmniAccuracy(Callback):
    """Logs caption and text token accuracy of the training steps run by OmniStrategy: sums
    the last stages' counts over all ranks (one all-reduce per step) and logs on rank 0."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        counts = pl_module.accuracy_counts
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            counts = counts.clone()
            dist.all_reduce(counts)
        pl_module.accuracy_counts.zero_()
        if counts[1] + counts[3] == 0 or trainer.logger is None or trainer.global_rank != 0:
            return
        metrics = {}
        if counts[1] > 0:
            metrics["train/caption_acc"] = float(counts[0] / counts[1])
        if counts[3] > 0:
            metrics["train/text_acc"] = float(counts[2] / counts[3])
        trainer.logger.log_metrics(metrics, step=trainer.global_step)
