"""Gemma 4's MTP assistant (transformers ``Gemma4AssistantForCausalLM``, layout ``gemma4-assistant``) as method mtp
on a Gemma 4 target, proven against the public code (tests/reference_gemma4.py): tiny checkpoints written by
transformers' own ``save_pretrained`` (random weights, with and without centroid-masked logits); every draft specviz
makes equals what transformers' own assistant, driven by its own ``SinglePositionMultiTokenCandidateGenerator``,
drafts from the same committed tokens, and greedy output equals plain greedy token for token (fp32, eager and static
runners). Planted mistakes (the embedding not scaled by sqrt(H_t), positions advanced within a round, K/V from the
wrong target layer, a sliding window one key short) make the comparison fail."""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT, draft_mismatches, with_head

import reference_gemma4 as G
import transformers
from tiny_models import build_tokenizer
from specviz import SpecDecoder
from specviz.heads.formats import layout_of, load_head_dir
from specviz.methods.mtp import formats as mtp_formats
from specviz.methods.eagle.view import FATE_COLOUR
from specviz.methods.mtp.assistant import Gemma4AssistantHead

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread
K, NEW = 3, 24


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("gemma4-assistant")


@pytest.fixture(scope="module")
def target_dir(root):
    return G.save_target(root / "target")


@pytest.fixture(scope="module")
def base(target_dir):
    return SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def plain(base):
    return base.generate(PROMPT, method="none", max_new_tokens=NEW).output_token_ids


@pytest.fixture(scope="module")
def heads(root, base, plain):
    """{name: assistant dir}: random (the planted mistakes' baseline), ordered (centroid-masked logits) and follow
    (drafts that mostly follow the target's own continuation, one successor in five wrong: full and partial
    accepts)."""
    ids = base.encode(PROMPT) + plain
    return {"random": G.save_assistant(root / "random", seed=3),
            "ordered": G.save_assistant(root / "ordered", seed=4, ordered=True),
            "follow": G.save_assistant(root / "follow", seed=5, follow=G.successors(ids, wrong_every=5),
                                       target=base.target_model)}


def mismatches(dec, directory, **settings):
    """(trace, [(step, specviz's drafts, the reference's)] where they differ) for a chain of K."""
    return draft_mismatches(dec, "mtp", G.AssistantReference(dec.target_model, directory), K, NEW, min_compared=6,
                            **settings)


def swapped(base, head):
    """``base`` drafting mtp with ``head`` (a context manager)."""
    return with_head(base, "mtp", head)


@pytest.mark.parametrize("runner", ["eager", "static"])
@pytest.mark.parametrize("name", ["random", "ordered", "follow"])
def test_every_draft_equals_transformers_and_greedy_equals_plain(target_dir, heads, plain, runner, name):
    """Loaded through the one API and detected from the files; every draft equals transformers' own; the output is
    plain greedy's; the trace records the layout and the target layers read (2: the last non-KV-shared sliding
    layer, 1: the last non-KV-shared full one)."""
    dec = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32", runner=runner,
                                      heads={"mtp": str(heads[name])})
    assert layout_of(heads[name]) == "gemma4-assistant" and isinstance(dec.heads["mtp"], Gemma4AssistantHead)
    trace, bad = mismatches(dec, heads[name])
    assert not bad, bad
    assert trace.output_token_ids == plain
    head = trace.config["head"]
    assert head["format"] == "gemma4-assistant" and head["kv_layers"] == G.SOURCES
    assert head["use_ordered_embeddings"] == (name == "ordered")
    if name == "follow":
        accepted = [st.num_accepted for st in trace.steps if st.draft_token_ids]
        assert K in accepted and any(0 < a < K for a in accepted), accepted  # full and partial accepts


def test_planted_unscaled_embedding_fails(base, heads, monkeypatch):
    """The target's embedding without Gemma 4's sqrt(H_t) scale drafts differently."""
    monkeypatch.setattr(Gemma4AssistantHead, "embed",
                        lambda self, ids: torch.nn.functional.embedding(ids, self.embed_tokens.weight))
    with swapped(base, load_head_dir(heads["random"], base.target_model, "mtp")):
        assert mismatches(base, heads["random"])[1]


def test_planted_positions_advanced_within_a_round_fail(base, heads, monkeypatch):
    """Step m at position n + m - 1 (EAGLE's advancing positions) instead of n for every step drafts differently."""
    real = Gemma4AssistantHead.draft
    state = {"pos": None, "m": 0, "most": 0}

    def advancing(self, h, tok, pos, kv):
        if state["pos"] is not pos:  # the proposer makes one position tensor per round
            state.update(pos=pos, m=0)
        out = real(self, h, tok, pos + state["m"], kv)
        state["m"] += 1
        state["most"] = max(state["most"], state["m"])
        return out

    monkeypatch.setattr(Gemma4AssistantHead, "draft", advancing)
    with swapped(base, load_head_dir(heads["random"], base.target_model, "mtp")):
        trace, bad = mismatches(base, heads["random"])
    assert bad and state["most"] == K  # rounds of K steps ran, and they drafted differently


def test_planted_kv_from_the_wrong_layer_fails(base, heads, monkeypatch):
    """K/V of the first layer of each type (not the last non-KV-shared one) drafts differently."""
    monkeypatch.setattr(mtp_formats, "kv_source_layers", lambda config: {G.S: 0, G.F: 1})
    head = load_head_dir(heads["random"], base.target_model, "mtp")
    assert head.kv_layers == {G.S: 0, G.F: 1}
    with swapped(base, head):
        assert mismatches(base, heads["random"])[1]


def test_planted_sliding_window_one_key_short_fails(base, heads, monkeypatch):
    """Sliding layers seeing the last W keys (the target's own window) instead of transformers' W + 1 for the
    assistant (its bidirectional |q - k| <= W) draft differently."""
    real = Gemma4AssistantHead._visible

    def short(self, kind, position_ids, slots):
        seen = real(self, kind, position_ids, slots)
        if kind == G.S:
            seen = seen & (torch.arange(slots)[None, :] >= position_ids.reshape(1, 1) - self.config.sliding_window)
        return seen

    monkeypatch.setattr(Gemma4AssistantHead, "_visible", short)
    with swapped(base, load_head_dir(heads["random"], base.target_model, "mtp")):
        assert mismatches(base, heads["random"])[1]


def test_sampling_drafts_the_argmax_verified_one_hot(base, heads):
    """At T > 0 the assistant still drafts transformers' argmax, handed over as a deterministic draft (q one-hot:
    the recorded q of every drafted token is 1); the step records say so for the view."""
    with swapped(base, load_head_dir(heads["ordered"], base.target_model, "mtp")):
        trace, bad = mismatches(base, heads["ordered"], temperature=0.9, verify="standard", seed=2)
    assert not bad, bad
    drafted = [st for st in trace.steps if st.draft_token_ids]
    assert all(st.match["one_hot_draft"] and st.match["greedy"] for st in drafted)
    assert {st.match["real_logits"] for st in drafted} == {80}  # 4 clusters of 320 / 16 tokens
    assert all(pos.q == 1.0 for st in drafted for pos in st.positions)


def test_refused_on_other_targets_and_other_cache_layouts(root, heads, target_dir):
    """A non-Gemma-4 target, or a Gemma 4 target whose cache layout differs from the assistant's (KV heads, head_dim,
    global_head_dim, layer types), is refused at load with what differs."""
    from tiny_models import save_model

    llama = save_model("llama", root / "llama")
    with pytest.raises(ValueError, match="only for a Gemma 4 target.*'llama'"):
        SpecDecoder.from_pretrained(llama, device="cpu", dtype="float32", heads={"mtp": str(heads["random"])})
    model = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32").target_model
    for over, words in ((dict(num_key_value_heads=1), "sliding_attention num_key_value_heads 1 != target layer 2's 2"),
                        (dict(head_dim=8), "sliding_attention head_dim 8 != target layer 2's 16"),
                        (dict(global_head_dim=16), "full_attention global_head_dim 16 != target layer 1's 32")):
        bad = G.save_assistant(root / f"bad-{next(iter(over))}", **over)
        with pytest.raises(ValueError, match="cache layout: .*" + words):
            load_head_dir(bad, model, "mtp")
    full_only = G.save_target(root / "full-only", layer_types=[G.F] * 5)
    with pytest.raises(ValueError, match="layer_types: the assistant has sliding_attention layers"):
        SpecDecoder.from_pretrained(full_only, device="cpu", dtype="float32", heads={"mtp": str(heads["random"])})


def test_view_says_what_the_format_implies(base, heads):
    """The view names the layout and its source, the target layers read per type (sliding: the last W + 1 keys), the
    centroid masking and how T > 0 is verified."""
    from specviz.methods.mtp.view import mtp_figure, mtp_html

    with swapped(base, load_head_dir(heads["ordered"], base.target_model, "mtp")):
        trace = base.generate(PROMPT, method="mtp", num_speculative_tokens=K, max_new_tokens=6)
    step = next(i for i, st in enumerate(trace.steps) if st.draft_token_ids)
    n = trace.steps[step].match["root_position"]
    page = mtp_html(trace.to_dict(), step)
    for words in ("gemma4-assistant", "Gemma4AssistantForCausalLM", f"target layer 2, positions {n - 1 - G.WINDOW}",
                  f"target layer 1, positions 0..{n - 1}", "80 of 320", "not a real distribution", "q one-hot",
                  f"same position {n}"):
        assert words in page, words
    fig = mtp_figure(trace.to_dict(), step)
    assert "target layers 2 (sliding) and 1 (full)" in fig.layout.title.text
    named = {t.name for t in fig.data if t.showlegend is not False}
    drawn = set(fig.data[0].marker.color)  # every colour the bars use has its legend entry
    assert drawn and {f"probability of the drafted token: {f}" for f, c in FATE_COLOUR.items() if c in drawn} <= named
    old = trace.to_dict()  # a trace recorded before kv_reads existed: one layer kv_layer, positions 0..n-1
    for st in old["steps"]:
        (st.get("match") or {}).pop("kv_reads", None)
    assert f"target layer 2, positions 0..{n - 1}" in mtp_html(old, step)


def test_whole_buffer_chain_equals_the_exact_length_chain(target_dir, heads):
    """The CUDA-graph body (MtpDraftGraphs: the static cache's whole layer buffers, stale slots past n masked inside)
    drafts what the eager chain drafts over exactly the n cached positions, at every step of a request. On the CPU the
    capture fails (no CUDA) and the same body runs eagerly, which is what is compared here."""
    from specviz.methods.mtp.proposer import MtpDraftGraphs, MtpProposer

    dec = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32", runner="static",
                                      heads={"mtp": str(heads["follow"])})
    graphs, pairs = MtpDraftGraphs(), []

    class Both(MtpProposer):
        def propose(self, token_ids, num_tokens=None, context=None):
            draft = super().propose(token_ids, num_tokens, context)
            n = len(token_ids) - 1
            if len(draft.token_ids):
                tok = torch.tensor([[int(token_ids[n])]])
                whole, _ = graphs.draft(self.head, context.target_runner, self._feature, tok, n, len(draft.token_ids))
                pairs.append((draft.token_ids.tolist(), whole.tolist()))
            return draft

    import dataclasses

    from specviz import methods

    saved = methods.get("mtp")
    methods.register(dataclasses.replace(saved, make=lambda b: Both(b.decoder.heads["mtp"], K)))
    try:
        dec.generate(PROMPT, method="mtp", num_speculative_tokens=K, max_new_tokens=NEW)
    finally:
        methods.register(saved)
    assert len(pairs) > 5 and all(whole == eager for eager, whole in pairs), pairs


def test_written_back_in_the_published_layout(root, base, heads):
    """save_published of a loaded assistant writes transformers' layout again (the same drafts when read back); specviz's
    own mtp head has no published layout and is refused with why."""
    from specviz.heads.formats.export import save_published
    from specviz.methods.mtp.head import MtpHead, mtp_config_from_target

    head = load_head_dir(heads["ordered"], base.target_model, "mtp")
    assert save_published(head, root / "written", dtype=torch.float32)["layout"] == "gemma4-assistant"
    runs = []
    for directory in (heads["ordered"], root / "written"):
        with swapped(base, load_head_dir(directory, base.target_model, "mtp")):
            runs.append(base.generate(PROMPT, method="mtp", num_speculative_tokens=K, max_new_tokens=NEW))
    assert [s.draft_token_ids for s in runs[0].steps] == [s.draft_token_ids for s in runs[1].steps]
    from tiny_models import build_model

    own = MtpHead(mtp_config_from_target(build_model("llama").config))
    with pytest.raises(ValueError, match="no published layout"):
        save_published(own, root / "own")


def test_bf16_keeps_rope_frequencies_fp32(base, heads):
    """A bf16 assistant keeps every per-type RoPE frequency buffer in float32 (Fp32RopeMixin)."""
    head = load_head_dir(heads["random"], base.target_model, "mtp", dtype=torch.bfloat16)
    rot = head.model.model.rotary_emb
    names = [n for n, _ in rot.named_buffers() if n.endswith("inv_freq")]
    assert len(names) == 4 and all(getattr(rot, n).dtype == torch.float32 for n in names)
    assert head.model.pre_projection.weight.dtype == torch.bfloat16


@pytest.mark.gpu
def test_static_graphs_equal_eager_on_gpu(target_dir, heads):
    """On CUDA the static runner drafts through captured graphs (no failed capture) exactly what the eager runner
    drafts, and both give plain greedy's tokens (fp32)."""
    decs = {r: SpecDecoder.from_pretrained(target_dir, device="cuda", dtype="float32", runner=r,
                                           heads={"mtp": str(heads["follow"])}) for r in ("eager", "static")}
    want = decs["eager"].generate(PROMPT, method="none", max_new_tokens=NEW).output_token_ids
    runs = {r: d.generate(PROMPT, method="mtp", num_speculative_tokens=K, max_new_tokens=NEW) for r, d in decs.items()}
    assert runs["eager"].output_token_ids == runs["static"].output_token_ids == want
    assert [s.draft_token_ids for s in runs["eager"].steps] == [s.draft_token_ids for s in runs["static"].steps]
    graphs, = decs["static"].pool.free(("mtp", id(decs["static"].heads["mtp"])))  # drafted through captured graphs
    assert graphs.replays > 0 and graphs.graphs and all(g is not None for g in graphs.graphs.values())


def test_a_multimodal_gemma4_checkpoint_is_decoded_by_its_text_decoder(root, target_dir, base, heads, plain):
    """Gemma 4's instruction models ship as ``Gemma4ForConditionalGeneration`` (text decoder under
    ``model.language_model``, a vision tower beside it): specviz decodes its text decoder as ``Gemma4ForCausalLM``,
    sharing the weights, so method none gives the text-only target's output and the assistant drafts what
    transformers' own drafts on the text-only target (the same weights)."""
    text = base.target_model
    torch.manual_seed(0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16)
    config = transformers.Gemma4Config(text_config=transformers.Gemma4TextConfig(**G.TARGET), vision_config=vision,
                                       audio_config=None, tie_word_embeddings=False)
    multimodal = transformers.Gemma4ForConditionalGeneration(config).eval()
    multimodal.model.language_model.load_state_dict(text.model.state_dict())
    multimodal.lm_head.load_state_dict(text.lm_head.state_dict())
    multimodal.generation_config.eos_token_id = None
    directory = root / "multimodal"
    multimodal.save_pretrained(directory, safe_serialization=True)
    build_tokenizer().save_pretrained(directory)
    dec = SpecDecoder.from_pretrained(directory, device="cpu", dtype="float32", heads={"mtp": str(heads["follow"])})
    assert type(dec.target_model).__name__ == "Gemma4ForCausalLM"
    assert dec.target_model.specviz_text_of == "Gemma4ForConditionalGeneration"
    assert dec.names["model_sources"]["target"]["text_decoder_of"] == "Gemma4ForConditionalGeneration"
    assert dec.generate(PROMPT, method="none", max_new_tokens=NEW).output_token_ids == plain
    trace, bad = draft_mismatches(dec, "mtp", G.AssistantReference(text, heads["follow"]), K, NEW, min_compared=6)
    assert not bad, bad
    assert trace.output_token_ids == plain and sum(s.num_accepted for s in trace.steps) > 0
    mm16 = SpecDecoder.from_pretrained(directory, device="cpu", dtype="bfloat16").target_model
    text16 = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="bfloat16").target_model
    assert all(b.dtype == torch.float32 for n, b in mm16.named_buffers() if n.endswith("inv_freq"))  # not cast
    ids = torch.tensor([base.encode(PROMPT)])
    with torch.no_grad():
        assert torch.equal(mm16(ids).logits, text16(ids).logits)


def test_the_lesson_says_what_the_head_read_and_drafted(base, heads):
    """The lesson's draft chapter for mtp names the constant position, the target layers whose K/V were read and each
    drafted token with its confidence (the method's draft_why), not the generic sentence."""
    from specviz.viz.common import fmt_prob, quoted
    from specviz.viz.lesson import _draft_why

    with swapped(base, load_head_dir(heads["follow"], base.target_model, "mtp")):
        trace = base.generate(PROMPT, method="mtp", num_speculative_tokens=K, max_new_tokens=8)
    st = next(s for s in trace.steps if s.draft_token_ids)
    text = _draft_why(trace, st)
    assert f"same position {st.match['steps'][0]['position']}" in text
    assert "target layers 2 (sliding) and 1 (full)" in text
    for s, t in zip(st.match["steps"], st.draft_token_ids):
        said = f"pass {s['step']} → {quoted(trace, t)} (the head's probability of it {fmt_prob(s['draft_prob'])})"
        assert said in text
