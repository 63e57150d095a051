"""Launch to ready: the app started as a user starts it (``python app.py``, a new process), timed until

1. its server answers (``server_up_s``),
2. a first Run has finished: the first bundled example with its speedup comparison, submitted as soon as the server
   answers (``first_run_done_s``; its trace's ``capture_ms`` is what that run captured itself, outside its timings),
3. the warm-up line says the warm-up has ended (``warm_up_done_s``),

then the same request again (``second_run``). With a background compile stage, runs are sent one after the other while
the warm-up line says it is compiling (``runs_during_compile``, up to ``--runs-during-compile``: each one's wall time
includes any wait for the graph being swapped in; compare it with ``second_run``'s). Each
run says which CUDA graphs its target forwards replayed (``runner``: the trace's ``runner_compiled``: compiled once the
warm-up's compile stage has swapped them in).
``--launches 2`` (default) launches the app twice in a row: the second launch finds the first one's compile caches
(Inductor's on-disk caches and specviz's mega-cache file), so its compile stage runs from cache hits. Seconds from
each launch; each milestone and each new warm-up line is printed as it comes (a launch cut short still reports),
then one JSON object printed and written to --out.

    python benchmarks/app_ready.py --out results/gpu/app_ready.json               # the machine's default device
    python benchmarks/app_ready.py --device cpu -- --compile                      # options after -- go to app.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _wait_for_server(url: str, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with code {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"no answer from {url} within {timeout} s")


def stop_app(proc: subprocess.Popen, timeout: float = 20.0) -> str:
    """Terminate the launched app (kill it after ``timeout`` s) and return everything it printed."""
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def _first_example_request() -> tuple:
    from specviz.ui.run import RunRequest

    ex = json.loads((ROOT / "assets/examples/prompts.json").read_text())["examples"][0]
    st = ex["settings"]
    options = {k: st[k] for k in ("prompt_lookup_min", "prompt_lookup_max") if k in st}
    return RunRequest(prompt=ex["prompt"], method=st["method"], num_speculative_tokens=st["num_speculative_tokens"],
                      verify=st.get("verify", "greedy"), temperature=st.get("temperature", 0.0),
                      max_new_tokens=st.get("max_new_tokens", 96), compare=True, options=options).values()


def _warm_line(client) -> str:
    """The line under the header (its first output; the second is the poll timer's update)."""
    out = client.predict(api_name="/warm_up_status")
    return str(out[0] if isinstance(out, (list, tuple)) else out)


def _run(client, args: tuple) -> dict:
    from load_app import exported

    t = time.time()
    client.predict(*args, api_name="/run")
    wall = time.time() - t
    client.predict(api_name="/measure")  # the speedup over none, measured after the run (its own event)
    trace = exported(client)
    m = trace.metrics
    meas = (m.get("baseline_none") or {}).get("measurement") or {}
    return {"wall_s": round(wall, 2), "with_measurement_s": round(time.time() - t, 2),
            "capture_ms": m.get("capture_ms"),
            "speedup_median": meas.get("median"), "tokens": m.get("num_generated_tokens"),
            "runner": trace.config.get("runner_compiled"), "measured_on": meas.get("runner")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds to wait for each stage")
    ap.add_argument("--launches", type=int, default=2, help="launches in a row (the later ones find the caches)")
    ap.add_argument("--runs-during-compile", type=int, default=4, help="runs sent while the stage compiles, one "
                    "after the other (each one's wall time includes any wait for a graph being swapped in)")
    ap.add_argument("app_args", nargs="*", help="more options for app.py (after --)")
    a = ap.parse_args()
    out = {"launches": [launch(a) for _ in range(a.launches)]}
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))


def launch(a: argparse.Namespace) -> dict:
    """One launch of the app, timed (see the module docstring)."""
    from gradio_client import Client

    from load_app import free_port

    port = free_port()
    cmd = [sys.executable, str(ROOT / "app.py"), "--port", str(port), *(["--device", a.device] if a.device else []),
           *a.app_args]
    url = f"http://127.0.0.1:{port}/"
    res: dict = {"command": " ".join(cmd[1:]), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.time()

    def note(key: str, value) -> None:  # each milestone printed as it comes: a launch cut short still reports
        res[key] = value
        print(json.dumps({"at_s": round(time.time() - t0, 1), key: value}), flush=True)

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_server(url, proc, a.timeout)
        note("server_up_s", round(time.time() - t0, 1))
        client = Client(url, verbose=False)
        note("warm_up_line_at_server_up", _warm_line(client)[:300])
        request = _first_example_request()
        note("first_run", _run(client, request))
        note("first_run_done_s", round(time.time() - t0, 1))
        end, line, lines, during = time.time() + a.timeout, "", [], []
        res["runs_during_compile"] = during
        while time.time() < end:
            line = _warm_line(client)
            if not lines or line != lines[-1][1]:  # the warm-up's progress, timed
                lines.append((round(time.time() - t0, 1), line[:200]))
                print(json.dumps({"at_s": lines[-1][0], "warm_up_line": lines[-1][1]}), flush=True)
            if line.startswith(("warmed up", "warm-up failed")) or not line.strip():
                break
            if "compiling the forwards" in line and len(during) < a.runs_during_compile:  # what a run waits then
                during.append({"line": line[:200], "at_s": round(time.time() - t0, 1), **_run(client, request)})
                note("run_during_compile", during[-1])
            time.sleep(1.0)
        res["warm_up_lines"] = lines
        note("warm_up_done_s", round(time.time() - t0, 1))
        res["warm_up_line"] = line[:300]
        note("second_run", _run(client, request))
    except Exception as exc:  # noqa: BLE001 - a launch that fails is reported with the app's log, the next one runs
        res["error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        res["app_log_tail"] = stop_app(proc)[-1500:]
    print(json.dumps({k: v for k, v in res.items() if k != "app_log_tail"}), flush=True)
    return res


if __name__ == "__main__":
    main()
