"""The LSSP contract and encoder rows of any shape.

* Only an encoder declaring ``splittable_rows = True`` has a sample's rows split over ranks
  (``splittable_heads``); any other encoder's samples run whole, so an encoder that adds learned
  positions inside ``forward`` trains under ``lssp=True`` exactly as in a plain run.
* Encoder inputs ``[B, L, *row_shape]`` with rows of more than one dimension (``[3, 4]``) go
  through LSSP and grouped reordering; the encoder sees ``[n, L, 3, 4]`` as in the plain run.

Equivalence runs: 2 gloo ranks, float64, against the single-process computation.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from _omni_spawn import run_spmd
from omni_models import (
    AUD,
    AUD_DIM,
    IMG,
    SEQ,
    VOCAB,
    Block,
    Embedding,
    Head,
    _Record,
    _trainer,
    loss_terms,
    spawn,
)
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_omni import Modality, OmniSpec
from lightning_omni.plan.lssp_schedule import GroupOptions, build_grouped_plan
from lightning_omni.runtime.lssp_exec import encoder_many
from lightning_omni.runtime.splittable import splittable_heads
from lightning_omni.runtime.token_encoder import TokenEncoder
from lightning_omni.spec import scatter_features, valid_rows

GRID = (3, 4)  # the row shape of the grid encoder's inputs
POS_DIM = 6


class PositionEncoder(nn.Module):
    """Adds a learned position to every row inside ``forward``: on an SP chunk every position
    would restart at 0. It has ``heads`` and accepts ``attention=`` (the rule before the
    contract split it), but does not declare ``splittable_rows``."""

    def __init__(self, in_dim: int, width: int, hidden: int, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.inp = nn.Linear(in_dim, width)
        self.pos = nn.Parameter(torch.randn(16, width))
        self.enc = TokenEncoder(width, width, heads, 1, out_dim=hidden)

    def forward(self, x: Tensor, lengths: Tensor | None = None, attention=None) -> Tensor:
        return self.enc(self.inp(x) + self.pos[:x.shape[1]], lengths, attention=attention)


class GridEncoder(nn.Module):
    """Rows of shape ``[3, 4]``, each independent except through attention (splittable).
    Refuses any other input shape, so a runtime that hands it flat rows fails."""

    splittable_rows = True

    def __init__(self, width: int, hidden: int, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.enc = TokenEncoder(math.prod(GRID), width, heads, 1, out_dim=hidden)

    def forward(self, x: Tensor, lengths: Tensor | None = None, attention=None) -> Tensor:
        if x.dim() != 4 or tuple(x.shape[2:]) != GRID:
            raise ValueError(f"GridEncoder: expected [n, L, 3, 4] inputs, got {tuple(x.shape)}")
        return self.enc(x.flatten(2), lengths, attention=attention)


# -- the contract ---------------------------------------------------------------------------------
def test_splittable_heads():
    assert splittable_heads(TokenEncoder(4, 8, heads=4)) == 4
    assert splittable_heads(GridEncoder(8, 8, heads=2)) == 2
    assert splittable_heads(PositionEncoder(4, 8, 8)) == 0  # heads, attention=, no declaration
    assert splittable_heads(nn.Linear(2, 2)) == 0
    # a TP-sharded encoder: Ulysses shards each TP rank's heads
    assert splittable_heads(TokenEncoder(4, 8, heads=4), 2) == 2
    assert splittable_heads(nn.Linear(2, 2), 2) == 0
    with pytest.raises(ValueError, match="TokenEncoder: 4 attention heads are not divisible by "
                                         "the encoder's tensor-parallel degree 3"):
        splittable_heads(TokenEncoder(4, 8, heads=4), 3)

    class Declared(nn.Module):
        splittable_rows = True

        def __init__(self, heads=None) -> None:
            super().__init__()
            if heads is not None:
                self.heads = heads

        def forward(self, x, lengths=None, attention=None):
            return x

    for heads in (None, 0, 2.0, True, "4"):
        with pytest.raises(ValueError, match=r"Declared: declares splittable_rows=True.*"
                                             r"expected an int `heads` attribute >= 1, got "
                                             + repr(heads).replace(".", r"\.")):
            splittable_heads(Declared(heads))

    class NoAttention(nn.Module):
        splittable_rows, heads = True, 2

        def forward(self, x, lengths=None):
            return x

    with pytest.raises(ValueError, match=r"NoAttention: .*expected a forward accepting "
                                         r"`attention=`, got forward\(x, lengths=None\)"):
        splittable_heads(NoAttention())

    class Vague(nn.Module):
        splittable_rows, heads = "yes", 2

    with pytest.raises(ValueError, match=r"Vague.splittable_rows: expected True .* or False, "
                                         r"got 'yes'"):
        splittable_heads(Vague())


def _opts(heads: int, max_rows: float = math.inf) -> GroupOptions:
    return GroupOptions(True, False, (0, 0), (heads,), 1.0, 0.5, max_rows)


# replica 0 loads a 9-row and a 1-row sample, replica 1 a 1-row one (rows of one modality)
LONG = ((((9,), (1,)),), (((1,), (0,)),))


def test_heads_zero_is_never_split():
    split = build_grouped_plan("uniform_insertion", 1, LONG, _opts(2)).works[0].splits[0]
    assert [g.sample_id for g in split.sp_groups] == [0]  # splittable: long by cost, split
    for max_rows in (math.inf, 9.0):
        (w,) = build_grouped_plan("uniform_insertion", 1, LONG, _opts(0, max_rows)).works
        assert w.splits[0].sp_groups == ()
        assert w.splits[0].dp_samples == ((0, 1), (2,))  # whole, on their own replica
    with pytest.raises(ValueError, match=r"sample 0 of microbatch 0 of replica 0 \(image\): 9 "
                                         r"encoder rows, over lssp_max_rows=8, and LSSP cannot "
                                         r"split them: .*does not declare `splittable_rows = "
                                         r"True`.*raise lssp_max_rows to at least 9"):
        build_grouped_plan("uniform_insertion", 1, LONG, _opts(0, 8.0), ("image",))
    # the same for one microbatch's plan (run_lssp_microbatch's planner)
    from lightning_omni.runtime.lssp_exec import EncoderCost, plan_encoder_lssp

    cost, rows = EncoderCost(1.0, 0.5, bytes_per_token=1.0), [{0: 9, 1: 1, 2: 1}]
    assert plan_encoder_lssp(rows, cost, 2, 2, 100).microbatches[0].sp_groups
    split = plan_encoder_lssp(rows, cost, 2, 0, 100).microbatches[0]
    assert split.sp_groups == () and sorted(s for d in split.dp_samples for s in d) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"sample 0 .*largest SP degree 1 allowed \(2 ranks, 0 "
                                         r"heads: the encoder is not splittable\)"):
        plan_encoder_lssp(rows, cost, 2, 0, 8)
    with pytest.raises(ValueError, match=r"heads: expected an int >= 0"):
        plan_encoder_lssp(rows, cost, 2, -1, 100)


def test_run_lssp_microbatch_refuses_to_split_an_undeclared_encoder():
    from lightning_omni.runtime.lssp_exec import (
        EncoderCost,
        build_exec_plan,
        plan_encoder_lssp,
        run_lssp_microbatch,
    )

    rows = {0: 9, 1: 1, 2: 1}
    plan = plan_encoder_lssp([rows], EncoderCost(1.0, 0.5), 2, 2, math.inf)
    ex = build_exec_plan(plan.microbatches[0], rows, {0: 0, 1: 0, 2: 1})
    # refused before any communication (no process group needed)
    with pytest.raises(ValueError, match=r"PositionEncoder: the plan splits samples \[0\] over "
                                         r"ranks, but the encoder does not declare "
                                         r"`splittable_rows = True`"):
        run_lssp_microbatch(PositionEncoder(4, 8, 8), ex, {}, [0, 1])


# -- the pieces with [L, 3, 4] rows ---------------------------------------------------------------
OUT = 5
ROWS = {0: 9, 1: 2, 2: 3, 3: 1}  # all loaded by rank 0; rank 1 loads nothing


def _grid_encoder() -> GridEncoder:
    torch.manual_seed(0)
    return GridEncoder(8, OUT).double()


def _grid_sample(sid: int, n: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(50 + sid)
    return (torch.randn(n, *GRID, generator=g, dtype=torch.float64),
            torch.randn(n, OUT, generator=g, dtype=torch.float64))


def _pieces_worker(rank: int, world: int):
    from lightning_omni.runtime.lssp_exec import (
        EncoderCost,
        build_exec_plan,
        plan_encoder_lssp,
        run_lssp_microbatch,
    )
    from lightning_omni.runtime.sample_exchange import GroupedReorder

    mine = {s: n for s, n in ROWS.items() if rank == 0}
    out = {}
    for mode in ("lssp", "reorder"):
        enc = _grid_encoder()
        inputs = {s: _grid_sample(s, n)[0] for s, n in mine.items()}
        if mode == "lssp":  # sample 0 over the memory cap: sequence parallel over both ranks
            plan = plan_encoder_lssp([ROWS], EncoderCost(1.0, bytes_per_token=1.0), world,
                                     enc.heads, memory_cap=5)
            assert [g.sample_id for g in plan.microbatches[0].sp_groups] == [0]
            ex = build_exec_plan(plan.microbatches[0], ROWS, {s: 0 for s in ROWS})
            res = run_lssp_microbatch(enc, ex, inputs, [0, 1], backend="torch", row_shape=GRID,
                                      out_dim=OUT)
            feats, anchor, sent = res.features, res.anchor, res.bytes_sent
        else:
            reorder = GroupedReorder([0, 0])
            gp = reorder.plan(mine)
            got = reorder.exchange(gp, inputs, GRID, torch.float64)
            assert all(tuple(x.shape[1:]) == GRID for x in got.values())
            sids = sorted(got)
            enc_feats = dict(zip(sids, encoder_many(enc, [got[s] for s in sids]), strict=True))
            feats, anchor = reorder.return_features(gp, enc_feats, (OUT,), torch.float64)
            sent = reorder.bytes_sent
        loss = anchor.sum() * 0
        for s, f in feats.items():
            loss = loss + (f * _grid_sample(s, ROWS[s])[1]).sum()
        loss.backward()
        out[mode] = ({s: f.detach() for s, f in feats.items()},
                     {n: p.grad.clone() for n, p in enc.named_parameters()}, sent)
    return out


def test_rows_of_shape_3x4_through_lssp_and_reordering():
    results = run_spmd(_pieces_worker, 2, timeout=120)
    enc = _grid_encoder()
    sids = sorted(ROWS)
    ref = encoder_many(enc, [_grid_sample(s, ROWS[s])[0] for s in sids])
    sum((f * _grid_sample(s, ROWS[s])[1]).sum() for s, f in zip(sids, ref, strict=True)).backward()
    for mode in ("lssp", "reorder"):
        feats, _, sent = results[0][mode]
        assert sorted(feats) == sids and not results[1][mode][0]  # back at the loading rank
        for s, f in zip(sids, ref, strict=True):
            torch.testing.assert_close(feats[s], f.detach(), rtol=1e-10, atol=1e-12)
        for n, p in enc.named_parameters():
            torch.testing.assert_close(results[0][mode][1][n] + results[1][mode][1][n], p.grad,
                                       rtol=1e-10, atol=1e-12, msg=f"{mode}: grad of {n}")
        assert sent > 0 and results[1][mode][2] > 0  # rows went to rank 1 and came back


# -- under OmniStrategy ---------------------------------------------------------------------------
class ContractToy(pl.LightningModule):
    """The toy LLM with an image encoder of kind ``"position"`` (learned positions in
    ``forward``, 6-wide rows) or ``"grid"`` (``[3, 4]`` rows) and a TokenEncoder for audio."""

    def __init__(self, image: str, hidden: int = 16, width: int = 8) -> None:
        super().__init__()
        self.image_encoder = (PositionEncoder(POS_DIM, width, hidden) if image == "position"
                              else GridEncoder(width, hidden))
        self.audio_encoder = TokenEncoder(AUD_DIM, width, 2, 1, out_dim=hidden)
        self.embed = Embedding(hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(2))
        self.head = Head(hidden)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        tokens = batch["tokens"]
        h = self.embed(tokens)
        for enc, x, n, tid in ((self.image_encoder, batch["image"], batch["image_len"], IMG),
                               (self.audio_encoder, batch["audio"], batch["audio_len"], AUD)):
            has = (n > 0).nonzero().squeeze(1)
            if has.numel():
                h = scatter_features(h, tokens, tid, valid_rows(enc(x[has], n[has]), n[has]))
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        total, count = loss_terms(self(batch), batch)
        return total / count

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def configure_omni(self) -> OmniSpec:
        return OmniSpec(
            modalities=[Modality("image", self.image_encoder, "image", "image_len", IMG),
                        Modality("audio", self.audio_encoder, "audio", "audio_len", AUD)],
            embedding=self.embed, blocks=list(self.blocks), head=self.head, loss=loss_terms)


IMG_MAX, AUD_MAX = 6, 4


class ContractData(Dataset):
    """Image rows per sample: 6 for sample 0 of every 8, 1 for the other even ones, none for
    odd samples 1-7 of every 16 and 2 for odd samples 9-15. With 2 replicas reading alternate
    samples, replica 1 loads no image in the first step, and a 6-row image is long (by the
    quadratic cost: it weighs more than half of its microbatch's pooled image cost)."""

    def __init__(self, n: int, image: str) -> None:
        g = torch.Generator().manual_seed(3)
        row = (POS_DIM,) if image == "position" else GRID
        self.items = []
        for i in range(n):
            li = (IMG_MAX if i % 8 == 0 else 1) if i % 2 == 0 else (0 if i % 16 < 8 else 2)
            la = int(torch.randint(0, AUD_MAX + 1, (1,), generator=g))
            text = SEQ - li - la - 2
            tokens = torch.zeros(SEQ, dtype=torch.long)
            tokens[:li], tokens[li:li + la] = IMG, AUD
            tokens[li + la:li + la + text] = torch.randint(3, VOCAB, (text,), generator=g)
            labels = torch.full((SEQ,), -100, dtype=torch.long)
            labels[li + la:li + la + text - 1] = tokens[li + la + 1:li + la + text]
            image = torch.zeros(IMG_MAX, *row, dtype=torch.float64)
            image[:li] = torch.randn(li, *row, generator=g, dtype=torch.float64)
            audio = torch.zeros(AUD_MAX, AUD_DIM, dtype=torch.float64)
            audio[:la] = torch.randn(la, AUD_DIM, generator=g, dtype=torch.float64)
            self.items.append({"tokens": tokens, "labels": labels, "image": image,
                               "image_len": torch.tensor(li), "audio": audio,
                               "audio_len": torch.tensor(la)})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return self.items[i]


STEPS, BATCH = 2, 8
MODES = {
    # image samples are long by cost but never split (the encoder is not splittable)
    "position+lssp": ("position", {"lssp": True, "encoder_cost": (1.0, 0.5)}),
    # [3, 4] rows: the 6-row images run sequence parallel, short ones move between replicas
    "grid+lssp+reorder": ("grid", {"lssp": True, "reorder": True, "lssp_max_rows": 4}),
    "grid+reorder": ("grid", {"reorder": True, "encoder_cost": (1.0, 0.5)}),
}


def _model(image: str) -> ContractToy:
    torch.manual_seed(0)
    return ContractToy(image).double()


def _strategy_worker(rank: int, world: int, modes: list[str]) -> dict:
    from lightning_omni import OmniStrategy

    out = {}
    for name in modes:
        image, kw = MODES[name]
        data = ContractData(STEPS * BATCH, image)
        loader = DataLoader(data, batch_size=BATCH // 2, shuffle=False,
                            sampler=DistributedSampler(data, 2, rank, shuffle=False))
        strategy = OmniStrategy(data_parallel=2, num_microbatches=2, ulysses_backend="torch",
                                **kw)
        rec = _Record()
        _trainer(world, strategy, STEPS, [rec]).fit(_model(image), loader)
        grouped = strategy.last_step.grouped
        images = [w.splits[0] for w in grouped.works if w.splits[0] is not None]
        out[name] = {"losses": rec.losses, "grads0": rec.grads0, "metrics": grouped.metrics(),
                     "image_sp": sum(len(s.sp_groups) for s in images),
                     "image_rows": max(n for w in grouped.works for n in w.lengths[0].values())}
    return out


def _reference(image: str) -> dict:
    model = _model(image)
    opt = model.configure_optimizers()
    data = list(DataLoader(ContractData(STEPS * BATCH, image), batch_size=BATCH))
    losses, grads0 = [], None
    for i, batch in enumerate(data):
        opt.zero_grad()
        loss = model.training_step(batch, i)
        loss.backward()
        grads0 = grads0 or {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append(float(loss.detach()))
        opt.step()
    return {"losses": losses, "grads0": grads0}


def _check(ranks: list[dict], mode: str) -> None:
    ref = _reference(MODES[mode][0])
    seen = set()
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r[mode]["losses"], dtype=torch.float64),
                                   torch.tensor(ref["losses"], dtype=torch.float64),
                                   rtol=1e-7, atol=0)
        for n, g in r[mode]["grads0"].items():
            torch.testing.assert_close(g, ref["grads0"][n], rtol=1e-7, atol=1e-12,
                                       msg=lambda m, n=n: f"{mode} grad {n}: {m}")
            seen.add(n)
    assert seen == set(ref["grads0"])


def test_position_encoder_under_lssp_equals_plain_run():
    (r0, r1) = spawn(_strategy_worker, 2, ["position+lssp"], timeout=120)
    _check([r0, r1], "position+lssp")
    # the last step had a 6-row image, long by cost (over half its microbatch's image cost):
    # a splittable encoder's would run sequence parallel; this one ran whole
    assert r0["position+lssp"]["image_rows"] == IMG_MAX
    assert r0["position+lssp"]["image_sp"] == 0


@pytest.fixture(scope="module")
def grid_runs():
    return spawn(_strategy_worker, 2, ["grid+lssp+reorder", "grid+reorder"], timeout=150)


@pytest.mark.parametrize("mode", ["grid+lssp+reorder", "grid+reorder"])
def test_rows_of_shape_3x4_under_the_strategy(grid_runs, mode):
    _check(grid_runs, mode)
    metrics = grid_runs[0][mode]["metrics"]
    if "lssp" in mode:  # the 6-row images ran sequence parallel
        assert grid_runs[0][mode]["image_sp"] >= 1
    assert metrics["reorder/samples_moved"] > 0
