from __future__ import annotations

import pytest

from pipeline.chain.serve.patterns import MAX_PATTERN_LEN, MAX_PATTERNS, compile_patterns
from pipeline.errors import BadParams


def test_prefix_semantics() -> None:
    keep = compile_patterns(["s/", "acc[0-9]+/"])
    assert keep is not None
    assert keep("s/k") and keep("acc12/x")
    assert not keep("xs/k") and not keep("acc/x")


def test_empty_list_keeps_all() -> None:
    assert compile_patterns([]) is None
    assert compile_patterns(None) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (["(("], "does not compile"),
        (["a" * (MAX_PATTERN_LEN + 1)], "longer than"),
        (["a"] * (MAX_PATTERNS + 1), "at most"),
        ([1], "not a string"),
        ("s/", "must be a list"),
        ([r"(a)\1"], "does not compile"),  # backreferences: not linear-time, refused by RE2
    ],
)
def test_bad_patterns(raw, message) -> None:
    with pytest.raises(BadParams, match=message):
        compile_patterns(raw)


def test_pathological_pattern_is_linear() -> None:
    keep = compile_patterns(["(a+)+$"])
    assert keep is not None
    assert not keep("a" * 50_000 + "b")  # would hang a backtracking engine
