"""Method eagle3: an EAGLE-3 head drafts from the inputs of three of the target's layers (Li et al. 2025,
arXiv 2503.01840); the same proposers, trees and views as method eagle."""

from __future__ import annotations

from specviz.methods.eagle import eagle_method

METHOD = eagle_method("eagle3", "EAGLE-3 head on three target layers", "the EAGLE-3 head",
                      "method eagle3 (EAGLE-3: a small head drafts from the inputs of three of the target's layers)",
                      ("#8c564b", "pentagon"), "an EAGLE-3 head", "train_eagle3")
