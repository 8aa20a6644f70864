"""What samples show, in numbers: image completions and text against baselines.

Child et al., 2019, section 7 judges models by held-out bits and shows samples;
a sample's look is easy to over-read. These functions turn what notebook 09 says
about its samples into numbers that can be checked:

* ``brightness_agreement``  does a completion keep the brightness of the image it
                            continues? The correlation, over images, of the
                            given top half's mean with the completed bottom
                            half's mean (for the held-out truth, the same);
* ``roughness``             mean absolute difference of horizontally adjacent
                            pixels: how smooth a region is (photographs: small);
* ``text_profile``          printable bytes, Python keywords (whole words) per
                            kilobyte, lines indented by four spaces;
* ``unigram_bytes``         a baseline text: bytes drawn independently from a
                            text's byte frequencies (no context at all);
* ``longest_shared``        the longest substring two texts share.
"""

from __future__ import annotations

import difflib
import keyword
import re

import numpy as np

_WORD = re.compile(rb"[A-Za-z_][A-Za-z_0-9]*")
_KEYWORDS = {k.encode() for k in keyword.kwlist}


def _halves(images: np.ndarray, given: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(images, dtype=np.float64).reshape(len(images), -1)
    return x[:, :given], x[:, given:]


def brightness_agreement(images: np.ndarray, given: int) -> float:
    """Correlation over images of the mean of tokens [0, given) with the mean of the rest."""
    top, bottom = _halves(images, given)
    return float(np.corrcoef(top.mean(1), bottom.mean(1))[0, 1])


def roughness(images: np.ndarray, image_shape, given: int) -> float:
    """Mean |x[r, c+1] - x[r, c]| over the part after ``given`` (whole image rows)."""
    h, w, ch = image_shape
    x = np.asarray(images, dtype=np.float64).reshape(len(images), h, w, ch)
    rows = given // (w * ch)
    return float(np.abs(np.diff(x[:, rows:], axis=2)).mean())


def text_profile(texts) -> dict:
    """{"printable": fraction of bytes that are printable ASCII or newline,
    "keywords_per_kb": whole-word Python keywords per 1000 bytes, "indented":
    fraction of non-empty lines starting with four spaces} over ``texts`` (bytes)."""
    data = b"\n".join(bytes(t) for t in texts)
    printable = sum(32 <= b < 127 or b == 10 for b in data) / max(len(data), 1)
    words = _WORD.findall(data)
    lines = [line for line in data.split(b"\n") if line.strip()]
    return {"printable": printable,
            "keywords_per_kb": 1000 * sum(w in _KEYWORDS for w in words) / max(len(data), 1),
            "indented": sum(line.startswith(b"    ") for line in lines) / max(len(lines), 1)}


def unigram_bytes(reference: np.ndarray, length: int, count: int, seed: int = 0) -> list[bytes]:
    """``count`` texts of ``length`` bytes drawn independently from the byte
    frequencies of ``reference`` (a uint8 array)."""
    freq = np.bincount(np.asarray(reference, dtype=np.uint8), minlength=256).astype(np.float64)
    rng = np.random.default_rng(seed)
    return [bytes(rng.choice(256, size=length, p=freq / freq.sum()).astype(np.uint8))
            for _ in range(count)]


def longest_shared(a: bytes, b: bytes) -> int:
    """Length of the longest substring that ``a`` and ``b`` share."""
    match = difflib.SequenceMatcher(None, a, b, autojunk=False).find_longest_match(
        0, len(a), 0, len(b))
    return match.size
