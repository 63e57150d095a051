"""Reference drafters written from the public code, in plain torch (no specviz module), and writers of
tiny checkpoints in the exact published layouts (random weights).

Each reference re-runs its drafter from scratch for every draft (no cache): row j of an EAGLE head is
(feature of position j, token j + 1) at position j, causal; a draft step appends one row. Sources:

* EAGLE-1: SafeAILab/EAGLE ``eagle/model/cnets1.py`` ``Model.forward`` / ``LlamaDecoderLayer`` (layer 0
  without input norm), ``topK_genrate`` (the token after each feature, the target's LM head on the
  un-normed output), ``LlamaRotaryEmbedding`` (base 10000 without ``rope_theta``).
* EAGLE-3: SafeAILab ``eagle/model/cnets.py`` (``LlamaDecoderLayeremb``, fc only on 3H-wide inputs,
  ``lm_head(norm(h))``, draft id i -> i + d2t[i]; taps appended in ``modeling_llama_kv.py``'s layer
  loop before layers {2, N//2, N-3}); SpecForge ``llama3_eagle.py`` (``fc_norm`` per tap, ``norm_output``)
  and its capture ids (output of layer i); speculators ``model_definitions.py`` / ``core.py``
  (``norm_before_residual``, ``norm_before_fc``, ``norm_output`` = the normed h fed back).
* Medusa: FasterDecoding/Medusa ``medusa_model.py`` (``ResBlock``, per-head ``Linear`` LM head),
  ``medusa_model_legacy.py`` (medusa2: the base LM head); vLLM ``models/medusa.py`` (``token_map``).
* DFlash: z-lab/dflash ``dflash/model.py`` (``Qwen3DFlashAttention``, ``extract_context_feature``
  with ``hidden_states[i + 1]``, ``dflash_generate``'s block and positions).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS = 320, 32, 8, 4, 2
HEAD_DIM = HIDDEN // HEADS
TARGET_ROPE = 50000.0  # the target's RoPE base; every head below uses its own (10000 unless its config says)


# ---- the tiny target ------------------------------------------------------------------------------------
def save_target(path: Path) -> Path:
    """A tiny random Llama (8 layers, d = 32, RoPE base 50000) with the test tokenizer, as safetensors."""
    from tiny_models import build_tokenizer

    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                      initializer_range=0.3, bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": TARGET_ROPE})
    LlamaForCausalLM(cfg).eval().save_pretrained(path, safe_serialization=True)
    build_tokenizer().save_pretrained(path)
    return path


# ---- plain-torch pieces -----------------------------------------------------------------------------------
def rms(x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x):
    return torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], dim=-1)


def rope(x, positions, base):
    """x [heads, T, hd] rotated at ``positions`` [T] (cnets ``LlamaRotaryEmbedding``: cat(freqs, freqs))."""
    hd = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2).float() / hd))
    freqs = positions.float()[:, None] * inv[None]  # [T, hd / 2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def linear(x, w, b=None):
    return F.linear(x, w, b)


def attention(W, prefix, x_q, x_kv, q_pos, k_pos, base, heads, kv_heads, causal, qk_norm=None, eps=1e-6):
    """Multi-head attention of cnets / Qwen3 style. x_q [Tq, *], x_kv [Tk, *]; W holds
    ``{prefix}{q,k,v,o}_proj.weight`` (+ biases when present); qk_norm: (q_norm w, k_norm w) per head."""
    q = linear(x_q, W[prefix + "q_proj.weight"], W.get(prefix + "q_proj.bias"))
    k = linear(x_kv, W[prefix + "k_proj.weight"], W.get(prefix + "k_proj.bias"))
    v = linear(x_kv, W[prefix + "v_proj.weight"], W.get(prefix + "v_proj.bias"))
    hd = q.shape[-1] // heads
    q = q.view(-1, heads, hd).transpose(0, 1)  # [H, Tq, hd]
    k = k.view(-1, kv_heads, hd).transpose(0, 1)
    v = v.view(-1, kv_heads, hd).transpose(0, 1)
    if qk_norm is not None:
        q, k = rms(q, qk_norm[0], eps), rms(k, qk_norm[1], eps)
    q, k = rope(q, q_pos, base), rope(k, k_pos, base)
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)  # [H, Tq, Tk]
    if causal:
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    out = torch.softmax(scores.float(), dim=-1) @ v  # [H, Tq, hd]
    return linear(out.transpose(0, 1).reshape(x_q.shape[0], -1), W[prefix + "o_proj.weight"], W.get(prefix + "o_proj.bias"))


def mlp(W, prefix, x):
    return linear(F.silu(linear(x, W[prefix + "gate_proj.weight"])) * linear(x, W[prefix + "up_proj.weight"]),
                  W[prefix + "down_proj.weight"])


# ---- target features, read as each source reads them ------------------------------------------------------
@torch.no_grad()
def layer_inputs(target, ids, layers):
    """{l: [T, d]} the input of target layer l (cnets' taps: appended before running layer l), by pre-hooks."""
    got, handles = {}, []
    for l in layers:
        handles.append(target.model.layers[l].register_forward_pre_hook(
            lambda mod, args, kwargs, l=l: got.__setitem__(l, (args[0] if args else kwargs["hidden_states"])[0]),
            with_kwargs=True))
    try:
        target.model(input_ids=torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return got


@torch.no_grad()
def layer_outputs(target, ids, layers):
    """{i: [T, d]} the output of target layer i (SpecForge's capture ids), by forward hooks."""
    got, handles = {}, []
    for i in layers:
        handles.append(target.model.layers[i].register_forward_hook(
            lambda mod, args, out, i=i: got.__setitem__(i, (out[0] if isinstance(out, tuple) else out)[0])))
    try:
        target.model(input_ids=torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return got


@torch.no_grad()
def final_hidden(target, ids):
    """[T, d] the base model's ``outputs[0]``: the last hidden state after the final norm."""
    return target.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


# ---- EAGLE-1 / EAGLE-3 references -------------------------------------------------------------------------
class EagleReference:
    """A SafeAILab-style EAGLE head (``eagle3=False``: cnets1; True: cnets, with SpecForge / speculators flags).

    W: the checkpoint's tensors; cfg: its numbers; target: the HF target (embedding, LM head, taps)."""

    def __init__(self, W, target, *, eagle3, taps=(), tap_outputs=False, prefix="", base=10000.0, eps=1e-5,
                 norm_before_residual=False, fc_norm=False, norm_before_fc=False, norm_logits=True, feed_normed=False,
                 linear_rope=1.0):
        self.W, self.target, self.eagle3, self.taps, self.prefix = W, target, eagle3, list(taps), prefix
        self.tap_outputs = tap_outputs  # SpecForge: the ids name layer outputs
        self.base, self.eps = base, eps
        self.linear_rope = linear_rope  # cnets LlamaLinearScalingRotaryEmbedding: positions / factor
        self.flags = dict(nbr=norm_before_residual, fc_norm=fc_norm, nbf=norm_before_fc, norm_logits=norm_logits,
                          feed_normed=feed_normed)
        self.emb = W.get("embed_tokens.weight", target.get_input_embeddings().weight.detach())
        self.d2t = W.get("d2t")

    def target_features(self, ids):
        if not self.eagle3:
            return final_hidden(self.target, ids)
        got = (layer_outputs if self.tap_outputs else layer_inputs)(self.target, ids, self.taps)
        return torch.cat([got[l] for l in sorted(self.taps)], dim=-1)  # low, mid, high

    def fc_in(self, feats):
        W, p = self.W, self.prefix
        if self.flags["nbf"]:
            feats = rms(feats, W["input_norm.weight"], self.eps)
        if self.flags["fc_norm"]:
            chunks = feats.chunk(len(self.taps), dim=-1)
            feats = torch.cat([rms(c, W[f"fc_norm.{i}.weight"], self.eps) for i, c in enumerate(chunks)], dim=-1)
        return linear(feats, W["fc.weight"], W.get("fc.bias"))

    def rows(self, hidden_in, ids, pos):
        """hidden_in [T, H] (already through fc where the source applies it), ids [T] -> h [T, H]."""
        W, p, eps = self.W, self.prefix, self.eps
        pos = pos / self.linear_rope
        emb = self.emb[ids]
        if not self.eagle3:  # cnets1: fc(cat(emb, hidden)) then a layer without input norm
            h = linear(torch.cat([emb, hidden_in], -1), W["fc.weight"], W.get("fc.bias"))
            h = h + attention(W, p + "self_attn.", h, h, pos, pos, self.base, HEADS, KV_HEADS, causal=True)
        else:  # cnets LlamaDecoderLayeremb
            hn = rms(hidden_in, W[p + "hidden_norm.weight"], eps)
            x = torch.cat([rms(emb, W[p + "input_layernorm.weight"], eps), hn], -1)
            residual = hn if self.flags["nbr"] else hidden_in
            h = residual + attention(W, p + "self_attn.", x, x, pos, pos, self.base, HEADS, KV_HEADS, causal=True)
        return h + mlp(W, p + "mlp.", rms(h, W[p + "post_attention_layernorm.weight"], eps))

    def head_out(self, h):
        """(fed-back hidden, the drafted target token id) of one output row h [H] (greedy)."""
        W = self.W
        if not self.eagle3:
            return h, int(self.target.lm_head(h).argmax())
        if self.flags["feed_normed"]:
            h = rms(h, W["norm.weight"], self.eps)
            z = linear(h, W["lm_head.weight"])
        else:
            z = linear(rms(h, W["norm.weight"], self.eps) if self.flags["norm_logits"] else h, W["lm_head.weight"])
        i = int(z.argmax())
        return h, i + int(self.d2t[i]) if self.d2t is not None and z.shape[-1] < VOCAB else i

    @torch.no_grad()
    def draft(self, context, k):
        """k greedy drafts after ``context`` (x_0..x_n, x_n the root), recomputing every row per draft."""
        n = len(context) - 1
        feats = self.target_features(context[:n])  # positions 0..n-1
        target_in = self.fc_in(feats) if self.eagle3 else feats
        hidden_rows, ids = [target_in[j] for j in range(n)], list(context[1:])  # row j: (g_j, x_{j+1})
        drafts = []
        for m in range(k):
            pos = torch.arange(len(ids))
            out = self.rows(torch.stack(hidden_rows), torch.tensor(ids), pos)
            fed, tok = self.head_out(out[-1])
            drafts.append(tok)
            hidden_rows.append(fed)
            ids.append(tok)
        return drafts


# ---- Medusa references ------------------------------------------------------------------------------------
class MedusaReference:
    """FasterDecoding (``lm``: "per_head" own heads {h}.{L}.weight, "target") or vLLM ("vllm": blocks /
    lm_heads / token_map) Medusa heads: chain draft i = argmax of head i-1 at f_{n-1}."""

    def __init__(self, W, target, layout, heads, layers):
        self.W, self.target, self.layout, self.K, self.L = W, target, layout, heads, layers

    @torch.no_grad()
    def draft(self, context, k):
        n = len(context) - 1
        f = final_hidden(self.target, context[:n])[-1]  # f_{n-1}
        out = []
        for h in range(min(k, self.K)):
            x = f
            for l in range(self.L):
                if self.layout == "vllm":
                    x = x + F.silu(linear(x, self.W[f"blocks.{h}.layers.{l}.weight"],
                                          self.W.get(f"blocks.{h}.layers.{l}.bias")))
                else:
                    x = x + F.silu(linear(x, self.W[f"{h}.{l}.linear.weight"], self.W[f"{h}.{l}.linear.bias"]))
            if self.layout == "vllm":
                i = int(linear(x, self.W[f"lm_heads.{h}.weight"]).argmax())
                out.append(int(self.W["token_map"][i]) if "token_map" in self.W else i)
            elif self.layout == "per_head":
                out.append(int(linear(x, self.W[f"{h}.{self.L}.weight"]).argmax()))
            else:
                out.append(int(self.target.lm_head(x).argmax()))
        return out


# ---- DFlash reference -------------------------------------------------------------------------------------
class DFlashReference:
    """z-lab's ``DFlashDraftModel`` over the whole context each step (its draft KV cache holds exactly the
    context K/V this recomputes)."""

    def __init__(self, W, target, layer_ids, layers, block_size, mask_id, base, eps, heads=HEADS, kv_heads=KV_HEADS,
                 scale=1.0, multiplier=1.0, softcap=None):
        self.W, self.target, self.ids, self.layers = W, target, list(layer_ids), layers
        self.B, self.mask, self.base, self.eps, self.heads, self.kv = block_size, mask_id, base, eps, heads, kv_heads
        self.scale, self.multiplier, self.softcap = scale, multiplier, softcap  # _draft_value's fields

    @torch.no_grad()
    def draft(self, context, k):
        logits = self.logits(context)
        logits[:, self.mask] = float("-inf")  # specviz never drafts MASK (z-lab's sample() does not exclude it)
        return logits.argmax(-1)[:k].tolist()

    @torch.no_grad()
    def logits(self, context):
        """compute_logits of block slots 1..B-1 after the committed ``context``: float [B - 1, V]."""
        W, eps = self.W, self.eps
        n = len(context) - 1
        out = self.target.model(input_ids=torch.tensor([context[:n]]), output_hidden_states=True)
        ctx = torch.cat([out.hidden_states[i + 1][0] for i in self.ids], dim=-1)  # extract_context_feature
        th = rms(linear(ctx, W["fc.weight"]), W["hidden_norm.weight"], eps)  # [n, H]
        block = torch.tensor([context[n]] + [self.mask] * (self.B - 1))
        h = self.target.get_input_embeddings().weight[block] * self.scale  # _raw_input_embeddings: [B, H]
        q_pos, k_pos = torch.arange(n, n + self.B), torch.arange(0, n + self.B)
        for i in range(self.layers):
            p = f"layers.{i}."
            x = rms(h, W[p + "input_layernorm.weight"], eps)
            a = attention(W, p + "self_attn.", x, torch.cat([th, x]), q_pos, k_pos, self.base, self.heads, self.kv,
                          causal=False, qk_norm=(W[p + "self_attn.q_norm.weight"], W[p + "self_attn.k_norm.weight"]),
                          eps=eps)
            h = h + a
            h = h + mlp(W, p + "mlp.", rms(h, W[p + "post_attention_layernorm.weight"], eps))
        logits = self.target.lm_head(rms(h, W["norm.weight"], eps))[1:] * self.multiplier  # slots 1..B-1
        if self.softcap is not None and self.softcap > 0:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


# ---- checkpoint writers ------------------------------------------------------------------------------------
def _w(*shape, scale=0.3):
    return torch.randn(*shape) * scale


def _norm(n):
    return 1.0 + 0.3 * torch.randn(n)  # far from ones, so a skipped norm changes the drafts


def _attn(prefix, d_in, heads=HEADS, kv=KV_HEADS, hd=HEAD_DIM, d_out=HIDDEN):
    return {prefix + "q_proj.weight": _w(heads * hd, d_in), prefix + "k_proj.weight": _w(kv * hd, d_in),
            prefix + "v_proj.weight": _w(kv * hd, d_in), prefix + "o_proj.weight": _w(d_out, heads * hd)}


def _mlp(prefix, inter=2 * HIDDEN):
    return {prefix + "gate_proj.weight": _w(inter, HIDDEN), prefix + "up_proj.weight": _w(inter, HIDDEN),
            prefix + "down_proj.weight": _w(HIDDEN, inter)}


def _llama_fields(**more):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
            "intermediate_size": 2 * HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "num_hidden_layers": 1, "rms_norm_eps": 1e-05, "hidden_act": "silu", "max_position_embeddings": 2048,
            "vocab_size": VOCAB, "tie_word_embeddings": False, **more}


def write(path: Path, config: dict, tensors: dict, name="model.safetensors", pickle=False) -> dict:
    """config.json + the tensors (safetensors, or ``torch.save`` as the official .bin / .pt files)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if pickle:
        torch.save(tensors, path / name)
    else:
        save_file({k: v.clone() for k, v in tensors.items()}, str(path / name))
    return tensors


def reduced_vocab(seed, size=64):
    """(d2t offsets int64 [size], t2d bool [VOCAB]): ``size`` even target ids, sorted ascending, as
    SafeAILab's ``traineagle3/cnets.py`` builds them (d2t[i] = used[i] - i); offsets strictly increase."""
    used = sorted(2 * t for t in random.Random(seed).sample(range(VOCAB // 2), size))
    d2t = torch.tensor([u - i for i, u in enumerate(used)], dtype=torch.long)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def eagle1_safeailab(path, target, seed=0, bias=True, pickle=True):
    """SafeAILab EAGLE-1: ``fc`` [H, 2H] with a bias (``"bias": true``; LLaMA-3 heads: ``"bias": false`` and none),
    ``layers.0.*`` without input norm, the target's embedding copied in, no rope_theta (base 10000); shipped as
    pytorch_model.bin."""
    torch.manual_seed(seed)
    W = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().clone(), "fc.weight": _w(HIDDEN, 2 * HIDDEN),
         **({"fc.bias": _w(HIDDEN)} if bias else {}), **_attn("layers.0.self_attn.", HIDDEN), **_mlp("layers.0.mlp."),
         "layers.0.post_attention_layernorm.weight": _norm(HIDDEN)}
    return write(path, _llama_fields(bias=bias), W, "pytorch_model.bin" if pickle else "model.safetensors", pickle=pickle)


def _eagle3_core(prefix, seed, draft_vocab, taps=3, hd=HEAD_DIM):
    torch.manual_seed(seed)
    return {**_attn(prefix + "self_attn.", 2 * HIDDEN, hd=hd), **_mlp(prefix + "mlp."),
            prefix + "hidden_norm.weight": _norm(HIDDEN), prefix + "input_layernorm.weight": _norm(HIDDEN),
            prefix + "post_attention_layernorm.weight": _norm(HIDDEN), "fc.weight": _w(HIDDEN, taps * HIDDEN),
            "norm.weight": _norm(HIDDEN), "lm_head.weight": _w(draft_vocab, HIDDEN)}


def eagle3_safeailab(path, seed=1, t2d=True, hd=HEAD_DIM, **fields):
    """SafeAILab EAGLE-3: ``midlayer.*``, ``fc`` [H, 3H], own norm and lm_head over 64 draft tokens, ``d2t``
    offsets (+ ``t2d``), no embedding, no rope_theta; ``hd``: attention head size (``head_dim`` in the config when
    it is not H / heads); ``fields``: more config fields (e.g. rope_theta, rope_scaling)."""
    W = _eagle3_core("midlayer.", seed, 64, hd=hd)
    W["d2t"], mask = reduced_vocab(seed)
    if t2d:
        W["t2d"] = mask
    return write(path, _llama_fields(draft_vocab_size=64, **({"head_dim": hd} if hd != HEAD_DIM else {}), **fields), W)


def eagle3_specforge(path, target, seed=2, capture=(1, 3, 5)):
    """SpecForge ``LlamaForCausalLMEagle3``: SafeAILab's keys, ``fc_norm`` per tap, ``norm_output`` true,
    nested ``eagle_config`` capture ids (outputs of layers 1, 3, 5), rope_theta 20000, explicit head_dim, and
    the target's embedding included (the HF export)."""
    W = _eagle3_core("midlayer.", seed, 96)
    W.update({f"fc_norm.{i}.weight": _norm(HIDDEN) for i in range(3)})
    W["d2t"], W["t2d"] = reduced_vocab(seed, 96)
    W["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    cfg = _llama_fields(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=96, rope_theta=20000.0,
                        head_dim=HEAD_DIM, fc_norm=True, norm_output=True,
                        eagle_config={"eagle_aux_hidden_state_layer_ids": list(capture)})
    return write(path, cfg, W)


def eagle3_speculators(path, target, seed=3, layer_ids=(1, 3, 6), norm_output=False, norm_before_fc=False):
    """vllm-project/speculators ``eagle3``: ``layers.0.*``, ``norm_before_residual: true``, top-level layer ids
    (inputs of layers 1, 3, 6), ``transformer_layer_config`` written as a diff (no rope_theta: 10000), the
    target's embedding, d2t / t2d."""
    W = _eagle3_core("layers.0.", seed, 80)
    W["d2t"], W["t2d"] = reduced_vocab(seed, 80)
    W["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    if norm_before_fc:
        W["input_norm.weight"] = _norm(3 * HIDDEN)
    cfg = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
           "draft_vocab_size": 80, "norm_before_residual": True, "norm_before_fc": norm_before_fc,
           "norm_output": norm_output, "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": list(layer_ids),
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]},
           "transformer_layer_config": {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN,
                                        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
                                        "head_dim": HEAD_DIM, "num_hidden_layers": 1, "rms_norm_eps": 1e-05,
                                        "vocab_size": VOCAB}}
    return write(path, cfg, W)


def medusa1(path, seed=4, heads=3, config_heads=2):
    """FasterDecoding Medusa-1: ``medusa_lm_head.pt`` with ``{h}.0.linear.*`` and a per-head LM head ``{h}.1.weight``;
    config.json understating the head count (the upstream TODO)."""
    torch.manual_seed(seed)
    W = {}
    for h in range(heads):
        W.update({f"{h}.0.linear.weight": _w(HIDDEN, HIDDEN), f"{h}.0.linear.bias": _w(HIDDEN),
                  f"{h}.1.weight": _w(VOCAB, HIDDEN)})
    cfg = {"medusa_num_heads": config_heads, "medusa_num_layers": 1, "base_model_name_or_path": "tiny"}
    return write(path, cfg, W, "medusa_lm_head.pt", pickle=True)


def medusa2(path, seed=5, heads=3):
    """FasterDecoding medusa2 (``train_legacy.py``): ``medusa_lm_head.safetensors``, two ResBlocks per head that
    are ONE module (``[ResBlock(H)] * L``: the same tensor under ``{h}.0`` and ``{h}.1``), the base LM head."""
    torch.manual_seed(seed)
    W = {}
    for h in range(heads):
        w, b = _w(HIDDEN, HIDDEN), _w(HIDDEN)
        W.update({f"{h}.0.linear.weight": w, f"{h}.0.linear.bias": b, f"{h}.1.linear.weight": w,
                  f"{h}.1.linear.bias": b})
    cfg = {"medusa_num_heads": heads, "medusa_num_layers": 2, "version": "2", "base_model_name_or_path": "tiny"}
    return write(path, cfg, W, "medusa_lm_head.safetensors")


def medusa_vllm(path, seed=6, heads=3, truncated=100):
    """vLLM Medusa: ``blocks.{h}.layers.0.weight`` (no bias), ``lm_heads.{h}.weight`` over a truncated vocabulary,
    ``token_map`` (absolute target ids)."""
    torch.manual_seed(seed)
    W = {}
    for h in range(heads):
        W.update({f"blocks.{h}.layers.0.weight": _w(HIDDEN, HIDDEN), f"lm_heads.{h}.weight": _w(truncated, HIDDEN)})
    W["token_map"] = torch.tensor(sorted(random.Random(seed).sample(range(VOCAB), truncated)), dtype=torch.long)
    cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": HIDDEN, "vocab_size": VOCAB,
           "num_heads": heads, "num_hidden_layers": 1, "truncated_vocab_size": truncated}
    return write(path, cfg, W)


def dflash_zlab(path, seed=7, layer_ids=(1, 5), block_size=4, nested=False, mask_id=2, layers=2, top_level=False,
                **fields):
    """z-lab DFlash (``DFlashDraftModel``, Qwen3 layers with q/k norms), rope_theta 1e6, ``block_size`` at the top
    level (or nested in ``dflash_config``), ``target_layer_ids`` in z-lab's convention (output of layer i), in
    ``dflash_config`` (or, ``top_level``, beside it with ``mask_token_id``: ``_draft_value`` reads both);
    ``fields``: more ``dflash_config`` entries (``input_embedding_scale``, ...)."""
    torch.manual_seed(seed)
    W = {"fc.weight": _w(HIDDEN, len(layer_ids) * HIDDEN), "hidden_norm.weight": _norm(HIDDEN),
         "norm.weight": _norm(HIDDEN)}
    for i in range(layers):
        p = f"layers.{i}."
        W.update({**_attn(p + "self_attn.", HIDDEN), **_mlp(p + "mlp."), p + "self_attn.q_norm.weight": _norm(HEAD_DIM),
                  p + "self_attn.k_norm.weight": _norm(HEAD_DIM), p + "input_layernorm.weight": _norm(HIDDEN),
                  p + "post_attention_layernorm.weight": _norm(HIDDEN)})
    dcfg = {"mask_token_id": mask_id, "target_layer_ids": list(layer_ids), **fields}
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": layers, "rms_norm_eps": 1e-06,
           "rope_theta": 1000000.0, "max_position_embeddings": 4096, "vocab_size": VOCAB, "attention_bias": False,
           "num_target_layers": LAYERS, "dflash_config": dcfg}
    if top_level:
        cfg.update(mask_token_id=dcfg.pop("mask_token_id"), target_layer_ids=dcfg.pop("target_layer_ids"))
    if nested:
        dcfg["block_size"] = block_size
    else:
        cfg["block_size"] = block_size
    return write(path, cfg, W)
