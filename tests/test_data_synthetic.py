"""The synthetic language: deterministic, MRPC-shaped, balanced, and not solvable by a bag of words."""

from __future__ import annotations

import csv
from collections import Counter

import pytest

from precswitch.data import synthetic as S


def _read_tsv(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_files_are_glue_mrpc_shaped_deterministic_and_counted_in_synth_json(tmp_path):
    """train/dev/test.tsv with MRPC's columns, balanced labels, unique ids; the same seed writes the same bytes,
    another seed other ones; synth.json counts each split's pair kinds; sizes < 1 are refused, nothing written."""
    import json

    from precswitch.errors import PrecswitchError

    sizes = {"n_corpus": 200, "n_train": 101, "n_dev": 40, "n_test": 30}
    a, b, c = (S.write_synthetic(tmp_path / n, seed=s, **sizes) for n, s in (("a", 3), ("b", 3), ("c", 4)))
    for name in ("corpus.txt", "train.tsv", "dev.tsv", "test.tsv"):
        assert (a / name).read_bytes() == (b / name).read_bytes() != (c / name).read_bytes(), name
    assert (a / "test.tsv").read_text().splitlines()[0].split("\t") == list(S.MRPC_COLUMNS)
    rows = {split: _read_tsv(a / f"{split}.tsv") for split in ("train", "dev", "test")}
    assert {k: len(v) for k, v in rows.items()} == {"train": 101, "dev": 40, "test": 30}
    assert Counter(r["Quality"] for r in rows["train"]) == {"1": 51, "0": 50}
    assert Counter(r["Quality"] for r in rows["test"]) == {"1": 15, "0": 15}
    ids = [r[k] for v in rows.values() for r in v for k in ("#1 ID", "#2 ID")]
    assert len(set(ids)) == len(ids)
    corpus = (a / "corpus.txt").read_text(encoding="utf-8").splitlines()
    assert len(corpus) == 200 and all(line.strip() for line in corpus)
    vocab = set(S.build_lexicon().vocabulary())
    assert all(set(t.split()) <= vocab for t in corpus + [r[k] for v in rows.values() for r in v
                                                           for k in ("#1 String", "#2 String")])
    meta = json.loads((a / "synth.json").read_text())
    for split, n in (("train", 101), ("dev", 40), ("test", 30)):
        assert meta["pair_kinds"][split] == dict(Counter(r["kind"] for r in S.make_pairs(n, 3, split=split)))
    assert meta["sizes"] == sizes and meta["language"] == __import__("dataclasses").asdict(S.LanguageConfig())
    assert meta["vocabulary_size"] == len(vocab)
    for bad in (0, -5):
        with pytest.raises(PrecswitchError, match="n_test"):
            S.write_synthetic(tmp_path / "s", seed=1, n_test=bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # nothing half-written


def test_dev_test_and_train_pairs_are_drawn_from_streams_of_their_own():
    """With a shared stream, dev repeated train's events (the same labels, propositions and first wordings), and
    the accuracy measured memory; test is a second held-out draw like dev, so a recipe tuned on dev is not
    reported on the pairs it was tuned on."""
    splits = {split: S.make_pairs(300, seed=0, split=split) for split in ("train", "dev", "test")}
    sentences = lambda rows: {r[c] for r in rows for c in ("#1 String", "#2 String")}  # noqa: E731
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not sentences(splits[a]) & sentences(splits[b]), (a, b)
        assert [r["Quality"] for r in splits[a]] != [r["Quality"] for r in splits[b]], (a, b)


def test_negatives_reuse_the_words_or_change_a_concept():
    cfg = S.LanguageConfig(p_synonym=0.0, neg_swap_adjectives=0.2, neg_replace=0.3)  # no synonym rewrites: compare words
    rows = S.make_pairs(400, seed=2, cfg=cfg)
    kinds = Counter(r["kind"] for r in rows)
    assert {"paraphrase", "swap_roles", "swap_adjectives"} <= set(kinds)
    assert any(k.startswith("replace_") for k in kinds)
    for r in rows:
        a, b = r["#1 String"].split(), r["#2 String"].split()
        content = lambda ws: Counter(w for w in ws if w not in S.FUNCTION_WORDS)  # noqa: E731
        if r["kind"] in ("paraphrase", "swap_roles", "swap_adjectives"):
            assert content(a) == content(b), r  # same content words: only order/roles differ
        else:
            assert content(a) != content(b), r


def test_bag_of_words_baseline_is_near_chance():
    """Order and synonymy decide: a bag-of-words logistic regression must not solve the task."""
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    train = S.make_pairs(S.DEFAULT_SIZES["n_train"], seed=0, split="train")
    dev = S.make_pairs(S.DEFAULT_SIZES["n_dev"], seed=0, split="dev")
    y_tr, y_dev = [r["Quality"] for r in train], [r["Quality"] for r in dev]
    vec = CountVectorizer(token_pattern=r"\S+").fit(
        [r["#1 String"] for r in train] + [r["#2 String"] for r in train]
    )

    def separate(rows):  # words of sentence 1 and of sentence 2 as separate features
        return hstack([vec.transform([r["#1 String"] for r in rows]), vec.transform([r["#2 String"] for r in rows])])

    def joint(rows):  # one bag for the pair
        return vec.transform([r["#1 String"] + " " + r["#2 String"] for r in rows])

    for feats in (separate, joint):
        clf = LogisticRegression(C=1.0, max_iter=3000).fit(feats(train), y_tr)
        acc = clf.score(feats(dev), y_dev)
        assert acc <= 0.62, (feats.__name__, acc)


def test_which_sentence_is_the_original_is_random():
    """With a role swap only the rewritten event is impossible (a thing as agent): if it were always
    sentence 2, the position would tell the model where to look."""
    cfg = S.LanguageConfig(p_synonym=0.0, p_passive=0.0, neg_replace=0.0)
    lex = S.build_lexicon(cfg)
    animate = {w for syn in lex.nouns[: cfg.n_animate] for w in syn}
    neg = [r for r in S.make_pairs(400, seed=1, cfg=cfg, lex=lex) if r["Quality"] == 0]
    first_is_original = sum(r["#1 String"].split()[2] in animate for r in neg) / len(neg)
    assert 0.35 < first_is_original < 0.65


def _concept_of(groups):
    return {w: i for i, syn in enumerate(groups) for w in syn}


def test_lexicon_words_are_unique_and_the_lexicon_seed_changes_the_language():
    """Two concepts sharing a word would make a sentence ambiguous (and a paraphrase label arbitrary)."""
    lex = S.build_lexicon()
    words = [w for g in (lex.nouns, lex.adjectives, lex.verbs) for syn in g for w in syn]
    words += lex.places + lex.foods + lex.materials
    assert len(words) == len(set(words)) and not set(words) & S.FUNCTION_WORDS
    cfg = S.LanguageConfig()
    assert [len(g) for g in (lex.nouns, lex.adjectives, lex.verbs)] == [
        cfg.n_noun_concepts, cfg.n_adj_concepts, cfg.n_verb_concepts]
    assert all(len(syn) == cfg.synonyms for g in (lex.nouns, lex.adjectives, lex.verbs) for syn in g)
    other = S.build_lexicon(S.LanguageConfig(lexicon_seed=1))
    assert set(other.vocabulary()) != set(lex.vocabulary())
    assert S.build_lexicon(S.LanguageConfig(lexicon_seed=1)) == other


def test_every_noun_concept_has_its_own_habitat_food_and_adjectives():
    """Contexts are spread over the concepts (each used at most ceil(n/k) times), and a concept's typical
    adjectives are distinct: what lets masked LM tell the concepts apart."""
    cfg = S.LanguageConfig()
    lex = S.build_lexicon(cfg)
    hab = Counter(lex.noun_habitat)
    assert len(lex.noun_habitat) == cfg.n_noun_concepts and max(hab.values()) == -(-cfg.n_noun_concepts // cfg.n_places)
    assert len(set(lex.noun_habitat)) == cfg.n_places
    foods, materials = lex.noun_food[: cfg.n_animate], lex.noun_food[cfg.n_animate:]
    assert sorted(foods) == list(range(cfg.n_foods))  # 24 animals, 24 foods: one each
    assert max(Counter(materials).values()) == -(-cfg.n_things // cfg.n_materials)
    assert all(len(set(a)) == cfg.adj_prefs for a in lex.noun_adjs)
    assert len({tuple(sorted(a)) for a in lex.noun_adjs}) > cfg.n_noun_concepts // 2


def test_knowledge_sentences_use_the_typical_contexts_of_the_noun_concept():
    cfg = S.LanguageConfig(p_restate=0.0, p_knowledge=1.0, p_typical=1.0)
    lex = S.build_lexicon(cfg)
    noun_c, adj_c = _concept_of(lex.nouns), _concept_of(lex.adjectives)
    seen_nouns = set()
    for line in S.make_corpus(1500, seed=6, cfg=cfg, lex=lex):
        ws = line.split()
        (noun,) = [w for w in ws if w in noun_c]
        c = noun_c[noun]
        seen_nouns.add(noun)
        for w in ws:
            if w in adj_c:
                assert adj_c[w] in lex.noun_adjs[c], line
            if w in lex.places:
                assert w == lex.places[lex.noun_habitat[c]], line
            if w in lex.foods:
                assert c < cfg.n_animate and w == lex.foods[lex.noun_food[c]], line
            if w in lex.materials:
                assert c >= cfg.n_animate and w == lex.materials[lex.noun_food[c]], line
    assert seen_nouns == set(noun_c)  # every synonym, the held-out ones included, is introduced
    # by default 90% typical: the place of a 'lives near' / 'lies in' sentence is mostly the habitat
    cfg = S.LanguageConfig(p_restate=0.0, p_knowledge=1.0)
    hits = total = 0
    for line in S.make_corpus(3000, seed=6, cfg=cfg, lex=lex):
        ws = line.split()
        places = [w for w in ws if w in lex.places]
        if places:
            (noun,) = [w for w in ws if w in noun_c]
            total += 1
            hits += places[0] == lex.places[lex.noun_habitat[noun_c[noun]]]
    assert 0.85 < hits / total < 0.97


def test_passive_sentences_put_the_agent_after_by():
    """'the PATIENT was VERB by the AGENT': the animate stays the doer in either voice."""
    cfg = S.LanguageConfig(p_synonym=0.0, p_passive=1.0, neg_replace=0.0)
    lex = S.build_lexicon(cfg)
    animate = {w for syn in lex.nouns[: cfg.n_animate] for w in syn}
    things = {w for syn in lex.nouns[cfg.n_animate:] for w in syn}
    for r in S.make_pairs(100, seed=3, cfg=cfg, lex=lex):
        for s in (r["#1 String"], r["#2 String"]):
            ws = s.split()
            assert ws[3] == "was" and ws[5] == "by", s
            if r["Quality"] == 1:
                assert ws[2] in things and ws[-2] in animate, s
        if r["Quality"] == 1:
            continue
        oks = [s.split()[2] in things for s in (r["#1 String"], r["#2 String"])]
        assert sorted(oks) == [False, True], r  # a role swap: one sentence has a thing as the doer


@pytest.mark.parametrize("front", [0.0, 1.0])
def test_the_place_phrase_goes_to_the_front_with_p_front_place(front):
    cfg = S.LanguageConfig(p_place=1.0, p_front_place=front)
    lex = S.build_lexicon(cfg)
    for r in S.make_pairs(40, seed=2, cfg=cfg, lex=lex):
        for s in (r["#1 String"], r["#2 String"]):
            ws = s.split()
            if front:
                assert ws[:2] == ["in", "the"] and ws[2] in lex.places and ws[3] == ",", s
            else:
                assert ws[-4:-2] == ["in", "the"] and ws[-2] in lex.places and ws[-1] == ".", s


def test_p_synonym_1_replaces_every_content_word_and_a_single_synonym_stays():
    cfg = S.LanguageConfig(p_synonym=1.0, p_passive=0.0)
    content = lambda s: {w for w in s.split() if w not in S.FUNCTION_WORDS}  # noqa: E731
    pos = [r for r in S.make_pairs(200, seed=1, cfg=cfg, split="dev") if r["Quality"] == 1]
    assert pos and all(not content(r["#1 String"]) & content(r["#2 String"]) for r in pos)
    # train with 2 synonyms, 1 held out: one noun synonym left, which a rewrite must keep (not crash)
    cfg = S.LanguageConfig(synonyms=2, heldout_synonyms=1, p_synonym=1.0, p_passive=0.0)
    lex = S.build_lexicon(cfg)
    nouns = {syn[0] for syn in lex.nouns}
    for r in S.make_pairs(60, seed=1, cfg=cfg, lex=lex, split="train"):
        if r["Quality"] == 1:
            n1 = [w for w in r["#1 String"].split() if w in nouns]
            assert n1 and sorted(n1) == sorted(w for w in r["#2 String"].split() if w in nouns), r


def test_negative_kinds_follow_the_documented_shares():
    """docs/data.md: the default's negatives are 5 in 7 swap_roles, 2 in 7 replacements (weights 1 : 0.4,
    issue 38); with neg_replace 0 they are all role swaps."""
    rows = S.make_pairs(3000, seed=0)
    neg = Counter(r["kind"] for r in rows if r["Quality"] == 0)
    assert {r["kind"] for r in rows if r["Quality"] == 1} == {"paraphrase"}
    assert neg.get("swap_adjectives", 0) == 0 and 0.68 < neg["swap_roles"] / 1500 < 0.75
    assert {k for k in neg if k.startswith("replace_")} == {"replace_noun", "replace_verb", "replace_adj"}
    rows = S.make_pairs(3000, seed=0, cfg=S.LanguageConfig(neg_replace=0.0))
    assert Counter(r["kind"] for r in rows if r["Quality"] == 0) == {"swap_roles": 1500}


def test_events_have_two_different_adjectives_and_a_replacement_keeps_the_restriction():
    """A replaced concept is another concept of its class: a new agent is animate, a new adjective differs
    from the other noun's (else a swap or a replacement could leave the meaning unchanged)."""
    cfg = S.LanguageConfig(p_synonym=0.0, p_passive=0.0, neg_swap_roles=0.0, neg_replace=1.0)
    lex = S.build_lexicon(cfg)
    noun_c, adj_c = _concept_of(lex.nouns), _concept_of(lex.adjectives)
    for r in S.make_pairs(600, seed=4, cfg=cfg, lex=lex):
        for s in (r["#1 String"], r["#2 String"]):
            ws = s.split()  # the ADJ NOUN VERB the ADJ NOUN .
            assert noun_c[ws[2]] < cfg.n_animate <= noun_c[ws[6]], s
            assert adj_c[ws[1]] != adj_c[ws[5]], s


def test_corpus_restatement_share_rewrites_and_exact_length():
    """An "in other words , ..." line (the second of a discourse unit) rewrites the event of the line before: with
    p_synonym 0 its content words are exactly that line's."""
    lines = S.make_corpus(600, seed=4, cfg=S.LanguageConfig(p_synonym=0.0, p_restate=0.5))
    content = lambda s: Counter(w for w in s.split() if w not in S.FUNCTION_WORDS)  # noqa: E731
    restated = [i for i, ln in enumerate(lines) if ln.startswith("in other words , ")]
    assert len(restated) > 100 and all(i % 2 == 1 for i in restated)
    assert all(content(lines[i].removeprefix("in other words , ")) == content(lines[i - 1]) for i in restated)
    lines = S.make_corpus(4001, seed=3)
    assert len(lines) == 4001 and len(S.make_corpus(7, seed=3)) == 7
    restated = [i for i, ln in enumerate(lines) if ln.startswith("in other words , ")]
    assert 0.15 < len(restated) / (len(lines) // 2) < 0.25  # p_restate 0.2 of the discourse units
    copies = sum(lines[i].removeprefix("in other words , ") == lines[i - 1] for i in restated)
    assert copies < 0.2 * len(restated)  # rewritten (voice, synonyms), not copied
    knowledge = sum(ln.split()[0] == "every" or " lives " in ln or " lies " in ln or " made of " in ln
                    or ln.startswith("in the ") for ln in lines)
    assert 0.3 < knowledge / len(lines) < 0.5  # half of the 80% unrelated lines


@pytest.mark.parametrize("split", ["train", "dev"])
def test_no_pair_of_the_default_task_has_two_identical_sentences(split):
    """A rewrite that kept every synonym and the voice made a positive of two identical strings (26 of 1,500
    train positives of the default task): a trivial pair, not a paraphrase. It is redrawn for either label,
    so two sentences with the same bag of words occur in neither class (a bag of words learns nothing from it)."""
    rows = S.make_pairs(S.DEFAULT_SIZES[f"n_{split}"], seed=0, split=split)
    assert not [r for r in rows if r["#1 String"] == r["#2 String"]]
    same_bag = Counter(r["Quality"] for r in rows if sorted(r["#1 String"].split()) == sorted(r["#2 String"].split()))
    assert same_bag == {}
    assert Counter(r["Quality"] for r in rows) == {1: len(rows) // 2, 0: len(rows) // 2}


def test_rewrites_differ_through_the_place_and_a_language_without_rewrites_still_terminates():
    """With no synonyms and one voice a pair can differ only by the place's position; with that fixed too,
    no rewrite is possible and positives are copies (drawn, not redrawn for ever)."""
    cfg = S.LanguageConfig(p_synonym=0.0, p_passive=0.0, p_place=1.0)
    for r in S.make_pairs(60, seed=1, cfg=cfg):
        assert r["#1 String"] != r["#2 String"], r
        if r["Quality"] == 1:
            bag = lambda s: sorted(s.replace(" ,", "").split())  # noqa: E731
            assert bag(r["#1 String"]) == bag(r["#2 String"]), r  # the same words, the place moved
    cfg = S.LanguageConfig(p_synonym=0.0, p_passive=1.0, p_place=1.0, p_front_place=0.0)
    pos = [r for r in S.make_pairs(20, seed=1, cfg=cfg) if r["Quality"] == 1]
    assert pos and all(r["#1 String"] == r["#2 String"] for r in pos)


def test_heldout_synonyms_is_the_number_of_noun_synonyms_train_pairs_never_use():
    """heldout_synonyms 2 of 3: train pairs use only each noun's first synonym; dev (and any split other than
    train) uses all three. A count of 1 whatever the key said would put the second synonym in train."""
    cfg = S.LanguageConfig(heldout_synonyms=2)
    lex = S.build_lexicon(cfg)
    first = {syn[0] for syn in lex.nouns}
    nouns = {w for syn in lex.nouns for w in syn}
    words = lambda rows: {w for r in rows for w in (r["#1 String"] + " " + r["#2 String"]).split()}  # noqa: E731
    assert words(S.make_pairs(300, seed=0, cfg=cfg, split="train", lex=lex)) & nouns <= first
    for split in ("dev", "test"):
        used = words(S.make_pairs(300, seed=0, cfg=cfg, split=split, lex=lex)) & nouns
        assert len(used - first) > len(lex.nouns), split  # most second and third synonyms occur
    assert nouns <= {w for line in S.make_corpus(4000, seed=0, cfg=cfg, lex=lex) for w in line.split()}


def test_language_bounds_accept_the_edge_values_and_refuse_one_past_them():
    """adj_prefs may equal n_adj_concepts (every adjective typical), one more is refused in one line (it was
    random.sample's ValueError); probabilities 0 and 1 are allowed, just outside is refused."""
    from precswitch.errors import PrecswitchError

    S.check_language(S.LanguageConfig(n_adj_concepts=3, adj_prefs=3, p_synonym=0.0, p_passive=1.0, p_place=1.0))
    assert len(S.make_pairs(20, seed=1, cfg=S.LanguageConfig(n_adj_concepts=3, adj_prefs=3))) == 20
    with pytest.raises(PrecswitchError, match=r"adj_prefs \(4\) must be <= n_adj_concepts \(3\)"):
        S.check_language(S.LanguageConfig(n_adj_concepts=3, adj_prefs=4))
    for bad in (-0.01, 1.01):
        with pytest.raises(PrecswitchError, match=r"p_passive is a probability"):
            S.check_language(S.LanguageConfig(p_passive=bad))


@pytest.mark.parametrize("k", [1, 4])
def test_adj_prefs_is_the_number_of_typical_adjectives_of_each_noun_concept(k):
    """The knowledge sentences of a concept use exactly its adj_prefs typical adjectives (p_typical 1)."""
    cfg = S.LanguageConfig(adj_prefs=k, p_restate=0.0, p_knowledge=1.0, p_typical=1.0)
    lex = S.build_lexicon(cfg)
    assert all(len(set(a)) == k for a in lex.noun_adjs)
    noun_c, adj_c = _concept_of(lex.nouns), _concept_of(lex.adjectives)
    seen: dict[int, set[int]] = {}
    for line in S.make_corpus(3000, seed=1, cfg=cfg, lex=lex):
        ws = line.split()
        (c,) = [noun_c[w] for w in ws if w in noun_c]
        seen.setdefault(c, set()).update(adj_c[w] for w in ws if w in adj_c)
    assert all(seen[c] <= set(lex.noun_adjs[c]) for c in seen)
    assert sum(len(s) == k for s in seen.values()) > 0.8 * len(seen)


def test_every_knowledge_form_and_every_replaced_slot_occurs():
    """The corpus teaches animacy (what pre-training brings to the role-swap negatives): each line's frame is one
    of its noun class's four (animals live near and eat, things lie in and are made of, never the other way
    round), and all four of each class are drawn (one left out went unnoticed). A replacement negative may
    change any of the five concept slots, the patient's adjective included."""
    cfg = S.LanguageConfig(p_restate=0.0, p_knowledge=1.0)
    lex = S.build_lexicon(cfg)
    noun_c = _concept_of(lex.nouns)
    frames = {  # the function words (but "the" and ".") of the four frames of an animate noun, then of a thing
        True: [("lives", "near"), ("every", "eats"), ("likes", "to", "eat", "in"), ("in", ",", "every", "is")],
        False: [("lies", "in"), ("every", "is", "made", "of"), ("is", "made", "of", "and", "lies", "in"), ("in", ",", "is")],
    }
    seen = set()
    for ln in S.make_corpus(800, seed=3, cfg=cfg, lex=lex):
        (c,) = [noun_c[w] for w in ln.split() if w in noun_c]
        skeleton = tuple(w for w in ln.split() if w in S.FUNCTION_WORDS and w not in ("the", "."))
        seen.add((c < cfg.n_animate, frames[c < cfg.n_animate].index(skeleton)))
    assert seen == {(a, k) for a in (True, False) for k in range(4)}
    cfg = S.LanguageConfig(p_synonym=0.0, p_passive=0.0, neg_swap_roles=0.0, neg_replace=1.0)
    lex = S.build_lexicon(cfg)
    changed = Counter()
    for r in S.make_pairs(300, seed=2, cfg=cfg, lex=lex):
        a, b = r["#1 String"].split(), r["#2 String"].split()  # the ADJ NOUN VERB the ADJ NOUN .
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if r["Quality"] == 0:
            assert len(diff) == 1, r
            changed[{1: "a_adj", 2: "a_noun", 3: "verb", 5: "p_adj", 6: "p_noun"}[diff[0]]] += 1
    assert set(changed) == {"a_adj", "a_noun", "verb", "p_adj", "p_noun"}, changed


def test_an_untypical_knowledge_sentence_draws_its_food_or_material_at_random():
    """p_typical 0: foods and materials are drawn from the whole list, not the concept's own."""
    cfg = S.LanguageConfig(p_restate=0.0, p_knowledge=1.0, p_typical=0.0)
    lex = S.build_lexicon(cfg)
    noun_c = _concept_of(lex.nouns)
    own = other = 0
    for line in S.make_corpus(2000, seed=4, cfg=cfg, lex=lex):
        ws = line.split()
        (c,) = [noun_c[w] for w in ws if w in noun_c]
        for w in ws:
            if w in lex.foods or w in lex.materials:
                mine = (lex.foods if c < cfg.n_animate else lex.materials)[lex.noun_food[c]]
                own, other = own + (w == mine), other + (w != mine)
    assert other > 5 * own > 0
