"""Tree forwards in both runners: the logits of every tree node equal those of its root-to-node
path run as a plain chain (docs/design/methods.md 11.2, vLLM ``test_tree_attn_correctness``), the built mask
equals a brute-force ancestor mask, and KV compaction after a commit equals a recompute."""

from __future__ import annotations

import pytest
import torch

from specviz import tree as T
from specviz.models import load_model
from specviz.runner import EagerRunner, tree_attention, tree_positions
from specviz.static_runner import StaticRunner

# root children 0, 1, 2; node 3 under 0; nodes 4, 5 under 1; node 6 under 3; node 7 under 6
PARENTS = [-1, -1, -1, 0, 1, 1, 3, 6]
TOKENS = [11, 12, 13, 21, 22, 23, 31, 41]


def _brute_force_mask(parents):
    """M[a][b] over rows 0 = root, 1 + i = node i: b is on the path from the root to a."""
    n = len(parents)
    m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    for a in range(n + 1):
        m[a, 0] = True
        node = a - 1
        while node >= 0:
            m[a, node + 1] = True
            node = parents[node]
    return m


@pytest.mark.parametrize("parents", [PARENTS, [-1, -1, -1, -1], T.chain_parents(5), [-1, 0, 0, 1, 2, 2, 5, -1]])
def test_tree_attention_equals_brute_force(parents):
    assert torch.equal(tree_attention(parents), _brute_force_mask(parents))
    assert torch.equal(tree_attention(parents)[1:, 1:], T.ancestor_mask(parents))
    assert tree_positions(parents, 7).tolist() == [7, *(7 + d for d in T.depths(parents))]


def _runners(model, kind):
    if kind == "eager":
        return EagerRunner(model)
    # "static_padded": rows padded to a tree-size bucket, as under CUDA graphs (here eagerly); "_compiled": the
    # tree forward through torch.compile ("aot_eager": dynamo's trace and the functionalized cache writes)
    compiled = kind.endswith("_compiled")
    return StaticRunner(model, max_cache_len=128, tree_buckets=(4, 16) if kind.startswith("static_padded") else None,
                        compile=compiled, compile_backend="aot_eager")


@pytest.fixture(scope="module", params=[("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa")])
def model(request, tiny_dirs):
    arch, attn = request.param
    m = load_model(tiny_dirs[arch][0], torch.device("cpu"), torch.float32)
    m.config._attn_implementation = attn
    return m


PREFIX = torch.tensor([3, 17, 45, 9, 88, 120, 7, 64])  # committed tokens x_0..x_{n-1}
ROOT = 55  # the last committed token x_n


@pytest.mark.parametrize("kind", ["eager", "static", "static_padded", "static_padded_device_parents",
                                  "static_padded_compiled"])
def test_tree_logits_equal_each_path_as_a_chain(model, kind):
    """Each node's logits and features equal its root path run as a chain; "device_parents": the parents as an
    int64 tensor (a tree drafted on the device, whose mask the static runner builds by device ops); "compiled":
    the tree forward compiled (and compile stayed on)."""
    if kind.endswith("_compiled"):
        torch._dynamo.reset()
    runner = _runners(model, kind.replace("_device_parents", ""))
    runner.reset()
    runner.forward(PREFIX)
    parents = torch.tensor(PARENTS, dtype=torch.long) if kind.endswith("device_parents") else PARENTS
    out = runner.forward_features(torch.tensor([ROOT, *TOKENS]), ("final_norm",), parents=parents)
    assert out.logits.shape == (1 + len(TOKENS), model.config.vocab_size)
    assert runner.seq_len == len(PREFIX) + 1 + len(TOKENS)
    if kind != "eager":  # the write position follows seq_len (padding rows are not in the cache)
        assert int(runner.cache.layers[0].cumulative_length) == runner.seq_len
    ref = EagerRunner(model)
    for node in range(-1, len(TOKENS)):
        path = T.path_to(PARENTS, node)
        ref.reset()
        chain = ref.forward_features(torch.cat([PREFIX, torch.tensor([ROOT, *(TOKENS[j] for j in path)])]),
                                     ("final_norm",))
        torch.testing.assert_close(out.logits[node + 1], chain.logits[-1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.features["final_norm"][node + 1], chain.features["final_norm"][-1],
                                   rtol=1e-4, atol=1e-4)
    if kind.endswith("_compiled"):
        assert runner._compiled_tree is not None  # no fallback to the eager tree forward


@pytest.mark.parametrize("kind", ["eager", "static", "static_padded"])
@pytest.mark.parametrize("path_end", [-1, 0, 2, 4, 5, 7])
@pytest.mark.parametrize("rows", ["host", "device"])
def test_commit_compacts_kv_equal_to_a_recompute(model, kind, path_end, rows):
    """After a tree forward and commit(path), the cache holds exactly the keys/values of the
    committed text, and the next forward gives the logits of a fresh prefill; likewise when the path's
    forward rows come as a device tensor (the tree verifier's kept rows, padded past the path)."""
    path = T.path_to(PARENTS, path_end)
    runner = _runners(model, kind)
    runner.reset()
    runner.forward(PREFIX)
    runner.forward_features(torch.tensor([ROOT, *TOKENS]), parents=PARENTS)
    kept_rows = torch.tensor([0, *(1 + c for c in path)] + [len(PARENTS)] * (len(PARENTS) - len(path)))
    runner.commit(path, **({"rows": kept_rows[1:1 + len(path)]} if rows == "device" else {}))
    committed = torch.cat([PREFIX, torch.tensor([ROOT, *(TOKENS[j] for j in path)])])
    assert runner.seq_len == len(committed)
    if kind != "eager":  # every layer's K/V is a view of one tensor: the compaction is one gather for all
        assert runner._kv is not None
        assert all(layer.keys.data_ptr() == runner._kv[2 * i].data_ptr() for i, layer in enumerate(runner.cache.layers))
    fresh = EagerRunner(model)
    fresh.reset()
    fresh.forward(committed)
    n = len(committed)
    for layer, ref in zip(runner.cache.layers, fresh.cache.layers):
        for name in ("keys", "values"):
            torch.testing.assert_close(getattr(layer, name)[:, :, :n], getattr(ref, name), rtol=1e-4, atol=1e-4)
    nxt = torch.tensor([99, 5])
    torch.testing.assert_close(runner.forward(nxt), fresh.forward(nxt), rtol=1e-4, atol=1e-4)


def test_chain_parents_take_the_causal_path(model):
    runner = EagerRunner(model)
    runner.reset()
    runner.forward(PREFIX)
    ids = torch.tensor([ROOT, 1, 2, 3])
    a = runner.forward_features(ids, parents=T.chain_parents(3)).logits
    runner.commit([0, 1])
    assert runner.seq_len == len(PREFIX) + 3
    runner.truncate(len(PREFIX))
    b = runner.forward(ids)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bad_tree_inputs_raise(model):
    runner = EagerRunner(model)
    runner.reset()
    runner.forward(PREFIX)
    with pytest.raises(ValueError, match="1 \\+ N tokens"):
        runner.forward_features(torch.tensor([ROOT, 1, 2]), parents=[-1, -1, 0])
    with pytest.raises(ValueError, match="parent"):
        runner.forward_features(torch.tensor([ROOT, 1, 2]), parents=[-1, 1])
    runner.forward_features(torch.tensor([ROOT, 1, 2]), parents=[-1, -1])
    with pytest.raises(ValueError, match="commit keeps"):
        runner.commit([0, 1, 1])


@pytest.mark.gpu
def test_static_tree_graphs_on_cuda_match_chains_and_commit(tiny_dirs):
    """The tree-size-bucket CUDA graphs (captured on the first tree, replayed on the second, at a
    new position) give each path's chain logits, and commit equals a recompute."""
    model = load_model(tiny_dirs["llama"][0], torch.device("cuda"), torch.float32)
    runner = StaticRunner(model, max_cache_len=128)
    assert runner.cuda_graphs and runner.tree_buckets
    ref = StaticRunner(model, max_cache_len=128, cuda_graphs=False)
    runner.reset()
    runner.forward(PREFIX)
    prefix = PREFIX
    for round_ in range(2):
        out = runner.forward_features(torch.tensor([ROOT, *TOKENS]), parents=PARENTS).logits
        for node in range(-1, len(TOKENS)):
            path = T.path_to(PARENTS, node)
            ref.reset()
            chain = ref.forward(torch.cat([prefix, torch.tensor([ROOT, *(TOKENS[j] for j in path)])]))
            torch.testing.assert_close(out[node + 1], chain[-1].to(out.device), rtol=1e-4, atol=1e-4)
        path = T.path_to(PARENTS, 6)
        runner.commit(path)
        prefix = torch.cat([prefix, torch.tensor([ROOT, *(TOKENS[j] for j in path)])])
        assert runner.seq_len == len(prefix)
        runner.forward(torch.tensor([ROOT]))  # the next "root" at a new position
        prefix = torch.cat([prefix, torch.tensor([ROOT])])
        runner.truncate(len(prefix) - 1)
        prefix = prefix[:-1]
    assert any(isinstance(k, tuple) and k[0] == "tree" for k in runner.graphs)
    assert runner._kv is not None  # the compaction ran on the stacked K/V (one gather for every layer)


def test_device_tree_attention_equals_the_host_one_on_random_trees():
    """tree_attention_device (parents on the device, pointer doubling) gives tree_attention's mask and the
    nodes' depths exactly, for random trees of 1..64 nodes (chains, stars and deep trees among them)."""
    import random

    from specviz.runner import tree_attention, tree_attention_device
    from specviz.tree import depths

    rng = random.Random(0)
    shapes = [[-1], list(range(-1, 63)), [-1] * 20]  # one node, a 64-deep chain, a star
    shapes += [[rng.randrange(-1, i) for i in range(rng.randrange(1, 65))] for _ in range(200)]
    for parents in shapes:
        mask, depth = tree_attention_device(torch.tensor(parents, dtype=torch.long))
        assert torch.equal(mask, tree_attention(parents)), parents
        assert depth.tolist() == depths(parents), parents
