"""The benchmark's FlexAttention peer runs in its fastest documented configuration: it calls
``fast.backends.flex.flex_sparse_attention`` (Child et al., 2019, sec. 5.5: a sparse kernel is
worth what it beats, so the peer it is measured against gets its best)."""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import flex_attention

from fast.backends import flex as flex_backend
from fast.measure import contenders


def test_the_peer_and_the_backend_use_one_block_mask_and_one_compiled_function(monkeypatch):
    """Both calls go through the one compiled FlexAttention (replaced here by an eager spy)
    with the identical BlockMask object: the natural-order layout's, full blocks apart."""
    calls = []

    def spy():
        def run(q, k, v, **kwargs):
            calls.append(kwargs)
            return flex_attention(q, k, v, **kwargs)
        return run

    monkeypatch.setattr(flex_backend, "_compiled_flex", spy)
    n, H, params = 300, 2, {"stride": 8}
    fn = contenders.build("strided", params, H, "cpu", torch.float32, names=["flex"])["flex"]
    assert fn.compiles
    q, k, v = (torch.randn(1, H, n, 16, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    out = fn(q, k, v)
    want = flex_backend.flex_sparse_attention(q, k, v, "strided", **params)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    mask = flex_backend.cached_block_mask("strided", n, H, device="cpu", params=params)
    assert len(calls) == 2 and calls[0]["block_mask"] is calls[1]["block_mask"] is mask
    assert calls[0].keys() == calls[1].keys() == {"block_mask", "scale"}
    assert mask.full_kv_num_blocks is not None                  # full blocks kept apart
    assert fn.density[n] == contenders.block_density(mask)
    # the flash contender passes FlexAttention's backend choice through the same call (the
    # eager spy ignores it; compiled on the CPU it would refuse it)
    contenders.flex("strided", params, H, "cpu", {"BACKEND": "FLASH"})(q, k, v)
    assert calls[-1]["kernel_options"] == {"BACKEND": "FLASH"}
    assert calls[-1]["block_mask"] is mask


def test_the_full_pattern_keeps_its_full_blocks_out_of_the_mask_mod():
    mask = flex_backend.cached_block_mask("full", 384, 1, device="cpu")
    assert int(mask.full_kv_num_blocks.sum()) == 3 and int(mask.kv_num_blocks.sum()) == 3
    assert contenders.block_density(mask) == 6 / 9


def test_the_flash_backend_runs_on_cuda_only_and_says_why_not():
    assert contenders.why_not("flex flash", "cpu", torch.float16) == \
        "FlexAttention's FLASH backend runs on CUDA only"
    why = contenders.flash_why_not("cuda")
    assert why is None or why.startswith(("FlexAttention's FLASH backend needs the flash-attn-4",
                                          "torch ")), why
    assert contenders.has_backward("flex flash", "cuda")
    assert not contenders.has_backward("flex flash", "cpu")
    assert "flex flash" in contenders.default_names("cuda")
    assert "flex flash" not in contenders.default_names("cpu")
