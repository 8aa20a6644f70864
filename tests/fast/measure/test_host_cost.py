"""The host-cost benchmark itself: every case measured, its counts what the paths promise.

Child et al., 2019, section 5.5. ``python -m fast bench --host-cost``
(``fast.measure.host_cost``) reports per call, forward and forward+backward, the host
time, the Triton launches (stubbed) and every other op dispatched. Here it runs with few
calls (its times mean nothing on a shared machine; its counts do): every case and every
way of binding an operator is there, the counts agree with what
``tests/fast/kernels/test_host_cost.py`` asserts of the path, the kinds of op are named,
and the report prints a line per case and part.
"""

from __future__ import annotations

import pytest

from fast.measure import host_cost
from tests.fast.kernels.triton_helpers import needs_interpreter


def test_each_op_has_its_kind():
    kinds = {name: host_cost.kind(name) for name in (
        "aten.empty.memory_format", "aten.zeros.default", "aten._to_copy.default",
        "aten.sum.dim_IntList", "aten._local_scalar_dense.default", "aten.detach.default",
        "sparse_transformer.triton.default", "aten.arange.start")}
    assert kinds == {"aten.empty.memory_format": "allocation", "aten.zeros.default": "fill",
                     "aten._to_copy.default": "cast", "aten.sum.dim_IntList": "reduction",
                     "aten._local_scalar_dense.default": "host read",
                     "aten.detach.default": "view",
                     "sparse_transformer.triton.default": "operator",
                     "aten.arange.start": "other"}


@pytest.mark.slow
@needs_interpreter
def test_the_benchmark_measures_every_case_and_reports_it():
    data = host_cost.measure({"calls": 3})
    results = data["results"]
    assert set(results) == {"triton/fused", "triton/baseline", "structured", "dense", "full",
                            "layer/triton/fused", "layer/triton/baseline", "layer/dense"}
    assert set(data["operator"]) == {"custom_op", "library+Function", "library+ours"}
    fused = results["triton/fused"]
    assert (fused["fwd"]["launches"], fused["fwd_bwd"]["launches"]) == (2, 6)
    assert set(fused["fwd"]["ops_by_kind"]) == {"allocation", "operator"}
    assert "fill" not in fused["fwd_bwd"]["ops_by_kind"]
    assert "cast" not in fused["fwd_bwd"]["ops_by_kind"]
    assert results["dense"]["fwd"]["ops"] == 1
    # "full" is SDPA's op, and on the CPU the look for overflowing scores before it
    # (structured.looks_for_overflow; none on a GPU: test_full_by_a_gpus_default_is_sdpa_alone)
    full = dict(results["full"]["fwd"]["ops_by_name"])
    look = {"aten.linalg_vector_norm.default": 2, "aten.mul.Tensor": 2, "aten.ge.Scalar": 1,
            "aten._local_scalar_dense.default": 1}
    assert {op: full.pop(op) for op in look if op in full} == look
    assert full == results["dense"]["fwd"]["ops_by_name"]
    for r in (*results.values(), *data["operator"].values()):
        for part in ("fwd", "fwd_bwd"):
            assert r[part]["wall_us"] > 0 and r[part]["cpu_us"] > 0
            # each case against dense SDPA's call in the same run
            assert r[part]["vs_dense"] == round(
                r[part]["cpu_us"] / results["dense"][part]["cpu_us"], 2)
    assert results["dense"]["fwd"]["vs_dense"] == 1.0
    lines = host_cost.report(data).splitlines()
    assert len(lines) == 2 + 2 * len(results) + 1
