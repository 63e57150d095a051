"""The Gradio app: a thin layer over the engine (runs) and :mod:`specviz.viz` (figures).

``build_app(target, draft, device)`` returns the Blocks without loading a model;
``launch_options()`` gives the stylesheet and upload cap for ``demo.launch``.
"""

from specviz.ui.layout import build_app, launch_options

__all__ = ["build_app", "launch_options"]
