"""``fast.plots.samples.image_grid``: sampled images side by side, with a one-pixel
border, in the grid the caller asks for (Child et al., 2019, sec. 7, the sample figures)."""

from __future__ import annotations

import numpy as np
import pytest

from fast.plots.samples import image_grid


def test_image_grid_layout():
    seqs = np.arange(8 * 4, dtype=np.int64).reshape(8, 4) % 256   # eight 2x2 grey images
    assert image_grid(seqs, (2, 2, 1)).shape == (3 * 3 + 1, 3 * 3 + 1, 3)        # square: 3x3 cells
    assert image_grid(seqs, (2, 2, 1), cols=4).shape == (2 * 3 + 1, 4 * 3 + 1, 3)  # 2 rows of 4
    with pytest.raises(ValueError, match="cols"):
        image_grid(seqs, (2, 2, 1), cols=0)

