"""Draft heads that read the target's hidden states: EAGLE-1 (``eagle``) and EAGLE-3 (``eagle3``).

No gradio / plotly here. Interface (shapes, dtypes, the step API): :mod:`specviz.heads.modules`.
Features a head reads from a target forward: :mod:`specviz.heads.features`.
Hidden-state dumps (vLLM ``extract_hidden_states`` counterpart): :mod:`specviz.heads.extract`.
Heads in the layouts the field publishes (SafeAILab, SpecForge, speculators, FasterDecoding, vLLM, z-lab),
recognised from their files and normalised at load, and written back out: :mod:`specviz.heads.formats`.
"""

from specviz.heads.config import HEAD_DIRS, HeadConfig, check_matches_target, default_aux_layer_ids, head_config_from_target
from specviz.heads.features import TargetFeatures, target_features
from specviz.heads.io import default_head_dir, load_config, load_head, save_head
from specviz.heads.modules import Eagle3Head, EagleHead, build_head, crop_cache, position_mask

__all__ = [
    "HeadConfig", "head_config_from_target", "check_matches_target", "default_aux_layer_ids",
    "TargetFeatures", "target_features", "EagleHead", "Eagle3Head", "build_head", "crop_cache",
    "position_mask", "save_head", "load_head", "load_config", "default_head_dir", "HEAD_DIRS",
]
