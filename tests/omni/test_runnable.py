"""From prediction to launch: which planned layouts OmniStrategy runs, with what arguments."""
import json
from pathlib import Path

import pytest
import yaml

from lightning_omni.cli import main
from lightning_omni.plan.costs import H100_80G, TransformerConfig
from lightning_omni.plan.runnable import launch, runnable_grid, runnable_systems
from lightning_omni.plan.scenario import ParallelConfig, Scenario
from lightning_omni.plan.search import DEFAULT_GRID, Grid, candidate_configs
from lightning_omni.plan.workload import image_text_mixture

ENC = TransformerConfig("tiny-vit", layers=4, hidden=512, heads=8, ffn_hidden=2048, causal=False)
LLM = TransformerConfig("tiny-llm", layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=32000)


def _scenario(global_batch: int = 8, off: tuple[str, ...] = ()) -> Scenario:
    return Scenario("t", ENC, LLM, H100_80G, 8, global_batch, 2048, image_text_mixture(0.5),
                    omni_off=off)


def test_runnable_layouts_map_to_strategy_arguments():
    sc = _scenario()
    omni = launch("omni", ParallelConfig(1, 2, 4), sc)
    assert omni.runnable and omni.why_not == ()
    assert omni.strategy_kwargs == {"pipeline_parallel": 2, "data_parallel": 4,
                                    "schedule": "uniform_insertion", "num_microbatches": 2,
                                    "lssp": True, "reorder": True, "zero_stage": 1}
    mega = launch("megatron", ParallelConfig(1, 4, 2, stage0_layer_fraction=0.5), sc)
    assert mega.runnable
    assert mega.strategy_kwargs["schedule"] == "encoder_first_stage"
    assert not mega.strategy_kwargs["lssp"] and not mega.strategy_kwargs["reorder"]
    # stage 0 takes half of an even share (1 of 8 layers), the rest spread over the others
    assert mega.strategy_kwargs["stage_blocks"] == [1, 2, 2, 3]
    ablated = launch("omni", ParallelConfig(1, 2, 4),
                     _scenario(off=("uniform_insertion", "lssp")))
    assert ablated.strategy_kwargs["schedule"] == "encoder_first_stage"
    assert not ablated.strategy_kwargs["lssp"] and ablated.strategy_kwargs["reorder"]


@pytest.mark.parametrize("system, cfg, sc, words", [
    ("omni", ParallelConfig(4, 2, 1, encoder_tp=3), _scenario(), "tensor parallelism"),
    ("omni", ParallelConfig(1, 2, 4, encoder_tp=2), _scenario(), "tensor parallelism"),
    ("megatron", ParallelConfig(1, 4, 2, vpp=2), _scenario(global_batch=6),
     "no multiple of pp"),
    ("megatron", ParallelConfig(1, 4, 2, vpp=4), _scenario(), "virtual stage without"),
    ("megatron", ParallelConfig(1, 2, 4, stage0_layer_fraction=0.0), _scenario(),
     "without LLM layers"),
    ("omni", ParallelConfig(1, 1, 8), _scenario(global_batch=12), "does not divide"),
    ("disaggregated", ParallelConfig(1, 1, 4, encoder_gpus=4), _scenario(), "encoder pool"),
    ("omni", ParallelConfig(1, 1, 4, encoder_gpus=4), _scenario(off=("multiplexing",)),
     "encoder pool"),
])
def test_each_unsupported_dimension_is_named(system, cfg, sc, words):
    verdict = launch(system, cfg, sc)
    assert not verdict.runnable and verdict.strategy_kwargs == {}
    assert len(verdict.why_not) == 1 and words in verdict.why_not[0]


@pytest.mark.parametrize("system", ["omni", "megatron"])
def test_recompute_layouts_launch_with_recompute(system):
    """The planner's recompute (every LLM layer / encoder layer keeps its input) is
    OmniStrategy's ``recompute`` / ``encoder_recompute``; LSSP stays on with it."""
    plain = launch(system, ParallelConfig(1, 2, 4), _scenario()).strategy_kwargs
    assert "recompute" not in plain and "encoder_recompute" not in plain
    for rec, enc in ((True, False), (False, True), (True, True)):
        verdict = launch(system, ParallelConfig(1, 2, 4, recompute=rec, encoder_recompute=enc),
                         _scenario())
        assert verdict.runnable and verdict.why_not == ()
        kw = dict(verdict.strategy_kwargs)
        assert (kw.pop("recompute", False), kw.pop("encoder_recompute", False)) == (rec, enc)
        assert kw == plain


def test_interleaved_layouts_launch_with_their_chunks():
    from lightning_omni import OmniStrategy

    for system in ("megatron", "omni"):  # Omni's with LSSP and grouped reordering on
        verdict = launch(system, ParallelConfig(1, 2, 4, vpp=2), _scenario())
        assert verdict.runnable and verdict.why_not == ()
        assert verdict.strategy_kwargs["virtual_pipeline_parallel"] == 2
        strategy = OmniStrategy(**verdict.strategy_kwargs)
        assert strategy.virtual_pipeline_parallel == 2 and strategy.num_microbatches == 2
    assert "virtual_pipeline_parallel" not in launch("megatron", ParallelConfig(1, 2, 4),
                                                     _scenario()).strategy_kwargs


def test_tensor_parallel_layouts_launch_where_the_runtime_runs_them():
    """TP at the encoders' degree (ZeRO-1 over DP too), Omni's with and without LSSP and
    grouped reordering: the strategy's TP arguments. Encoder TP below TP runs as encoder
    lanes; an encoder TP above TP or not dividing it is refused."""
    from lightning_omni import OmniStrategy

    mega = launch("megatron", ParallelConfig(2, 2, 2, encoder_tp=2), _scenario())
    assert mega.runnable, mega.why_not
    assert (mega.strategy_kwargs["tensor_parallel"], mega.strategy_kwargs["zero_stage"],
            mega.strategy_kwargs["encoder_tensor_parallel"]) == (2, 1, 2)
    omni = launch("omni", ParallelConfig(2, 4, 1, encoder_tp=2),
                  _scenario(off=("lssp", "reorder")))
    assert omni.runnable and omni.strategy_kwargs["schedule"] == "uniform_insertion"
    strategy = OmniStrategy(**omni.strategy_kwargs)
    assert (strategy.tensor_parallel, strategy.encoder_tensor_parallel) == (2, 2)
    grouped = launch("omni", ParallelConfig(2, 4, 1, encoder_tp=2), _scenario())
    assert grouped.runnable, grouped.why_not
    strategy = OmniStrategy(**grouped.strategy_kwargs)
    assert strategy.lssp and strategy.reorder and strategy.encoder_tensor_parallel == 2
    lanes = launch("omni", ParallelConfig(4, 2, 1, encoder_tp=2), _scenario())
    assert lanes.runnable, lanes.why_not
    strategy = OmniStrategy(**lanes.strategy_kwargs)
    assert (strategy.tensor_parallel, strategy.encoder_tensor_parallel) == (4, 2)
    assert strategy.lssp and strategy.reorder
    odd = launch("omni", ParallelConfig(4, 2, 1, encoder_tp=3), _scenario())
    assert not odd.runnable and "encoder TP 3 does not divide the LLM's TP 4" in odd.why_not[0]


def test_runnable_grid_searches_exactly_the_layouts_launch_accepts():
    """``--runnable-only`` keeps the grid's TP choices and drops, layout by layout, what
    ``launch`` refuses: the same set as the full grid filtered by ``launch``, TP > 1 where
    the runtime runs it (encoder TP = TP, Omni's with LSSP and grouped reordering on or
    ablated), and every kept layout's arguments build an ``OmniStrategy``."""
    from lightning_omni import OmniStrategy

    grid = runnable_grid(DEFAULT_GRID)
    assert grid.tp == DEFAULT_GRID.tp and grid.recompute == DEFAULT_GRID.recompute
    assert grid.vpp == DEFAULT_GRID.vpp  # model chunks per rank stay a choice
    interleaved, tensor_parallel = set(), set()
    plain, ablated = _scenario(), _scenario(off=("lssp", "reorder"))
    # PP8 of 8 layers; DP8 of 12; Omni without LSSP/reorder
    for sc in (plain, _scenario(global_batch=12), ablated):
        for system in runnable_systems(("megatron", "disaggregated", "omni"), sc):
            configs = candidate_configs(system, sc, grid=grid)
            assert configs, system
            full = [c for c in candidate_configs(system, sc) if launch(system, c, sc).runnable]
            assert configs == full, system
            for c in configs:
                kwargs = launch(system, c, sc).strategy_kwargs
                strategy = OmniStrategy(**kwargs)
                assert (strategy.pipeline_parallel, strategy.data_parallel) == (c.pp, c.dp)
                if c.tp > 1:
                    assert (strategy.tensor_parallel, strategy.encoder_tensor_parallel) == \
                        (c.tp, c.encoder_tp)
            interleaved |= {system for c in configs if c.vpp > 1}
            tensor_parallel |= {(system, sc.omni_off) for c in configs if c.tp > 1}
    assert interleaved == {"megatron", "omni"}
    assert tensor_parallel == {("megatron", ()), ("megatron", ("lssp", "reorder")),
                               ("omni", ()), ("omni", ("lssp", "reorder"))}
    # the full grid has layouts the runtime cannot run, TP ones among them
    refused = [c for c in candidate_configs("omni", plain)
               if not launch("omni", c, plain).runnable]
    assert any(c.tp > 1 for c in refused)
    assert runnable_systems(("megatron", "disaggregated", "omni"), plain) == ["megatron", "omni"]
    for bad in (Grid(tp=()), Grid(stage0_fractions=(0.0,))):
        with pytest.raises(ValueError, match="grid: expected a TP degree and a stage-0"):
            runnable_grid(bad)


def test_strategy_accepts_the_planned_arguments():
    from lightning_omni import OmniStrategy

    kwargs = launch("megatron", ParallelConfig(1, 4, 2, stage0_layer_fraction=0.5),
                    _scenario()).strategy_kwargs
    strategy = OmniStrategy(**kwargs)
    assert (strategy.pipeline_parallel, strategy.data_parallel) == (4, 2)
    assert strategy.stage_blocks == [1, 2, 2, 3] and strategy.num_microbatches == 4
    kwargs = launch("omni", ParallelConfig(1, 2, 4, recompute=True, encoder_recompute=True),
                    _scenario()).strategy_kwargs
    strategy = OmniStrategy(**kwargs)
    assert strategy.recompute and strategy.encoder_recompute and strategy.lssp


TINY = {
    "name": "tiny",
    "models": {"encoder": {"name": "tiny-vit", "layers": 4, "hidden": 512, "heads": 8,
                           "ffn_hidden": 2048, "causal": False},
               "llm": {"name": "tiny-llm", "layers": 8, "hidden": 1024, "heads": 16,
                       "ffn_hidden": 4096, "vocab": 32000}},
    "cluster": {"gpus": 8, "hardware": "H100-SXM-80G"},
    "batch": {"global_batch": 8, "seq_len": 2048},
    "mixture": {"kind": "image_text", "ratios": [0.5]},
    "run": {"phases": [{"share": 0.5, "steps": 1}], "sampled_steps": 2},
}


def _plan(tmp_path: Path, capsys, *flags: str) -> tuple[str, dict]:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    assert main([str(path), "--no-plots", "--out-dir", str(out), *flags]) == 0
    return capsys.readouterr().out, json.loads((out / "summary.json").read_text())


def test_omni_plan_marks_and_restricts_to_runnable_layouts(tmp_path, capsys):
    text, summary = _plan(tmp_path, capsys)
    assert " runs " in text
    records = [p["launch"] for s in ("megatron", "disaggregated", "omni") for p in summary[s]]
    assert all(r["runnable"] == (not r["why_not"]) for r in records)
    assert not summary["disaggregated"][0]["launch"]["runnable"]
    text, summary = _plan(tmp_path, capsys, "--runnable-only")
    assert "skipping Disaggregated" in text and "disaggregated" not in summary
    for system in ("megatron", "omni"):
        assert summary[system][0]["launch"]["runnable"]
    run = {r["system"]: r for r in summary["run"]}
    assert run["omni"]["launch"]["strategy_kwargs"]["schedule"] == "uniform_insertion"
    assert "launch: OmniStrategy(pipeline_parallel=" in text


RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "omni_plan"


@pytest.mark.parametrize("recipe", ["workload_a_vit1b_llama12b.yaml",
                                    "workload_c_vit10b_llama70b.yaml"])
def test_runnable_only_plans_the_paper_workloads(tmp_path, capsys, recipe):
    """``omni-plan --runnable-only`` on the paper's workloads: Omni and Megatron-like each
    get a layout that runs, whose arguments build an ``OmniStrategy``, and that fits where
    the planner says so; Omni's is the unrestricted search's pick. The recipe's own keys are
    cut to one mix and two sampled steps to keep it fast (models, cluster, batch and phases
    as the recipe)."""
    from lightning_omni import OmniStrategy

    workload = yaml.safe_load((RECIPES / recipe).read_text())
    workload["mixture"]["ratios"] = [0.5]
    workload["mixture"].pop("timeline_ratio", None)
    workload["run"]["sampled_steps"] = len(workload["run"]["phases"])
    path = tmp_path / recipe
    path.write_text(yaml.safe_dump(workload))
    out = tmp_path / "out"
    assert main([str(path), "--no-plots", "--out-dir", str(out), "--runnable-only"]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    cap = H100_80G.memory_cap_bytes / 1e9
    assert "disaggregated" not in summary
    rows = [(s, summary[s][0]) for s in ("megatron", "omni")]
    rows += [(r["system"], dict(r, oom=not r["fits_design"] or r["oom_steps"] > 0,
                                config=r["layout"])) for r in summary["run"]]
    assert sorted(s for s, _ in rows) == ["megatron", "megatron", "omni", "omni"]
    for system, row in rows:
        verdict = row["launch"]
        assert verdict["runnable"] and verdict["why_not"] == [], (system, row["config"])
        strategy = OmniStrategy(**verdict["strategy_kwargs"])
        assert f"TP{strategy.tensor_parallel} PP{strategy.pipeline_parallel}" in row["config"]
        assert f"DP{strategy.data_parallel}" in row["config"]
        if not row["oom"]:
            assert row["peak_memory_gb"] <= cap, (system, row)
    labels = {"megatron": "Megatron-like", "omni": "Omni"}
    for system, row in rows:  # the table's "runs" cell, just before the layout
        lines = [ln for ln in text.splitlines() if f" {labels[system]} " in f" {ln}"
                 and ln.endswith(f"  {row['config']}")]
        assert lines and all(ln.endswith(f" yes   {row['config']}") for ln in lines), lines
    assert "runs no" not in text
    free = tmp_path / "free"  # the unrestricted search on the same workload
    assert main([str(path), "--no-plots", "--out-dir", str(free)]) == 0
    capsys.readouterr()
    best = json.loads((free / "summary.json").read_text())["omni"][0]
    assert best["config"] == summary["omni"][0]["config"], (best["config"],
                                                            summary["omni"][0]["config"])
    assert best["launch"]["runnable"], best["launch"]["why_not"]
