"""Input pipeline: batches (order and masked-LM masks) are functions of (seed, step), so building the
next batch ahead, a resume or the precision's own RNG use never change them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import make_prepared  # noqa: E402

from precswitch.train import config as C  # noqa: E402
from precswitch.train.engine import (  # noqa: E402
    Batches, make_collator, run_stage,
)
from precswitch.train.engine import batching as engine_batching, inputs as engine_inputs, loop as engine_loop  # noqa: E402

TINY = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    return {"mlm": make_prepared(root, "mlm", n_train=100), "classify": make_prepared(root, "classify")}


def _batches(path: Path, objective: str, seed: int, bs: int = 16) -> Batches:
    hp = C.resolve({"data": str(path), "steps": 1, "objective": objective})
    splits, meta = engine_inputs.load_data(hp)
    train = splits["train"]
    collate = make_collator(objective, engine_inputs.load_tokenizer(hp, meta), 0.15)
    return Batches(engine_batching.model_columns(train, objective), bs, seed, collate)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_batch_is_a_function_of_seed_and_step(data):
    b = _batches(data["mlm"], "mlm", seed=7)
    first = b.get(3)
    torch.rand(1000)  # the global RNG moves (dropout, other runs' masks) ...
    b.get(9)  # ... and the permutation cache moves to another epoch (100 rows / 16 = 6 steps per epoch)
    again = b.get(3)
    assert _same(first, again)  # ... the masks and order of step 3 stay
    assert (first["labels"] != -100).any()  # masked-LM labels exist
    assert not _same(first, b.get(4))
    assert not _same(first, _batches(data["mlm"], "mlm", seed=8).get(3))  # another seed masks otherwise


def test_loop_prefetch_is_invisible_in_results(data, tmp_path, monkeypatch):
    """The loop builds step t+1's batch during step t: every step still trains on Batches.get(t)."""
    from precswitch.train import engine

    seen = []
    real_get = engine.Batches.get

    def spy(self, step):
        seen.append(step)
        return real_get(self, step)

    real_sync = engine_loop.measure.sync

    def sync_spy(device):
        seen.append("sync")
        return real_sync(device)

    monkeypatch.setattr(engine.Batches, "get", spy)
    monkeypatch.setattr(engine_loop.measure, "sync", sync_spy)
    hp = {"data": str(data["mlm"]), "precision": "amp_bf16", "steps": 9, "seed": 4, "model": TINY,
          "timing_warmup_steps": 2, "batch_size": 16}
    m = run_stage(hp, tmp_path / "a")
    steps = [e for e in seen if e != "sync"]
    assert steps[:9] == list(range(9))  # each training batch built once, in order, none past the last step
    # step t+1's batch is built before step t's end-of-step synchronization (overlapping the GPU's work)
    assert seen[:5] == [0, 1, "sync", 2, "sync"]
    assert m["samples_seen"] == 9 * 16


def test_every_epoch_is_a_new_permutation_of_all_rows(data):
    """Each epoch shows every training row once, in an order of its own (a fixed order would repeat the same
    batches every epoch)."""
    import datasets

    b = _batches(data["classify"], "classify", seed=7)
    assert b.per_epoch == 6  # 96 rows / 16

    def rows(step):
        x = b.get(step)
        return [tuple(ids[: int(m.sum())].tolist()) for ids, m in zip(x["input_ids"], x["attention_mask"])]

    epoch0 = [r for s in range(6) for r in rows(s)]
    epoch1 = [r for s in range(6, 12) for r in rows(s)]
    every = sorted(tuple(x) for x in datasets.load_from_disk(str(data["classify"]))["train"]["input_ids"])
    assert sorted(epoch0) == every == sorted(epoch1)
    assert epoch0 != epoch1
