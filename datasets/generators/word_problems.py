"""Arithmetic word problems with small whole numbers, one or two steps.

Each template is a function that draws its numbers, writes the question and computes
the result and a one-line calculation ("20 + 8 = 28") from the same numbers (so answers are right by construction; divisions are
built from a product so they are exact, subtractions never go below zero).
"""

from __future__ import annotations

import random

from _common import TOTAL, assign_splits, main, unique

SEED = 20240613
NAMES = [("Sam", "he"), ("Maria", "she"), ("Leo", "he"), ("Aisha", "she"), ("Tom", "he"), ("Yuki", "she"), ("Ben", "he"), ("Nora", "she")]
THINGS = ["apples", "stickers", "marbles", "pencils", "cookies", "books", "stamps", "shells", "cards", "eggs"]


def add(r):
    (n, p), t, a, b = r.choice(NAMES), r.choice(THINGS), r.randint(2, 20), r.randint(2, 20)
    return f"{n} has {a} {t}. {p.capitalize()} gets {b} more {t}. How many {t} does {n} have now?", f"{a} + {b} = {a + b}", a + b


def sub(r):
    (n, p), (m, _), t = r.choice(NAMES), r.choice(NAMES), r.choice(THINGS)
    a = r.randint(8, 30)
    b = r.randint(1, a - 1)
    return f"{n} had {a} {t} and gave {b} of them to a friend. How many {t} does {n} have left?", f"{a} - {b} = {a - b}", a - b


def mul(r):
    t, a, b = r.choice(THINGS), r.randint(2, 9), r.randint(2, 9)
    return f"There are {a} boxes and each box holds {b} {t}. How many {t} are there in total?", f"{a} * {b} = {a * b}", a * b


def div(r):
    (n, _), t, each, k = r.choice(NAMES), r.choice(THINGS), r.randint(2, 9), r.randint(2, 6)
    return f"{n} shares {each * k} {t} equally among {k} friends. How many {t} does each friend get?", f"{each * k} / {k} = {each}", each


def price(r):
    item, cost, k = r.choice(["pen", "notebook", "ticket", "sandwich", "ball"]), r.randint(2, 12), r.randint(2, 6)
    return f"One {item} costs {cost} dollars. How many dollars do {k} {item}s cost?", f"{cost} * {k} = {cost * k}", cost * k


def two_step(r):
    (n, p), t = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(5, 20), r.randint(2, 15)
    c = r.randint(1, a + b - 1)
    return f"{n} has {a} {t}. {p.capitalize()} buys {b} more and then loses {c}. How many {t} does {n} have now?", f"{a} + {b} - {c} = {a + b - c}", a + b - c


def change(r):
    (n, _), cost, paid = r.choice(NAMES), r.randint(3, 18), r.choice([20, 50])
    return f"{n} buys a toy for {cost} dollars and pays with a {paid} dollar note. How many dollars of change does {n} get?", f"{paid} - {cost} = {paid - cost}", paid - cost


def ages(r):
    (n, _), (m, _), age, diff = r.choice(NAMES), r.choice(NAMES), r.randint(5, 15), r.randint(2, 9)
    if n == m:
        m = "Alex"
    return f"{n} is {age} years old. {m} is {diff} years older than {n}. How old is {m}?", f"{age} + {diff} = {age + diff}", age + diff


KINDS = [add, add, sub, sub, mul, div, price, two_step, change, ages]


def draw(r: random.Random) -> tuple[dict, dict]:
    question, calculation, result = r.choice(KINDS)(r)
    return {"question": question}, {"calculation": calculation, "result": result}


def build() -> list[dict]:
    rng = random.Random(SEED)
    return assign_splits("wp", unique(lambda: draw(rng), TOTAL, "question"))


if __name__ == "__main__":
    main("word_problems", build)
