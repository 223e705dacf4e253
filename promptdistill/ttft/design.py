"""The profiling design: which prompts to measure, built from the bundled specs and data.

Six kinds of design point (``DesignPoint.design``):

* ``sweep``: a Latin-hypercube sample over total tokens (log scale, a few dozen up to
  the context limit), few-shot count (0-8), a density knob and the static share of the
  prompt (the part a warm cache can serve);
* ``density_probe``: fixed token counts, the density knob from verbose to terse: the
  cleanest look at density with tokens held still;
* ``fewshot_probe``: one ~512-token base with 0, 1, 4 and 8 examples of ~64 tokens;
* ``spec``: the bundled specs rendered over their datasets by ``spec_messages``, the
  prompts the models will actually be asked about;
* ``ladder``: cold prompts of exactly 128, 256, ... 2048 tokens (up to the context
  limit): prefill throughput at fixed sizes, set against the hardware's matmul peak;
* ``queue``: groups of prompts sent together (``batch_id``, in ``batch_position``
  order), each with a unique first line so none can reuse another's cache blocks: what
  a request waits for when others arrive with it, and chunked prefill across steps.

Synthetic prompts are real text: the system part is a spec's instruction and rules,
continued with other specs' instructions and dataset documents as background, then
few-shot examples from the spec's train split in the spec's own example format; the
user part is the spec's user template over dataset inputs. The density knob rewrites
the instruction text from verbose (filler phrases added) to terse (stop words dropped);
the recorded ``semantic_density`` is measured on the result, never assumed.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.stats import qmc
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from promptdistill.core.errors import SpecError
from promptdistill.core.jsonio import canonical_json
from promptdistill.specs.datasets import dataset_for, records
from promptdistill.specs.load import load_specs
from promptdistill.specs.prompt import format_example, select_examples, spec_messages
from promptdistill.specs.render import escape_braces, placeholders, render_messages
from promptdistill.specs.text import FILLER_WORDS
from promptdistill.ttft.features import (
    features_from_messages,
    prompt_features,
    static_prefix_chars,
)

__all__ = [
    "BuiltPrompt",
    "Corpus",
    "DesignPoint",
    "build_prompt",
    "densify",
    "design_points",
    "load_corpus",
    "summarize_points",
    "with_nonce",
]

_FILLERS = (
    "Please note that",
    "It is really very important that",
    "Basically,",
    "As you probably already know,",
    "Just to be completely clear,",
    "In other words, what we would like is that",
    "We would really appreciate it if, in this case,",
)
_PIECE = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|[^A-Za-z]+")


@dataclass(frozen=True)
class DesignPoint:
    """One prompt shape to measure (all fields plain values; see the module docstring)."""

    point_id: str
    design: str
    spec: str
    target_tokens: int = 0
    """Intended total prompt tokens (0 for spec points: their length is the data's)."""
    fewshot_count: int = 0
    density_knob: float = math.nan
    """0: verbose instruction, 1: terse (stop words dropped); NaN for spec points."""
    static_share: float = 0.5
    """Intended share of the prompt in the static system part."""
    record_offset: int = 0
    """Which dataset records (examples, inputs) to use: varies the text between points."""
    example_tokens: int = 0
    """Cap on each example's tokens (0: natural length, bounded by the static budget)."""
    base_tokens: int = 0
    """When > 0: the instruction and user parts are sized from this base alone (split by
    ``static_share``) and the examples come on top, so points that differ only in
    ``fewshot_count`` share the same instruction and user text (the few-shot probe)."""
    batch_id: str = ""
    """Queue points: the group sent together ('' for a request measured alone)."""
    batch_position: int = 0
    """Queue points: the order within the group (the engine serves it first come, first served)."""


@dataclass(frozen=True)
class BuiltPrompt:
    """A design point made concrete: the messages and their measured features."""

    point: DesignPoint
    messages: tuple[Mapping[str, str], ...]
    prompt_text: str
    static_chars: int
    """Characters of ``prompt_text`` that are static: what a warm run primes the cache with."""
    features: Mapping[str, Any]
    prompt_id: str


@dataclass
class Corpus:
    """The specs with their records, and text to build prompts from."""

    specs: list[Any]
    train: dict[str, list[dict[str, Any]]]
    held: dict[str, list[dict[str, Any]]]
    """dev and test records: inputs for the user part and for spec points."""
    background: list[str]
    """Instruction texts and dataset documents of every spec, to lengthen a system part."""


def load_corpus(prompts_dir: str = "prompts") -> Corpus:
    """Load every spec in ``prompts_dir`` with its dataset.

    Raises:
        SpecError: a spec or dataset is invalid, or there is none.
    """
    specs = load_specs(prompts_dir)
    if not specs:
        raise SpecError(f"{prompts_dir}/: no *.yaml specs to build profiling prompts from")
    train, held, docs = {}, {}, []
    for spec in specs:
        df = dataset_for(spec)
        train[spec.name] = records(df, "train")
        held[spec.name] = records(df, "dev") + records(df, "test")
        docs += [str(v) for r in held[spec.name][:40] for v in r["inputs"].values()]
    background = [s.instruction_text() for s in specs] + [s.context for s in specs if s.context]
    # Interleave instructions with documents so any slice reads like a real system prompt.
    rng = random.Random(0)
    rng.shuffle(docs)
    return Corpus(specs=specs, train=train, held=held, background=background + docs)


def densify(text: str, knob: float, seed: int = 0) -> str:
    """Rewrite ``text`` from verbose (knob 0) to terse (knob 1).

    Each stop word is dropped with probability ``knob``; each sentence gets a filler
    phrase in front with probability ``0.6 * (1 - knob)``. Deterministic for a seed.
    """
    stop = ENGLISH_STOP_WORDS | FILLER_WORDS
    rng = random.Random(seed)
    out: list[str] = []
    sentence_start = True
    for piece in _PIECE.findall(text):
        if piece[0].isalpha():
            if sentence_start and rng.random() < 0.6 * (1 - knob):
                out.append(rng.choice(_FILLERS) + " ")
            sentence_start = False
            if piece.casefold() in stop and rng.random() < knob:
                continue
            out.append(piece)
        else:
            out.append(piece)
            if re.search(r"[.!?:\n]", piece):
                sentence_start = True
    return re.sub(r"[ \t]{2,}", " ", "".join(out)).strip()


def _fit_tokens(text: str, n_tokens: int, tokenize: Any) -> str:
    """The longest word prefix of ``text`` with at most ``n_tokens`` tokens."""
    if n_tokens <= 0:
        return ""
    words = text.split(" ")
    if len(tokenize(text)) <= n_tokens:
        return text
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenize(" ".join(words[:mid]))) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def _prompt_id(messages: Sequence[Mapping[str, str]]) -> str:
    return hashlib.sha256(canonical_json([dict(m) for m in messages]).encode()).hexdigest()[:16]


def _finish(point: DesignPoint, messages: list[dict[str, str]], features: Mapping[str, Any], tokenizer: Any) -> BuiltPrompt:
    return BuiltPrompt(
        point=point,
        messages=tuple(messages),
        prompt_text=tokenizer.apply_chat_template(messages),
        static_chars=static_prefix_chars(messages, tokenizer),
        features=dict(features),
        prompt_id=_prompt_id(messages),
    )


def build_prompt(point: DesignPoint, corpus: Corpus, tokenizer: Any) -> BuiltPrompt:
    """Make a design point concrete. ``tokenizer`` is the engine (or an HFTokenizer)."""
    spec = next(s for s in corpus.specs if s.name == point.spec)
    held = corpus.held[spec.name]
    if point.design == "spec":
        record = held[point.record_offset % len(held)]
        examples = select_examples(spec, corpus.train[spec.name], point.fewshot_count, seed=point.record_offset)
        messages = spec_messages(spec, record["inputs"], examples=examples)
        return _finish(point, messages, prompt_features(spec, record["inputs"], tokenizer, examples=examples), tokenizer)

    tok = tokenizer.tokenize
    overhead = len(tok(tokenizer.apply_chat_template([{"role": "system", "content": ""}, {"role": "user", "content": ""}])))
    budget = max(16, (point.base_tokens or point.target_tokens) - overhead)
    static_budget = max(8, round(budget * point.static_share))
    user_budget = max(4, budget - static_budget)

    # Few-shot examples in the spec's own format (spread over the train split), cut to the cap.
    k = point.fewshot_count
    train = corpus.train[spec.name]
    picked = [train[(point.record_offset + 7 * i) % len(train)] for i in range(k)]
    cap = point.example_tokens or max(12, min(128, int(static_budget * 0.7) // max(k, 1)))
    shown = [_fit_tokens(format_example(spec, r), cap, tok) for r in picked]
    example_block = ""
    if shown:
        example_block = f"{spec.examples.header}\n\n" + "\n\n".join(shown)
    example_tokens = len(tok(example_block)) if example_block else 0
    instruction_budget = static_budget if point.base_tokens else max(8, static_budget - example_tokens)

    # The instruction: this spec's instruction first, then background text, at the density asked for.
    start = point.record_offset % len(corpus.background)
    source = "\n\n".join([spec.instruction_text(), *corpus.background[start:], *corpus.background[:start]])
    instruction = densify(source, point.density_knob, seed=point.record_offset)
    instruction = _fit_tokens(instruction, instruction_budget, tok)
    system = instruction + (f"\n\n{example_block}" if example_block else "")

    # The user part: the spec's user template over dataset inputs, lengthened with more of them.
    names = placeholders(spec.user)
    record = held[point.record_offset % len(held)]
    inputs = {n: str(record["inputs"].get(n, "")) for n in names}
    if names:
        main = names[-1]
        more = [str(r["inputs"].get(main, "")) for r in held[point.record_offset + 1 :] + held[: point.record_offset]]
        fixed = len(tok(render_messages("", spec.user, {**inputs, main: ""})[0]["content"]))
        inputs[main] = _fit_tokens("\n\n".join([inputs[main], *more]), user_budget - fixed, tok)
    messages = render_messages(escape_braces(system), spec.user, inputs)
    features = features_from_messages(
        messages, tokenizer, instruction_text=instruction, fewshot_count=len(shown), fewshot_tokens=example_tokens
    )
    return _finish(point, messages, features, tokenizer)


def design_points(
    *,
    spec_names: Sequence[str],
    n_sweep: int,
    min_tokens: int,
    max_tokens: int,
    seed: int = 0,
    density_probe_tokens: Sequence[int] = (256, 1024),
    density_probe_knobs: Sequence[float] = (0.0, 0.33, 0.67, 1.0),
    fewshot_probe_counts: Sequence[int] = (0, 1, 4, 8),
    fewshot_base_tokens: int = 512,
    fewshot_example_tokens: int = 64,
    fewshot_spec: str | None = None,
    spec_records: int = 2,
    spec_fewshot: Mapping[str, Sequence[int]] | None = None,
    ladder_tokens: Sequence[int] = (),
    queue_batches: Sequence[tuple[int, int]] = (),
) -> list[DesignPoint]:
    """Every design point of a profile (pure: the same arguments give the same points).

    Args:
        spec_names: the specs to draw text from (and to profile as rendered).
        n_sweep: Latin-hypercube points of the sweep.
        min_tokens, max_tokens: the sweep's total-token range.
        spec_records: records per spec for the spec points (0: none).
        spec_fewshot: per spec, the few-shot counts to render it with (default: 0 and
            the spec's own count, given by the caller).
        ladder_tokens: sizes of the cold throughput ladder (those above ``max_tokens``
            are capped to it).
        queue_batches: (requests, tokens each) of every group sent together.
    """
    if not spec_names:
        raise ValueError("design_points needs at least one spec name")
    points: list[DesignPoint] = []
    if n_sweep > 0:
        sample = qmc.LatinHypercube(d=4, seed=seed).random(n_sweep)
        lo, hi = math.log(min_tokens), math.log(max_tokens)
        for i, (t, k, q, s) in enumerate(sample):
            points.append(
                DesignPoint(
                    point_id=f"sweep-{i:03d}",
                    design="sweep",
                    spec=spec_names[i % len(spec_names)],
                    target_tokens=int(round(math.exp(lo + t * (hi - lo)))),
                    fewshot_count=min(8, int(k * 9)),
                    density_knob=round(float(q), 3),
                    static_share=round(0.1 + 0.8 * float(s), 3),
                    record_offset=i * 3,
                )
            )
    for i, n in enumerate(t for t in density_probe_tokens if t <= max_tokens):
        for j, q in enumerate(density_probe_knobs):
            points.append(
                DesignPoint(
                    point_id=f"density-{n}-{j}",
                    design="density_probe",
                    spec=spec_names[(i + j) % len(spec_names)],
                    target_tokens=n,
                    density_knob=float(q),
                    static_share=0.6,
                    record_offset=100 + i,
                )
            )
    if fewshot_probe_counts and fewshot_base_tokens + max(fewshot_probe_counts) * fewshot_example_tokens <= max_tokens:
        spec = fewshot_spec or spec_names[0]
        for k in fewshot_probe_counts:
            points.append(
                DesignPoint(
                    point_id=f"fewshot-{k}",
                    design="fewshot_probe",
                    spec=spec,
                    target_tokens=fewshot_base_tokens + k * fewshot_example_tokens,
                    fewshot_count=k,
                    density_knob=0.5,
                    static_share=0.4,
                    record_offset=200,
                    example_tokens=fewshot_example_tokens,
                    base_tokens=fewshot_base_tokens,
                )
            )
    for name in spec_names if spec_records > 0 else ():
        for k in (spec_fewshot or {}).get(name, (0,)):
            for r in range(spec_records):
                points.append(DesignPoint(point_id=f"spec-{name}-k{k}-r{r}", design="spec", spec=name, fewshot_count=k, record_offset=r * 11))
    for i, n in enumerate(sorted({min(int(t), max_tokens) for t in ladder_tokens})):
        points.append(DesignPoint(point_id=f"ladder-{n}", design="ladder", spec=spec_names[i % len(spec_names)],
                                  target_tokens=n, density_knob=0.5, static_share=0.5, record_offset=400 + 5 * i))
    for b, (count, n) in enumerate(queue_batches):
        batch = f"queue-{count}x{min(n, max_tokens)}"
        for j in range(count):
            points.append(DesignPoint(point_id=f"{batch}-{j}", design="queue", spec=spec_names[(b + j) % len(spec_names)],
                                      target_tokens=min(n, max_tokens), density_knob=0.5, static_share=0.5,
                                      record_offset=300 + 17 * b + 3 * j, batch_id=batch, batch_position=j))
    return points


def with_nonce(built: BuiltPrompt, nonce: str, tokenizer: Any) -> BuiltPrompt:
    """The same prompt with a unique first line in the system part: nothing of it is cached.

    For backends that cannot reset the prefix cache. Features are recomputed (the nonce
    adds tokens); ``prompt_id`` stays the original's so repeats still group together.
    """
    messages = [dict(m) for m in built.messages]
    messages[0]["content"] = f"Request {nonce}.\n" + messages[0]["content"]
    features = dict(built.features)
    extra = len(tokenizer.tokenize(tokenizer.apply_chat_template(messages))) - features["total_tokens"]
    for key in ("total_tokens", "static_prefix_tokens"):
        features[key] += extra
    return replace(
        built,
        messages=tuple(messages),
        prompt_text=tokenizer.apply_chat_template(messages),
        static_chars=static_prefix_chars(messages, tokenizer),
        features=features,
    )


def summarize_points(points: Sequence[BuiltPrompt]) -> dict[str, Any]:
    """Ranges of the built prompts (for the progress header and the report)."""
    tot = np.array([p.features["total_tokens"] for p in points])
    den = np.array([p.features["semantic_density"] for p in points])
    return {
        "prompts": len(points),
        "total_tokens": [int(tot.min()), int(tot.max())] if len(tot) else [0, 0],
        "semantic_density": [round(float(den.min()), 3), round(float(den.max()), 3)] if len(den) else [0, 0],
    }
