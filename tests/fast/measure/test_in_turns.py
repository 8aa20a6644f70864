"""``fast.measure.in_turns``: contenders timed in alternation, the conditions recorded.

Child et al., 2019, Table 2 (speed compared within one run): the calls run in turns,
A, B, A, B, with the thread count asked for and restored afterwards.
"""

from __future__ import annotations

import pytest
import torch

from fast.measure.in_turns import in_turns


def test_calls_run_in_turns_with_the_threads_asked_for():
    order, threads = [], []

    def call(name):
        def run():
            order.append(name)
            threads.append(torch.get_num_threads())
        return run

    before = torch.get_num_threads()
    result = in_turns({"a": call("a"), "b": call("b")}, rounds=3, threads=1)
    assert order == ["a", "b"] * 3 and threads == [1] * 6
    assert torch.get_num_threads() == before
    assert result["rounds"] == 3 and result["threads"] == 1 and result["cores"] >= 1
    assert [len(x) for x in result["load_average"]] == [3, 3]
    for name in "ab":
        assert len(result["wall_s"][name]) == 3 == len(result["cpu_s"][name])
        assert result["min_s"][name] == min(result["wall_s"][name])


@pytest.mark.parametrize("kw,message", [
    (dict(calls={}), "calls must name at least one callable, got none"),
    (dict(rounds=0), r"rounds must be an integer >= 1, got 0"),
    (dict(threads=True), r"threads must be an integer >= 1, got True"),
])
def test_bad_arguments(kw, message):
    args = {"calls": {"a": lambda: None}, **kw}
    with pytest.raises(ValueError, match=message):
        in_turns(**args)
