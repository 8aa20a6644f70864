"""``python -m fast peer-hf``: transformers' own model tests against the Hugging Face adapter.

Child et al., 2019, section 4, in other people's models (docs/design.md §12): the fast
model tests of transformers for Llama, GPT-2, Mistral and Qwen2, with sdpa and with the
adapter's "full" and "strided" as every model's default attention, compared test by test
(``fast.experiments.peer_hf``). A developer's check, not part of ``make test``: it needs
transformers' test files, which this repository does not hold.

    python -m fast peer-hf build --tree DIR --source TRANSFORMERS_GIT [--sdist TAR]
    python -m fast peer-hf run --tree DIR [--models llama ...] [--modes sdpa full strided]
    python -m fast peer-hf report --tree DIR [--modes full strided]
    python -m fast peer-hf run --tree DIR --models mistral --modes sdpa full \\
        --no-sliding-window --tag nosw                        # Mistral without its window

(``pip install parameterized pytest-timeout httpx`` first: the tests import them.)
"""

from __future__ import annotations

from pathlib import Path

from fast.commands import cli
from fast.experiments.peer_hf import MODELS, MODES, UPSTREAM, build_tree, report, run

COMMAND = "python -m fast peer-hf"
ACTIONS = ("build", "run", "report")


def parser() -> cli.Parser:
    """The parser of ``python -m fast peer-hf``; runs nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("action", type=cli.choice(ACTIONS),
                   help="build the test tree, run the suite, or report what it found")
    p.add_argument("--tree", type=cli.text, required=True,
                   help="the folder of the test tree (build makes DIR/transformers; run and "
                        "report take DIR/transformers or DIR itself; logs in its logs/)")
    p.add_argument("--source", type=cli.existing_path, default=None,
                   help=f"build: a git directory of huggingface/transformers holding commit "
                        f"{UPSTREAM[:8]}")
    p.add_argument("--sdist", type=cli.existing_file, default=None,
                   help="build: transformers-5.23.0.tar.gz (default: pip download)")
    p.add_argument("--models", nargs="+", type=cli.choice(MODELS), default=list(MODELS),
                   help="the model test files (default: all four)")
    p.add_argument("--modes", nargs="+", type=cli.choice(MODES), default=None,
                   help="run: the attentions (default: sdpa full strided); report: those "
                        "compared with sdpa (default: full strided)")
    p.add_argument("--tag", type=cli.text, default=None,
                   help="a label for the logs of a variant run (report reads the same label)")
    p.add_argument("--no-sliding-window", action="store_true",
                   help="run: build MistralConfig with sliding_window=None")
    return p


def _tree(folder: str) -> Path:
    path = Path(folder)
    return path / "transformers" if (path / "transformers" / "tests").is_dir() else path


def main(argv=None) -> int:
    args = parser().parse_or_exit(argv)
    if args.action == "build":
        if args.source is None:
            cli.fail(COMMAND, "build needs --source; allowed: a git directory of "
                              f"huggingface/transformers holding commit {UPSTREAM[:8]}")
        cli.writable_or_exit(COMMAND, args.tree)
        try:
            print(f"tree ready: {build_tree(args.tree, args.source, args.sdist)}")
        except ValueError as err:
            cli.fail(COMMAND, err)
        return 0
    tree = _tree(args.tree)
    if not (tree / "tests" / "models").is_dir():
        cli.fail(COMMAND, f"--tree {args.tree}: no test tree there (tests/models missing); "
                          f"allowed: a folder made by {COMMAND} build")
    if args.action == "run":
        run(tree, args.models, args.modes or MODES, args.tag or "", args.no_sliding_window,
            log=lambda line: print(line, flush=True))
        return 0
    print(report(tree, args.modes or ("full", "strided"), args.models, args.tag or ""))
    return 0
