"""What every trained drafter shares, whatever its method: a JSON config and the target's frozen embedding and LM head
(:mod:`specviz.heads.common`), specviz's own file format (:mod:`specviz.heads.io`) and the published layouts,
recognised from the files (:mod:`specviz.heads.formats`). Each method's head, loader and trainer live in its folder
(``specviz/methods/<name>/``). No gradio / plotly here.
"""

from specviz.heads.io import default_head_dir, load_config, load_head, save_head

__all__ = ["default_head_dir", "load_config", "load_head", "save_head"]
