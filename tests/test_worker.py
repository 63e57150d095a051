"""The app's run threads (specviz/ui/worker.py): runs reuse a few long-lived daemon threads."""

from __future__ import annotations

import threading

from specviz.ui.worker import BackgroundRun, RunPool, run_pool


def test_sequential_jobs_reuse_one_thread_and_concurrent_ones_get_their_own():
    pool = RunPool(max_threads=4)
    names = []
    for _ in range(20):  # one after the other: always the same thread
        done = threading.Event()
        pool.submit(lambda: names.append(threading.current_thread().name), on_done=done.set)
        assert done.wait(5)
    assert len(set(names)) == 1 and pool.threads == 1
    release, started = threading.Event(), []
    lock = threading.Lock()

    def hold():
        with lock:
            started.append(threading.current_thread().name)
        release.wait(5)

    for _ in range(6):  # 6 at once with 4 threads at most: 4 run, 2 wait their turn
        pool.submit(hold)
    for _ in range(100):
        if len(started) == 4:
            break
        threading.Event().wait(0.02)
    assert len(started) == 4 and pool.threads == 4
    release.set()
    for _ in range(100):
        if len(started) == 6:
            break
        threading.Event().wait(0.02)
    assert len(started) == 6 and len(set(started)) == 4 and pool.threads == 4
    assert all(t.daemon for t in pool._threads)  # never holds up the process's exit


class _Decoder:
    def __init__(self):
        self.threads = []

    def iter_generate(self, prompt, **settings):
        self.threads.append(threading.current_thread().name)
        yield f"trace of {prompt}"


def test_background_runs_share_the_pool_threads():
    """Ten runs one after the other start no new thread once the pool has one (the app's soak ran 200)."""
    dec = _Decoder()
    before = run_pool().threads
    for i in range(10):
        run = BackgroundRun(dec, f"p{i}", {}, threading.Event())
        assert run.finished.wait(5) and run.error is None and run.result() == f"trace of p{i}"
    assert run_pool().threads == max(before, 1)
    assert all(name.startswith("specviz-run") for name in dec.threads)
