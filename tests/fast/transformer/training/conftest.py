"""Fixtures of the training tests: the digits dataset (scikit-learn's 8x8 digits, shipped
with the package), loaded once per test module (Child et al., 2019, sec. 7: image data)."""

from __future__ import annotations

import pytest

from fast.data import load


@pytest.fixture(scope="module")
def digits():
    return load("digits")
