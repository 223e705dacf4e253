"""Instruction distillation: prune and rewrite an instruction, keep what the task needs.

* :mod:`~promptdistill.specs.clauses`: cutting an instruction into prunable clauses;
* :mod:`~promptdistill.distill.candidates`: clause scores, pruning rules, the candidates;
* :mod:`~promptdistill.distill.loop`: ``distill(engine, spec)``, the rounds and the race;
* :mod:`~promptdistill.distill.result`: ``DistillResult`` and its files.
"""

from promptdistill.distill.loop import DistillConfig, distill

__all__ = ["DistillConfig", "distill"]
