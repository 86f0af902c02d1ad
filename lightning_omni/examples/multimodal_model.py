"""A small multimodal captioner: patch ViT + audio encoder + GPT, written for one device.

The parts are kept apart (encoders with their projectors, embedding, blocks, head, loss) so
that ``configure_omni`` can name them for OmniStrategy; ``training_step`` is the plain
single-device reference. The encoders are ``TokenEncoder``s, whose attention can run Ulysses
sequence parallel for long samples (LSSP) without any change to their weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from ..runtime.token_encoder import TokenEncoder
from .multimodal_data import AUD, AUDIO_DIM, IMAGE_DIM, IMG, SEQ_LEN, VOCAB


class GptBlock(nn.Module):
    """Pre-norm causal self-attention and an MLP ``mlp_ratio`` times as wide as the stream.

    The fused ``qkv`` output is laid out head by head (``[heads, 3, head_dim]``) and the
    forward counts the heads from the tensor, so that a tensor-parallel shard of ``qkv``'s
    output rows (``ColwiseParallel``, see ``runtime.tensor_parallel.gpt_tp_plan``) holds whole
    heads with their q, k and v and the block runs unchanged on it."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden: expected a multiple of heads ({heads}), got {hidden}")
        self.heads, self.head_dim = heads, hidden // heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, mlp_ratio * hidden), nn.GELU(),
                                 nn.Linear(mlp_ratio * hidden, hidden))

    def forward(self, h: Tensor) -> Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, -1, 3, self.head_dim).unbind(3)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        h = h + self.out(a.transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.ln2(h))


class Embedding(nn.Module):
    """Token plus learned position embedding; ``init_std`` scales the random positions."""

    def __init__(self, hidden: int, vocab: int = VOCAB, seq_len: int = SEQ_LEN,
                 init_std: float = 0.02) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.randn(seq_len, hidden) * init_std)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.tok(tokens) + self.pos[: tokens.shape[1]]


class Head(nn.Module):
    def __init__(self, hidden: int, vocab: int = VOCAB) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.ln(h))


def caption_loss(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(summed next-token cross-entropy over labelled positions, their count)."""
    labels = batch["labels"]
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                            ignore_index=-100, reduction="sum")
    return total, (labels != -100).sum()


def _hits(logits: Tensor, batch: dict[str, Tensor], rows: Tensor) -> tuple[Tensor, Tensor]:
    """(labelled tokens of the selected rows predicted exactly, labelled tokens there)."""
    labels = batch["labels"]
    keep = (labels != -100) & rows[:, None]
    return (logits.argmax(-1)[keep] == labels[keep]).sum(), keep.sum()


def caption_accuracy(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    return _hits(logits, batch, batch["is_caption"])


def text_accuracy(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    return _hits(logits, batch, ~batch["is_caption"])


# per-step values reduced like the loss: (sum, count) per batch, global sum over global count
METRICS = {"caption_acc": caption_accuracy, "text_acc": text_accuracy}


def _scatter(h: Tensor, tokens: Tensor, token_id: int, rows: Tensor) -> Tensor:
    """Put feature rows (sample by sample) at the placeholder tokens."""
    mask = (tokens == token_id).unsqueeze(-1)
    return h.masked_scatter(mask, rows.to(h.dtype)) if rows.shape[0] else h


class CaptionSteps(LightningModule):
    """Steps that return the loss and ``METRICS`` as ``(sum, count)`` terms give them, logged
    from the batch-end hooks.

    OmniStrategy replaces the ``*_step`` methods by pipelined steps and hands their outputs
    (the global loss and metrics) to the batch-end hooks, so logging lives there: the same
    values in a plain run and under OmniStrategy. ``step_terms``: (name, terms) pairs."""

    step_terms: tuple = (("loss", caption_loss), *METRICS.items())

    def _step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        logits = self(batch)
        out = {}
        for name, terms in self.step_terms:
            total, count = terms(logits, batch)
            out[name] = total / count  # NaN for a metric without tokens in the batch
        return out

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._step(batch)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._step(batch)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self._log("train", outputs, batch)

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._log("val", outputs, batch)

    def _log(self, prefix: str, outputs: dict[str, Tensor], batch: dict[str, Tensor]) -> None:
        bs = batch["tokens"].shape[0]
        self.log(f"{prefix}/loss", outputs["loss"], prog_bar=True, batch_size=bs)
        for name, _ in self.step_terms[1:]:
            if not torch.isnan(outputs[name]):
                self.log(f"{prefix}/{name}", outputs[name], prog_bar=name == "caption_acc",
                         batch_size=bs)


class MultimodalCaptioner(CaptionSteps):
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

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr,
                                 weight_decay=self.hparams.weight_decay)

    def configure_omni(self):
        """The parts OmniStrategy needs (see ``lightning_omni.spec``)."""
        from ..spec import Modality, OmniSpec

        return OmniSpec(
            modalities=[Modality(name, enc, name, f"{name}_len", tid)
                        for name, enc, tid in self.modalities()],
            embedding=self.embed, blocks=list(self.blocks), head=self.head, loss=caption_loss,
            metrics=METRICS, tp_plan=multimodal_tp_plan(self.modalities()))


def multimodal_tp_plan(modalities) -> dict:
    """Tensor-parallel plans of the captioner's parts: ``gpt_tp_plan`` for the LLM and
    ``token_encoder_tp_plan`` for each ``TokenEncoder`` (applied when OmniStrategy runs
    with TP; see ``runtime.tensor_parallel``)."""
    from ..runtime.tensor_parallel import gpt_tp_plan, token_encoder_tp_plan

    plan = gpt_tp_plan()
    for name, encoder, _ in modalities:
        if isinstance(encoder, TokenEncoder):
            plan[name] = token_encoder_tp_plan()
    return plan
