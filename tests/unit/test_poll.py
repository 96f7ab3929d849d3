"""tests/support/poll.py, the one poller of the tests: what it returns and how it fails."""

from __future__ import annotations

import itertools

import pytest

from tests.support.poll import until, until_sync


async def test_until_returns_the_first_truthy_value_sync_or_async() -> None:
    counter = itertools.count()
    assert await until(lambda: next(counter) >= 3 and "done", "three polls") == "done"

    async def ready() -> int:
        return 7

    assert await until(ready, "an async condition") == 7


def test_accept_decides_and_the_value_is_returned_even_if_falsy() -> None:
    counter = itertools.count()
    assert until_sync(lambda: next(counter) - 2, "zero", accept=lambda v: v == 0) == 0


async def test_a_timeout_names_the_condition_its_last_value_and_the_detail() -> None:
    with pytest.raises(AssertionError) as caught:
        await until(lambda: [], within_s=0.05, detail=lambda: "the process said: boom")
    text = str(caught.value)
    assert "lambda: []" in text  # a lambda without a ``what`` is shown by its source
    assert "last value []" in text and "the process said: boom" in text


def test_the_blocking_form_fails_the_same_way() -> None:
    def never() -> dict[str, int]:
        return {"n": 1}

    with pytest.raises(AssertionError, match=r"never \(last value \{'n': 1\}\)"):
        until_sync(never, within_s=0.05, accept=lambda d: d["n"] == 2)
    with pytest.raises(AssertionError, match="the thing I wait for"):
        until_sync(lambda: 0, "the thing I wait for", within_s=0.05)
