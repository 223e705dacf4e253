"""Product titles and the URL slug the shop's rules make of each.

Titles are assembled from adjectives, materials, products and optional extras (a
colour in parentheses, a size, "& ..." sets, possessives, a leading "The"). The
expected slug is computed by :func:`slugify`, the shop's rules written as code:
"&" becomes "and", apostrophes are dropped, everything is lowercased, the words
"the", "a" and "an" are removed, and the remaining runs of letters and digits are
joined with single hyphens.
"""

from __future__ import annotations

import random
import re

from _common import TOTAL, assign_splits, main, unique

SEED = 20240614
DROPPED = {"the", "a", "an"}
OWNERS = ["Men's", "Women's", "Kids'", "Baby's", "Dog's"]
ADJECTIVES = ["Classic", "Ultra Light", "Waterproof", "Vintage", "Organic", "Foldable", "Heavy Duty", "Mini", "Wireless", "Cozy"]
MATERIALS = ["Wool", "Leather", "Cotton", "Bamboo", "Steel", "Ceramic", "Linen", ""]
PRODUCTS = ["Scarf", "Backpack", "Water Bottle", "Desk Lamp", "Rain Jacket", "Coffee Mug", "Yoga Mat", "Phone Stand", "Cutting Board", "Sneakers", "Beanie", "Tote Bag"]
COLOURS = ["Red", "Navy Blue", "Black", "Forest Green", "Grey", "Sand"]
SIZES = ["500 ml", "2 Pack", "Size 10", "XL", "12 inch", "3 Pieces"]
EXTRAS = ["Case", "Cover", "Strap", "Lid", "Stand", "Pouch"]


def slugify(title: str) -> str:
    """The shop's slug rules (the expected answer)."""
    text = title.replace("&", " and ").replace("'", "").lower()
    words = [w for w in re.findall(r"[a-z0-9]+", text) if w not in DROPPED]
    return "-".join(words)


def draw(r: random.Random) -> tuple[dict, dict]:
    words = []
    if r.random() < 0.15:
        words.append(r.choice(["The", "A"]))
    if r.random() < 0.3:
        words.append(r.choice(OWNERS))
    words.append(r.choice(ADJECTIVES))
    words.append(r.choice(MATERIALS))
    product = r.choice(PRODUCTS)
    words.append(product)
    title = " ".join(w for w in words if w)
    style = r.random()
    if style < 0.25:
        title += f" ({r.choice(COLOURS)})"
    elif style < 0.45:
        title += f", {r.choice(SIZES)}"
    elif style < 0.6:
        title += f" & {r.choice(EXTRAS)}"
    elif style < 0.7:
        title += f" with {r.choice(['a', 'an'])} {r.choice(['Extra', 'Built-in', 'Adjustable'])} {r.choice(EXTRAS)}"
    return {"title": title}, {"slug": slugify(title)}


def build() -> list[dict]:
    rng = random.Random(SEED)
    return assign_splits("fr", unique(lambda: draw(rng), TOTAL, "title"))


if __name__ == "__main__":
    main("format_rules", build)
