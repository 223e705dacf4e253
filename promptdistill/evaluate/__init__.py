"""The shared evaluator: specs over records on the engine, every reply scored."""

from promptdistill.evaluate.evaluator import EvalItem, evaluate, evaluate_many, judge_cost

__all__ = ["EvalItem", "evaluate", "evaluate_many", "judge_cost"]
