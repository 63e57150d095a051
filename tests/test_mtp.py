"""Method mtp: a Gemma-4-style head whose queries read the target's own KV cache. The runners'
``layer_kv`` is the cache itself; drafting writes no KV (the target cache is unchanged and the head
holds none); every step runs at the constant position n-1 with the previous step's token and hidden
state; greedy output equals plain greedy decoding (eager and static); T > 0 is lossless (chi-square);
the view. Heads have random weights on tiny random targets."""

from __future__ import annotations

import dataclasses

from types import SimpleNamespace

import pytest
import torch
from helpers import PROMPT, assert_greedy_equals_plain_greedy, assert_static_graphs_equal_eager, cli_args
from helpers import runner_decoders, tiny_head_dirs
from stats_helpers import chi2_pvalue, exact_marginals, first_two, save_small_word_target

from specviz import SpecDecoder
from specviz.heads import load_head, save_head
from specviz.methods.mtp.head import MtpHead, OneLayerReads, mtp_config_from_target
from specviz.methods.mtp.proposer import MtpProposer
from specviz.runner import EagerRunner
from specviz.static_runner import StaticRunner

D = 32
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


def random_mtp(model, seed: int) -> MtpHead:
    torch.manual_seed(seed)
    return MtpHead(mtp_config_from_target(model.config, draft_hidden_size=24, intermediate_size=48), model).eval()


@pytest.fixture(scope="module")
def mtp_dirs(tmp_path_factory):
    return tiny_head_dirs(tmp_path_factory, "mtp", lambda model: random_mtp(model, 12))


@pytest.fixture(scope="module")
def mtp_decoders(mtp_dirs):
    return runner_decoders(mtp_dirs[0], {"mtp": mtp_dirs[1]})


class OracleMtp(OneLayerReads, torch.nn.Module):
    """Stub with MtpHead's call signature that records every call. Step m (known from the fed-back
    hidden state, which it sets to 1000 + m) at position t puts its mass on ``oracle[t + 1 + m]`` (the
    token step m predicts), except on every ``every``-th chain, where step 2 proposes another token."""

    def __init__(self, oracle: list[int], vocab: int, d: int, kv_layer: int, every: int = 2):
        super().__init__()
        self.config = SimpleNamespace(kind="mtp", kv_layer=kv_layer, aux_layer_ids=())
        self.oracle, self.vocab, self.d, self.every = oracle, vocab, d, every
        self.calls: list[dict] = []
        self.chains = 0

    def forward(self, h_in, token_ids, position_ids, keys, values, key_mask=None):
        marker = float(h_in[0, 0, 0])
        m = int(marker - 1000) + 1 if marker >= 1000 else 1
        self.chains += m == 1
        t = int(position_ids[0, 0])
        self.calls.append({"m": m, "t": t, "tok": int(token_ids[0, 0]), "h": h_in.clone(), "keys": keys,
                           "values": values})
        tok = self.oracle[t + 1 + m] if t + 1 + m < len(self.oracle) else 5
        if m == 2 and self.every and self.chains % self.every == 0:
            tok = (tok + 1) % self.vocab
        logits = torch.zeros(1, 1, self.vocab)
        logits[0, 0, tok] = 10.0
        return torch.full((1, 1, self.d), 1000.0 + m), logits


def _layer_kv_fresh(model, ids: list[int], layer: int):
    from specviz.methods.mtp.head import target_layer_kv

    with torch.no_grad():
        _, _, k, v = target_layer_kv(model, torch.tensor([ids]), layer)
    return k[0], v[0]


@pytest.mark.parametrize("runner_cls", (EagerRunner, StaticRunner))
def test_layer_kv_is_the_cache(mtp_decoders, runner_cls):
    """runner.layer_kv(l) -> (keys, values) [kv_heads, seq_len, head_dim]: views of the runner's own
    cache (no copy), equal to a fresh forward's layer-l K/V (RoPE applied), cut at seq_len after a
    rollback; a layer out of range or an empty cache is a ValueError."""
    model = mtp_decoders["eager"].target_model
    ids = mtp_decoders["eager"].encode(PROMPT)
    runner = runner_cls(model) if runner_cls is EagerRunner else runner_cls(model, max_cache_len=128)
    runner.reset()
    with pytest.raises(ValueError, match="empty"):
        runner.layer_kv(0)
    runner.forward(torch.tensor(ids))
    runner.truncate(len(ids) - 3)
    L = model.config.num_hidden_layers
    for layer in (0, L - 1):
        k, v = runner.layer_kv(layer)
        want_k, want_v = _layer_kv_fresh(model, ids[: len(ids) - 3], layer)
        assert k.shape == (model.config.num_key_value_heads, len(ids) - 3, 8)
        torch.testing.assert_close(k, want_k, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, want_v, rtol=1e-4, atol=1e-5)
        assert k.untyped_storage().data_ptr() == runner.cache.layers[layer].keys.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="layer must be in"):
        runner.layer_kv(L)


@pytest.mark.parametrize("runner", ("eager", "static"))
def test_greedy_equals_plain_greedy(mtp_decoders, runner):
    """fp32 CPU, k in {1, 2, 4, 6}: the random head and an oracle stub (full and partial accepts) give
    exactly method none's tokens."""
    dec = mtp_decoders[runner]
    assert_greedy_equals_plain_greedy(
        dec, runner, ("mtp",), (1, 2, 4, 6),
        lambda kind, full, real: OracleMtp(full, dec.vocab_size, D, real["mtp"].config.kv_layer),
        min_accepted=16 * 2, rejection_from_k=2)


@pytest.mark.parametrize("runner", ("eager", "static"))
def test_drafting_writes_no_kv_at_a_constant_position(mtp_decoders, runner):
    """Every draft step of a chain runs at position n-1 (the last committed one), reads the target's
    layer-kv_layer cache through layer_kv (the very tensors, all n positions) and the previous step's
    token and hidden state; propose() leaves the target cache's length and contents unchanged, and
    neither the proposer nor the head holds a cache."""
    dec = mtp_decoders[runner]
    want = dec.generate(PROMPT, method="none", max_new_tokens=14).output_token_ids
    full = dec.encode(PROMPT) + want
    real = dict(dec.heads)
    oracle = OracleMtp(full, dec.vocab_size, D, real["mtp"].config.kv_layer)
    checks = []

    class Spy(MtpProposer):
        def propose(self, token_ids, num_tokens=None, context=None):
            r = context.target_runner
            L = r.model.config.num_hidden_layers
            before = [tuple(t.clone() for t in r.layer_kv(layer)) for layer in range(L)]
            n0, calls0 = r.seq_len, len(oracle.calls)
            draft = super().propose(token_ids, num_tokens, context)
            after = [r.layer_kv(layer) for layer in range(L)]
            checks.append((len(token_ids) - 1, n0, r.seq_len, before, after, oracle.calls[calls0:], draft))
            return draft

    from specviz import methods

    saved = methods.get("mtp")
    methods.register(dataclasses.replace(saved, make=lambda b: Spy(oracle, b.config.num_speculative_tokens)))
    dec.heads["mtp"] = oracle
    try:
        got = dec.generate(PROMPT, method="mtp", num_speculative_tokens=3, max_new_tokens=14)
    finally:
        methods.register(saved)
        dec.heads = real
    assert got.output_token_ids == want and checks
    for n, n0, n1, before, after, calls, draft in checks:
        assert n0 == n1 == n  # the target cache holds x_0..x_{n-1}, before and after drafting
        for (k0, v0), (k1, v1) in zip(before, after):
            assert torch.equal(k0, k1) and torch.equal(v0, v1)
        assert [c["m"] for c in calls] == list(range(1, len(draft) + 1))
        assert all(c["t"] == n - 1 for c in calls)  # constant position
        assert [c["tok"] for c in calls] == [full[n], *draft.token_ids.tolist()[:-1]]  # root, then d_{m-1}
        k_view, _ = after[oracle.config.kv_layer]
        assert all(c["keys"].shape[2] == n and torch.equal(c["keys"][0], k_view) for c in calls)
        assert all(float(c["h"][0, 0, 0]) == 1000 + c["m"] - 1 for c in calls[1:])  # h fed back
    prop = Spy(oracle, 3)
    assert not [name for name, v in vars(prop).items() if "cache" in name or isinstance(v, (list, tuple)) and v]
    real_head = real["mtp"]
    assert not any("cache" in name for name, _ in real_head.named_buffers())
    assert not [m for m in real_head.modules() if hasattr(m, "k_proj") or hasattr(m, "v_proj")]  # Q-only


def test_head_reads_only_keys_up_to_its_position(mtp_decoders):
    """The real head: its output for a query at position t does not change when keys after t change
    (the default mask), and does change when a key <= t changes."""
    dec = mtp_decoders["eager"]
    head = dec.heads["mtp"]
    c = head.config
    torch.manual_seed(0)
    h, keys, values = torch.randn(1, 1, D), torch.randn(1, c.num_key_value_heads, 9, c.head_dim), \
        torch.randn(1, c.num_key_value_heads, 9, c.head_dim)
    tok, pos = torch.tensor([[7]]), torch.tensor([[5]])
    with torch.no_grad():
        base = head(h, tok, pos, keys, values)[1]
        later = keys.clone()
        later[:, :, 6:] += 5
        same = head(h, tok, pos, later, values)[1]
        earlier = keys.clone()
        earlier[:, :, 3] += 5
        moved = head(h, tok, pos, earlier, values)[1]
    torch.testing.assert_close(base, same)
    assert (base - moved).abs().max() > 1e-4


def test_save_load_missing_and_cli(mtp_dirs, mtp_decoders, capsys):
    from specviz.cli import main

    target, head_dir = mtp_dirs
    dec = mtp_decoders["eager"]
    head = load_head(head_dir, dec.target_model)
    c = head.config
    args = (torch.randn(1, 2, D), torch.tensor([[3, 4]]), torch.tensor([[4, 4]]),
            torch.randn(1, c.num_key_value_heads, 5, c.head_dim), torch.randn(1, c.num_key_value_heads, 5, c.head_dim))
    with torch.no_grad():
        torch.testing.assert_close(head(*args)[1], dec.heads["mtp"](*args)[1])
    bare = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="method 'mtp' needs a Gemma-4-style MTP head.*heads="):
        bare.generate(PROMPT, method="mtp")
    common = cli_args(target)
    assert main([*common, "--method", "mtp", "--mtp-head", str(head_dir)]) == 0
    assert "mean acceptance length" in capsys.readouterr().out


@pytest.fixture(scope="module")
def small_decoder(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-small")
    model = save_small_word_target(root)
    save_head(random_mtp(model, 5), root / "mtp", dtype=torch.float32)
    return SpecDecoder.from_pretrained(root / "target", device="cpu", dtype="float32", heads={"mtp": str(root / "mtp")})


@pytest.mark.parametrize("verify,sampling", (("standard", dict(temperature=0.9)),
                                             ("block", dict(temperature=1.0, top_k=5))))
def test_sampling_is_lossless_per_position(small_decoder, verify, sampling):
    """T > 0, k = 2, drafts sampled from q = the head's processed distribution: the first and second
    generated tokens are distributed as the target's (chi-square over 400 seeded runs, p > 0.001)."""
    dec, prompt, trials = small_decoder, [1, 6, 2, 3], 400
    counts, accepted = first_two(dec, prompt, trials, "mtp", num_speculative_tokens=2, verify=verify, **sampling)
    assert 0.05 * trials < accepted < 1.95 * trials
    for i, p in enumerate(exact_marginals(dec, prompt, **sampling)):
        assert chi2_pvalue(counts[i], p, trials) > 1e-3, (verify, i, counts[i].tolist())


def test_mtp_view(mtp_decoders):
    """The chain of MTP steps: per step the constant position, the target layer and positions it read,
    the hidden state and token fed, the drafted token, its confidence and the target's decision."""
    from specviz.methods.eagle.view import CELL
    from specviz.viz.source import source_figure, source_html

    dec = mtp_decoders["eager"]
    tr = dec.generate(PROMPT, method="mtp", num_speculative_tokens=4, max_new_tokens=12)
    st = next(s for s in tr.steps if s.draft_token_ids)
    page = source_html(tr, st.index)
    n = st.match["root_position"]
    L = dec.heads["mtp"].config.kv_layer
    assert "sv-mtp" in page and page.count("<tr data-mtp-step=") == len(st.draft_token_ids)
    assert page.count(f"<td {CELL}>L{L} 0..{n - 1}</td>") == len(st.draft_token_ids)
    assert "trained by specviz (no public recipe)" in page
    for s in st.match["steps"]:
        assert s["position"] == n - 1 and 0.0 <= s["draft_prob"] <= s["head_top_prob"] <= 1.0
    fig = source_figure(tr, st.index)
    fates = [("accepted" if m <= st.num_accepted else "rejected" if m == st.num_accepted + 1 else "not verified")
             for m in range(1, len(st.draft_token_ids) + 1)]
    assert [t.name for t in fig.data] == ["the head's probability of the drafted token", *(
        f"probability of the drafted token: {f}" for f in dict.fromkeys(fates)), "probability of the head's top token"]
    assert "target layer" in fig.layout.title.text
    assert len(fig.data[0].x) == len(st.draft_token_ids)


@pytest.mark.gpu
def test_static_graphs_equal_eager_on_gpu(mtp_dirs):
    """fp32 on CUDA: with CUDA graphs the static runner's cache (read by layer_kv) gives the eager
    runner's tokens and acceptances, greedy and seeded sampling; greedy equals method none."""
    target, head = mtp_dirs
    decs = runner_decoders(target, {"mtp": head}, device="cuda")
    assert decs["static"].runner_factory.func is StaticRunner
    assert_static_graphs_equal_eager(decs, "mtp", 4, "block")
    # the greedy chains drafted through captured graphs (MtpDraftGraphs), none of which failed
    graphs, = decs["static"].pool.free(("mtp", id(decs["static"].heads["mtp"])))
    assert graphs.replays > 0 and graphs.graphs and all(g is not None for g in graphs.graphs.values())


def test_whole_buffer_chain_equals_the_exact_length_chain(mtp_decoders):
    """The graph path's chain (MtpDraftGraphs: the static cache's whole layer buffers, keys past t masked)
    gives the eager chain's drafts (over exactly the n cached positions) at every step of a request. On the
    CPU the capture itself fails (no CUDA) and the same body runs eagerly, which is what is compared here;
    on CUDA tests/test_mtp.py::test_static_graphs_equal_eager_on_gpu runs the graphs."""
    from specviz.methods.mtp.proposer import MtpDraftGraphs

    dec = mtp_decoders["static"]
    graphs = MtpDraftGraphs()
    pairs = []

    class Both(MtpProposer):
        def propose(self, token_ids, num_tokens=None, context=None):
            draft = super().propose(token_ids, num_tokens, context)  # eager: no graphs given
            n, r = len(token_ids) - 1, context.target_runner
            if len(draft.token_ids):
                tok = torch.tensor([[int(token_ids[n])]])
                drafts, conf = graphs.draft(self.head, r, self._feature, tok, n, len(draft.token_ids))
                pairs.append((draft.token_ids.tolist(), drafts.tolist(), torch.tensor(self._pending[1].tolist()), conf))
            return draft

    from specviz import methods

    saved = methods.get("mtp")
    methods.register(dataclasses.replace(saved, make=lambda b: Both(b.decoder.heads["mtp"], 4)))
    try:
        dec.generate(PROMPT, method="mtp", num_speculative_tokens=4, max_new_tokens=20)
    finally:
        methods.register(saved)
    assert len(pairs) > 3 and graphs.graphs and all(g is None for g in graphs.graphs.values())  # no CUDA here
    for eager, whole, conf_eager, conf_whole in pairs:
        assert whole == eager
        torch.testing.assert_close(conf_whole, conf_eager, rtol=1e-5, atol=1e-6)
