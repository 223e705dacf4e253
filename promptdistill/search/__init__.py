"""The one search kernel the distiller and the optimizer share.

* :mod:`~promptdistill.search.splits`: train / screen / certify / test records;
* :mod:`~promptdistill.search.budget`: LM calls and minutes;
* :mod:`~promptdistill.search.sequential`: anytime-valid bounds and record planning;
* :mod:`~promptdistill.search.racing`: candidates, screening, the race, selection.
"""

from promptdistill.search.budget import Budget
from promptdistill.search.racing import Candidate, Decision, RaceSettings, race, screen, select
from promptdistill.search.sequential import Plan, confidence_sequence, plan_records
from promptdistill.search.splits import Splits, split_records

__all__ = [
    "Budget",
    "Candidate",
    "Decision",
    "Plan",
    "RaceSettings",
    "Splits",
    "confidence_sequence",
    "plan_records",
    "race",
    "screen",
    "select",
    "split_records",
]
