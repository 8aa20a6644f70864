"""The notebooks' prose held to their outputs and to the paper: a checker that reads
the ``.ipynb`` files with nbformat (nothing is executed).

Child et al., 2019: notebooks 01-09 re-derive the paper (sec. 4-7) and quote it.
Hand-written conclusions drift from the outputs they describe, and paraphrases get
dressed as quotes. Three rules make the house style enforceable ("a number or an
ordering in prose is printed in the same section, generated from the data, or asserted
by a check cell"; "a quote is the paper's exact words with its section"):

number
    Every number written in a markdown cell (integers, decimals, percentages, "3x",
    thousands written 12,288 or 16{,}384, 3.5e-4) appears, at the precision written, in
    the text outputs of the same section: the cells between two headings, any level. A
    cell marked ``NBVAL_IGNORE_OUTPUT`` or ``NBVAL_SKIP`` gives no evidence (nbval does
    not compare its outputs, so a number read off them is stale after the next run: such
    a sentence is printed by the cell itself). An integer may also be a parameter written
    in the section's code, and so may a bare value after "=" in math (``$l = 6$``).
    Not numbers of the prose: headings, inline code, links, HTML comments, list
    numbering, references (sec. 4.3, eq. 2-4, Figure 3(b), Table 2, notebook 02, §2),
    years, the rest of a formula (``$n^{1.5}$``, ``$2\\sqrt{n} + 1$``), numbers inside a
    quote of the paper, and a number the paper states (``PAPER_NUMBERS``) in a sentence
    that cites it (sec., Table, Figure, eq., "the paper") or in a paraphrase of it.
    Anything else is asserted by a named check cell: the markdown carries
    ``<!-- check: NAME -->`` and a code cell whose first line is ``# check: NAME``
    contains ``assert`` and the number.
quote
    A blockquote either says it is a paraphrase (the word "paraphrase" in it), or ends
    with its section, ``(sec. 4.3)``, and every piece of it between ``[...]`` is the
    paper's exact words: found in that section's passages in ``PAPER_WORDS``.
reference
    "section 4" is ambiguous in a notebook that has sections of its own. The paper's are
    written "sec. 4.3" (and must exist in the paper); the notebook's own "§2" (a
    heading "## 2. ..." must exist); another file's "docs/design.md §6" or "notebook 05 §3".

Orderings ("fewest", "faster") are not machine-checked: a sentence stating one prints
the numbers it orders in the same section, which the number rule then holds.

    python -m tests.notebooks.notebook_prose notebooks/*.ipynb     # every finding, file and cell
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from tests.conftest import ROOT


# The paper's numbered sections (arXiv:1904.10509v1).
PAPER_SECTIONS = frozenset(
    "1 2 3 4 4.1 4.2 4.3 5 5.1 5.2 5.3 5.4 5.5 5.6 6 7 7.1 7.2 7.3 7.4 8 9".split())

# The numbers the paper states, by where it states them; a sentence that cites the paper
# may use them without printing them.
PAPER_NUMBERS = {
    "sec. 4.3": "128 8 120 256 248 1 16 32",
    "sec. 5.2": "1.702 4.0",
    "sec. 5.3": "3 2",
    "sec. 5.4": "16,384",
    "sec. 6": "5000 1.0 0.01 0.125 256 512 1024 4 2 8",
    "sec. 7.1": "3072 2 128 256 120 0.00035 0.25 48000 2000 2.80 2.798 0.004 2.85 2.82 1 3",
    "sec. 7.2": "12,288 90 10 30 8 512 0.40 80 128 32 0.99 0.992 0.001 1.03 12,160",
    "sec. 7.3": "48 16 512 152 128 0.01 70 7 64 3.44 3.437 3.52 300",
    "sec. 7.4": "4 8 1 3 65,536 5 12 16",
    "Table 1": "3.03 2.92 2.90 2.85 2.80 59 1.06 1.03 0.99 88 277 95 3.57 3.7 3.81 3.52 150 "
               "3.44 152 1.97",
    "Table 2": "12,288 1.00 1.31 0.99 0.55 1.13 0.35 3,072 2.82 0.54 2.85 0.47 2.80 0.38",
    "Table 3": "6,144 9,216 10,752 11,904 12,096 12,160 0.9952 0.9936 0.9932 0.9930 0.9922 "
               "0.9908",
    "Table 4": "65,536 262,144 1,048,576 152 25 3 1.97 2.17 2.99",
    "Figure 1, 2, 5": "1.0 12,288 65,536 128 19 20 64",
}

# The paper's exact words, by section: each passage is a run of the paper's text between
# two equations (paragraphs joined by a space), copied from the paper, its math written as
# the notebooks write it (LaTeX) and its emphasis as the paper sets it. A notebook's quote
# is made of pieces of one passage, "[...]" between the pieces.
PAPER_WORDS = {
    "4.2": (
        r"A self-attention layer maps a matrix of input embeddings $X$ to an output matrix and "
        r"is parameterized by a connectivity pattern $S = \{S_1, \dots, S_n\}$, where $S_i$ "
        r"denotes the set of indices of the input vectors to which the $i$th output vector "
        r"attends. The output vector is a weighted sum of transformations of the input vectors:",
        r"Here $W_q$, $W_k$, and $W_v$ represent the weight matrices which transform a given "
        r"$x_i$ into a *query*, *key*, or *value*, and $d$ is the inner dimension of the queries "
        r"and keys. The output at each position is a sum of the values weighted by the scaled "
        r"dot-product similarity of the keys and queries. "
        r"Full self-attention for autoregressive models defines $S_i = \{j : j \le i\}$, "
        r"allowing every element to attend to all previous positions and its own position. "
        r"Factorized self-attention instead has $p$ separate attention heads, where the $m$th "
        r"head defines a subset of the indices $A_i^{(m)} \subset \{j : j \le i\}$ and lets "
        r"$S_i = A_i^{(m)}$. We are chiefly interested in *efficient* choices for the subset "
        r"$A$, where $|A_i^{(m)}| \propto \sqrt[p]{n}$. "
        r"Additionally, for the time being we consider *valid* choices of $A$, where all input "
        r"positions are connected to all future output positions across the $p$ steps of "
        r"attention. "
        r"For every $j \le i$ pair, we set every $A$ such that $i$ can attend to $j$ through a "
        r"path of locations with maximum length $p+1$. Specifically, if $(j, a, b, c, \dots, i)$ "
        r"is the path of indices, then $j \in A_a^{(1)}$, $a \in A_b^{(2)}$, $b \in A_c^{(3)}$, "
        r"and so forth. "
        r"These two criteria allow us keep the ability of Transformers to propagate signals "
        r"from arbitrary input positions to arbitrary output positions in a constant number of "
        r"steps, while reducing the total effective computation to $O(n\sqrt[p]{n})$. We also "
        r"note that softening the validity criterion (for instance, having a series of only "
        r"locally connected layers) may be a useful inductive bias for certain domains. "
        r"In this work, we explore two factorizations for $p=2$, which we describe in the "
        r"following section, though we note that the same techniques can be easily extended to "
        r"higher dimensions.",
    ),
    "4.3": (
        r"A natural approach to defining a factorized attention pattern in two dimensions is to "
        r"have one head attend to the previous $l$ locations, and the other head attend to every "
        r"$l$th location, where $l$ is the *stride* and chosen to be close to $\sqrt{n}$, a "
        r"method we call *strided* attention. "
        r"Formally, $A_i^{(1)} = \{t, t+1, \dots, i\}$ for $t = \max(0, i - l)$ and "
        r"$A_i^{(2)} = \{j : (i - j) \bmod l = 0\}$. This pattern can be visualized in "
        r"Figure 3(b). "
        r"This formulation is convenient if the data naturally has a structure that aligns "
        r"with the stride, like images or some types of music. "
        r"For data without a periodic structure, like text, however, we find that the network "
        r"can fail to properly route information with the strided pattern, as spatial "
        r"coordinates for an element do not necessarily correlate with the positions where the "
        r"element may be most relevant in the future. "
        r"In those cases, we instead use a *fixed* attention pattern (Figure 3(c)), where "
        r"specific cells summarize previous locations and propagate that information to all "
        r"future cells. "
        r"Formally, $A_i^{(1)} = \{j : (\lfloor j/l \rfloor = \lfloor i/l \rfloor)\}$, where the "
        r"brackets denote the floor operation, and $A_i^{(2)} = \{j : j \bmod l \in "
        r"\{t, t+1, \dots, l\}\}$, where $t = l - c$ and $c$ is a hyperparameter. "
        r"Concretely, if the stride is 128 and $c=8$, then all future positions greater than "
        r"128 can attend to positions 120-128, all positions greater than 256 can attend to "
        r"248-256, and so forth. "
        r"A fixed-attention pattern with $c=1$ limits the expressivity of the network "
        r"significantly, as many representations in the network are only used for one block "
        r"whereas a small number of locations are used by all blocks. We instead found choosing "
        r"$c \in \{8, 16, 32\}$ for typical values of $l \in \{128, 256\}$ to perform well, "
        r"although it should be noted that this increases the computational cost of this "
        r"method by $c$ in comparison to the strided attention. "
        r"Additionally, we found that when using multiple heads, having them attend to distinct "
        r"subblocks of length $c$ within the block of size $l$ was preferable to having them "
        r"attend to the same subblock.",
    ),
    "5.1": (
        r"Standard dense attention simply performs a linear transformation of the attend "
        r"function defined in Equation 2:",
        r"where $W_p$ denotes the post-attention weight matrix. The simplest technique for "
        r"integrating factorized self-attention is to use one attention type per residual "
        r"block, and interleave them sequentially or at a ratio determined as a hyperparameter:",
        r"Here $r$ is the index of the current residual block and $p$ is the number of "
        r"factorized attention heads. "
        r"A second approach is to have a single head attend to the locations of the pixels that "
        r"both factorized heads would attend to, which we call a *merged* head:",
        r"This is slightly more computationally intensive, but only by a constant factor. A "
        r"third approach is to use multi-head attention (Vaswani et al., 2017), where $n_h$ "
        r"attention products are computed in parallel, then concatenated along the feature "
        r"dimension:",
        r"Here, the $A$ can be the separate attention patterns, the merged patterns, or "
        r"interleaved as in Eq. 2. Also, the dimensions of the weight matrices inside the "
        r"attend function are reduced by a factor of $1/n_h$, such that the number of "
        r"parameters are invariant across values of $n_h$. "
        r"We typically find multiple heads to work well, though for extremely long sequences "
        r"where the attention dominates the computation time, it is more worthwhile to perform "
        r"them one at a time and sequentially.",
    ),
    "5.2": (
        r"We found that Transformers were difficult to train with many layers, as noted by "
        r"(Al-Rfou et al., 2018). Instead of incorporating auxiliary losses, we adopted the "
        r"following architectural changes. First, we use the pre-activation residual block of "
        r"(He et al., 2016), defining a network of $N$ layers in the following way:",
        r"where embed is a function we describe in the next section, $W_{out}$ is a weight "
        r"matrix, and resblock(h) normalizes the input to the attention block and a positionwise "
        r"feedforward network in the following way:",
        r"The norm function denotes Layer Normalization (Ba et al., 2016), and "
        r"$ff(x) = W_2 f(W_1 x + b_1) + b_2$. Our choice of $f$ is the Gaussian Error Linear Unit "
        r"(Hendrycks & Gimpel, 2016), $f(X) = X \odot \operatorname{sigmoid}(1.702 \cdot X)$, as "
        r"used in (Radford et al., 2018). The output dimension of $W_1$ is 4.0 times the input "
        r"dimension, unless otherwise noted. "
        r"Observe that $H_N$ is the sum of $N$ applications of functions $a$ and $b$, and thus "
        r"each function block receives a gradient directly from the output layer. We scale the "
        r"initialization of $W_2$ and $W_p$ in Eq. 5 by $\frac{1}{\sqrt{2N}}$ to keep the ratio "
        r"of input embedding scale to residual block scale invariant across values of $N$.",
    ),
    "5.3": (
        r"In addition to the embedding of input symbols, positional embeddings are typically "
        r"used in Transformers and other location-agnostic architectures to encode the spatial "
        r"relationships of data (Gehring et al., 2017), (Parmar et al., 2018). "
        r"We found using learned embeddings which either encoded the structure of the data or "
        r"the factorized attention patterns were important for performance of our models. "
        r"We added either $n_{emb} = d_{data}$ or $n_{emb} = d_{attn}$ embeddings to each input "
        r"location, where $d_{data}$ refers to the number of dimensions of the data, and "
        r"$d_{attn}$ is the number of dimensions of the factorized attention. If $\mathbf{x}_i$ "
        r"is the one-hot encoded $i$th element in the sequence, and $\mathbf{o}_i^{(j)}$ "
        r"represents the one-hot encoded position of $\mathbf{x}_i$ in the $j$th dimension "
        r"$(1 \le j \le n_{emb})$, then:",
        r"For images, we used data embeddings, where $d_{data} = 3$ for the row, column, and "
        r"channel location of each input byte. For text and audio, we used two-dimensional "
        r"attention embeddings, where $d_{attn} = 2$ and the index corresponds to each "
        r"position's row and column index in a matrix of width equal to the stride.",
    ),
    "5.4": (
        r"Gradient checkpointing has been shown to be effective in reducing the memory "
        r"requirements of training deep neural networks (Chen et al., 2016), (Gruslys et al., "
        r"2016). It is worth noting, however, that this technique is particularly effective for "
        r"self-attention layers when long sequences are processed, as memory usage is high for "
        r"these layers relative to the cost of computing them. "
        r"Using recomputation alone, we are able to train dense attention networks with hundreds "
        r"of layers on sequence lengths of 16,384, which would be infeasible on modern hardware "
        r"otherwise. "
        r"In our experiments, we recompute the attention and feedforward blocks during the "
        r"backwards pass. To simplify our implementation, we do not apply dropout within the "
        r"attention blocks, as in (Vaswani et al., 2017), and instead only apply it at the end of "
        r"each residual addition, as seen in Figure 4.",
    ),
    "5.5": (
        r"The sparse attention masks in 3(b) and 3(c) can be efficiently computed by slicing out "
        r"sub-blocks from the query, key, and value matrices and computing the product in blocks. "
        r"Attention over a local window can be computed as-is, whereas attention with a stride of "
        r"k can be computed by transposing the matrix and computing a local window. Fixed "
        r"attention positions can be aggregated and computed in blocks. "
        r"In order to ease experimentation, we implemented a set of GPU kernels which efficiently "
        r"perform these operations. The softmax operation is fused into a single kernel and also "
        r"uses registers to eliminate loading the input data more than once, allowing it to run "
        r"at the same speed as a simple nonlinearity. The upper triangle of the attention matrix "
        r"is never computed, moreover, removing the need for the negative bias term of (Vaswani "
        r"et al., 2017) and halving the number of operations to be performed.",
    ),
    "5.6": (
        r"We store network weights in single-precision floating-point, but otherwise compute "
        r"network activations and gradients in half-precision, as in (Micikevicius et al., "
        r"2017). This accelerates our training due to the usage of Tensor Core operations on the "
        r"V100 GPU. During the gradient calculation, we use dynamic loss scaling to reduce "
        r"numerical underflow, and we communicate half-precision gradients when averaging "
        r"across multiple GPUs. When sampling, we cast the queries and keys to single-precision, "
        r"as the query-key product can sometimes overflow the max value of half-precision.",
    ),
    "6": (
        r"We use the Adam optimizer with a linear warmup of 5000 iterations and a gradient "
        r"clipping of 1.0, both of which we found important for model stability. We use a weight "
        r"decay penalty of 0.01. We annealed the learning rate according to a cosine decay as in "
        r"(Radford et al., 2018). We train on 8 V100 GPUs unless otherwise noted. "
        r"All embeddings are of a constant dimension $d$, usually one of $\{256, 512, 1024\}$. "
        r"By default, all linear transforms are to the same dimension, with the exception of the "
        r'feed-forward network, which projects the input to $4d$, unless we use "half-size" '
        r"transformations, where it is $2d$. Additionally, sometimes we halve the size of the "
        r"query and key transformations. "
        r"We initialize the token embedding $W_e$ from $\mathcal{N}(0, \frac{0.125}{\sqrt{d}})$ "
        r"and the position embeddings from $\mathcal{N}(0, \frac{0.125}{\sqrt{d n_{emb}}})$. "
        r"Within the attention and feedforward components, all biases are initialized to 0 and "
        r"all weights are initialized from $\mathcal{N}(0, \frac{0.125}{\sqrt{d_{in}}})$ where "
        r"$d_{in}$ is the fan-in dimension. The weight matrix for the output logits was "
        r"initialized to 0.",
    ),
    "7.1": (
        r"We train strided Sparse Transformers on CIFAR-10 images represented as sequences of "
        r"3072 bytes. Models have 2 heads, 128 layers, $d=256$, half-size feedforward network "
        r"and query-key projections, and are trained for 120 epochs with a learning rate of "
        r"0.00035 and a dropout rate of 0.25 until validation error stops decreasing. "
        r"We use 48000 examples for training and 2000 examples for validation, evaluating the "
        r"performance of our best models on the test set. The model achieves **2.80** bits per "
        r"dim ($2.798 \pm 0.004$ over seeds 1, 2, 3) versus the previous 2.85 state of the art "
        r"(Chen et al., 2017). We also compare performance of different attention patterns in "
        r"Table 2. The strided attention reaches the lowest error in the shortest amount of "
        r"time, surpassing the error of dense attention at 2.82 bits per dim.",
    ),
    "7.2": (
        r"In order to assess Sparse Transformers on datasets without a strong two-dimensional "
        r"structure, we trained models on the EnWik8 dataset, which represents the first $10^8$ "
        r"bytes of Wikipedia and contains a great degree of variability in periodic structure. "
        r"We trained with a context length of 12,288, which is longer than previous approaches. "
        r"We trained on the first 90 million tokens and reserved the last 10 million for "
        r"validation and test. We used 30-layer fixed Sparse Transformers with 8 heads, "
        r"$d = 512$, and a dropout rate of 0.40. We trained for 80 epochs until validation loss "
        r"stopped decreasing. We used a stride of 128, $c = 32$, and merged the factorized "
        r"attention heads. "
        r"Our best model reached 0.99 bits per dim ($0.992 \pm 0.001$ over seeds 1, 2, 3), "
        r"surpassing the 1.03 state-of-the-art for a similarly-sized Transformer-XL (Dai et al., "
        r"2018) and matching the 0.99 of a model trained with more than double the number of "
        r"parameters. Strided attention failed to do well on this dataset, whereas fixed "
        r"patterns were able to recover and surpass the performance of dense attention, as "
        r"listed in Table 2. "
        r"Additionally, during evaluation of the test set, we modified the minimum context "
        r"length the network could use by evaluating fewer tokens in parallel. We saw monotonic "
        r"increases in performance with more tokens used, up to 12,160 out of the 12,288 tokens "
        r"used for training (see Table 3), which suggests the network is effectively "
        r"incorporating long-term dependencies.",
    ),
}

# The paper's title ("") and its sections' headings, as the paper writes them.
PAPER_HEADINGS = {
    "": "Generating Long Sequences with Sparse Transformers",
    "1": "Introduction", "2": "Related Work", "3": "Background",
    "4": "Factorized Self-Attention",
    "4.1": "Qualitative assessment of learned attention patterns",
    "4.2": "Factorized self-attention", "4.3": "Two-dimensional factorized attention",
    "5": "Sparse Transformer", "5.1": "Factorized attention heads",
    "5.2": "Scaling to hundreds of layers", "5.3": "Modeling diverse data types",
    "5.4": "Saving memory by recomputing attention weights",
    "5.5": "Efficient block-sparse attention kernels", "5.6": "Mixed-precision training",
    "6": "Training", "7": "Experiments", "7.1": "CIFAR-10", "7.2": "Text",
    "7.3": "ImageNet 64x64", "7.4": "Classical music from raw audio", "8": "Conclusion",
    "9": "Acknowledgements",
}

IGNORED = ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP")
HEADING = re.compile(r"^#{1,6}\s")
CHECK_MARK = re.compile(r"<!--\s*check:\s*([\w-]+)\s*-->")
CHECK_CELL = re.compile(r"^\s*#\s*check:\s*([\w-]+)\s*$", re.M)
PAPER_CITE = re.compile(r"\b(?:[Ss]ecs?\.\s*\d|[Ee]qs?\.\s*\d|Table\s+\d|Figure\s+\d|Fig\.\s*\d"
                        r"|the paper|paper's|Child et al)")

# A reference list: "4.3", "3(b)", "2-4", "5.2 and 6" (one decimal digit: a section,
# not a measured number, so "Table 2, 1.31" keeps its 1.31).
_ITEM = r"\d+(?:\.\d)?(?:\([a-z]\))?(?![\d.]\d)"
_LIST = rf"{_ITEM}(?:\s*(?:[-–,]|\band\b|\bor\b|\bto\b)\s*{_ITEM})*"
REFERENCE = re.compile(rf"(?:\b(?:[Ss]ecs?\.|[Ee]qs?\.|[Ss]ections?|[Ee]quations?|Figures?|Fig\."
                       rf"|Tables?|[Nn]otebooks?)\s*|§\s*){_LIST}")
YEAR = re.compile(r"\(\s*(?:19|20)\d\d\s*\)|\b(?:January|February|March|April|May|June|July"
                  r"|August|September|October|November|December)\s+(?:19|20)\d\d\b"
                  r"|\bet al\.,?\s+(?:19|20)\d\d\b|arXiv[:\s]*\d{4}\.\d{4,5}(?:v\d)?")
# A number: 12,288 / 16{,}384 / 3.5 / 3.5e-4, then perhaps % or x; not part of a word.
NUMBER = re.compile(r"(?<![\w.,{}\\])(\d{1,3}(?:(?:,|\{,\})\d{3})+|\d+)(\.\d+)?(?:[eE]([-+−]?\d+))?"
                    r"(\s?%|\\%|x(?![\w])|\s?×|\s?\\times(?![a-z]))?(?![\w])")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
MATH_VALUE = re.compile(r"(?:=|\\approx)\s*(\d{1,3}(?:\{,\}\d{3})+|\d+(?:\.\d+)?)"
                        r"(?=\s*(?:$|[,;.)\]]|\\(?:dots|ldots|cdots|text|quad|qquad|[,;! ])|\\\}))")
EVIDENCE = re.compile(r"\d+(?:,\d{3})*(?:_\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Finding:
    path: str
    cell: int
    rule: str
    words: str
    why: str

    def __str__(self) -> str:
        return f"{self.path} cell {self.cell} [{self.rule}] {self.words!r}: {self.why}"


@dataclass(frozen=True)
class Number:
    """A number written in prose: its value, the precision written, what kind it is."""
    text: str
    value: float
    tol: float
    kind: str          # "int", "decimal", "percent", "times"
    in_math: bool = False

    def found_in(self, values: list[float]) -> bool:
        """Whether one of ``values`` (signs dropped) rounds to it; a percentage also matches
        the fraction (83% and 0.83)."""
        targets = [self.value] + ([self.value / 100] if self.kind == "percent" else [])
        tols = [self.tol] + ([self.tol / 100] if self.kind == "percent" else [])
        return any(abs(abs(x) - t) <= tol * (1 + 1e-9) + 1e-12
                   for x in values for t, tol in zip(targets, tols))


def _number(m: re.Match) -> Number:
    """The ``Number`` a match of ``NUMBER`` writes; its tolerance is half its last digit."""
    whole, frac, exp, suffix = m.group(1), m.group(2) or "", m.group(3), m.group(4)
    digits = whole.replace("{,}", "").replace(",", "")
    decimals = len(frac) - 1 if frac else 0
    scale = 10.0 ** int(exp.replace("−", "-")) if exp else 1.0
    value = float(digits + frac) * scale
    kind = ("percent" if suffix and "%" in suffix else "times" if suffix
            else "decimal" if frac or exp else "int")
    return Number(m.group(0).strip(), value, 0.5 * 10.0 ** -decimals * scale, kind)


def numbers_in(text: str) -> list[tuple[Number, int]]:
    """The numbers of a prose sentence (references and years already blanked by ``_prose``)
    with their positions: plain numbers outside math, bare values after "=" inside it."""
    found = []
    found += [(_number(m), m.start()) for m in NUMBER.finditer(_blank(MATH, text))]
    for math in MATH.finditer(text):
        for m in MATH_VALUE.finditer(math.group(0)):
            n = _number(NUMBER.search(m.group(1)))
            found.append((Number(n.text, n.value, n.tol, n.kind, in_math=True),
                          math.start() + m.start(1)))
    return sorted(found, key=lambda pair: pair[1])


def _values(text: str) -> list[float]:
    """Every number printed in (or written in the code of) a cell, as evidence."""
    values = []
    for token in EVIDENCE.findall(text):
        values.append(float(token.replace(",", "").replace("_", "")))
        if "," in token:                  # "[84,100]" printed without spaces: each piece too
            values += [float(p) for p in token.split(",") if p and "." not in p]
    return values


PAPER_VALUES = sorted({float(t.replace(",", "")) for v in PAPER_NUMBERS.values()
                       for t in v.split()})


def _blank(pattern: re.Pattern | str, text: str, flags: int = 0) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (positions kept)."""
    return re.sub(pattern, lambda m: " " * len(m.group(0)), text, flags=flags)


def _strip_markup(text: str) -> str:
    """Markdown with the parts that are not prose blanked: code, comments, links' targets,
    HTML tags, URLs."""
    for pattern in (r"```.*?```", r"<!--.*?-->", r"`[^`\n]*`", r"(?<=\])\([^)\s]*\)",
                    r"https?://\S+", r"<[^>\n]+>"):
        text = _blank(pattern, text, re.S)
    return text


def _prose(sentence: str) -> str:
    """A sentence without what is not a number of its prose: references, years, list
    numbering ("1. ", "(2)"), names such as CIFAR-10, "0-indexed". Positions are kept."""
    for pattern in (YEAR, REFERENCE, r"(?m)^\s*\d+[.)]\s", r"(?<![\w.])\d{1,2}\.(?=\s+[a-z*(])",
                    r"\(\d\)", r"\b[A-Za-z]+-\d+\b", r"\b[01]-indexed\b"):
        sentence = _blank(pattern, sentence)
    return sentence


def sentences(text: str) -> list[str]:
    """A markdown text cut into sentences, list items and table rows (the unit in which a
    number must cite the paper to be the paper's)."""
    parts = re.split(r"\n\s*\n|\n(?=\s*(?:[-*|]|\d+[.)])\s)|(?<=[.!?])\s+(?=[A-Z(])", text)
    return [p for p in parts if p.strip()]


def blockquotes(text: str) -> tuple[list[str], str]:
    """The blockquotes of a markdown text (each joined into one line) and the text
    without them."""
    quotes, rest, current = [], [], []
    for line in text.split("\n"):
        if line.lstrip().startswith(">"):
            current.append(re.sub(r"^\s*>\s?", "", line))
            continue
        if current:
            quotes.append(" ".join(current))
            current = []
        rest.append(line)
    if current:
        quotes.append(" ".join(current))
    return quotes, "\n".join(rest)


def _normal(text: str) -> str:
    text = text.replace("*", "").replace("’", "'").replace("\\leq", "\\le")
    return re.sub(r"\s+", " ", text).strip()


def quote_problem(quote: str) -> str | None:
    """Why a blockquote is neither the paper's exact words with its section nor a marked
    paraphrase; None when it is one of them."""
    if re.search(r"paraphras", quote, re.I):
        return None
    m = re.search(r"\(sec\.\s*(\d+(?:\.\d+)?)\)\s*$", quote)
    if m is None:
        return 'a quote ends with its section, "(sec. 4.3)", or says "paraphrase"'
    section = m.group(1)
    if section not in PAPER_WORDS:
        return f"no passage of sec. {section} in PAPER_WORDS (tests/notebooks/notebook_prose.py)"
    passages = [_normal(p) for p in PAPER_WORDS[section]]
    for piece in re.split(r"\[(?:\.\.\.|…)\]", quote[:m.start()]):
        piece = _normal(piece).strip(" .,;:")
        if re.search(r"[A-Za-z]", piece) and not any(piece in p for p in passages):
            words = piece.split()
            good = 0
            while good < len(words) and any(" ".join(words[:good + 1]) in p for p in passages):
                good += 1
            return (f"not the paper's words (sec. {section}) from "
                    f"{' '.join(words[max(0, good - 3):good + 6])!r}")
    return None


def _headings(lines) -> set[str]:
    return {m.group(1) for line in lines if (m := re.match(r"^#{1,6}\s+(\d+)\.\s", line))}


def _notebook_headings(nb) -> set[str]:
    return _headings(line for c in nb.cells if c.cell_type == "markdown"
                     for line in c.source.split("\n"))


def reference_problems(text: str, own: set[str], root: Path = ROOT) -> list[tuple[str, str]]:
    """(words, why) for each ambiguous or dangling section reference of a markdown text."""
    problems = []
    text = _strip_markup(text)
    for m in re.finditer(r"\b[Ss]ections?\s+\d+(?:\.\d+)?", text):
        problems.append((m.group(0), 'write "sec. N" for the paper, "§N" for this notebook'))
    for m in re.finditer(r"\b[Ss]ecs?\.\s*(\d+(?:\.\d+)?)(?:\s*[-–]\s*(\d+(?:\.\d+)?))?", text):
        for s in filter(None, m.groups()):
            if s not in PAPER_SECTIONS:
                problems.append((m.group(0), f"the paper has no sec. {s}"))
    for m in re.finditer(r"(\S+\.md|[Nn]otebook\s+(\d\d))?\s*§\s*(\d+)", text):
        where, other, number = m.groups()
        if where and where.endswith(".md"):
            path = root / where.strip("(*")
            heads = _headings(path.read_text().split("\n")) if path.is_file() else set()
            name = where
        elif other:
            paths = sorted((root / "notebooks").glob(f"{other}_*.ipynb"))
            heads = _notebook_headings(nbformat.read(paths[0], as_version=4)) if paths else set()
            name = f"notebook {other}"
        else:
            heads, name = own, "this notebook"
        if number not in heads:
            problems.append((m.group(0).strip(), f'{name} has no heading "{number}. ..."'))
    return problems


@dataclass
class _Section:
    outputs: list[float]
    code: list[float]


def _output_text(cell) -> str:
    texts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stdout":
            texts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            texts += [data.get(k, "") for k in ("text/plain", "text/markdown")]
    return "\n".join(t if isinstance(t, str) else "".join(t) for t in texts)


def check_notebook(path: str | Path, root: Path = ROOT) -> list[Finding]:
    """Every finding of the three rules in one notebook."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    name = path.name
    own = _notebook_headings(nb)
    checks: dict[str, list] = {}
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for label in CHECK_CELL.findall(cell.source.split("\n", 1)[0]):
                checks.setdefault(label, []).append((idx, cell))

    # Sections: each markdown line goes to the section open where it stands.
    sections = [_Section([], [])]
    segments = []                     # (cell index, section index, markdown text)
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            lines = []
            for line in cell.source.split("\n"):
                if HEADING.match(line):
                    if lines:
                        segments.append((idx, len(sections) - 1, "\n".join(lines)))
                    sections.append(_Section([], []))
                    lines = []
                else:
                    lines.append(line)
            if lines:
                segments.append((idx, len(sections) - 1, "\n".join(lines)))
        elif cell.cell_type == "code":
            sections[-1].code += _values(cell.source)
            if not any(flag in cell.source for flag in IGNORED):
                sections[-1].outputs += _values(_output_text(cell))

    findings = []
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for words, why in reference_problems(cell.source, own, root):
                findings.append(Finding(name, idx, "reference", words, why))

    for idx, sec, text in segments:
        extra_out = []
        for label in CHECK_MARK.findall(text):
            cells = checks.get(label, [])
            if len(cells) != 1:
                findings.append(Finding(name, idx, "number", f"check: {label}",
                                        f"{len(cells)} code cells start with '# check: {label}'"
                                        " (one asserts what this cell says)"))
            elif "assert" not in cells[0][1].source:
                findings.append(Finding(name, idx, "number", f"check: {label}",
                                        f"cell {cells[0][0]} asserts nothing"))
            else:
                extra_out += _values(cells[0][1].source) + _values(_output_text(cells[0][1]))
        quotes, rest = blockquotes(_strip_markup(text))
        for quote in quotes:
            problem = quote_problem(quote)
            if problem:
                findings.append(Finding(name, idx, "quote", quote[:60] + "...", problem))
        paraphrases = [q for q in quotes if re.search(r"paraphras", q, re.I)]
        outputs = sections[sec].outputs + extra_out
        code = sections[sec].code
        for sentence, cited in ([(s, False) for s in sentences(rest)]
                                + [(s, True) for q in paraphrases for s in sentences(q)]):
            cites = cited or bool(PAPER_CITE.search(sentence))
            for number, at in numbers_in(_prose(sentence)):
                if number.found_in(outputs):
                    continue
                if (number.kind == "int" or number.in_math) and number.found_in(code):
                    continue
                if cites and number.kind in ("int", "decimal") and any(
                        abs(number.value - v) <= 1e-9 * max(1.0, v) for v in PAPER_VALUES):
                    continue
                snippet = re.sub(r"\s+", " ", sentence[max(0, at - 40): at + len(number.text) + 25])
                findings.append(Finding(name, idx, "number", number.text,
                                        f"not in this section's compared outputs: ...{snippet}..."))
    return findings


def main(argv: list[str]) -> int:
    findings = [f for path in argv for f in check_notebook(path)]
    for f in findings:
        print(f)
    print(f"{len(findings)} findings in {len(argv)} notebooks")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
