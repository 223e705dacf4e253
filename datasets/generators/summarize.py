"""Meeting notes and a reference summary of each.

Notes are assembled from facts drawn first: one status update, one problem, one
decision and two action items (each with an owner and a day), mixed with filler
sentences that are not key points. The reference summary and key points are written
from the same facts, so they are complete and faithful by construction.

``expected`` also keeps the facts themselves (``facts``: status, problem, decision, the
action items with owner and deadline, and the small-talk sentences), which the spec's
metric (``prompts/summarize_metric.py``) looks for in a reply. Few-shot examples show only
the output schema's keys, so ``facts`` never reaches a prompt.
"""

from __future__ import annotations

import random

from _common import TOTAL, assign_splits, main, unique

SEED = 20240615
TEAMS = ["mobile team", "support team", "warehouse team", "marketing team", "data team", "finance team"]
PEOPLE = ["Priya", "Marco", "Ana", "Jonas", "Wei", "Fatima", "Lucas", "Emma", "Kofi", "Sofia"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
THINGS = ["new checkout page", "April newsletter", "returns dashboard", "Android login fix", "holiday rota", "updated price list", "new onboarding guide"]
PROBLEMS = [
    "the nightly export failed twice this week",
    "customers wait more than ten minutes on the phone line",
    "the label printer in bay 3 keeps jamming",
    "the payment provider raised its fees by 2 percent",
    "the staging server ran out of disk space",
    "two large orders were shipped to the wrong address",
    "the weekly report shows a drop in repeat customers",
]
DECISIONS = [
    "postpone the dark mode feature to next quarter",
    "hire one temporary agent for the holiday season",
    "switch couriers for international parcels",
    "move the weekly meeting to Thursday mornings",
    "pause the paid social campaign until the new designs are ready",
    "keep the current prices until January",
]
ACTIONS = [
    "write the release notes",
    "send the fee details to finance",
    "order a replacement printer",
    "draft the job advert",
    "clean up the staging server",
    "call the two affected customers",
    "update the help page",
]
FILLER = [
    "The meeting started ten minutes late because of a room booking mix-up.",
    "Everyone was present except {p}, who is on holiday.",
    "There was some small talk about the office coffee machine.",
    "{p} shared a few photos from the team lunch.",
]


def draw(r: random.Random) -> tuple[dict, dict]:
    team = r.choice(TEAMS)
    p1, p2, p3, p4 = r.sample(PEOPLE, 4)
    thing, problem, decision = r.choice(THINGS), r.choice(PROBLEMS), r.choice(DECISIONS)
    a1, a2 = r.sample(ACTIONS, 2)
    d0, d1, d2 = r.choice(DAYS), r.choice(DAYS), r.choice(DAYS)
    facts = [
        f"{p1} said the {thing} is finished and goes live on {d0}.",
        f"{p2} reported that {problem}.",
        f"After some discussion the team agreed to {decision}.",
    ]
    r.shuffle(facts)
    filler = [f.format(p=p4) for f in r.sample(FILLER, r.randint(1, 2))]
    body = facts[:1] + filler[:1] + facts[1:] + filler[1:]
    weekday = r.choice(DAYS)
    text = (
        f"Notes from the {weekday} meeting of the {team}. " + " ".join(body)
        + f" Action items: {p3} will {a1} by {d1}; {p2} will {a2} by {d2}."
    )
    expected = {
        "summary": f"The {team} confirmed the {thing} goes live on {d0}, noted that {problem}, and agreed to {decision}.",
        "key_points": [
            f"The {thing} goes live on {d0} ({p1}).",
            f"Problem: {problem} ({p2}).",
            f"Decision: {decision}.",
            f"{p3} will {a1} by {d1}.",
            f"{p2} will {a2} by {d2}.",
        ],
        "confidence_score": 0.9,
        "facts": {
            "status": {"owner": p1, "thing": thing, "day": d0},
            "problem": {"owner": p2, "text": problem},
            "decision": decision,
            "actions": [{"owner": p3, "task": a1, "deadline": d1}, {"owner": p2, "task": a2, "deadline": d2}],
            "small_talk": filler,
        },
    }
    return {"notes": text}, expected


def build() -> list[dict]:
    rng = random.Random(SEED)
    return assign_splits("sum", unique(lambda: draw(rng), TOTAL, "notes"))


if __name__ == "__main__":
    main("summarize", build)
