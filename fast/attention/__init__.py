"""Sparse Transformer attention, called as SDPA is (Child et al., 2019, sections 4-5).

``api.py``: ``sparse_attention``, the public entry point and its contract; ``plan.py``:
one call plan per call signature, every check once; ``paths.py``: which path a call
runs, and each path bound.
"""

from fast.attention.api import sparse_attention
from fast.attention.paths import BACKENDS, choose_path, resolve_backend
from fast.attention.plan import CallPlan, call_plans, clear_call_plans, finite_default

__all__ = ["BACKENDS", "CallPlan", "call_plans", "choose_path", "clear_call_plans",
           "finite_default", "resolve_backend", "sparse_attention"]
