"""``python -m fast samples``: images, completions and text drawn from the kept models.

Child et al., 2019, section 7: samples of the models ``python -m fast table2`` keeps in
figures/data/models/ (not those of a ``table2 --out`` run), drawn with the sparse-cache
sampler (``fast.experiments.samples``), written to figures/samples_*.png, every drawn
token kept in figures/data/samples.json; the text models' continuations are printed.

    python -m fast samples [--seed 0]
"""

from __future__ import annotations

from fast.commands import cli
from fast.experiments import samples
from fast.experiments.paths import FIGURES
from fast.plots.style import PATTERN_ORDER

COMMAND = "python -m fast samples"


def parser() -> cli.Parser:
    """The parser of ``python -m fast samples``; loads nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--seed", type=cli.integer(0), default=0,
                   help="the generator seed every model draws with (default 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    kept = samples.KEPT
    for modality in ("image", "text"):
        if len(samples.missing(modality, kept)) == len(PATTERN_ORDER):
            cli.fail(COMMAND, f"no kept {modality} model in {kept}; allowed: run python -m "
                              f"fast table2 first (it keeps {modality}_<pattern>.pt there)")
    cli.writable_or_exit(COMMAND, FIGURES)
    for modality in ("image", "text"):
        gone = samples.missing(modality, kept)
        if gone:
            print(f"samples: no kept {modality} model for {gone} in {kept}", flush=True)
    paths, drawn = samples.draw(FIGURES, kept, seed=args.seed, record=samples.RECORD)
    for path in (*paths, samples.RECORD):
        print(f"samples: wrote {path}")
    for pattern, texts in drawn["text"].items():
        print(f"=== text, {pattern} ===\n" + "\n---\n".join(texts))
    return 0
