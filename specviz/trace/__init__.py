"""The trace: plain data recorded from engine events, the single source of every view.

:mod:`~specviz.trace.schema` (the dataclasses, their JSON round trip and the metric definitions in its docstring),
:mod:`~specviz.trace.validate` (an upload checked as data, field by field, never executed),
:mod:`~specviz.trace.metrics` (:class:`RunMetrics`: every metric, from committed tokens), :mod:`~specviz.trace.recorder` (engine events
in, a Trace out). Importing it loads neither torch nor transformers.
"""

from .metrics import (ACCEPTANCE_LENGTH_CONVENTIONS, TOKENS_PER_FORWARD_FORMULA, RunMetrics, acceptance_length,
                      compute_metrics, tokens_per_target_forward)
from .recorder import Recorder
from .schema import (FATES, MAX_TRACE_BYTES, READABLE_VERSIONS, TRACE_VERSION, TREE_RULES, Emitted, Position, Step,
                     Trace, TreeNode, chain_nodes)
from .validate import TraceFormatError, load_json_capped

__all__ = ["ACCEPTANCE_LENGTH_CONVENTIONS", "Emitted", "FATES", "MAX_TRACE_BYTES", "Position", "READABLE_VERSIONS",
           "Recorder", "RunMetrics", "Step", "TOKENS_PER_FORWARD_FORMULA", "TRACE_VERSION", "TREE_RULES", "Trace", "TraceFormatError",
           "TreeNode", "acceptance_length", "chain_nodes", "compute_metrics", "load_json_capped",
           "tokens_per_target_forward"]
