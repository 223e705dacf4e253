"""Prompt specs: how a production prompt template is described, loaded and rendered.

A spec lives in ``prompts/<name>.yaml``; its dataset in ``datasets/<dataset>`` beside
``prompts/``. The template is split the way a prefix cache wants it: a static system
part (instruction, context, constraints, few-shot examples) rendered first and a
variable user part, holding every input, rendered last::

    name: ticket_triage
    description: Route a support ticket to the team that handles it.
    dataset: ticket_triage.jsonl
    inputs: {ticket: The customer's message.}
    template:
      system:
        instruction: Classify the ticket ...
        constraints: [Answer with exactly one label.]
        examples: {count: 3, selection: balanced, format: "Ticket: {ticket}\\nAnswer: {expected}"}
      user: "Ticket: {ticket}"
    output: {schema: {...}, max_tokens: 20}
    metric: {kind: exact, field: label}
    slo: {ttft_ms: 400, max_quality_drop: 0.02}
    rollout: {canary_share: 0.1, steps: [0.1, 0.5, 1.0]}    # optional: docs/rollout.md

System text (instruction, context, constraints) is literal: braces in it are plain text.
The user template and the example format use ``{input}`` placeholders and ``{{``/``}}``
for literal braces (see :mod:`promptdistill.specs.render`).

Everything that renders a spec goes through :func:`spec_messages`, which is
``render_messages(build_system(spec, examples), spec.user, inputs)``: the optimizer, the
evaluator and the published template (:func:`template_content`) share that one path.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from promptdistill.core.errors import SpecError, error_listing
from promptdistill.core.jsonio import canonical_json
from promptdistill.specs.checks import spec_errors
from promptdistill.specs.plugins import source_hash

__all__ = ["ExamplesConfig", "Load", "MetricSpec", "OBJECTIVES", "Rollout", "Slo", "Spec", "rules_block", "spec_error",
           "spec_from_dict"]

RULES_HEADER = "Rules:"
"""Heading of the constraints block, in the system text and in ``instruction_text()``."""


@dataclass(frozen=True)
class ExamplesConfig:
    """How many few-shot examples the system part carries and how they are chosen."""

    count: int = 0
    """Number of examples taken from the dataset's train split."""
    selection: str = "first"
    """'first' (file order), 'random' (seeded sample), 'balanced' (round-robin over
    expected labels) or 'fixed' (the records named in ``ids``, in that order)."""
    format: str | None = None
    """Template for one example: input placeholders, ``{expected}`` (objects as JSON) and
    ``{expected_<field>}`` for a field of an object ``expected``. None: one
    ``Name: {name}`` line per input, then ``Answer: {expected}``."""
    ids: tuple[str, ...] = ()
    """Record ids for the 'fixed' selection."""
    header: str = "Examples:"
    """Line printed before the examples."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", tuple(self.ids))


@dataclass(frozen=True)
class MetricSpec:
    """How a reply is scored against the expected output (see :mod:`promptdistill.specs.metrics`)."""

    kind: str = "exact"
    """exact | json_field | numeric | contains | judge_rubric | python."""
    field: str | None = None
    """exact/numeric/contains: compare this field of the JSON reply (and of ``expected``
    when it is an object) instead of the whole reply."""
    fields: tuple[str, ...] = ()
    """json_field: the fields compared (default: every key of ``expected``)."""
    tolerance: float = 0.0
    """numeric and json_field numbers: largest absolute difference still counted equal."""
    case_sensitive: bool = False
    """Compare strings case-sensitively (labels are compared case-insensitively by default)."""
    pattern: str | None = None
    """A regular expression the whole (stripped) answer must match, else the score is 0."""
    rubric: str | None = None
    """judge_rubric: what the judge looks for (scored by the judge, not here)."""
    function: str | None = None
    """python: the project's scoring function, ``"module:callable"`` (see :mod:`promptdistill.specs.plugins`)."""
    scores: str | None = None
    """python: ``"binary"`` when the function returns only 0 and 1 (an allowed-values rule):
    a race then uses the group-sequential test, and any other value is an error. None:
    scores anywhere in [0, 1]."""
    project_dir: str | None = dataclasses.field(default=None, compare=False)
    """python: where ``function``'s module is looked up first (the folder above ``prompts/``).
    Not part of the spec's content: moving a project does not change its specs."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))

    @property
    def discrete(self) -> bool:
        """Scores on a small fixed grid (exact, numeric and a python metric declared
        ``scores: binary``: 0/1; contains, json_field: shares of a few checks). A race tests
        these with the group-sequential test; judge and other python scores count as
        continuous (an anytime-valid bound)."""
        return self.kind in ("exact", "numeric", "contains", "json_field") or self.scores == "binary"

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, in the shape of the YAML file."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v != () and k != "project_dir"}
        if "fields" in out:
            out["fields"] = list(out["fields"])
        return out


@dataclass(frozen=True)
class Load:
    """The load a service runs a template at: an open-loop request rate or a concurrency.

    Exactly one is set. A rate is how production traffic arrives (independent requests,
    Poisson); a concurrency is a fixed number of callers that each wait for their reply.
    """

    rate_rps: float | None = None
    """Requests per second arriving independently of replies (open loop)."""
    concurrency: int | None = None
    """Requests in flight at any time (closed loop)."""

    def __post_init__(self) -> None:
        if (self.rate_rps is None) == (self.concurrency is None):
            raise ValueError("a load sets exactly one of rate_rps and concurrency")
        if self.rate_rps is not None and not self.rate_rps > 0:
            raise ValueError(f"load.rate_rps must be above 0, got {self.rate_rps}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"load.concurrency must be at least 1, got {self.concurrency}")

    @property
    def kind(self) -> str:
        return "rate" if self.rate_rps is not None else "concurrency"

    @property
    def value(self) -> float:
        return float(self.rate_rps if self.rate_rps is not None else self.concurrency)  # type: ignore[arg-type]

    def describe(self) -> str:
        """'4 req/s' or 'concurrency 8', as reasons and reports name the load."""
        return f"{self.rate_rps:g} req/s" if self.rate_rps is not None else f"concurrency {self.concurrency}"

    def to_dict(self) -> dict[str, Any]:
        return {"rate_rps": self.rate_rps} if self.rate_rps is not None else {"concurrency": self.concurrency}


OBJECTIVES = ("latency", "quality")
"""``slo.objective``'s values, the default first."""


@dataclass(frozen=True)
class Slo:
    """The service-level objective the optimizer must respect."""

    ttft_ms: float | None = None
    """Time-to-first-token target in milliseconds; None: no target. With a ``load`` it is
    the target of the ``ttft_percentile``-th percentile at that load."""
    max_quality_drop: float = 0.02
    """Largest drop in the metric's mean score (absolute, in [0, 1]) an optimized prompt may have."""
    load: Load | None = None
    """The service's load. Set: latency decisions compare the predicted TTFT percentile at
    this load; None: the TTFT of a request sent alone (cold, warm, expected)."""
    ttft_percentile: float = 95.0
    """Which TTFT percentile ``ttft_ms`` targets at ``load`` (P95 by default)."""
    objective: str = "latency"
    """What a published prompt must improve: "latency" (faster, or as fast and no worse: the
    default) or "quality" (better by ``min_quality_gain``, and no slower beyond the TTFT
    model's resolution or within ``ttft_ms``)."""
    min_quality_gain: float = 0.02
    """With ``objective: quality``: the gain in mean score over the baseline (absolute, in
    (0, 1]) a winner is certified to exceed (superiority by this margin)."""

    @property
    def latency_name(self) -> str:
        """What latency the decisions use: 'P95 TTFT at 4 req/s', or 'solo TTFT'."""
        if self.load is None:
            return "solo TTFT"
        return f"P{self.ttft_percentile:g} TTFT at {self.load.describe()}"

    def to_dict(self) -> dict[str, Any]:
        """The YAML shape; a spec without a load keeps its earlier shape (and hash)."""
        out: dict[str, Any] = {"ttft_ms": self.ttft_ms, "max_quality_drop": self.max_quality_drop}
        if self.load is not None:
            out["load"] = self.load.to_dict()
            out["ttft_percentile"] = self.ttft_percentile
        # Likewise the objective: a spec that keeps the default keeps its shape and hash.
        if self.objective != OBJECTIVES[0] or self.min_quality_gain != Slo.min_quality_gain:
            out["objective"] = self.objective
            out["min_quality_gain"] = self.min_quality_gain
        return out


@dataclass(frozen=True)
class Rollout:
    """How a certified winner reaches production: first on the ``canary`` label with a share
    of production's traffic, then widened step by step (docs/rollout.md). ``spec_errors``
    checks the shares."""

    canary_share: float = 0.1
    """The share of production's keys the canary starts with, in (0, 1)."""
    steps: tuple[float, ...] = ()
    """The shares the canary goes through, increasing, from ``canary_share`` to 1.0 (at 1.0
    it becomes production). Empty: ``canary_share``, then 0.5 when above it, then 1.0."""

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        if not steps:
            steps = (self.canary_share, *((0.5,) if self.canary_share < 0.5 else ()), 1.0)
        object.__setattr__(self, "steps", steps)

    def to_dict(self) -> dict[str, Any]:
        return {"canary_share": self.canary_share, "steps": list(self.steps)}


@dataclass(frozen=True)
class Spec:
    """A loaded, validated prompt spec. Frozen: ``with_changes`` returns a new one."""

    name: str
    description: str
    dataset: Path
    inputs: tuple[str, ...]
    instruction: str
    user: str
    context: str | None = None
    constraints: tuple[str, ...] = ()
    examples: ExamplesConfig = field(default_factory=ExamplesConfig)
    output_schema: dict[str, Any] | None = None
    schema_from: str | None = None
    """The input whose value is the reply's JSON Schema for that request (a schema, or a
    function definition whose ``parameters`` are one): per-request constrained decoding."""
    max_tokens: int | None = None
    metric: MetricSpec = field(default_factory=MetricSpec)
    slo: Slo = field(default_factory=Slo)
    rollout: Rollout | None = None
    """How a winner is rolled out (a canary and its steps); None: promoted to production at once."""
    input_descriptions: Mapping[str, str] = field(default_factory=dict)
    source_path: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "constraints", tuple(self.constraints))
        object.__setattr__(self, "dataset", Path(self.dataset))
        object.__setattr__(self, "input_descriptions", dict(self.input_descriptions))
        errors = spec_errors(self)
        if errors:
            raise spec_error(self.where, errors)

    def __hash__(self) -> int:  # dict fields: hash the canonical content instead
        return hash(self.spec_hash())

    @property
    def where(self) -> str:
        """How errors name this spec: its file, or ``<spec NAME>`` when built in code."""
        return str(self.source_path) if self.source_path else f"<spec {self.name}>"

    def instruction_text(self) -> str:
        """Instruction plus constraints, formatted exactly as in the system text."""
        parts = [self.instruction.strip()]
        if self.constraints:
            parts.append(rules_block(self.constraints))
        return "\n\n".join(parts)

    def with_changes(self, **changes: Any) -> "Spec":
        """A new, re-validated spec with some fields changed; this one is untouched.

        Example:
            >>> shorter = spec.with_changes(instruction="Classify the ticket.", constraints=())
        """
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"Spec has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The spec in the shape of its YAML file (dataset as a file name)."""
        ex = self.examples
        examples: dict[str, Any] = {"count": ex.count, "selection": ex.selection, "header": ex.header}
        if ex.format is not None:
            examples["format"] = ex.format
        if ex.ids:
            examples["ids"] = list(ex.ids)
        system: dict[str, Any] = {"instruction": self.instruction}
        if self.context is not None:
            system["context"] = self.context
        system["constraints"] = list(self.constraints)
        system["examples"] = examples
        output: dict[str, Any] = {"schema": self.output_schema, "max_tokens": self.max_tokens}
        if self.schema_from is not None:
            output["schema_from"] = self.schema_from
        out = {
            "name": self.name,
            "description": self.description,
            "dataset": self.dataset.name,
            "inputs": {n: self.input_descriptions.get(n, "") for n in self.inputs},
            "template": {"system": system, "user": self.user},
            "output": output,
            "metric": self.metric.to_dict(),
            "slo": self.slo.to_dict(),
        }
        if self.rollout is not None:  # a spec without one keeps its earlier shape (and hash)
            out["rollout"] = self.rollout.to_dict()
        return out

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON of :meth:`to_dict` (the file's content, not its path),
        and of a python metric's source: a changed metric is a changed spec."""
        data = self.to_dict()
        if self.metric.kind == "python" and self.metric.function:
            data["metric_source_sha256"] = source_hash(self.metric.function, self.metric.project_dir)
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def rules_block(constraints: Sequence[str]) -> str:
    """The constraints as the system text shows them: a ``Rules:`` heading and one ``- `` line each."""
    return RULES_HEADER + "\n" + "\n".join(f"- {c.strip()}" for c in constraints)


def spec_error(where: str, errors: Sequence[str]) -> SpecError:
    """A SpecError listing every ``field: reason`` of one spec, each prefixed by ``where``."""
    return error_listing([f"{where}: {e}" for e in errors])


def spec_from_dict(data: Mapping[str, Any], *, source_path: str | Path | None = None) -> Spec:
    """Build a Spec from an already schema-valid dict (the YAML file's content)."""
    tmpl = data["template"]
    system = tmpl["system"]
    ex = system.get("examples") or {}
    out = data.get("output") or {}
    metric = dict(data["metric"])
    slo = data.get("slo") or {}
    rollout = data.get("rollout")
    src = Path(source_path) if source_path else None
    project = src.parent.parent if src else Path(".")
    datasets_dir = project / "datasets"
    return Spec(
        name=data["name"],
        description=data["description"],
        dataset=datasets_dir / data["dataset"],
        inputs=tuple(data["inputs"]),
        input_descriptions=dict(data["inputs"]),
        instruction=system["instruction"],
        context=system.get("context"),
        constraints=tuple(system.get("constraints") or ()),
        examples=ExamplesConfig(
            count=ex.get("count", 0),
            selection=ex.get("selection", "first"),
            format=ex.get("format"),
            ids=tuple(ex.get("ids") or ()),
            header=ex.get("header", "Examples:"),
        ),
        user=tmpl["user"],
        output_schema=out.get("schema"),
        schema_from=out.get("schema_from"),
        max_tokens=out.get("max_tokens"),
        metric=MetricSpec(**{k: v for k, v in metric.items() if v is not None}, project_dir=str(project.resolve())),
        slo=Slo(ttft_ms=slo.get("ttft_ms"), max_quality_drop=slo.get("max_quality_drop", 0.02),
                load=Load(**slo["load"]) if slo.get("load") else None,
                ttft_percentile=slo.get("ttft_percentile", 95.0), objective=slo.get("objective", OBJECTIVES[0]),
                min_quality_gain=slo.get("min_quality_gain", Slo.min_quality_gain)),
        rollout=None if rollout is None else Rollout(
            canary_share=rollout.get("canary_share", (rollout.get("steps") or [0.1])[0]),
            steps=tuple(rollout.get("steps") or ())),
        source_path=src,
    )

