"""specviz.train: the recipe that trains the bundled demo models.

Modules, in pipeline order: ``corpus`` (transformers 5.17.0 source, fixed held-out rule, list
hashes), ``tokenizer`` (byte-level BPE via `tokenizers`, saved as an HF fast tokenizer),
``configs`` (presets, LlamaConfig, parameter counts), ``data`` (packing, windows, batch order),
``loop`` (target and draft trained on the same batches), ``heads`` (target hidden states and the
EAGLE / Medusa pairing for head training), ``plot``, ``recipe`` (the end-to-end run),
``evaluate`` (held-out numbers for the model card). Entry points: ``python -m specviz.train`` and
``python -m specviz.train.evaluate``. Imports nothing from the UI (no gradio, no plotly).
"""
