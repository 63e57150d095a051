"""Every supported transformers family gives plain greedy's tokens with every head-free method, in both runners.

Tiny random checkpoints (tests/family_models.py: Llama, Qwen2 / Qwen3 / Qwen3-MoE, Mixtral, OLMoE, Mistral with
and without a window, Phi-3, OLMo-2, Granite, SmolLM3, GPT-NeoX, GPT-2, Gemma 2 / 3 / 4 text, GPT-OSS, Cohere2),
each with a 1-layer draft of its own family, saved as model directories and loaded through specviz's loader. The
reference is transformers' own greedy ``generate`` of the same target (its own sliding-window caches, no rollback);
token ids in and out. Sliding-window families have a window of 4, the prompt is 22 tokens, and the test checks that
drafts were rejected (so the cache was rolled back across the window boundary) in both runners. The runner-level
tests hold a rollback and a tree forward deeper than the window to transformers' no-cache forward of the same text.
"""

from __future__ import annotations

import pytest
import torch

from family_models import FAMILIES, MOE_FAMILIES, SLIDING, WINDOW, build_family, save_family
from specviz import SpecDecoder
from specviz import tree as T
from specviz.attention import UnsupportedModelError, attention_layout
from specviz.runner import EagerRunner
from specviz.static_runner import StaticRunner, capture_notes

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = list(range(5, 16)) * 2  # 22 token ids, repeated: n-gram and suffix drafts find matches
NEW = 20
TREE = "[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]"  # a static draft tree: two branches, depth 3
METHODS = [("none", dict(num_speculative_tokens=1)),
           ("ngram", dict(num_speculative_tokens=3, prompt_lookup_min=1)),
           ("ngram_gpu", dict(num_speculative_tokens=3, prompt_lookup_min=1)),
           ("suffix", dict(num_speculative_tokens=4)),
           ("draft_model", dict(num_speculative_tokens=3)),
           ("draft_model", dict(num_speculative_tokens=3, speculative_token_tree=TREE))]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """{family: (target dir, draft dir)}: the target with 2-3 layers (seed 0), the draft with 1 (seed 1)."""
    root = tmp_path_factory.mktemp("families")
    return {name: (save_family(name, root / f"{name}-target"), save_family(name, root / f"{name}-draft", seed=1,
                                                                           layers=1))
            for name in FAMILIES}


def reference_greedy(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    """transformers' own greedy decoding (``generate``, its own caches): the new token ids."""
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def run_every_method(dec: SpecDecoder, want: list[int]) -> int:
    """Assert every head-free method's greedy output equals ``want``; return the steps with a rejected draft."""
    rejections = 0
    for method, kw in METHODS:
        trace = dec.generate(PROMPT, method=method, max_new_tokens=NEW, **kw)
        assert trace.output_token_ids == want, (method, kw, trace.output_token_ids, want)
        rejections += sum(1 for s in trace.steps if s.num_accepted < s.num_drafted)
    return rejections


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_method_gives_plain_greedy_in_both_runners(family_dirs, family):
    target, draft = family_dirs[family]
    eager = SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32", runner="eager")
    want = reference_greedy(eager.target_model, PROMPT, NEW)
    assert len(want) >= 8, f"{family}: the reference stopped at EOS after {len(want)} tokens; pick another seed"
    static = SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32", runner="static")
    for dec in (eager, static):
        rejected = run_every_method(dec, want)
        if family in SLIDING:  # rollbacks happened with a context past the window (22 > 4 from the first step)
            assert rejected > 0, (family, type(dec.target_runner).__name__)
    assert isinstance(static.target_runner, StaticRunner) and isinstance(eager.target_runner, EagerRunner)
    assert attention_layout(static.target_model.config).sliding == (family in SLIDING)


def _full_forward_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """float32 [len(ids), V]: transformers' own forward of the whole text, no cache (its own window masks)."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def _runner(model: torch.nn.Module, kind: str):
    if kind == "eager":
        return EagerRunner(model)
    return StaticRunner(model, max_cache_len=64, tree_buckets=(4, 16) if kind == "static_padded" else None)


@pytest.fixture(scope="module", params=["mistral-window", "gemma2", "gpt-oss"])
def sliding_model(request):
    return build_family(request.param)


@pytest.mark.parametrize("kind", ["eager", "static"])
def test_rollback_across_the_window_equals_a_fresh_forward(sliding_model, kind):
    """Forward 10 + 6 tokens, roll back to 12 (across the window of 4), forward 4 more, roll back again: each
    forward's logits equal transformers' no-cache forward of the same text."""
    ids = list(range(5, 25))
    ref = _full_forward_logits(sliding_model, ids[:16])
    runner = _runner(sliding_model, kind)
    runner.reset()
    torch.testing.assert_close(runner.forward(torch.tensor(ids[:10])), ref[:10], rtol=1e-4, atol=1e-4)
    runner.forward(torch.tensor(ids[10:16]))  # a "draft" that gets rejected
    runner.truncate(12)
    torch.testing.assert_close(runner.forward(torch.tensor(ids[12:16])), ref[12:16], rtol=1e-4, atol=1e-4)
    runner.truncate(12)
    other = [99, 98, 97, 96]  # a different continuation over the rolled-back positions
    ref2 = _full_forward_logits(sliding_model, ids[:12] + other)
    torch.testing.assert_close(runner.forward(torch.tensor(other)), ref2[12:16], rtol=1e-4, atol=1e-4)


# a tree 6 deep (deeper than the window) with branches: root children 0, 1; 0 -> 2 -> 3 -> 4 -> 5 -> 6; 1 -> 7
PARENTS = [-1, -1, 0, 2, 3, 4, 5, 1]
TOKENS = [11, 12, 21, 31, 41, 51, 61, 22]


@pytest.mark.parametrize("kind", ["eager", "static", "static_padded"])
def test_tree_forward_respects_each_layers_window(sliding_model, kind):
    """Each tree node's logits equal transformers' no-cache forward of its root path (prefix + path), for a tree
    deeper than the window: the ancestor mask and each layer's window combine; then a commit of the deepest path
    leaves the cache equal to that text's (the next forward's logits match)."""
    prefix = [3, 17, 45, 9, 88, 120, 7, 64, 55]  # committed text; its last token is the tree's root
    runner = _runner(sliding_model, kind)
    runner.reset()
    runner.forward(torch.tensor(prefix[:-1]))
    out = runner.forward_features(torch.tensor([prefix[-1], *TOKENS]), parents=PARENTS).logits
    for node in range(-1, len(TOKENS)):
        path = [TOKENS[j] for j in T.path_to(PARENTS, node)]
        want = _full_forward_logits(sliding_model, prefix + path)[-1]
        torch.testing.assert_close(out[node + 1], want, rtol=1e-4, atol=1e-4, msg=f"node {node}")
    deepest = T.path_to(PARENTS, 6)
    runner.commit(deepest)
    text = prefix + [TOKENS[j] for j in deepest]
    want = _full_forward_logits(sliding_model, text + [7, 8])[-2:]
    torch.testing.assert_close(runner.forward(torch.tensor([7, 8])), want, rtol=1e-4, atol=1e-4)


def test_unsupported_families_are_refused_when_loading(tmp_path):
    """A family whose cache cannot be rolled back (Qwen3-Next's linear attention) or masked (Llama 4's chunked
    attention) is refused by from_pretrained with a ValueError naming the family, from its config alone."""
    import transformers

    for config, family, why in ((transformers.Qwen3NextConfig(num_hidden_layers=4), "qwen3_next", "recurrent state"),
                                (transformers.Llama4TextConfig(num_hidden_layers=4), "llama4_text", "chunked")):
        path = tmp_path / family
        config.save_pretrained(path)  # no weights: the config is checked before any are read
        with pytest.raises(UnsupportedModelError, match=f"'{family}'.*{why}") as info:
            SpecDecoder.from_pretrained(path, device="cpu")
        assert isinstance(info.value, ValueError)
    for config, family in ((transformers.RwkvConfig(), "rwkv"), (transformers.RecurrentGemmaConfig(), "recurrent_gemma"),
                           (transformers.MambaConfig(), "mamba")):
        with pytest.raises(UnsupportedModelError, match=f"'{family}'.*state"):
            attention_layout(config)
    with pytest.raises(UnsupportedModelError, match="'gemma3_text'.*bidirectional"):
        attention_layout(transformers.Gemma3TextConfig(use_bidirectional_attention=True))


def test_the_window_checks_can_fail(sliding_model):
    """The window tests are not vacuous: with the runners' window switched off (layout.window None), the static
    runner's forward past the window and the eager runner's tree forward no longer match transformers' reference."""
    import dataclasses

    ids = list(range(5, 25))
    static = _runner(sliding_model, "static")
    static.layout = dataclasses.replace(static.layout, window=None)
    static.reset()
    assert not torch.allclose(static.forward(torch.tensor(ids)), _full_forward_logits(sliding_model, ids), atol=1e-3)
    eager = _runner(sliding_model, "eager")
    eager.layout = dataclasses.replace(eager.layout, window=None)
    eager.reset()
    prefix = [3, 17, 45, 9, 88, 120, 7, 64, 55]
    eager.forward(torch.tensor(prefix[:-1]))
    out = eager.forward_features(torch.tensor([prefix[-1], *TOKENS]), parents=PARENTS).logits
    deep = prefix + [TOKENS[j] for j in T.path_to(PARENTS, 6)]
    assert not torch.allclose(out[1 + 6], _full_forward_logits(sliding_model, deep)[-1], atol=1e-3)


needs_cuda = pytest.mark.gpu


@needs_cuda
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_on_cuda_with_graphs(family_dirs, family):
    """On the GPU (fp32): the static runner with CUDA graphs gives transformers' greedy tokens with every head-free
    method, and every capture succeeded (no graph left eager, no capture note)."""
    target, draft = family_dirs[family]
    dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype="float32", runner="static")
    want = reference_greedy(dec.target_model, PROMPT, NEW)
    run_every_method(dec, want)
    for model in (dec.target_model, dec.draft_model):
        assert capture_notes(model) == [], (family, capture_notes(model))
    runners = [r for r in dec.pool.objects() if isinstance(r, StaticRunner)]
    assert runners and all(r.cuda_graphs for r in runners)
    assert all(entry is not None for r in runners for entry in r.graphs.values()), family
    assert sum(len(r.graphs) for r in runners) > 0


@needs_cuda
@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_moe_families_capture_without_host_copies(family_dirs, family, dtype):
    """MoE experts inside CUDA graphs (bf16: transformers' grouped_mm on the CUTLASS path; fp32: batched_mm, see
    specviz.attention.graph_experts_implementation): 0 capture failures over every verify width and tree bucket."""
    target, draft = family_dirs[family]
    dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype=dtype, runner="static", compile=False)
    dec.warm_up(max_speculative_tokens=4, verify_methods=("greedy",), temperatures=(), synthetic_rates=())
    for model in (dec.target_model, dec.draft_model):
        assert capture_notes(model) == [], (family, dtype, capture_notes(model))
    runners = [r for r in dec.pool.objects() if isinstance(r, StaticRunner)]
    assert runners and all(entry is not None for r in runners for entry in r.graphs.values())
    trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=NEW)
    assert len(trace.output_token_ids) > 0


def test_a_multimodal_gemma3_checkpoint_decodes_its_text_decoder(tmp_path):
    """A ``Gemma3ForConditionalGeneration`` checkpoint (text decoder beside a vision tower) is decoded through its text
    decoder as ``Gemma3ForCausalLM``: every head-free method gives transformers' own greedy output of the multimodal
    model, in both runners."""
    import transformers
    from family_models import COMMON, FAMILIES
    from tiny_models import build_tokenizer

    over = FAMILIES["gemma3"][2]
    text = transformers.Gemma3TextConfig(**{**COMMON, **over, "layer_types": list(over["layer_types"])})
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)).eval()
    model.save_pretrained(tmp_path / "target", safe_serialization=True)
    build_tokenizer().save_pretrained(tmp_path / "target")
    draft = save_family("gemma3", tmp_path / "draft", seed=1, layers=1)
    want = reference_greedy(model, PROMPT, NEW)
    for runner in ("eager", "static"):
        dec = SpecDecoder.from_pretrained(tmp_path / "target", draft, device="cpu", dtype="float32", runner=runner)
        assert type(dec.target_model).__name__ == "Gemma3ForCausalLM"
        assert dec.target_model.specviz_text_of == "Gemma3ForConditionalGeneration"
        run_every_method(dec, want)
