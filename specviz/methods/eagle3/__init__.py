"""Method eagle3: an EAGLE-3 head drafts from the inputs of three of the target's layers (Li et al. 2025,
arXiv 2503.01840); the same proposers, trees and views as method eagle."""

from __future__ import annotations

from specviz.methods.base import HeadSpec, Method, Texts
from specviz.methods.eagle import HOW, describe_head, make_eagle, warm_up_eagle

METHOD = Method(
    "eagle3", "EAGLE-3 head on three target layers", make=make_eagle,
    texts=Texts("the EAGLE-3 head", HOW,
                "method eagle3 (EAGLE-3: a small head drafts from the inputs of three of the target's layers)",
                confidence="head softmax"),
    style=("#8c564b", "pentagon"), tree_forms=("static", "dynamic"),
    head=HeadSpec("an EAGLE-3 head", bundled="specviz-eagle3", describe=describe_head,
                  trainer="specviz.methods.eagle.train:train_eagle3", module="specviz.methods.eagle.head",
                  formats="specviz.methods.eagle.formats"),
    warm_up=warm_up_eagle, view="specviz.methods.eagle.view")
