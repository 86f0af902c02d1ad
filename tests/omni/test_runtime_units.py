"""Runtime pieces that need no processes: stage cuts, microbatches, feature rows, memory meter,
OmniSpec checks, checkpoint files."""

import pytest
import torch
from omni_models import IMG, OmniToy, ToyData, global_batches, make_model

from lightning_omni.runtime import checkpoint as ckpt
from lightning_omni.runtime.executor import padded_to_longest, rows_of, split_microbatches
from lightning_omni.runtime.layout import make_layout, partition_blocks
from lightning_omni.runtime.memory import SavedTensorMeter
from lightning_omni.spec import OmniSpec, OmniSpecError, get_spec
from lightning_omnilab import safe_load


def test_partition_minimizes_the_heaviest_stage():
    assert partition_blocks([1, 1, 1, 1], 2) == [2, 2]
    assert partition_blocks([4, 1, 1, 1, 1], 2) == [1, 4]
    assert partition_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [5, 2, 2]  # 15, 13, 17
    with pytest.raises(ValueError, match="pipeline_parallel"):
        partition_blocks([1, 1], 3)


def test_layout_checks_sizes_and_numbers_ranks_replica_by_replica():
    lay = make_layout(4, 3, 2, 2, [1.0] * 4)
    assert (lay.stage, lay.replica, lay.is_last) == (1, 1, True)
    assert lay.stage_group(0) == (0, 2) and lay.block_bounds == ((0, 2), (2, 4))
    with pytest.raises(ValueError, match="world size 4, got 3 \\* 1"):
        make_layout(4, 0, 3, 1, [1.0] * 4)
    with pytest.raises(ValueError, match="stage_blocks"):
        make_layout(2, 0, 2, 1, [1.0] * 4, stage_blocks=[3, 2])


def test_microbatches_split_evenly_or_say_why_not():
    batch = global_batches(ToyData(16), 6)[0]
    assert [mb["tokens"].shape[0] for mb in split_microbatches(batch, 3)] == [2, 2, 2]
    with pytest.raises(ValueError, match="6 samples .* num_microbatches=4"):
        split_microbatches(batch, 4)


def test_rows_of_picks_each_samples_rows_in_order():
    lengths = torch.tensor([2, 0, 3, 1])
    assert rows_of(lengths, torch.tensor([2, 3])).tolist() == [2, 3, 4, 5]
    assert rows_of(lengths, torch.tensor([0, 3])).tolist() == [0, 1, 5]
    # the rows of complementary sets, reordered, are all rows once
    both = torch.cat([rows_of(lengths, torch.tensor([0])), rows_of(lengths, torch.tensor([2, 3]))])
    assert sorted(both.tolist()) == list(range(6))


def test_meter_counts_saved_activations_not_parameters_and_frees_them():
    lin = torch.nn.Linear(64, 64)
    meter = SavedTensorMeter(list(lin.parameters()))
    x = torch.randn(32, 64, requires_grad=True)
    with meter.hooks():
        y = torch.tanh(lin(x))  # saves x (input of linear) and tanh's output
    assert meter.live == 2 * 32 * 64 * 4
    y.sum().backward()
    del y
    assert meter.live == 0 and meter.peak == 2 * 32 * 64 * 4


def test_spec_errors_name_the_part():
    class Plain(torch.nn.Module):
        pass

    with pytest.raises(OmniSpecError, match="configure_omni"):
        get_spec(Plain())
    model = make_model(0)
    spec = model.configure_omni()
    with pytest.raises(OmniSpecError, match="blocks: expected at least pipeline_parallel=8"):
        spec.validate(8)
    batch = global_batches(ToyData(4), 4)[0]
    wrong = OmniSpec(spec.modalities, spec.embedding, [torch.nn.Linear(16, 8).double()], spec.head,
                     spec.loss)
    with pytest.raises(OmniSpecError, match=r"blocks\[0\]: expected output of its input's shape"):
        wrong.check_shapes(batch)
    narrow = OmniToy(hidden=16)
    narrow.image_encoder.proj[-1] = torch.nn.Linear(12, 8)
    with pytest.raises(OmniSpecError, match=r"modalities\[image\].encoder: .*hidden=16"):
        narrow.configure_omni().check_shapes({k: v.float() if v.is_floating_point() else v
                                              for k, v in batch.items()})
    bad = dict(batch)
    bad["tokens"] = batch["tokens"].clone()
    row = int((batch["image_len"] > 0).nonzero()[0, 0])
    bad["tokens"][row, (bad["tokens"][row] == IMG).nonzero()[0, 0]] = 5
    with pytest.raises(OmniSpecError, match="placeholder tokens"):
        spec.check_batch(bad)
    with pytest.raises(OmniSpecError, match="batch\\['audio'\\]"):
        spec.check_batch({k: v for k, v in batch.items() if k != "audio"})


def test_checkpoint_files_are_atomic_and_incomplete_ones_refused(tmp_path):
    d = tmp_path / "c.ckpt"
    ckpt.write_shard(d, 0, {"state_dict": {"a": torch.ones(2)}})
    with pytest.raises(FileNotFoundError, match="interrupted save"):
        ckpt.consolidate(d)
    ckpt.write_shard(d, 1, {"state_dict": {"a": torch.zeros(2), "b": torch.ones(1)}})
    ckpt.write_marker(d, 2)
    merged = ckpt.consolidate(d)
    assert merged["a"].tolist() == [1.0, 1.0] and merged["b"].tolist() == [1.0]
    # no temporary file left; each shard with its digest (a damaged shard is refused)
    assert sorted(p.name for p in d.iterdir()) == ["complete.json", "complete.json.sha256",
                                                   "stage0.pt", "stage0.pt.sha256",
                                                   "stage1.pt", "stage1.pt.sha256"]
    raw = bytearray((d / "stage1.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one damaged byte
    (d / "stage1.pt").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="stage1.pt: not a readable checkpoint"):
        ckpt.consolidate(d)
    with pytest.raises(ValueError, match="stage: expected one of 0..1"):
        ckpt.read_shard(d, 2)


def test_a_save_over_an_older_checkpoint_cut_short_keeps_the_older_one_whole(tmp_path,
                                                                              monkeypatch):
    """Killed after one shard of a second save to the same path (last.ckpt): the shards went to
    the staging directory, so the path still holds the older checkpoint, whole."""
    from types import SimpleNamespace

    from lightning_omni.strategy import OmniStrategy

    d = tmp_path / "last.ckpt"
    for stage in (0, 1):
        ckpt.write_shard(d, stage, {"state_dict": {"a": torch.full((2,), float(stage))}})
    ckpt.write_marker(d, 2)
    writes = []

    def killed_after_the_shard(directory, stage, checkpoint):
        safe_load.save(checkpoint, ckpt.shard_path(directory, stage))
        writes.append(directory)
        raise SystemExit("killed")  # the process dies before the other stage's shard

    monkeypatch.setattr(ckpt, "write_shard", killed_after_the_shard)
    layout = SimpleNamespace(replica=0, tp_rank=0, stage=0, pp=2, vpp=1)
    rank0 = SimpleNamespace(engine=SimpleNamespace(layout=layout), is_global_zero=True,
                            barrier=lambda name: None)
    with pytest.raises(SystemExit):
        OmniStrategy.save_checkpoint(rank0, {"state_dict": {"a": torch.ones(2)}}, d)
    assert writes == [ckpt.staging_path(d)]
    assert ckpt.consolidate(d)["a"].tolist() == [0.0, 0.0]  # the older save, digests checked
    monkeypatch.undo()  # the next save clears the staging directory it left
    OmniStrategy.save_checkpoint(rank0, {"state_dict": {"a": torch.ones(2)}}, d)
    assert not ckpt.staging_path(d).exists()


def test_an_encoder_that_reads_its_padding_is_refused_at_the_first_batch():
    model = make_model(0)
    spec = model.configure_omni()
    batch = global_batches(ToyData(8), 8)[0]
    assert bool((batch["image_len"] > 0).any())
    assert bool((batch["image_len"] < batch["image"].shape[1]).any())  # there is padding
    image = spec.modalities[0]

    class Wrapped(torch.nn.Module):
        def __init__(self, inner, reads_padding: bool):
            super().__init__()
            self.inner, self.reads_padding = inner, reads_padding
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x, lengths):
            if self.reads_padding:  # attends over every row, padding included
                lengths = torch.full_like(lengths, x.shape[1])
            return self.drop(self.inner(x, lengths))

    def with_encoder(encoder):
        mod = type(image)(image.name, encoder, image.inputs, image.lengths, image.token_id)
        return OmniSpec([mod, *spec.modalities[1:]], spec.embedding, spec.blocks, spec.head,
                        spec.loss)

    masked = Wrapped(image.encoder, reads_padding=False)
    with_encoder(masked).check_shapes(batch)  # masks its padding; dropout does not count
    assert all(m.training for m in masked.modules())  # checked in eval mode, flags restored
    with pytest.raises(OmniSpecError, match=r"modalities\[image\].encoder: expected the valid "
                                            r"rows of a sample not to depend on its padding"):
        with_encoder(Wrapped(image.encoder, reads_padding=True)).check_shapes(batch)


def test_each_group_of_samples_is_encoded_at_its_own_longest():
    inputs = torch.arange(4 * 6, dtype=torch.float64).reshape(4, 6, 1)
    lengths = torch.tensor([2, 0, 5, 3])
    assert padded_to_longest(inputs, lengths, torch.tensor([0, 3])).shape == (2, 3, 1)
    assert padded_to_longest(inputs, lengths, torch.tensor([2])).shape == (1, 5, 1)
    got = padded_to_longest(inputs, lengths, torch.tensor([3, 0]))
    assert torch.equal(got, inputs[[3, 0], :3])
