"""Two ways to choose few-shot examples, and the specs that render them.

* **Fixed**: one set of train records in the static system part, the same for every
  request, so a prefix cache serves it. ``fixed_subsets`` proposes a few sets per count
  (the spec's own rule, a label-balanced one, seeded random ones) and ``swapped_subset``
  one example of a set swapped for another train record (the optimizer's greedy search);
  the optimizer keeps the one with the best screen score and records it in the spec as
  ``examples: {selection: fixed, ids: [...]}`` (``fixed_spec``).
* **Per request**: the train records most similar to each request's input (TF-IDF
  cosine, ``SimilarExamples``). They differ per request, so they go into the user part
  as an input of their own, ``{fewshot}`` (``per_request_spec``), and the static prefix
  ends before them: the TTFT features see that no cached prefix covers them.

Both render through ``spec_messages`` like everything else.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics.pairwise import linear_kernel

from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import format_example, select_examples
from promptdistill.specs.render import escape_braces, render_text

__all__ = ["FEWSHOT_INPUT", "SimilarExamples", "fixed_spec", "fixed_subsets", "per_request_spec", "swapped_subset",
           "with_fewshot"]

FEWSHOT_INPUT = "fewshot"
"""The input that carries per-request examples in the user part."""


def fixed_spec(spec: Spec, records: Sequence[Mapping[str, Any]]) -> Spec:
    """``spec`` with exactly these train records as its fixed examples (count 0: none)."""
    ids = tuple(str(r["id"]) for r in records)
    examples = dataclasses.replace(spec.examples, count=len(ids), selection="fixed" if ids else "first", ids=ids)
    return spec.with_changes(examples=examples)


def fixed_subsets(
    spec: Spec, train: Sequence[Mapping[str, Any]], count: int, *, n_subsets: int = 3, seed: int = 0
) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """Up to ``n_subsets`` distinct example sets of ``count`` train records, named by how they were drawn.

    The first is the spec's own selection rule (so the baseline's choice is always
    among them), then a label-balanced draw, then seeded random draws.
    """
    if count <= 0:
        return [("none", [])]
    if count > len(train):
        return []
    out: list[tuple[str, list[Mapping[str, Any]]]] = []
    seen: set[tuple[str, ...]] = set()

    def add(name: str, picked: Sequence[Mapping[str, Any]]) -> None:
        key = tuple(sorted(str(r["id"]) for r in picked))
        if key not in seen and len(out) < n_subsets:
            seen.add(key)
            out.append((name, list(picked)))

    rule = spec.examples.selection
    own = spec if rule != "fixed" or len(spec.examples.ids) >= count else spec.with_changes(
        examples=dataclasses.replace(spec.examples, selection="first", ids=()))
    add(own.examples.selection, select_examples(own, train, count, seed))
    balanced = spec.with_changes(examples=dataclasses.replace(spec.examples, selection="balanced", ids=()))
    add("balanced", select_examples(balanced, train, count, seed))
    randomised = spec.with_changes(examples=dataclasses.replace(spec.examples, selection="random", ids=()))
    for s in range(1, 4 * n_subsets):
        if len(out) >= n_subsets:
            break
        add(f"random{s}", select_examples(randomised, train, count, seed + s))
    return out


def swapped_subset(train: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]], *, seed: int,
                   tried: set[tuple[str, ...]] = frozenset()) -> tuple[list[Mapping[str, Any]], str] | None:
    """``current`` with one example swapped for a train record not in it, drawn with ``seed``:
    the set (same order, the new record in the old one's place) and what was swapped
    ('tt-0003 -> tt-0071'); None when every single swap gives a set in ``tried`` (sorted id
    tuples) or the train split has no other record. Deterministic for a seed."""
    import random

    ids = {str(r["id"]) for r in current}
    outside = [r for r in train if str(r["id"]) not in ids]
    options = [(i, r) for i in range(len(current)) for r in outside]
    random.Random(seed).shuffle(options)
    for i, new in options:
        swapped = [*current[:i], new, *current[i + 1:]]
        if tuple(sorted(str(r["id"]) for r in swapped)) not in tried:
            return swapped, f"{current[i]['id']} -> {new['id']}"
    return None


def per_request_spec(spec: Spec) -> Spec:
    """``spec`` with no system examples and a ``{fewshot}`` input leading the user part."""
    if FEWSHOT_INPUT in spec.inputs:
        raise ValueError(f"{spec.where}: inputs: {FEWSHOT_INPUT!r} is reserved for per-request examples")
    header = escape_braces(spec.examples.header or "")
    lead = f"{header}\n\n{{{FEWSHOT_INPUT}}}" if header else f"{{{FEWSHOT_INPUT}}}"
    return spec.with_changes(
        user=f"{lead}\n\n{spec.user}",
        inputs=(*spec.inputs, FEWSHOT_INPUT),
        input_descriptions={**spec.input_descriptions, FEWSHOT_INPUT: "Train examples most similar to this request."},
        examples=dataclasses.replace(spec.examples, count=0, selection="first", ids=()),
    )


class SimilarExamples:
    """Nearest train records by TF-IDF cosine similarity of the rendered user text.

    Args:
        spec: whose user template renders the texts compared.
        train: the train records (the example pool).

    Example:
        >>> sim = SimilarExamples(spec, train).fit()          # doctest: +SKIP
        >>> [r["id"] for r in sim.neighbours(record["inputs"], 2)]  # doctest: +SKIP
        ['tt-0012', 'tt-0040']
    """

    def __init__(self, spec: Spec, train: Sequence[Mapping[str, Any]]):
        self.spec = spec
        self.train = train

    def _text(self, inputs: Mapping[str, Any]) -> str:
        return render_text(self.spec.user, {k: v for k, v in inputs.items() if k != FEWSHOT_INPUT})

    def fit(self) -> "SimilarExamples":
        if not self.train:
            raise ValueError("SimilarExamples needs at least one train record")
        self.vectorizer_ = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1)
        self.matrix_ = self.vectorizer_.fit_transform([self._text(r["inputs"]) for r in self.train])
        return self

    def neighbours(self, inputs: Mapping[str, Any], k: int) -> list[Mapping[str, Any]]:
        """The ``k`` most similar train records, most similar first (ties: file order)."""
        if not hasattr(self, "matrix_"):
            raise RuntimeError("SimilarExamples is not fitted; call fit() first")
        sims = linear_kernel(self.vectorizer_.transform([self._text(inputs)]), self.matrix_)[0]
        order = sorted(range(len(self.train)), key=lambda i: (-sims[i], i))
        return [self.train[i] for i in order[:k]]


def with_fewshot(spec: Spec, records: Sequence[Mapping[str, Any]], similar: SimilarExamples, k: int) -> list[dict[str, Any]]:
    """Copies of ``records`` whose inputs carry the ``k`` nearest examples as ``fewshot`` text.

    ``spec`` is the original spec (its example format and header are used).
    """
    out = []
    for r in records:
        shots = similar.neighbours(r["inputs"], k)
        text = "\n\n".join(format_example(spec, s) for s in shots)
        out.append({**r, "inputs": {**r["inputs"], FEWSHOT_INPUT: text}, "fewshot_ids": [s["id"] for s in shots]})
    return out
