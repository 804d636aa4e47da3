"""Masked-LM masks (transformers' DataCollatorForLanguageModeling through the engine's collator):
15% of the real tokens with 80/10/10, never a special or padding token, and the same masks in every
precision of a seed -- fp8 stages (which pad each batch to a multiple of 16) included."""

from __future__ import annotations

import torch

from precswitch.train.engine import eval_batches, make_collator, step_seed

WORDS = "the a red blue old young fox dog cat bird chased saw liked met quickly slowly".split()


def _tokenizer(tmp_path):
    from precswitch.data.tokenizer import build_tokenizer, load_tokenizer

    build_tokenizer([" ".join(WORDS)] * 3, tmp_path / "tok", vocab_size=200)
    return load_tokenizer(tmp_path / "tok")


def _features(tok, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = []
    for _ in range(n):
        k = int(torch.randint(3, 40, (1,), generator=g))  # lengths 3..39: never a multiple of 16 for all rows
        words = [WORDS[int(i)] for i in torch.randint(len(WORDS), (k,), generator=g)]
        e = tok(" ".join(words), return_token_type_ids=True)
        feats.append({"input_ids": e["input_ids"], "attention_mask": e["attention_mask"],
                      "token_type_ids": e["token_type_ids"]})
    return feats


def _collate(collate, feats, seed):
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        return collate(feats)


def test_mask_rates_and_never_special_or_padding(tmp_path):
    tok = _tokenizer(tmp_path)
    collate = make_collator("mlm", tok, 0.15)
    special = torch.tensor(sorted(tok.all_special_ids))
    n_real = n_masked = n_mask_tok = n_kept = 0
    for s in range(30):
        b = _collate(collate, _features(tok, 32, seed=s), step_seed(1, s))
        masked = b["labels"] != -100
        orig = torch.where(masked, b["labels"], b["input_ids"])
        is_special = torch.isin(orig, special)
        assert not (masked & is_special).any() and not (masked & (b["attention_mask"] == 0)).any()
        n_real += int((~is_special & (b["attention_mask"] == 1)).sum())
        n_masked += int(masked.sum())
        n_mask_tok += int((masked & (b["input_ids"] == tok.mask_token_id)).sum())
        n_kept += int((masked & (b["input_ids"] == b["labels"])).sum())
    assert 0.13 < n_masked / n_real < 0.17
    assert 0.76 < n_mask_tok / n_masked < 0.84 and 0.06 < n_kept / n_masked < 0.14  # (+ ~1/vocab random hits)


def test_fp8_padding_keeps_the_masks_of_the_other_precisions(tmp_path):
    tok = _tokenizer(tmp_path)
    plain, fp8 = make_collator("mlm", tok, 0.15), make_collator("mlm", tok, 0.15, pad_to_multiple_of=16)
    for s in range(5):
        feats = _features(tok, 16, seed=s)
        a, b = _collate(plain, feats, step_seed(3, s)), _collate(fp8, feats, step_seed(3, s))
        L = a["input_ids"].shape[1]
        assert b["input_ids"].shape[1] % 16 == 0 and b["input_ids"].shape[1] >= L
        for k in ("input_ids", "labels", "attention_mask", "token_type_ids"):
            assert torch.equal(b[k][:, :L], a[k]), (s, k)
        assert (b["labels"][:, L:] == -100).all() and (b["attention_mask"][:, L:] == 0).all()
        assert (b["input_ids"][:, L:] == tok.pad_token_id).all()
    # the fixed eval masks too (built in sequence under one seed)
    rows = _features(tok, 40, seed=9)
    ea, eb = eval_batches(_Rows(rows), plain, 8, 1234), eval_batches(_Rows(rows), fp8, 8, 1234)
    for x, y in zip(ea, eb):
        assert torch.equal(y["labels"][:, : x["labels"].shape[1]], x["labels"])


def test_masks_of_the_same_rows_differ_by_step_and_by_seed(tmp_path):
    """step_seed(seed, step) decides the masks: the same rows are masked otherwise at another step of the
    seed and at the same step of another seed (a seed-only or step-only RNG would repeat masks), and
    identically again under the same (seed, step)."""
    tok = _tokenizer(tmp_path)
    collate = make_collator("mlm", tok, 0.15)
    feats = _features(tok, 32, seed=0)
    labels = {(s, t): _collate(collate, feats, step_seed(s, t))["labels"] for s in (1, 2) for t in (0, 1)}
    assert torch.equal(_collate(collate, feats, step_seed(1, 0))["labels"], labels[(1, 0)])
    keys = list(labels)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            assert not torch.equal(labels[a], labels[b]), (a, b)


def test_the_masked_share_follows_mlm_probability(tmp_path):
    """train.*.mlm_probability is the share of real tokens masked (0.05 and 0.4 here, not the default 0.15),
    still never a special or padding token."""
    tok = _tokenizer(tmp_path)
    special = torch.tensor(sorted(tok.all_special_ids))
    for p in (0.05, 0.4):
        collate = make_collator("mlm", tok, p)
        n_real = n_masked = 0
        for s in range(6):
            b = _collate(collate, _features(tok, 32, seed=s), step_seed(2, s))
            masked = b["labels"] != -100
            real = ~torch.isin(torch.where(masked, b["labels"], b["input_ids"]), special) & (b["attention_mask"] == 1)
            assert not (masked & ~real).any()
            n_real, n_masked = n_real + int(real.sum()), n_masked + int(masked.sum())
        assert abs(n_masked / n_real - p) < 0.25 * p + 0.01, (p, n_masked / n_real)


def test_padding_to_16_adds_nothing_to_a_multiple_of_16_and_pads_every_column_alike(tmp_path):
    """An fp8 batch already 16 tokens wide is not widened (16 columns of padding would be pure waste); a wider pad
    pads every 2-D tensor (token types too: the model needs them all the same width); classification batches of an
    fp8 stage are padded to a multiple of 16 as well."""
    tok = _tokenizer(tmp_path)
    fp8 = make_collator("mlm", tok, 0.15, pad_to_multiple_of=16)
    exact = [f for f in _features(tok, 64, seed=4) if len(f["input_ids"]) <= 16]
    exact = [f for f in exact if len(f["input_ids"]) == 16] + [f for f in exact if len(f["input_ids"]) < 16][:7]
    assert len(exact[0]["input_ids"]) == 16
    b = _collate(fp8, exact, step_seed(1, 0))
    assert {v.shape[1] for v in b.values() if v.dim() == 2} == {16}
    b = _collate(fp8, _features(tok, 8, seed=5), step_seed(1, 0))
    assert len({v.shape[1] for v in b.values() if v.dim() == 2}) == 1 and b["input_ids"].shape[1] % 16 == 0
    feats = [{**f, "labels": i % 2} for i, f in enumerate(_features(tok, 8, seed=6))]
    c = make_collator("classify", tok, 0.15, pad_to_multiple_of=16)(feats)
    assert c["input_ids"].shape[1] % 16 == 0 and c["attention_mask"].shape == c["input_ids"].shape


class _Rows(list):
    """A list of feature dicts indexable by a range like a datasets.Dataset (column -> values)."""

    def __getitem__(self, idx):
        if isinstance(idx, range):
            got = [list.__getitem__(self, i) for i in idx]
            return {k: [r[k] for r in got] for k in got[0]}
        return list.__getitem__(self, idx)
