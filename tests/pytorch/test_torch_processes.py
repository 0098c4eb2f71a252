"""pyw8a8.torch beside torch in one process: the thread count they agree on, forks after
either ran a parallel op, and a model shared with torch.multiprocessing's workers.  Each
scenario runs in a fresh interpreter with a timeout,
so a hang fails the test instead of stalling the suite."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")

TIMEOUT = 120

SETUP = textwrap.dedent("""
    import os, sys, torch, pyw8a8, pyw8a8.torch as pt
    torch.manual_seed(0)
    layer = pt.Linear.from_float(torch.nn.Linear(1024, 512), activation="silu")
    x = torch.randn(64, 1024)
    big = torch.randn(4_000_000)

    def torch_parallel_op():
        return big.exp().sum().item()  # at::parallel_for: torch's OpenMP team, 2 threads

    def child_matches(reference):
        pid = os.fork()
        if pid == 0:
            with torch.no_grad():
                same = torch.equal(layer(x), reference)
            os._exit(0 if same else 3)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
""")


def run(body, threads=2, script=None):
    """The scenario's output words; `script`: run from that file (a spawned child imports
    its functions from there) instead of -c."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYW8A8_ISA", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_NUM_THREADS"] = str(threads)
    source = SETUP + textwrap.dedent(body)
    if script is not None:
        script.write_text(source)
    command = [sys.executable] + (["-c", source] if script is None else [str(script)])
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT,
                             env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung for {TIMEOUT} s; output so far: {exc.stdout!r} {exc.stderr!r}")
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@needs_fork
def test_torch_then_pyw8a8_then_fork_gives_the_child_the_same_bits():
    assert run("""
        torch_parallel_op()
        with torch.no_grad():
            reference = layer(x)
        print(child_matches(reference))
    """) == ["0"]


@needs_fork
def test_pyw8a8_s_attention_in_a_forked_child_gives_the_parent_s_bits():
    """The float attention runs on pyw8a8's OpenMP team too: in the child that survived
    the fork of a parent that ran it in parallel, it runs on one thread, the same bits."""
    assert run("""
        # small enough that torch's own ops in the child (torch.equal) stay serial
        q, k, v = (torch.randn(2, 4, 64, 32) for _ in range(3))
        def attend():
            return torch.ops.pyw8a8.float_attention(q, k, v, None, 0.25, False)
        reference = attend()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if torch.equal(attend(), reference) else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """) == ["0"]


@needs_fork
def test_a_fork_after_torch_alone_ran_leaves_pyw8a8_working_in_the_child():
    """torch, not pyw8a8, started the pool the child inherits (shared where torch and pyw8a8
    load one runtime): pyw8a8's first product in the child must not wait for it."""
    assert run("""
        pyw8a8.set_num_threads(1)  # so pyw8a8 starts no team in the parent
        with torch.no_grad():
            reference = layer(x)
        pyw8a8.set_num_threads(None)
        torch_parallel_op()
        print(child_matches(reference))
    """) == ["0"]


def test_pyw8a8_layers_follow_torch_set_num_threads_unless_pyw8a8_sets_its_own():
    assert run("""
        with torch.no_grad():
            torch.set_num_threads(2)  # torch's default may be the physical cores (MKL's)
            layer(x)
            first = pyw8a8.get_num_threads()
            torch.set_num_threads(1)
            one = layer(x)
            after_torch = pyw8a8.get_num_threads()
            pyw8a8.set_num_threads(2)
            two = layer(x)
            override = pyw8a8.get_num_threads()
            pyw8a8.set_num_threads(None)
            layer(x)
            back = pyw8a8.get_num_threads()
        print(first, after_torch, override, back, torch.equal(one, two))
    """) == ["2", "1", "2", "1", "True"]


def test_a_model_sent_to_workers_gives_them_and_the_parent_the_same_bits(tmp_path):
    """torch.multiprocessing workers of each start method given the model compute the
    parent's bits, and so does the parent after: sending a model to a spawned worker moves
    its buffers into shared memory, as model.share_memory() does, and the parent's next
    call read the freed memory before."""
    out = run("""
        import torch.multiprocessing as mp

        def work(model, x, queue):
            with torch.inference_mode():
                queue.put(model(x).numpy().copy())

        if __name__ == "__main__":
            model = pt.quantize(torch.nn.Sequential(layer, torch.nn.Linear(512, 64)))
            with torch.inference_mode():
                reference = model(x)
            for method in mp.get_all_start_methods():
                ctx = mp.get_context(method)
                queue = ctx.Queue()
                worker = ctx.Process(target=work, args=(model, x, queue))
                worker.start()
                same = torch.equal(torch.from_numpy(queue.get(timeout=100)), reference)
                worker.join(30)
                with torch.inference_mode():
                    parent = torch.equal(model(x), reference)
                print(method, same, parent, worker.exitcode)
            model.share_memory()
            with torch.inference_mode():
                print("share_memory", torch.equal(model(x), reference))
    """, script=tmp_path / "shared_model.py")
    methods = out[:-2][::4]
    assert "spawn" in methods and out[-2:] == ["share_memory", "True"], out
    assert out[:-2] == [v for m in methods for v in (m, "True", "True", "0")], out
