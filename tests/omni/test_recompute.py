"""Activation recomputation under OmniStrategy (``recompute``, ``encoder_recompute``): the same
losses, gradients and parameters as the plain run in float64, the same dropout masks replayed,
and fewer bytes held for backward. One spawn of 2 ranks runs every configuration."""

import pytest
import torch
from omni_models import ToyData, make_model, recompute_worker, reference_run, spawn

from lightning_omni import OmniStrategy

STEPS, BATCH, SAMPLES = 2, 16, 32
RTOL, ATOL = 1e-7, 1e-12
LAYERS = 8  # 4 blocks per stage at PP2
PLAIN = {"layers": LAYERS}
MIXED = {"layers": LAYERS, "encoder": "mixed"}  # image: TokenEncoder (per layer), audio: whole
TOKEN = {"layers": LAYERS, "encoder": "token"}  # both splittable (LSSP)
DROPOUT = {**MIXED, "dropout": 0.2}
TOKEN_DROPOUT = {**TOKEN, "dropout": 0.2}
BOTH = {"recompute": True, "encoder_recompute": True}
# name -> (reference model, run); the "dropout" runs are compared with each other
RUNS = {
    "uniform": (PLAIN, {"pp": 2, "dp": 1, "schedule": "uniform_insertion"}),
    "uniform+recompute": (PLAIN, {"pp": 2, "dp": 1, "schedule": "uniform_insertion",
                                  "recompute": True}),
    "first": (PLAIN, {"pp": 2, "dp": 1, "schedule": "encoder_first_stage"}),
    "first+recompute": (PLAIN, {"pp": 2, "dp": 1, "schedule": "encoder_first_stage",
                                "recompute": True}),
    "encoders": (MIXED, {"pp": 2, "dp": 1, "schedule": "uniform_insertion", **BOTH}),
    # long samples Ulysses sequence parallel over both ranks, their layers recomputed
    "lssp": (TOKEN, {"pp": 1, "dp": 2, "lssp": True, "lssp_max_rows": 3,
                     "ulysses_backend": "torch", **BOTH}),
    "dropout": (None, {"pp": 2, "dp": 1, "model": DROPOUT}),
    "dropout+recompute": (None, {"pp": 2, "dp": 1, "model": DROPOUT, **BOTH}),
    "lssp-dropout": (None, {"pp": 1, "dp": 2, "model": TOKEN_DROPOUT, "lssp": True,
                            "lssp_max_rows": 3, "ulysses_backend": "torch"}),
    "lssp-dropout+recompute": (None, {"pp": 1, "dp": 2, "model": TOKEN_DROPOUT, "lssp": True,
                                      "lssp_max_rows": 3, "ulysses_backend": "torch", **BOTH}),
}


@pytest.fixture(scope="module")
def ranks():
    runs = {name: {"model": ref, "seed": 7, **run} for name, (ref, run) in RUNS.items()}
    return spawn(recompute_worker, 2, runs, STEPS, BATCH, SAMPLES, timeout=240)


@pytest.fixture(scope="module")
def references():
    return {"plain": reference_run(STEPS, BATCH, ToyData(SAMPLES), **PLAIN),
            "mixed": reference_run(STEPS, BATCH, ToyData(SAMPLES), **MIXED),
            "token": reference_run(STEPS, BATCH, ToyData(SAMPLES), **TOKEN)}


def _same(got: dict, want: dict, what: str, names: set[str]) -> None:
    """Losses, first-step gradients and final parameters of ``got`` (one rank) equal
    ``want``'s; returns nothing, records the parameter names checked in ``names``."""
    torch.testing.assert_close(torch.tensor(got["losses"], dtype=torch.float64),
                               torch.tensor(want["losses"], dtype=torch.float64),
                               rtol=RTOL, atol=0, msg=lambda m: f"{what} losses: {m}")
    for key in ("grads0", "params"):
        for n, v in got[key].items():
            torch.testing.assert_close(v, want[key][n], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=n, k=key: f"{what} {k} {n}: {m}")
            names.add(n)


@pytest.mark.parametrize("name", [n for n, (ref, _) in RUNS.items() if ref is not None])
def test_matches_single_process(ranks, references, name):
    ref = RUNS[name][0]
    want = references[ref.get("encoder", "plain")]
    seen: set[str] = set()
    for r in ranks:
        _same(r[name], want, name, seen)
    assert seen == {n for n, _ in make_model(0, **ref).named_parameters()}


@pytest.mark.parametrize("run", ["dropout", "lssp-dropout"])
def test_recompute_replays_the_dropout_masks(ranks, references, run):
    """Dropout active (p=0.2 after every MLP and projector), each rank starting from the same
    random state: recomputing draws the forward's masks again, so the run equals the one
    without recompute; a recompute drawing new masks would not (nor would the random stream
    after it)."""
    for r in ranks:
        seen: set[str] = set()
        _same(r[f"{run}+recompute"], r[run], run, seen)
        assert seen
    # dropout is active: the losses are not those of the same model without it
    plain = references[RUNS[run][1]["model"]["encoder"]]["losses"]
    assert all(abs(a - b) > 1e-6 for a, b in zip(ranks[0][run]["losses"], plain, strict=True))


def test_recompute_holds_fewer_bytes(ranks):
    """Each stage of 4 blocks keeps only its blocks' inputs: the meter still counts them (what
    checkpoint saves for backward), so the peak drops but stays above those inputs."""
    block_input = (BATCH // 4) * 20 * 16 * 8  # [microbatch, SEQ, hidden] float64
    for r in ranks:
        plain, rec = r["uniform"]["peak"], r["uniform+recompute"]["peak"]
        in_flight = 2 - r["uniform"]["stage"]  # 1F1B at PP2: 2 microbatches on stage 0
        assert in_flight * 4 * block_input <= rec < 0.6 * plain, (r["uniform"]["stage"], rec,
                                                                  plain)
        assert r["dropout+recompute"]["peak"] < 0.6 * r["dropout"]["peak"]


@pytest.mark.parametrize("arg", ["recompute", "encoder_recompute"])
def test_arguments_are_booleans(arg):
    with pytest.raises(TypeError, match=f"{arg}: expected True or False, got 1"):
        OmniStrategy(**{arg: 1})


# -- the mechanism on one process ----------------------------------------------------------------
def _siglip(dropout: float = 0.0) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.SiglipVisionConfig(
        image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=32, attention_dropout=dropout, vision_use_head=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.SiglipVisionModel(config).double().train()


class _Tower(torch.nn.Module):
    """A projector around a Hugging Face tower, like ``LlavaImageEncoder``."""

    def __init__(self, tower: torch.nn.Module) -> None:
        super().__init__()
        self.vision_tower, self.projector = tower, torch.nn.Linear(16, 8).double()

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.projector(self.vision_tower(pixels).last_hidden_state)


def test_encoder_layers_rule():
    from omni_models import Encoder

    from lightning_omni.runtime.recompute import encoder_layers
    from lightning_omni.runtime.token_encoder import TokenEncoder

    token = TokenEncoder(4, 8, 2, 3)
    assert encoder_layers(token) == list(token.blocks)
    tower = _Tower(_siglip())
    layers = encoder_layers(tower)  # its nested ``encoder.layers``, whatever the nesting
    assert [type(m).__name__ for m in layers] == ["SiglipEncoderLayer"] * 3
    assert encoder_layers(Encoder(4, 8, 16)) is None  # no layer list: the whole call


def test_checkpointed_replays_hf_layers_and_leaves_them_as_they_were():
    """Per-layer recompute of a Hugging Face tower with attention dropout: the same gradients
    under the same seed, fewer saved bytes, each layer's hooks run once, and afterwards no
    trace on the modules (also when the forward raises)."""
    from lightning_omni.runtime.memory import SavedTensorMeter
    from lightning_omni.runtime.recompute import checkpointed, encoder_layers

    tower = _Tower(_siglip(dropout=0.3))
    layers = encoder_layers(tower)
    calls = []
    for layer in layers:
        layer.register_forward_hook(lambda *_: calls.append(1))
    pixels = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    params = list(tower.parameters())
    out = {}
    for rec in (False, True):
        meter = SavedTensorMeter(params)
        torch.manual_seed(3)
        with meter.hooks(), (checkpointed(layers) if rec else torch.enable_grad()):
            loss = tower(pixels).square().sum()
        loss.backward()
        out[rec] = ([p.grad.clone() for p in params], meter.peak, len(calls))
        tower.zero_grad()
        calls.clear()
    for a, b in zip(out[False][0], out[True][0], strict=True):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL)
    assert out[True][1] < 0.6 * out[False][1]
    assert out[False][2] == out[True][2] == len(layers)
    assert all("forward" not in layer.__dict__ for layer in layers)
    with torch.no_grad():  # the dropout is active: another seed, another output
        torch.manual_seed(4)
        assert float(tower(pixels).square().sum()) != pytest.approx(float(loss))
    with pytest.raises(RuntimeError, match="channels"), checkpointed(layers):
        tower(torch.randn(2, 5, 8, 8, dtype=torch.float64))
    assert all("forward" not in layer.__dict__ for layer in layers)


def test_recomputation_runs_under_the_forward_precision_context():
    """A layer that creates tensors in the default dtype (as under ``precision="64-true"``):
    recomputed outside the forward's context its saved tensors would change dtype."""
    from contextlib import contextmanager

    from torch.utils.checkpoint import CheckpointError

    from lightning_omni.runtime.recompute import checkpointed

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.linspace(1, 2, x.shape[-1])  # the default dtype

    @contextmanager
    def float64():
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            yield
        finally:
            torch.set_default_dtype(old)

    layer = Scale()
    for context, ok in ((float64, True), (None, False)):
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        with float64(), checkpointed([layer], *([context] if context else [])):
            y = layer(x).sin().sum()
        if ok:
            y.backward()
            torch.testing.assert_close(x.grad, torch.cos(x * torch.linspace(1, 2, 4,
                                                        dtype=torch.float64))
                                       * torch.linspace(1, 2, 4, dtype=torch.float64))
        else:
            with pytest.raises(CheckpointError):
                y.backward()
