"""A pytest plugin for transformers' own model tests: every model's default attention becomes
the adapter's, and each test's calls into it are counted.

Child et al., 2019, section 4 (attention over a pattern's positions) through
``fast.integrations.hf`` (docs/design.md §12): the peer suite (``fast.experiments.peer_hf``)
loads this module with ``pytest -p fast.experiments.peer_hf_plugin`` and edits nothing in
the tests it runs. Its settings come from the environment the suite gives pytest:

* ``PEER_HF_ATTN``: "sdpa" (the baseline: nothing switched, calls only counted), "full"
  or "strided" (stride ``PEER_HF_STRIDE``, default 3);
* ``PEER_HF_RECORD``: a JSON file, written at the end: each test's outcome and counts
  (``"tests"``) and the code that ran them (``"code"``, ``fast.experiments.provenance``);
* ``PEER_HF_NO_SLIDING_WINDOW=1``: MistralConfig built with ``sliding_window=None``
  (labelled extra runs, in the baseline and the library's alike).

How the switch works: transformers resolves a model's attention in
``PreTrainedModel.get_correct_attn_implementation(requested)``; with nothing requested it
picks "sdpa". The plugin returns the registered name there instead, where transformers
itself would have picked "sdpa" for a model that supports the attention interface; a test
that asks for "eager" or "sdpa" by name keeps it. So ``config._attn_implementation`` is
the adapter's for every model built without an explicit choice, and the model's masks are
made by the adapter's mask function.

Proof that the switch took: the registered attention and mask functions, the
``sparse_attention`` the adapter calls, and transformers' own sdpa are wrapped with
counters, and each test's counts are recorded with its outcome.
"""

from __future__ import annotations

import functools
import os
from collections import Counter

from fast.experiments.provenance import write_result

MODES = ("sdpa", "full", "strided")
NAMES = {"full": "peer_hf_full", "strided": "peer_hf_strided"}

COUNTS: Counter = Counter()     # the running test's calls
RECORD: dict = {}               # node id -> {"outcome": ..., counts}


def _counted(key: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        COUNTS[key] += 1
        return fn(*args, **kwargs)
    return wrapper


def _install(mode: str, stride: int, no_window: bool) -> None:
    if mode not in MODES:
        raise ValueError(f"PEER_HF_ATTN must be one of {MODES}, got {mode!r}")
    from transformers import AttentionInterface, AttentionMaskInterface, MistralConfig
    from transformers.modeling_utils import PreTrainedModel

    import fast.integrations.hf as hf

    hf.register(NAMES["full"], "full")
    hf.register(NAMES["strided"], "strided", stride=stride)
    for name in NAMES.values():
        for interface, key in ((AttentionInterface, "attention"),
                               (AttentionMaskInterface, "mask")):
            interface._global_mapping[name] = _counted(f"{key}:{name}",
                                                       interface._global_mapping[name])
    hf.sparse_attention = _counted("sparse_attention", hf.sparse_attention)
    AttentionInterface._global_mapping["sdpa"] = _counted(
        "sdpa", AttentionInterface._global_mapping["sdpa"])

    if no_window:
        init = MistralConfig.__init__

        @functools.wraps(init)
        def without_window(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.sliding_window = None

        MistralConfig.__init__ = without_window

    target = NAMES.get(mode)
    if target is None:
        return
    original = PreTrainedModel.get_correct_attn_implementation

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested, is_init_check=False):
        chosen = original(self, requested, is_init_check)
        if (requested is None and chosen == "sdpa"
                and getattr(self, "_supports_attention_backend", False)):
            COUNTS["switched"] += 1
            return target
        return chosen

    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


def pytest_configure(config):
    _install(os.environ.get("PEER_HF_ATTN", "sdpa"), int(os.environ.get("PEER_HF_STRIDE", "3")),
             os.environ.get("PEER_HF_NO_SLIDING_WINDOW", "0") == "1")


def pytest_report_header(config):
    mode = os.environ.get("PEER_HF_ATTN", "sdpa")
    return (f"peer-hf: default attention {NAMES.get(mode, 'sdpa (unchanged)')}; "
            f"Mistral without its window: {os.environ.get('PEER_HF_NO_SLIDING_WINDOW') == '1'}")


def pytest_runtest_setup(item):
    COUNTS.clear()


def pytest_runtest_makereport(item, call):
    """The outcome of the call (or of a setup that failed or skipped), with the counts."""
    if call.when == "teardown" or (call.when == "setup" and call.excinfo is None):
        return
    if call.excinfo is None:
        outcome = "passed"
    elif call.excinfo.typename == "Skipped":
        outcome = "skipped"
    else:
        outcome = "failed" if call.when == "call" else "error"
    RECORD[item.nodeid] = {"outcome": outcome, **COUNTS}


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("PEER_HF_RECORD")
    if path:
        write_result(path, {"tests": RECORD}, indent=0)      # stamped with its code
    ran = [r for r in RECORD.values() if r["outcome"] in ("passed", "failed")]
    ours = sum(1 for r in ran if any(k.startswith("attention:") for k in r))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "peer-hf attention accounting")
        reporter.write_line(f"{len(ran)} tests ran; {ours} called the adapter's attention, "
                            f"{sum(1 for r in ran if r.get('sdpa'))} transformers' sdpa")
