"""Method comparison: many configurations x prompts x seeds on one loaded decoder, pooled metrics.

:mod:`~specviz.compare.model` (the plain data and how a comparison is built), :mod:`~specviz.compare.run` (running it
on a decoder, every run from a known state, each configuration warmed first), :mod:`~specviz.compare.stats` (pooled
metrics, speedups, the table), :mod:`~specviz.compare.lossless` (the losslessness check and its near-tie analysis),
:mod:`~specviz.compare.replay` (the same draft, every rule), :mod:`~specviz.compare.io` (loading a saved comparison
as data), :mod:`~specviz.compare.cli` (``specviz compare``). Imports no gradio or plotly.
"""

from .io import comparison_from_dict, load_comparison
from .model import (BASELINE_TIMINGS, COMPARISON_FORMAT, COMPARISON_VERSION, MAX_COMPARISON_BYTES, MAX_RUNS, Comparison,
                    ComparisonFormatError, Prompt, RunConfig, RunResult, expand_configs, method_options, new_comparison,
                    plan, with_baselines)
from .replay import RULES, same_draft_rules
from .lossless import distribution_test, losslessness
from .run import fresh_request_state, iter_comparison, run_comparison
from .stats import (baseline_ratios, pooled_metrics, pooled_row, predicted_speedup, run_ratios, table, table_csv,
                    time_split, wilson_interval)

__all__ = ["BASELINE_TIMINGS", "COMPARISON_FORMAT", "COMPARISON_VERSION", "Comparison", "ComparisonFormatError",
           "MAX_COMPARISON_BYTES", "MAX_RUNS", "Prompt", "RULES", "RunConfig", "RunResult", "baseline_ratios",
           "comparison_from_dict", "distribution_test",
           "expand_configs", "fresh_request_state", "iter_comparison", "load_comparison", "losslessness",
           "method_options", "new_comparison", "plan", "pooled_metrics", "pooled_row", "predicted_speedup",
           "run_comparison", "run_ratios", "same_draft_rules", "table", "table_csv", "time_split", "wilson_interval"]
