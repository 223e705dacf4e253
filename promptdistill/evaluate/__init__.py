"""The shared evaluator: specs over records on the engine, every reply scored."""

from promptdistill.evaluate.evaluator import BATCH_TIMEOUT_S, EvalItem, EvalReport, evaluate, evaluate_many, judge_cost

__all__ = ["BATCH_TIMEOUT_S", "EvalItem", "EvalReport", "evaluate", "evaluate_many", "judge_cost"]
