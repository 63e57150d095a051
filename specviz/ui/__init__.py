"""The Gradio app: a thin layer over the engine (runs) and :mod:`specviz.viz` (figures).

``build_app(target, draft, device)`` returns the Blocks without loading a model;
``launch_options()`` gives the stylesheet and upload cap for ``demo.launch``. Both are imported on first
use, so that :mod:`specviz.ui.worker` (the run threads) imports without gradio (scripts/rss_probe.py on the GPU).
"""

__all__ = ["build_app", "launch_options"]


def __getattr__(name: str):
    if name in __all__:
        from specviz.ui import layout

        return getattr(layout, name)
    raise AttributeError(f"module 'specviz.ui' has no attribute {name!r}")
