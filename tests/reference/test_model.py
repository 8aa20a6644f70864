"""fast/transformer/network/model.py (float64) against its NumPy twin reference/model.py, which uses
reference.patterns.head_masks and reference.attention.attend (sec. 4-5)."""

import numpy as np
import pytest
import torch

from fast.transformer.config import ModelConfig
from fast.transformer.network.model import SparseTransformer
from reference import model as ref_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _compare(cfg, seed=0, batch=2):
    torch.manual_seed(seed)
    model = SparseTransformer(cfg).double().eval()
    with torch.no_grad():                 # non-trivial norms and biases
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randint(0, cfg.vocab_size + 1, (batch, cfg.n_ctx))
    fast = model(x).detach().numpy()
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    ref = ref_model.forward(weights, cfg, x.numpy())
    err = np.abs(fast - ref).max()
    print(cfg.pattern, cfg.combine, cfg.n_heads, err)
    assert fast.shape == ref.shape == (batch, cfg.n_ctx, cfg.vocab_size)
    assert err < 1e-10


@pytest.mark.parametrize("pattern, c", [("full", None), ("strided", None), ("fixed", 2)])
@pytest.mark.parametrize("combine", ["merged", "multihead", "interleaved"])
def test_text_model_matches_numpy_twin(pattern, combine, c):
    heads = 1 if combine == "merged" else 2      # H = 1 and H > 1
    cfg = ModelConfig(vocab_size=11, n_ctx=23, d_model=48 if heads == 2 else 24,
                      n_heads=heads, n_layers=3, pattern=pattern, combine=combine, stride=6,
                      c=c, embedding="text")
    _compare(cfg)


@pytest.mark.parametrize("pattern, combine, c", [("strided", "multihead", None),
                                                 ("fixed", "merged", 1)])
def test_image_model_half_size_matches_numpy_twin(pattern, combine, c):
    """(row, column, channel) embeddings, half-size ff and q/k, odd image shape."""
    cfg = ModelConfig(vocab_size=7, n_ctx=30, d_model=16, n_heads=2, n_layers=2,
                      pattern=pattern, combine=combine, stride=6, c=c, embedding="image",
                      image_shape=(5, 2, 3), ff_mult=2, qk_half=True)
    _compare(cfg)


def test_reference_coordinates():
    class Cfg:
        embedding, image_shape = "image", (2, 3, 2)
    row, col, ch = ref_model.coordinates(Cfg, 12)
    assert row.tolist() == [0] * 6 + [1] * 6
    assert col.tolist() == [0, 0, 1, 1, 2, 2] * 2
    assert ch.tolist() == [0, 1] * 6


def test_reference_rejects_bad_input():
    cfg = ModelConfig(vocab_size=5, n_ctx=8, d_model=8, n_heads=1, n_layers=1, stride=4)
    weights = {k: v.numpy() for k, v in SparseTransformer(cfg).state_dict().items()}
    with pytest.raises(ValueError, match="sequence length"):
        ref_model.forward(weights, cfg, np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ValueError, match="integer token ids"):
        ref_model.forward(weights, cfg, np.zeros((1, 4)))
