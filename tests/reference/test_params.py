"""Tests of reference/params.py: pattern names, parameters and their checks.

Child et al., 2019, sec. 4.3 (stride l, summary width c; several summary heads
need l % c == 0) and sec. 5.1 (combine modes). Every bad input raises a
ValueError that names what was given and what is allowed; every integer is
bounded above (2**31 - 1: the kernels' tables are int32).
"""

from __future__ import annotations

import numpy as np
import pytest

from reference import params, patterns
from reference.extensions import EXTENSIONS

BIG = [2**31, 2**63, np.int64(2**40)]


def test_names():
    # the paper's patterns and the neighbours, then those added since, one module each
    assert params.PATTERNS == ("full", "strided", "fixed", "longformer", "bigbird",
                          *EXTENSIONS)
    assert tuple(EXTENSIONS) == ("strided3",)
    assert params.FACTORIZED == ("full", "strided", "fixed")
    assert params.NEIGHBOURS == ("longformer", "bigbird")
    assert params.COMBINES == ("merged", "multihead", "interleaved")
    assert set(params.PARAMS) == set(params.PATTERNS)
    assert params.MAX_INT == 2**31 - 1
    # reference.patterns re-exports the names from their one home
    assert patterns.PATTERNS is params.PATTERNS and patterns.COMBINES is params.COMBINES


def test_a_parameter_without_a_check_is_refused_at_import(monkeypatch):
    """A module of reference.extensions that takes a parameter no check knows is refused
    when reference is imported (the check itself, on made-up tables); one named in its
    INTEGERS is checked as a bounded integer by check_params."""
    table = {"made_up": (("stride", "levels"), {})}
    with pytest.raises(TypeError, match=r"'made_up' takes \['levels'\].*INTEGERS"):
        params._every_parameter_checked(table, {})
    params._every_parameter_checked(table, {"made_up": {"levels": 1}})
    monkeypatch.setattr(params, "PATTERNS", params.PATTERNS + ("made_up",))
    monkeypatch.setattr(params, "PARAMS", {**params.PARAMS, **table})
    monkeypatch.setattr(params, "INTEGERS", {"made_up": {"levels": 1}})
    monkeypatch.setattr(params, "_LOOKUP", {**params._LOOKUP,
                                            **table})       # what check_params reads
    monkeypatch.setattr(params, "_INTEGER_LOOKUP", {"made_up": {"levels": 1}})
    with pytest.raises(ValueError, match=r"levels must be an integer >= 1, got 0"):
        params.check_params("made_up", 9, 1, "merged", 0, {"stride": 2, "levels": 0})
    assert params.check_params("made_up", 9, 1, "merged", 0, {"stride": 2, "levels": np.int64(3)}) \
        == {"stride": 2, "levels": 3}


def test_is_int():
    for x in (0, 7, np.int32(3), np.int64(-2), np.uint8(1)):
        assert params.is_int(x)
    for x in (True, np.bool_(True), 2.0, "3", None, np.float64(1.0)):
        assert not params.is_int(x)


@pytest.mark.parametrize("check,name,low", [
    (params.check_n, "sequence length n", 1), (params.check_stride, "stride l", 1),
    (params.check_window, "window", 1), (params.check_dilation, "dilation", 1),
    (params.check_n_random, "n_random", 0), (params.check_seed, "seed", 0),
    (params.check_n_heads, "n_heads", 1), (params.check_layer, "layer", 0),
])
def test_integer_checks_bound_both_sides(check, name, low):
    assert check(low) == low and type(check(np.int64(low))) is int
    assert check(params.MAX_INT) == params.MAX_INT
    for bad in [low - 1, True, 2.5, "4", None, *BIG]:
        with pytest.raises(ValueError) as err:
            check(bad)
        msg = str(err.value)
        assert msg.startswith(f"{name} must be an integer >= {low}, got {bad!r}"), msg
        assert f"[{low}, {params.MAX_INT}]" in msg and "2**31 - 1" in msg, msg


def test_huge_stride_is_rejected_everywhere_in_reference():
    """A stride of 2**63 used to be accepted and gave wrong masks."""
    for call in (lambda: patterns.strided(4, 2**63), lambda: patterns.fixed(4, 2**63, 1),
                 lambda: patterns.head_masks("strided", 4, 1, stride=2**31),
                 lambda: patterns.longformer(4, 2**31), lambda: patterns.bigbird(4, 1, 2**31, 0),
                 lambda: patterns.bigbird_random_keys(4, 1, seed=2**31),
                 lambda: params.check_params("fixed", 4, 1, "merged", 0, {"stride": 2**40,
                                                                          "c": 1})):
        with pytest.raises(ValueError, match=r"2\*\*31 - 1"):
            call()


def test_summary_checks():
    assert params.check_summary(8, 2) == 2 and params.check_summary(8, 8, 5) == 8
    assert params.check_summary(6, 4, 0) == 4  # one summary head: c need not divide l
    with pytest.raises(ValueError, match="c=5 > l=4"):
        params.check_summary(4, 5)
    with pytest.raises(ValueError, match="summary width c must be an integer >= 1, got 0"):
        params.check_summary(4, 0)
    with pytest.raises(ValueError, match=r"multiple of c; got l=6, c=4 and a head of summary "
                                         r"rank 1 \(every head has a rank, h, or h // 2 under "
                                         r"multihead, .*\[1, 2, 3, 6\]"):
        params.check_summary(6, 4, 1)
    with pytest.raises(ValueError, match="head index"):
        params.check_summary(6, 3, -1)
    with pytest.raises(ValueError, match="stride l"):
        params.check_summary(True, 1)


def test_summary_rank():
    assert [params.summary_rank(h, "merged") for h in range(5)] == [0, 1, 2, 3, 4]
    assert [params.summary_rank(h, "interleaved") for h in range(5)] == [0, 1, 2, 3, 4]
    assert [params.summary_rank(h, "multihead") for h in range(5)] == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="combine must be one of"):
        params.summary_rank(0, "sum")
    with pytest.raises(ValueError, match="head index"):
        params.summary_rank(-1, "merged")


def test_global_tokens():
    assert params.check_global_tokens(10, [7, 0, 7, np.int64(3)]) == (0, 3, 7)
    assert params.check_global_tokens(10, np.array([9, 1])) == (1, 9)
    assert params.check_global_tokens(10, ()) == ()
    with pytest.raises(ValueError, match=r"global token positions must lie in \[0, n=10\)"):
        params.check_global_tokens(10, [10])
    with pytest.raises(ValueError, match="global_tokens"):
        params.check_global_tokens(10, [-1])
    with pytest.raises(ValueError, match="must be integers, got \\[1.5\\]"):
        params.check_global_tokens(10, [1.5])
    with pytest.raises(ValueError, match="iterable"):
        params.check_global_tokens(10, 3)


def test_n_global_is_bounded_by_n():
    assert params.check_n_global(5, 5) == 5
    with pytest.raises(ValueError, match=r"n_global must be .*got 6 .*\[0, 5\].*n = 5"):
        params.check_n_global(5, 6)


def test_check_params_fills_defaults_drops_none_and_normalises():
    got = params.check_params("longformer", 9, 2, "multihead", 3,
                         {"window": np.int64(3), "global_tokens": np.array([4, 1, 4]),
                          "stride": None})
    assert got == {"window": 3, "dilation": 1, "global_tokens": (1, 4)}
    assert all(type(v) is int for v in (got["window"], got["dilation"]))
    hash(tuple(got.items()))  # usable as a cache key
    assert params.check_params("bigbird", 9, 1, "merged", 0,
                          {"window": 2, "n_random": 1, "n_global": 0}) == \
        {"window": 2, "n_random": 1, "n_global": 0, "seed": 0}
    assert params.check_params("full", 9, 1, "merged", 0, {"stride": None, "c": None}) == {}
    assert list(params.check_params("fixed", 9, 1, "merged", 0, {"c": 2, "stride": 4})) == \
        ["stride", "c"]


@pytest.mark.parametrize("args,match", [
    (("dense", 8, 1, "merged", 0, {}), "pattern must be one of"),
    (("full", 0, 1, "merged", 0, {}), "sequence length n must be"),
    (("full", 8, 0, "merged", 0, {}), "n_heads must be"),
    (("full", 8, 1, "sum", 0, {}), "combine must be one of"),
    (("full", 8, 1, "merged", -1, {}), "layer must be"),
    (("full", 8, 1, "merged", True, {}), "layer must be"),
    (("full", 8, 1, "merged", 0, {"stride": 4}), r"takes parameters \[\], got unexpected"),
    (("strided", 8, 1, "merged", 0, {"stride": 4, "c": 2}), r"unexpected \['c'\]"),
    (("strided", 8, 1, "merged", 0, {}), r"needs the parameter 'stride'.*missing \['stride'\]"),
    (("fixed", 8, 1, "merged", 0, {"stride": 4}), r"needs the parameter 'c'.*missing \['c'\]"),
    (("bigbird", 8, 1, "merged", 0, {"window": 2}),
     r"needs the parameter 'n_random'.*missing \['n_random', 'n_global'\]"),
    (("strided", 8, 1, "merged", 0, {"stride": 2**31}), r"stride l must be .*2\*\*31 - 1"),
    (("fixed", 8, 1, "merged", 0, {"stride": 4, "c": 5}), "c=5 > l=4"),
    (("longformer", 8, 1, "merged", 0, {"window": 0}), "window must be"),
    (("longformer", 8, 1, "merged", 0, {"window": 2, "dilation": 2**31}), "dilation must be"),
    (("longformer", 8, 1, "merged", 0, {"window": 2, "global_tokens": [8]}), "global_tokens"),
    (("bigbird", 8, 1, "merged", 0, {"window": 2, "n_random": -1, "n_global": 0}), "n_random"),
    (("bigbird", 8, 1, "merged", 0, {"window": 2, "n_random": 1, "n_global": 9}), "n_global"),
    (("bigbird", 8, 1, "merged", 0, {"window": 2, "n_random": 1, "n_global": 1, "seed": -1}),
     "seed must be"),
])
def test_check_params_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        params.check_params(*args)


@pytest.mark.parametrize("combine,ok_heads,bad_heads", [
    ("merged", 1, 2), ("interleaved", 1, 2), ("multihead", 2, 3)])
def test_check_params_rank_rule(combine, ok_heads, bad_heads):
    """c not dividing l is allowed while every head has summary rank 0."""
    for layer in (0, 1):
        params.check_params("fixed", 20, ok_heads, combine, layer, {"stride": 6, "c": 4})
        with pytest.raises(ValueError, match="multiple of c"):
            params.check_params("fixed", 20, bad_heads, combine, layer, {"stride": 6, "c": 4})
        params.check_params("fixed", 20, 64, combine, layer, {"stride": 6, "c": 3})
