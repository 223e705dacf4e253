"""The profiling design: points and the prompts built from the bundled specs (tokenizer only)."""

from __future__ import annotations

import numpy as np
import pytest

from promptdistill.ttft.features import semantic_density
from promptdistill.ttft.design import build_prompt, densify, design_points, load_corpus, with_nonce


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("prompts")


@pytest.fixture(scope="module")
def names(corpus):
    return [s.name for s in corpus.specs]


def test_design_is_deterministic_and_covers_the_ranges(names):
    a = design_points(spec_names=names, n_sweep=30, min_tokens=48, max_tokens=1980, seed=0)
    b = design_points(spec_names=names, n_sweep=30, min_tokens=48, max_tokens=1980, seed=0)
    assert a == b
    sweep = [p for p in a if p.design == "sweep"]
    tokens = [p.target_tokens for p in sweep]
    assert min(tokens) < 80 and max(tokens) > 1500
    assert {p.fewshot_count for p in sweep} == set(range(9))
    assert min(p.density_knob for p in sweep) < 0.1 and max(p.density_knob for p in sweep) > 0.9
    assert min(p.static_share for p in sweep) < 0.2 and max(p.static_share for p in sweep) > 0.8
    assert [p.fewshot_count for p in a if p.design == "fewshot_probe"] == [0, 1, 4, 8]
    assert len({p.point_id for p in a}) == len(a)


def test_sweep_prompts_hit_their_token_targets(corpus, names, tokenizer):
    points = [p for p in design_points(spec_names=names, n_sweep=12, min_tokens=48, max_tokens=1900) if p.design == "sweep"]
    for p in points:
        built = build_prompt(p, corpus, tokenizer)
        total = built.features["total_tokens"]
        assert total == len(tokenizer.tokenize(tokenizer.apply_chat_template(built.messages)))
        # Examples keep at least ~12 tokens each: a static part too small for them overshoots.
        if p.target_tokens * p.static_share >= 20 + 20 * p.fewshot_count:
            assert abs(total - p.target_tokens) <= max(0.05 * p.target_tokens, 10), p
        else:
            assert total <= p.target_tokens + 40 + 20 * p.fewshot_count, p
        assert built.features["fewshot_count"] == p.fewshot_count
        assert built.prompt_text.startswith(built.prompt_text[: built.static_chars])
        # Real text from the specs and data, not a repeated word.
        words = built.prompt_text.split()
        assert len(set(words)) > 0.3 * len(words)


def test_fewshot_probe_adds_examples_to_one_fixed_base(corpus, names, tokenizer):
    points = [p for p in design_points(spec_names=names, n_sweep=0, min_tokens=48, max_tokens=1900, fewshot_spec="summarize")
              if p.design == "fewshot_probe"]
    built = [build_prompt(p, corpus, tokenizer) for p in points]
    base = built[0]
    assert abs(base.features["total_tokens"] - 512) <= 16
    for b in built[1:]:
        k = b.point.fewshot_count
        assert b.messages[1] == base.messages[1]  # the same user part
        assert b.messages[0]["content"].startswith(base.messages[0]["content"])  # the same instruction, then examples
        assert abs(b.features["fewshot_tokens"] - 64 * k) <= 6 * k + 6
        assert b.features["semantic_density"] == base.features["semantic_density"]


def test_density_knob_moves_measured_density(corpus):
    text = corpus.specs[0].instruction_text()
    measured = [np.mean([semantic_density(densify(text, q, seed=s)) for s in range(3)]) for q in (0.0, 0.5, 1.0)]
    assert measured[0] < measured[1] < measured[2]
    assert measured[2] - measured[0] > 0.25
    assert densify(text, 0.3, seed=1) == densify(text, 0.3, seed=1)


def test_spec_points_render_exactly_as_the_spec_does(corpus, tokenizer):
    from promptdistill.ttft.features import prompt_features
    from promptdistill.specs import select_examples, spec_messages

    spec = corpus.specs[0]
    point = design_points(spec_names=[spec.name], n_sweep=0, min_tokens=48, max_tokens=100, spec_records=1,
                          spec_fewshot={spec.name: (2,)}, density_probe_tokens=(), fewshot_probe_counts=())[0]
    built = build_prompt(point, corpus, tokenizer)
    record = corpus.held[spec.name][0]
    examples = select_examples(spec, corpus.train[spec.name], 2, seed=0)
    assert list(built.messages) == spec_messages(spec, record["inputs"], examples=examples)
    assert built.features == prompt_features(spec, record["inputs"], tokenizer, examples=examples)


def test_nonce_makes_the_prompt_unique_but_keeps_its_group(corpus, names, tokenizer):
    point = design_points(spec_names=names, n_sweep=1, min_tokens=200, max_tokens=400)[0]
    built = build_prompt(point, corpus, tokenizer)
    a, b = with_nonce(built, "aaaa", tokenizer), with_nonce(built, "bbbb", tokenizer)
    assert a.prompt_text != b.prompt_text and a.prompt_id == b.prompt_id == built.prompt_id
    assert a.features["total_tokens"] == len(tokenizer.tokenize(a.prompt_text))


def test_ladder_and_queue_points(names):
    points = design_points(spec_names=names, n_sweep=0, min_tokens=48, max_tokens=2000, density_probe_tokens=(),
                           fewshot_probe_counts=(), spec_records=0, ladder_tokens=(128, 512, 2048),
                           queue_batches=((3, 384), (2, 4000)))
    ladder = [p for p in points if p.design == "ladder"]
    assert [p.target_tokens for p in ladder] == [128, 512, 2000]  # capped to what the context allows
    assert all(not p.batch_id for p in ladder)
    queue = [p for p in points if p.design == "queue"]
    assert [(p.batch_id, p.batch_position, p.target_tokens) for p in queue] == [
        ("queue-3x384", 0, 384), ("queue-3x384", 1, 384), ("queue-3x384", 2, 384),
        ("queue-2x2000", 0, 2000), ("queue-2x2000", 1, 2000)]
    assert len({p.point_id for p in points}) == len(points)
    assert len({p.record_offset for p in queue}) == len(queue)  # different text for every request


def test_queue_prompts_share_no_cache_block(corpus, names, tokenizer):
    points = [p for p in design_points(spec_names=names, n_sweep=0, min_tokens=48, max_tokens=1900, density_probe_tokens=(),
                                       fewshot_probe_counts=(), spec_records=0, queue_batches=((3, 300),))]
    built = [with_nonce(build_prompt(p, corpus, tokenizer), p.point_id, tokenizer) for p in points]
    ids = [tokenizer.tokenize(b.prompt_text) for b in built]
    # A prefix cache matches whole blocks from the start: requests that differ within the
    # first block (here: their first line) can never share one.
    for a in ids:
        for b in ids:
            if a is not b:
                assert a[:16] != b[:16]
