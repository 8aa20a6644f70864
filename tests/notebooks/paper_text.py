"""The paper's text, as the notebooks' prose checker needs it: its sections, the numbers it
states, its exact words, its headings and the sizes of its experiments.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers" (arXiv:1904.10509v1).
``tests/notebooks/notebook_prose.py`` holds the notebooks' quotes, numbers and section
references to these registries, and ``tests/paper_quotes.py`` the rest of the project's
prose. Each registry is copied from the paper; a test checks that they name only its
sections (``tests/notebooks/test_notebook_prose.py``).
"""

from __future__ import annotations

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
    # sec. 4's opening, and Figure 2's caption, which the paper prints in sec. 4
    "4": (
        r"Sparse Transformers separate the full self-attention operation across several steps "
        r"of attention, as visualized in Figure 3(b) and 3(c). To motivate our approach, we "
        r"first perform a qualitative assessment of attention patterns learned by a standard "
        r"Transformer on an image dataset.",
        r"Learned attention patterns from a 128-layer network on CIFAR-10 trained with full "
        r"attention. White highlights denote attention weights for a head while generating a "
        r"given pixel, and black denotes the autoregressive mask. Layers are able to learn a "
        r"variety of specialized sparse structures, which may explain their ability to adapt "
        r"to different domains. a) Many early layers in the network learn locally connected "
        r"patterns, which resemble convolution. b) In layers 19 and 20, the network learned to "
        r"split the attention across a row attention and column attention, effectively "
        r"factorizing the global attention calculation. c) Several attention layers showed "
        r"global, data-dependent access patterns. d) Typical layers in layers 64-128 exhibited "
        r"high sparsity, with positions activating rarely and only for specific input patterns.",
    ),
    "4.1": (
        r"We visualized the attention patterns learned by a 128-layer self-attention network on "
        r"CIFAR-10, and present several examples in Figure 2. Visual inspection showed that "
        r"most layers had sparse attention patterns across most data points, suggesting that "
        r"some form of sparsity could be introduced without significantly affecting "
        r"performance. Several layers (Figure 2c) clearly exhibited global patterns, however, "
        r"and others exhibited data-dependent sparsity (Figure 2d), both of which would be "
        r"impacted by introducing a predetermined sparsity pattern into all of the attention "
        r"matrices. "
        r"In this paper, we restricted our investigation to a class of sparse attention "
        r"patterns that have connectivity between all positions over several steps of "
        r"attention. These methods can be more efficient than full attention while still "
        r"providing global context to any given position. We aimed to empirically validate the "
        r"performance of these factorized patterns on a range of tasks, given that they are "
        r"unable to learn the exact same mappings as those in Figure 2. We present the "
        r"formulation of factorized attention below.",
    ),
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


# The sizes of the paper's experiments, by the dataset's name as the notebooks write it: what
# "the paper's Enwik8 sizes (n = ..., l = ...)" must say. Only what the paper states (sec. 7.1-7.3):
# the sequence length n, the stride l, the summary width c, the width d.
PAPER_SETTINGS = {
    "Enwik8": {"n": 12288, "l": 128, "c": 32, "d": 512},            # sec. 7.2
    "CIFAR-10": {"n": 3072, "d": 256},                               # sec. 7.1
    "ImageNet": {"n": 12288},                                        # sec. 7.3, 64 x 64 x 3
}
