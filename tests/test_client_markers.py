"""The special-token policy always ends, and no marker a value makes survives it.

A one-character marker cannot be split by a zero-width space: escaping it that way
inserted a space after it forever (``render`` never returned). It is now replaced by
U+FFFD, and the property below holds for random markers (one-character ones, markers that
are prefixes of each other, ``<|x|>`` and ``<｜x｜>`` shapes) and random values.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptdistill.client import DEFAULT_SPECIAL_TOKENS, SpecialTokenError, Templates
from promptdistill.registry import Registry

ZWSP, REPLACEMENT = "\u200b", "\ufffd"
# Written out again here, as an independent oracle for "a marker the tokenizer would match".
SHAPES = re.compile(r"<\|[A-Za-z0-9_.:/-]{1,48}\|>|<\uff5c[^\uff5c<>]{1,48}\uff5c>")
MARKER_CHARS = "<|>\uff5c\u00a7[]ab"
STATIC = "Note: {a} then {b}."  # its own text shares no character with any marker


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    reg = Registry(tmp_path_factory.mktemp("markers") / "registry")
    reg.publish("notes", {"name": "notes", "system": "Summarize.", "user": STATIC, "inputs": ["a", "b"],
                          "output_schema": None, "response_format": "none", "max_tokens": 16, "sampling": {}})
    return reg.root


def _survivors(text: str, markers: tuple[str, ...]) -> list[str]:
    found = [m for m in markers if m in text]
    return found + SHAPES.findall(text)


def test_a_one_character_marker_in_a_value_is_replaced_and_render_returns(root):
    t = Templates(root, special_tokens=(*DEFAULT_SPECIAL_TOKENS, "\u00a7")).get("notes:1")
    content = t.render(a="see \u00a72 and \u00a73", b="<|im_end|>")[1]["content"]
    assert content == f"Note: see {REPLACEMENT}2 and {REPLACEMENT}3 then <{ZWSP}|im_end|>."
    strict = Templates(root, special_tokens=("\u00a7",), on_special_tokens="reject").get("notes:1")
    with pytest.raises(SpecialTokenError, match="input 'a': holds the special-token string '\u00a7' at char 4"):
        strict.render(a="see \u00a72", b="")


def test_a_special_token_holding_the_replacement_character_is_refused(root):
    with pytest.raises(ValueError, match="special_tokens: .* holds U\\+FFFD"):
        Templates(root, special_tokens=("<x\ufffd>",))


_marker = st.text(MARKER_CHARS, min_size=1, max_size=4)


@st.composite
def _markers(draw) -> tuple[str, ...]:
    """1-4 markers, some of them prefixes of another (``<|``, ``<|a``, ``<``...)."""
    markers = draw(st.lists(_marker, min_size=1, max_size=4))
    prefixes = [m[:k] for m in markers for k in draw(st.lists(st.integers(1, 4), max_size=2)) if k <= len(m)]
    return tuple(dict.fromkeys(markers + prefixes))


@pytest.mark.timeout(300)  # a render that never returns fails here instead of hanging the run
@settings(max_examples=300, deadline=None)
@given(markers=_markers(), a=st.text(MARKER_CHARS + "xyz", max_size=30), b=st.text(MARKER_CHARS + "xyz", max_size=12))
def test_escaping_ends_and_leaves_no_marker_a_value_made(root, markers, a, b):
    plain = STATIC.format(a=a, b=b)
    t = Templates(root, special_tokens=markers).get("notes:1")
    content = t.render(a=a, b=b)[1]["content"]
    assert _survivors(content, markers) == [], (markers, a, b, content)
    # Nothing else changed: zero-width spaces inserted, one-character markers replaced.
    one_char = {m for m in markers if len(m) == 1}
    unspaced = content.replace(ZWSP, "")
    assert len(unspaced) == len(plain)
    assert all(x == y or (x == REPLACEMENT and y in one_char) for x, y in zip(unspaced, plain)), (markers, a, b)

    # 'reject' refuses exactly the values that make a marker (the template's text makes none).
    strict = Templates(root, special_tokens=markers, on_special_tokens="reject").get("notes:1")
    if _survivors(plain, markers):
        with pytest.raises(SpecialTokenError):
            strict.render(a=a, b=b)
    else:
        assert strict.render(a=a, b=b)[1]["content"] == plain == content
