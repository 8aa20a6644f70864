"""Model and training configurations of the Sparse Transformer, with named presets.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers":
section 4 (patterns), section 5.1 (how heads combine), sections 5.2-5.6 (the
network), section 6 (initialisation, training) and section 7 / Table 1 (the
shapes of the CIFAR-10, Enwik8 and ImageNet 64x64 models).

Two small dataclasses, a comment per field, as in nanoGPT:

* ``ModelConfig`` -- the network;
* ``TrainConfig`` -- the data, optimiser, precision and bookkeeping of a run.

Both check every field on construction: a bad value raises a ValueError that says
what was given and what is allowed. Integers are bounded by ``reference.params.MAX_INT``
(2**31 - 1, the int32 positions of the kernels), numbers must be finite, names come
from fixed lists. ``python -m fast train`` reads its options into these classes, so
these checks are its checks too. What needs the machine -- is CUDA there, can the
data be read, is ``out_dir`` writable, does it hold a checkpoint -- is checked by
``fast.transformer.training.train`` before the first step.

``PRESETS`` maps a name to a ``(ModelConfig, TrainConfig)`` pair;
``preset(name, **overrides)`` returns fresh copies with fields replaced.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass

from fast.attention import BACKENDS
from fast.data import DATASETS, SPLITS
from reference.params import COMBINES, MAX_INT, PARAMS, check_int, check_params, check_stride

# The model's patterns: every registered pattern whose parameters are fields of
# ModelConfig (stride, c): full, strided, fixed, and those added since that take no other.
FIELDS = ("stride", "c")
PATTERNS = tuple(name for name, (required, optional) in PARAMS.items()
                 if set(required) | set(optional) <= set(FIELDS))

EMBEDDINGS = ("image", "text")
ATTENTION_IMPLS = ("sparse", "masked")
OUTPUT_INITS = ("normal", "zero")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]{1,4})?")   # resolved in fast.transformer.network.devices
MAX_THREADS = 1024


@dataclass
class ModelConfig:
    vocab_size: int = 256            # output classes (byte values); the embedding has one
                                     # more row, the start token
    n_ctx: int = 256                 # sequence length n the model is built for (positions 0..n-1)
    d_model: int = 128               # residual width d
    n_heads: int = 4                 # attention heads; per-head width d / n_heads (sec. 5.1, eq. 8)
    n_layers: int = 4                # residual blocks N
    pattern: str = "strided"         # "full", "strided" or "fixed" (sec. 4.3), or another
                                     # of PATTERNS
    combine: str = "merged"          # "merged", "multihead" or "interleaved" (sec. 5.1)
    stride: int | None = 16          # l: strided / fixed stride, also the width of the text
                                     # position grid
    c: int | None = None             # summary width of the fixed pattern (paper: 8, 16 or 32)
    embedding: str = "text"          # "image": (row, column, channel) embeddings; "text":
                                     # (row, column) of a width-l grid (eq. 15)
    image_shape: tuple[int, int, int] | None = None  # (H, W, C) for embedding="image";
                                     # H*W*C must equal n_ctx
    ff_mult: int = 4                 # feed-forward widening: 4, or 2 for the paper's
                                     # "half-size" network
    qk_half: bool = False            # q and k of width d/2: sec. 7.1's "half-size
                                     # feedforward network and query-key projections"
    dropout: float = 0.0             # dropout at the end of each residual branch only
                                     # (sec. 5.2), so recomputation is exact
    recompute: bool = False          # gradient checkpointing of every residual block
                                     # whenever autograd records, train or eval (sec. 5.4)
    attention_impl: str = "sparse"   # "sparse": fast.sparse_attention; "masked": explicit
                                     # (n, n) masked softmax (slow, for checks/figures)
    attention_backend: str = "auto"  # passed to fast.sparse_attention(backend=...)
    output_init: str = "normal"      # W_out: "normal", N(0, 0.125/sqrt(d)) like every other
                                     # weight, or "zero", sec. 6's "initialized to 0"; normal
                                     # is the default by measurement (docs/design.md, sec. 4)

    def __post_init__(self):
        _int(self, "vocab_size", 2)
        _int(self, "n_ctx", 1)
        _int(self, "d_model", 1)
        _int(self, "n_heads", 1)
        _int(self, "n_layers", 1)
        _int(self, "ff_mult", 1)
        for name in ("qk_half", "recompute"):
            _bool(self, name)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got d_model={self.d_model}, "
                             f"n_heads={self.n_heads}")
        if self.qk_half and (self.d_model // 2) % self.n_heads:
            raise ValueError(f"qk_half=True needs d_model/2 divisible by n_heads, got "
                             f"d_model={self.d_model}, n_heads={self.n_heads}")
        _choice(self, "pattern", PATTERNS)
        _choice(self, "combine", COMBINES)
        _choice(self, "embedding", EMBEDDINGS)
        _choice(self, "attention_impl", ATTENTION_IMPLS)
        _choice(self, "attention_backend", BACKENDS)
        _choice(self, "output_init", OUTPUT_INITS)
        _number(self, "dropout", 0.0, 1.0, hi_open=True)
        takes = self._takes()
        if "stride" in takes or self.embedding == "text":
            if self.stride is None:
                raise ValueError(f"pattern={self.pattern!r} with embedding={self.embedding!r} "
                                 f"needs a stride l (an integer >= 1), got None")
            check_stride(self.stride)
        if "c" in takes and self.c is None:
            raise ValueError(f"pattern={self.pattern!r} needs the summary width c, got None")
        if "c" not in takes and self.c is not None:
            raise ValueError(f"c is the fixed pattern's summary width; pattern={self.pattern!r} "
                             f"takes no c, got c={self.c!r}")
        # the checks of every attention path; the heads' summary ranks do not depend
        # on the layer, so layer 0 stands for all of them
        check_params(self.pattern, self.n_ctx, self.n_heads, self.combine, 0,
                     self.pattern_params())
        if self.embedding == "image":
            shape = self.image_shape
            if (not isinstance(shape, (tuple, list)) or len(shape) != 3
                    or not all(isinstance(s, int) and not isinstance(s, bool)
                               and 1 <= s <= MAX_INT for s in shape)):
                raise ValueError(f"embedding='image' needs image_shape=(H, W, C) of integers "
                                 f"in [1, {MAX_INT}], got {shape!r}")
            self.image_shape = tuple(shape)
            h, w, ch = shape
            if h * w * ch != self.n_ctx:
                raise ValueError(f"n_ctx must equal H*W*C of image_shape={shape} "
                                 f"(= {h * w * ch}), got n_ctx={self.n_ctx}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def qk_dim(self) -> int:
        """Width of the q and k projections: d, or d/2 with qk_half."""
        return self.d_model // 2 if self.qk_half else self.d_model

    def _takes(self) -> tuple[str, ...]:
        """The fields the pattern takes as parameters (``reference.params.PARAMS``)."""
        required, optional = PARAMS[self.pattern]
        return tuple(name for name in FIELDS if name in required or name in optional)

    def pattern_params(self) -> dict:
        """Keyword parameters of the pattern (``reference.params.PARAMS``)."""
        return {name: getattr(self, name) for name in self._takes()}


@dataclass
class TrainConfig:
    dataset: str = "grey16"          # a name fast.data.load knows: grey16, photos32, digits,
                                     # stdlib, enwik8, cifar10, npy_images
    data_path: str | None = None     # local file/folder for enwik8, cifar10 and npy_images
                                     # (never downloaded)
    data_max_bytes: int | None = None  # cap on the bytes of each text split (stdlib,
                                     # enwik8); None = all
    batch_size: int = 16             # sequences per optimiser step, summed over all ranks
    max_iters: int = 300             # length of the run and of the cosine schedule
    stop_iter: int | None = None     # stop early after this many steps (the schedule still
                                     # spans max_iters); for interrupted runs
    lr: float = 1e-3                 # peak learning rate after warm-up
    min_lr_frac: float = 0.0         # cosine decays to lr * min_lr_frac
    warmup_iters: int = 30           # linear warm-up steps (paper: 5000)
    weight_decay: float = 0.01       # AdamW decoupled weight decay on weight matrices
                                     # (paper: 0.01)
    beta1: float = 0.9               # Adam beta1
    beta2: float = 0.95              # Adam beta2
    grad_clip: float = 1.0           # clip the global gradient norm (paper: 1.0); 0 = off
    precision: str = "auto"          # "auto" (fp16+loss scaling on CUDA, bf16 on CPU),
                                     # "fp32", "bf16", "fp16"
    device: str = "auto"             # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
    cpu_threads: int | None = None   # torch.set_num_threads during the run (1 helps on a
                                     # busy shared CPU); None = leave as is
    seed: int = 0                    # one seed: weights, data windows, dropout
                                     # (see fast.transformer.training.seed)
    eval_interval: int = 100         # evaluate every this many steps (and at the end);
                                     # 0 = only at the end
    eval_batches: int = 8            # batches per evaluation
    eval_splits: tuple[str, ...] = ("val",)  # splits evaluated
    log_interval: int = 10           # record the training loss every this many steps
    out_dir: str = "runs/default"    # where ckpt.pt is written
    checkpoint_interval: int = 0     # write a checkpoint every this many steps; 0 = only at the end
    save_checkpoint: bool = True     # write ckpt.pt at the end (and every checkpoint_interval)
    resume: bool = False             # continue from out_dir/ckpt.pt (the same weights as
                                     # an uninterrupted run with the same cpu_threads;
                                     # another thread count: to float rounding, and said)
    overwrite: bool = False          # a fresh run replaces a checkpoint already in out_dir
                                     # (without it, or resume, such a run is refused)

    def __post_init__(self):
        _choice(self, "dataset", DATASETS)
        for name in ("data_path", "data_max_bytes", "stop_iter", "cpu_threads"):
            if getattr(self, name) is None:
                continue
            if name == "data_path":
                _text(self, name)
            else:
                _int(self, name, 1, MAX_THREADS if name == "cpu_threads" else MAX_INT)
        for name, lo in (("batch_size", 1), ("max_iters", 1), ("warmup_iters", 0),
                         ("eval_interval", 0), ("eval_batches", 1), ("log_interval", 1),
                         ("checkpoint_interval", 0), ("seed", 0)):
            _int(self, name, lo)
        _number(self, "lr", 0.0, None, lo_open=True)
        _number(self, "min_lr_frac", 0.0, 1.0)
        _number(self, "weight_decay", 0.0, None)
        _number(self, "beta1", 0.0, 1.0, hi_open=True)
        _number(self, "beta2", 0.0, 1.0, hi_open=True)
        _number(self, "grad_clip", 0.0, None)
        _choice(self, "precision", PRECISIONS)
        if not isinstance(self.device, str) or not DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', "
                             f"got {self.device!r}")
        self.eval_splits = _splits(self.eval_splits)
        _text(self, "out_dir")
        for name in ("save_checkpoint", "resume", "overwrite"):
            _bool(self, name)
        if self.resume and self.overwrite:
            raise ValueError("resume=True continues the checkpoint in out_dir and "
                             "overwrite=True replaces it: choose one")


def _splits(value) -> tuple[str, ...]:
    """eval_splits as a tuple of split names: a text is one name or several separated
    by commas ("val", "val,test"), never its characters."""
    names = value.split(",") if isinstance(value, str) else value
    try:
        names = tuple(n.strip() if isinstance(n, str) else n for n in names)
    except TypeError:
        names = (value,)
    if not names or any(n not in SPLITS for n in names) or len(set(names)) != len(names):
        raise ValueError(f"eval_splits must be one or more distinct names of {SPLITS} "
                         f"(on the command line: val or val,test), got {value!r}")
    return names


def _int(cfg, name: str, lo: int, hi: int = MAX_INT) -> None:
    check_int(name, getattr(cfg, name), lo, hi,
              "2**31 - 1 (reference.params.MAX_INT), the bound of every integer here"
              if hi == MAX_INT
              else f"{hi}")


def _number(cfg, name: str, lo: float | None, hi: float | None, *, lo_open: bool = False,
            hi_open: bool = False) -> None:
    """A finite real number within [lo, hi] (ends open as told); bool is not a number."""
    v = getattr(cfg, name)
    ok = (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
          and (lo is None or (v > lo if lo_open else v >= lo))
          and (hi is None or (v < hi if hi_open else v <= hi)))
    if not ok:
        bounds = [f"{'>' if lo_open else '>='} {lo}" if lo is not None else "",
                  f"{'<' if hi_open else '<='} {hi}" if hi is not None else ""]
        raise ValueError(f"{name} must be a finite number {' and '.join(b for b in bounds if b)}"
                         f", got {v!r}")


def _bool(cfg, name: str) -> None:
    v = getattr(cfg, name)
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be True or False, got {v!r}")


def _text(cfg, name: str) -> None:
    v = getattr(cfg, name)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{name} must be a non-empty text, got {v!r}")


def _choice(cfg, name: str, allowed) -> None:
    v = getattr(cfg, name)
    if v not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {v!r}")


# ----------------------------------------------------------------------------
# Presets. "quick"/"quick_text"/"digits" train on this 2-core CPU in minutes;
# cifar10, enwik8 and imagenet64 are the paper's shapes (Table 1, sec. 7), for GPUs.
# ----------------------------------------------------------------------------

PRESETS: dict[str, tuple[ModelConfig, TrainConfig]] = {
    # 16x16 greyscale crops of the bundled photographs: n = 256, stride = row width 16.
    "quick": (
        ModelConfig(vocab_size=256, n_ctx=256, d_model=128, n_heads=4, n_layers=4,
                    pattern="strided", combine="merged", stride=16,
                    embedding="image", image_shape=(16, 16, 1)),
        TrainConfig(dataset="grey16", batch_size=8, max_iters=300, lr=1e-3, warmup_iters=30,
                    eval_batches=4, precision="fp32", out_dir="runs/quick"),
    ),
    # The bytes of Python's standard library, fixed pattern (text, sec. 4.3).
    "quick_text": (
        ModelConfig(vocab_size=256, n_ctx=256, d_model=128, n_heads=4, n_layers=4,
                    pattern="fixed", combine="merged", stride=16, c=4, embedding="text"),
        TrainConfig(dataset="stdlib", data_max_bytes=4_000_000, batch_size=8, max_iters=300,
                    lr=1e-3, warmup_iters=30, eval_batches=4, precision="fp32",
                    out_dir="runs/quick_text"),
    ),
    # scikit-learn digits: 8x8 images, 17 grey levels (values 0..16).
    "digits": (
        ModelConfig(vocab_size=17, n_ctx=64, d_model=64, n_heads=2, n_layers=2,
                    pattern="strided", combine="merged", stride=8,
                    embedding="image", image_shape=(8, 8, 1)),
        TrainConfig(dataset="digits", batch_size=32, max_iters=300, lr=2e-3, warmup_iters=20,
                    precision="fp32", out_dir="runs/digits"),
    ),
    # 32x32x3 crops of the bundled photographs, a CIFAR-10-shaped small model.
    "photos32": (
        ModelConfig(vocab_size=256, n_ctx=3072, d_model=128, n_heads=2, n_layers=4,
                    pattern="strided", combine="merged", stride=96,
                    embedding="image", image_shape=(32, 32, 3), ff_mult=2, qk_half=True),
        TrainConfig(dataset="photos32", batch_size=8, max_iters=500, lr=1e-3, warmup_iters=50,
                    out_dir="runs/photos32"),
    ),
    # Paper, CIFAR-10 (sec. 7.1): 128 layers, 2 heads, d=256, half-size ff and q/k,
    # strided, dropout 0.25, lr 0.00035. Stride = one image row (32 px x 3 channels).
    "cifar10": (
        ModelConfig(vocab_size=256, n_ctx=3072, d_model=256, n_heads=2, n_layers=128,
                    pattern="strided", combine="merged", stride=96, embedding="image",
                    image_shape=(32, 32, 3), ff_mult=2, qk_half=True, dropout=0.25,
                    recompute=True),
        TrainConfig(dataset="cifar10", data_path="data/cifar-10-batches-py", batch_size=16,
                    max_iters=300_000, lr=3.5e-4, warmup_iters=5000, eval_interval=5000,
                    eval_batches=64, checkpoint_interval=5000, out_dir="runs/cifar10"),
    ),
    # Paper, Enwik8 (sec. 7.2): 30 layers, 8 heads, d=512, fixed l=128 c=32, context 12,288.
    "enwik8": (
        ModelConfig(vocab_size=256, n_ctx=12288, d_model=512, n_heads=8, n_layers=30,
                    pattern="fixed", combine="merged", stride=128, c=32, embedding="text",
                    dropout=0.40, recompute=True),
        TrainConfig(dataset="enwik8", data_path="data/enwik8.zip", batch_size=16,
                    max_iters=80_000, lr=3.5e-4, warmup_iters=5000, eval_interval=5000,
                    eval_batches=64, checkpoint_interval=5000, out_dir="runs/enwik8"),
    ),
    # Paper, ImageNet 64x64 (sec. 7.3): 48 layers, 16 heads, d=512, strided; full-size
    # ff and q/k give the paper's 152M parameters (cifar10: 59M, enwik8: 95M, as Table 1).
    # Data: a local .npy of uint8 images (N, 64, 64, 3) (dataset "npy_images").
    "imagenet64": (
        ModelConfig(vocab_size=256, n_ctx=12288, d_model=512, n_heads=16, n_layers=48,
                    pattern="strided", combine="merged", stride=192, embedding="image",
                    image_shape=(64, 64, 3), ff_mult=4, qk_half=False, recompute=True),
        TrainConfig(dataset="npy_images", data_path="data/imagenet64", batch_size=16,
                    max_iters=500_000, lr=3.5e-4, warmup_iters=5000, eval_interval=5000,
                    eval_batches=64, checkpoint_interval=5000, out_dir="runs/imagenet64"),
    ),
}


def preset(name: str, **overrides) -> tuple[ModelConfig, TrainConfig]:
    """Fresh copies of preset ``name`` with any ModelConfig or TrainConfig field replaced.

    >>> model_cfg, train_cfg = preset("quick", n_layers=2, max_iters=50)
    """
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    m, t = PRESETS[name]
    m_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    t_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(overrides) - m_fields - t_fields)
    if unknown:
        raise ValueError(f"unknown config fields {unknown}; ModelConfig has {sorted(m_fields)}, "
                         f"TrainConfig has {sorted(t_fields)}")
    m = dataclasses.replace(m, **{k: v for k, v in overrides.items() if k in m_fields})
    t = dataclasses.replace(t, **{k: v for k, v in overrides.items() if k in t_fields})
    return m, t
