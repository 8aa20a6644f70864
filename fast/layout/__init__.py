"""Block-sparse layouts of the Sparse Transformer patterns (Child et al., 2019, sec. 5.5).

A layout says, for every head, which (query block, key block) tiles a pattern
touches and with which exact token mask, in a token order of its own per part
(strided columns transposed, fixed summaries gathered), without ever forming an
n x n mask. ``blocks`` holds the public ``block_layout``; ``natural`` derives the
natural-order part of any pattern from the pattern registry (``fast.patterns``);
``heads`` turns the head roles of ``reference.heads`` into a per-head table for the
reordered layouts; ``parts`` enumerates their candidate tiles from closed forms;
``tiles`` turns candidates into tables; ``prefix`` builds the parts whose queries read
a prefix of their keys (the fixed summary) without listing tiles; ``lut`` holds the
look-up tables, listed or as ranges; ``slots`` the slot orders that are formulas
(natural, transposed, gathered); ``from_masks`` builds natural-order parts from any
small dense mask.
"""

from fast.layout.blocks import BlockLayout, LayoutPart, block_layout

__all__ = ["BlockLayout", "LayoutPart", "block_layout"]
