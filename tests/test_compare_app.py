"""The Compare tab through gradio_client (tiny models): every event by api_name, a comparison run,
presets, bad input, export + import (equal table), opening a run in the single-run views."""

from __future__ import annotations

import json
import re

import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from test_app import app_url  # noqa: E402,F401  (the tiny-model app fixture)


def _text(cell) -> str:
    """What an HTML table cell shows (its tags dropped); other cells as they are."""
    return re.sub(r"<[^>]+>", "", cell) if isinstance(cell, str) else cell


def _hover(cell: str) -> str:
    return " ".join(re.findall(r"title='([^']*)'", cell))


API = ("compare", "compare_stop", "compare_preset", "compare_view", "compare_view_seed", "compare_scrub",
       "compare_pick", "compare_export", "compare_import", "compare_open", "compare_convention")
# outputs of compare / compare_import: progress, table, strips, scrub, rules, ksweep, prompt, seed, run, position, legend
PROGRESS, TABLE, STRIPS, SCRUB, RULES, KSWEEP, PROMPT, SEED, RUN, POSITION, LEGEND = range(11)


def _compare(client, methods=("ngram", "draft_model"), ks="2", verify=("auto",), temps="0", prompts=("set:0",),
             own="def add(a, b):\n    return a + b\n\ndef add(", seeds="0", max_new=8):
    return client.predict(list(methods), ks, list(verify), temps, list(prompts), own, seeds, max_new,
                          api_name="/compare")


def test_every_event_has_an_api_name(app_url):
    named = Client(app_url, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert all(f"/{name}" in named for name in API), sorted(named)


def test_compare_runs_every_configuration_and_exports_a_comparison_that_imports_equal(app_url, tmp_path):
    client = Client(app_url, verbose=False)
    out = _compare(client)
    assert out[PROGRESS].startswith("**done** · 6/6 runs"), out[PROGRESS]
    rows = out[TABLE]["data"]
    assert [r[0] for r in rows] == ["none", "ngram", "draft_model"]  # what every row shares is in the legend
    assert out[LEGEND].startswith("**Every row:** k = 2, greedy verification, T = 0.")
    assert "timed 3× per prompt and seed" in out[LEGEND] and "compare them only within one comparison" in out[LEGEND]
    assert all(_text(r[-1]) == "✓ equal (2/2)" for r in rows[1:]), [r[-1] for r in rows]
    # the cells stay numbers (the columns sort numerically) and show fixed decimals: 1.00, not 1
    speedup = out[TABLE]["headers"].index("speedup")
    shown = out[TABLE]["metadata"]["display_value"]
    assert rows[0][speedup] == 1 and shown[0][speedup] == "1.00", (rows[0], shown[0])
    assert all(isinstance(r[speedup], float) or isinstance(r[speedup], int) for r in rows)
    assert "output position" in out[SCRUB]
    files = client.predict(api_name="/compare_export")
    by_name = {f.rsplit("/", 1)[-1]: f for f in files}
    assert set(by_name) == {"compare.csv", "compare.json", "compare.html"}
    assert len(open(by_name["compare.csv"]).read().strip().splitlines()) == 1 + 3
    other = Client(app_url, verbose=False)  # a fresh session, no model run in it
    back = other.predict(handle_file(by_name["compare.json"]), api_name="/compare_import")
    assert back[PROGRESS].startswith("**imported** · 6 runs")
    assert back[TABLE]["data"] == rows
    opened = other.predict(2, 0, 0, api_name="/compare_open")
    assert "from the comparison" in opened[0] and "draft_model" in opened[0]
    moved = other.predict(0, 0, 3, api_name="/compare_scrub")
    assert "output position 3" in moved[1]
    picked = other.predict("draft_model k=2 greedy T=0|5|1", 0, 0, api_name="/compare_pick")
    assert "output position 5" in picked[1] and picked[3] == 2
    # the convention switch rewrites the AL column (header and values) and the k sweep's axis
    vllm = out[TABLE]["headers"].index("AL (vLLM)")
    table_pf, ksweep = other.predict("per_forward", api_name="/compare_convention")
    assert table_pf["headers"][vllm] == "AL (per forward)"
    assert [r[vllm] for r in table_pf["data"]] == [r[2] for r in rows]  # = tokens / forward, every step counted
    table_d, _ = other.predict("drafts_only", api_name="/compare_convention")
    assert table_d["headers"][vllm] == "AL − 1 (drafts only)"
    assert [r[vllm] for r in table_d["data"][1:]] == [round(r[vllm] - 1, 2) for r in rows[1:]]
    assert "tokens per target forward" in json.dumps(ksweep)  # the k sweep counts every step, whatever the table shows


def test_presets_fill_the_controls(app_url):
    client = Client(app_url, verbose=False)
    methods, ks, verify, temps, trees = client.predict("k sweep (k = 1, 2, 3, 5, 8; greedy)", api_name="/compare_preset")
    assert ks == "1,2,3,5,8" and "draft_model" in methods and temps == "0" and trees == ""
    methods, ks, verify, temps, trees = client.predict("same draft, every rule (draft model, T = 0.8)",
                                                       api_name="/compare_preset")
    assert methods == ["draft_model"] and set(verify) == {"standard", "block"} and temps == "0.8"
    methods, ks, verify, temps, trees = client.predict("eagle3: chains (k = 5, 7) vs EAGLE-2 trees",
                                                       api_name="/compare_preset")
    assert methods == ["eagle3"] and ks == "5,7" and trees == "4,5,24; 4,6,32"


def test_trees_run_beside_the_chains_and_open_in_the_single_run_views(app_url):
    client = Client(app_url, verbose=False)
    out = client.predict(["ngram", "draft_model"], "2", ["auto"], "0", [], "def add(a, b):\n    return a + b\n\ndef add(",
                         "0", 8, "vllm", "2; [(0,), (1,), (0, 0)]", api_name="/compare")
    assert out[PROGRESS].startswith("**done** · 5/5 runs"), out[PROGRESS]
    rows = out[TABLE]["data"]
    assert [r[0] for r in rows] == ["none", "ngram", "draft_model", "ngram tree 2 branches",
                                    "draft_model static tree [(0,),(1,),(0,0)]"]
    assert all(_text(r[-1]) == "✓ equal (1/1)" for r in rows[1:]), [r[-1] for r in rows]
    assert "static tree [(0,),(1,),(0,0)]" in json.dumps(out[KSWEEP])
    opened = client.predict(4, 0, 0, api_name="/compare_open")
    assert "from the comparison" in opened[0] and "draft_model" in opened[0]
    assert "Run runs those, not this configuration" in opened[0]  # the controls were not refilled: it says so
    bad = client.predict(["ngram"], "2", ["auto"], "0", [], "x = 1", "0", 8, "vllm", "4,6,32", api_name="/compare")
    assert "no chosen method takes the tree '4,6,32'" in bad[PROGRESS], bad[PROGRESS]


def test_bad_input_says_what_to_change(app_url, tmp_path):
    client = Client(app_url, verbose=False)
    assert "choose at least one method" in _compare(client, methods=())[PROGRESS]
    assert "k must be comma-separated" in _compare(client, ks="two")[PROGRESS]
    assert "choose at least one prompt" in _compare(client, prompts=(), own="")[PROGRESS]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "specviz-comparison", "version": 1, "configs": "x"}))
    assert "configs must be a list" in client.predict(handle_file(str(bad)), api_name="/compare_import")[PROGRESS]
    with pytest.raises(Exception, match="nothing to export yet"):
        client.predict(api_name="/compare_export")
    # an output position typed before any comparison, or past the outputs: no Gradio bound error, clamped
    assert client.predict(None, None, 32, api_name="/compare_view")[2]["value"] == 1
    last = _compare(client)[POSITION]["maximum"]
    assert client.predict(0, 0, 999, api_name="/compare_view")[2]["value"] == last > 1


def test_sampled_comparison_with_seeds_reports_the_distribution_check(app_url):
    client = Client(app_url, verbose=False)
    few = _compare(client, methods=("draft_model",), verify=("standard",), temps="1.0", seeds="0,1,2", prompts=(),
                   max_new=4)
    badge = few[TABLE]["data"][1][-1]
    assert _text(badge) == "few seeds" and "not enough samples (3 seeds; run ≥ 10)" in _hover(badge), badge
    # T = 0.3: the tiny models' p is peaked enough for tokens to repeat over 12 seeds (at T = 1 it is nearly flat)
    out = _compare(client, methods=("draft_model",), verify=("standard", "block"), temps="0.3", seeds="0-11",
                   prompts=(), max_new=6)
    rows = out[TABLE]["data"]
    assert [r[0] for r in rows] == ["none", "draft_model standard", "draft_model block"]  # k = 2, T = 0.3 alike
    assert all(_text(r[-1]).startswith("≈ χ² p=") and "≈ χ² per position p=" in _hover(r[-1])
               and "(12 seeds)" in _hover(r[-1]) for r in rows[1:]), rows
    rules = json.dumps(out[RULES])
    assert "greedy: mean acc. length" in rules and "block: mean acc. length" in rules


def test_stop_ends_the_comparison_after_the_current_run(app_url):
    import time

    client = Client(app_url, verbose=False)
    job = client.submit(["ngram", "draft_model"], "2", ["auto"], "0", [], "def add(a, b):\n    return a", "0-60", 8,
                        api_name="/compare")
    deadline = time.time() + 120
    while time.time() < deadline and not any("running" in str(o[PROGRESS]) for o in job.outputs()):
        time.sleep(0.2)
    assert "stopping" in client.predict(api_name="/compare_stop")
    final = job.result(timeout=120)
    assert final[PROGRESS].startswith("**stopped** ·"), final[PROGRESS]
    done = int(final[PROGRESS].split("·")[1].split("/")[0])
    assert 1 <= done < 3 * 61
