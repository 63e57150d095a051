"""Tiny Gemma 4 targets and MTP assistants in the exact published layout, and the public reference that drafts with
them: transformers 5.17's own ``Gemma4AssistantForCausalLM`` driven by transformers' own
``SinglePositionMultiTokenCandidateGenerator.get_candidates``, given what the target hands over after a forward
over the committed tokens (``hidden_states`` and ``shared_kv_states``).

The target has five layers [sliding, full, sliding, sliding, full] of which the last two are KV-shared
(``num_kv_shared_layers`` 2), so the K/V the assistant reads come from layer 2 (sliding) and layer 1 (full): neither
the first nor the last layer of its type. Full-attention layers have their own K/V layout (``attention_k_eq_v`` with
one global KV head of ``global_head_dim`` 32; sliding layers: 2 KV heads of ``head_dim`` 16) and per-layer inputs, as
Gemma 4's small models have. The window is 4, so prompts exceed it and the sliding reads are windowed.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tiny_models import VOCAB, build_tokenizer

S, F = "sliding_attention", "full_attention"
WINDOW = 4
TARGET = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=5, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, global_head_dim=32, attention_k_eq_v=True,
              num_global_key_value_heads=1, sliding_window=WINDOW, layer_types=[S, F, S, S, F], num_kv_shared_layers=2,
              hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, max_position_embeddings=256,
              initializer_range=0.3, bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=False)
SOURCES = {S: 2, F: 1}  # the last non-KV-shared target layer of each type
# the assistant's own text config: Q-only layers over the target's cache layout (same KV heads and head dims per type)
ASSISTANT = dict(TARGET, hidden_size=48, intermediate_size=96, num_hidden_layers=3, layer_types=[S, F, F],
                 num_kv_shared_layers=0, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)


def save_target(path: Path, seed: int = 1, **over) -> Path:
    """A tiny random Gemma4ForCausalLM (fp32) with the bundled tokenizer, saved as safetensors."""
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**{**TARGET, **over})).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(path, safe_serialization=True)
    build_tokenizer().save_pretrained(path)
    return path


def build_assistant(seed: int, ordered: bool, follow: dict[int, int] | None = None, target=None,
                    **text_over) -> transformers.Gemma4AssistantForCausalLM:
    """A random assistant: transformers' init, then every parameter moved by 0.3 N(0, 1) (norm weights away from
    one, so a dropped norm changes the drafts), a random ``token_ordering`` when ``ordered`` (16 clusters of 20
    tokens, the top 4 get real logits).

    ``follow`` {token: next token} (with ``target``): the embedding half of ``pre_projection`` is fitted (least
    squares over the target's scaled embeddings of those tokens) to point at the assistant's embedding of the next
    token, and the layers' post-attention / post-MLP norms shrink to 0.05: the drafts then mostly follow ``follow``
    (accepted when it is the target's own continuation) while still depending on the hidden state and the K/V."""
    torch.manual_seed(seed)
    cfg = transformers.Gemma4AssistantConfig(text_config={**ASSISTANT, **text_over},
                                             backbone_hidden_size=TARGET["hidden_size"], use_ordered_embeddings=ordered,
                                             num_centroids=16, centroid_intermediate_top_k=4)
    model = transformers.Gemma4AssistantForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        if ordered:
            model.masked_embedding.token_ordering.copy_(torch.randperm(VOCAB))
        if follow:
            toks = torch.tensor(list(follow))
            e = target.get_input_embeddings()(toks).float()  # [n, H_t], scaled by sqrt(H_t)
            want = 4.0 * model.model.embed_tokens.weight[torch.tensor(list(follow.values()))]  # [n, H]
            half = TARGET["hidden_size"]
            model.pre_projection.weight[:, :half] = torch.linalg.lstsq(e, want).solution.T
            model.pre_projection.weight[:, half:] *= 0.1
            for layer in model.model.layers:
                layer.post_attention_layernorm.weight.fill_(0.05)
                layer.post_feedforward_layernorm.weight.fill_(0.05)
    return model


def save_assistant(path: Path, seed: int = 3, ordered: bool = False, **kw) -> Path:
    """:func:`build_assistant` written by transformers' own ``save_pretrained`` (the exact published layout)."""
    build_assistant(seed, ordered, **kw).save_pretrained(path, safe_serialization=True)
    return path


def successors(ids: list[int], wrong_every: int = 0, vocab: int = VOCAB) -> dict[int, int]:
    """{token: the token after its first occurrence in ``ids``}; every ``wrong_every``-th entry points elsewhere (a
    draft the target rejects: partial accepts)."""
    out: dict[int, int] = {}
    for a, b in zip(ids, ids[1:]):
        if a not in out:
            out[a] = (b + 7) % vocab if wrong_every and len(out) % wrong_every == wrong_every - 1 else b
    return out


class AssistantReference:
    """Drafts as transformers drafts: ``draft(context, k)`` for committed tokens x_0..x_n runs the target over
    x_0..x_{n-1} (``output_hidden_states``, ``return_shared_kv_states``: what transformers' assisted decoding asks the
    target for) and calls ``SinglePositionMultiTokenCandidateGenerator.get_candidates`` with that output, the last
    row as the last accepted one, and ``num_assistant_tokens = k``. The assistant is loaded by transformers' own
    ``from_pretrained`` (safetensors) from the directory specviz loads."""

    def __init__(self, target, directory: Path):
        from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

        self.target = target
        self.assistant = transformers.Gemma4AssistantForCausalLM.from_pretrained(directory, use_safetensors=True).eval()
        config = transformers.GenerationConfig(max_length=10**6, eos_token_id=None, pad_token_id=1)
        self.generator = SinglePositionMultiTokenCandidateGenerator(
            input_ids=torch.zeros(1, 1, dtype=torch.long), assistant_model=self.assistant,
            target_model_input_embeddings=target.get_input_embeddings(), generation_config=config, model_kwargs={})

    @torch.no_grad()
    def draft(self, context: list[int], k: int) -> list[int]:
        ids = torch.tensor([context])
        n = ids.shape[1] - 1
        out = self.target(ids[:, :n], output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
        self.generator.num_assistant_tokens = k
        cand, _ = self.generator.get_candidates(ids, model_kwargs={}, model_outputs=out, is_first_iteration=False,
                                                n_last_matches=n - 1)
        return cand[0, n + 1:].tolist()
