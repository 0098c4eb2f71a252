"""The built wheel as a user without a compiler gets it: installed with ``pip install
--only-binary=:all:`` into a fresh virtual environment, once with the newest numpy 2.x and
once with numpy 1.26 (the wheel is built against numpy 2).

``PYW8A8_WHEEL`` names the wheel (``make dist`` writes it to ``dist/``; ``.ci/run`` builds
it and sets the variable); without it these tests skip. In each environment the wheel
multiplies exactly on every ISA this CPU runs, its thread policy handles the libgomp
the wheel vendors (under a hashed name), a fork after a parallel product does not hang,
``python -m pyw8a8 --version`` names this checkout's version (a stale wheel fails), and
under numpy 1.26 a fast subset of this suite passes (``NUMPY1_SUBSET``). Every command
runs outside the checkout, so the installed package is the one imported.
"""
import json
import os
import re
import subprocess
import textwrap
import venv
import zipfile

import pytest

import pyw8a8
from pyw8a8 import _thread_policy

pytestmark = pytest.mark.wheel

WHEEL = os.environ.get("PYW8A8_WHEEL", "")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
TIMEOUT = 600  # pip reaching the package index, or a hung fork

# numpy pins of the two environments; the 1.26 one also gets what the subset imports.
NUMPY = {"numpy2": ["numpy>=2"],
         "numpy1": ["numpy==1.26.4", "pytest", "hypothesis", "scipy", "ml_dtypes"]}
# The fast subset that runs under numpy 1.26: the API and its messages, the kernels'
# exactness on this CPU's ISAs, pickling, and the rotation.
NUMPY1_SUBSET = ["kernels/test_int8_matmul.py", "api/test_matmul.py", "api/test_quantize.py",
                 "api/test_messages.py", "api/test_properties.py", "api/test_pickle.py",
                 "kernels/test_rotation.py"]


def _wheel():
    if not WHEEL:
        pytest.skip("no wheel to test: `make dist`, then PYW8A8_WHEEL=dist/<the .whl>")
    if not os.path.isfile(WHEEL):
        pytest.fail(f"PYW8A8_WHEEL={WHEEL!r} is not a file")
    return os.path.abspath(WHEEL)


def _clean_env(**extra):
    """The environment without what would make a subprocess import the checkout, pick an
    ISA, or set the OpenMP wait policy (which the thread policy would then leave alone)."""
    drop = ("PYTHONPATH", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith("PYW8A8_")}
    env.update(extra)
    return env


class Env:
    """A fresh virtual environment with the wheel installed binary-only."""

    def __init__(self, name, root):
        self.name, self.root = name, root
        venv.create(root, with_pip=True)
        self.python = os.path.join(root, "bin", "python")
        self.pip(["install", "-q", "--only-binary=:all:", _wheel(), *NUMPY[name]])

    def pip(self, args):
        out = subprocess.run([self.python, "-m", "pip", *args], capture_output=True,
                             text=True, env=_clean_env(), timeout=TIMEOUT, cwd=self.root)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    def run(self, args, **env):
        """(return code, stdout, stderr) of the environment's python with `args`, run in
        the environment's directory, failing the test after TIMEOUT seconds."""
        try:
            out = subprocess.run([self.python, *args], capture_output=True, text=True,
                                 env=_clean_env(**env), timeout=TIMEOUT, cwd=self.root)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"hung for {TIMEOUT} s: {exc.stdout!r} {exc.stderr!r}")
        return out.returncode, out.stdout, out.stderr

    def check(self, code, **env):
        """stdout of `code`, which must exit 0."""
        status, stdout, stderr = self.run(["-c", textwrap.dedent(code)], **env)
        assert status == 0, stderr[-3000:]
        return stdout


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """Env by name, each made on first use."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = Env(name, str(tmp_path_factory.mktemp(name)))
        return made[name]
    return get


@pytest.fixture(params=sorted(NUMPY))
def env(request, envs):
    return envs(request.param)


@pytest.fixture(scope="module")
def vendored(tmp_path_factory):
    """The name of the vendored libgomp, as _kernels' needed entry names it."""
    unpacked = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(_wheel()) as z:
        names = z.namelist()
        [kernels] = [n for n in names if re.match(r"pyw8a8/_kernels\..*\.so$", n)]
        z.extract(kernels, unpacked)
    libs = [os.path.basename(n) for n in names if n.startswith("pyw8a8.libs/libgomp-")]
    needed = _thread_policy._needed_libraries(unpacked / kernels)
    assert len(libs) == 1 and libs[0] in needed, (libs, needed)
    return libs[0]


def test_the_wheel_is_manylinux_vendors_libgomp_and_ships_no_c_sources(vendored):
    wheel = os.path.basename(_wheel())
    assert re.search(r"-manylinux_\d+_\d+_\w+\.whl$", wheel), wheel
    assert re.fullmatch(r"libgomp-[0-9a-f]{8}\.so[.\d]*", vendored), vendored
    with zipfile.ZipFile(_wheel()) as z:
        assert not [n for n in z.namelist() if n.endswith(".c")]


EVERY_ISA = """
    import json, numpy as np, pyw8a8 as w8
    rng = np.random.default_rng(0)
    shapes = [(1, 1, 1), (1, 640, 1000), (7, 33, 129), (64, 256, 1024), (130, 65, 4097)]
    x = rng.standard_normal((37, 1000)).astype(np.float32)
    weight = w8.pack_weight(rng.standard_normal((129, 1000)).astype(np.float32))
    with w8.use_isa("scalar"):
        reference = w8.matmul(x, weight)
    exact = {}
    for isa in w8.available_isas():
        with w8.use_isa(isa):
            ok = True
            for m, n, k in shapes:
                qa = rng.integers(-127, 128, (m, k), dtype=np.int8)
                qw = rng.integers(-127, 128, (n, k), dtype=np.int8)
                for encoding in ("biased", "signed"):
                    product = w8.int8_matmul(qa, qw, encoding=encoding)
                    ok &= np.array_equal(product, qa.astype(np.int64) @ qw.T.astype(np.int64))
            ok &= np.array_equal(w8.matmul(x, weight), reference)  # the same on every ISA
            exact[isa] = bool(ok)
    print(json.dumps({"file": w8.__file__, "numpy": np.__version__, "exact": exact,
                      "compiled": w8.compiled_isas(), "cpu": w8.cpu_features()}))
"""


def test_every_isa_of_this_cpu_multiplies_exactly(env):
    found = json.loads(env.check(EVERY_ISA))
    assert found["file"].startswith(env.root), found["file"]  # the wheel, not the checkout
    assert found["numpy"].startswith("1.26." if env.name == "numpy1" else "2."), found
    assert found["exact"] and all(found["exact"].values()), found
    assert "scalar" in found["exact"]


def test_the_thread_policy_handles_the_vendored_libgomp(env, vendored):
    """pyw8a8 sets the spin count of its own runtime, the vendored copy, even when the
    system's libgomp was loaded first (which the policy must not take for its own)."""
    report = ("import json, numpy as np, pyw8a8 as w8; maps = open('/proc/self/maps').read(); "
              "print(json.dumps([w8.thread_policy()['openmp'], "
              "sorted({l.split()[-1] for l in maps.splitlines() if 'libgomp' in l}), "
              "w8.int8_matmul(np.ones((64, 4096), np.int8), np.ones((64, 4096), np.int8))"
              "[0, 0].item()]))")
    policy, loaded, value = json.loads(env.check(report))
    assert policy == f"GOMP_SPINCOUNT=10000 ({vendored})"
    assert [os.path.basename(p) for p in loaded] == [vendored]
    assert value == 4096
    system = ("import ctypes, ctypes.util; name = ctypes.util.find_library('gomp'); "
              "name and ctypes.CDLL(name); ")
    policy, loaded, value = json.loads(env.check(system + report))
    assert policy == f"GOMP_SPINCOUNT=10000 ({vendored})"
    assert vendored in map(os.path.basename, loaded)
    assert value == 4096


def test_a_fork_after_a_parallel_product_does_not_hang(env):
    """tests/processes/test_processes.py's case with the vendored runtime: the child's surviving
    thread runs on one thread, a thread it starts runs in parallel again."""
    out = env.check("""
        import os, threading, numpy as np, pyw8a8 as w8
        rng = np.random.default_rng(0)
        x = rng.standard_normal((64, 1024)).astype(np.float32)
        p = w8.pack_weight(rng.standard_normal((512, 1024)).astype(np.float32))
        reference = w8.matmul(x, p)
        assert w8.get_num_threads() == 2
        pid = os.fork()
        if pid == 0:
            ok = np.array_equal(w8.matmul(x, p), reference) and w8.get_num_threads() == 1
            ok = ok and "survived a fork" in w8.thread_policy()["fork"]
            seen = []
            thread = threading.Thread(target=lambda: seen.append(
                (w8.get_num_threads(), np.array_equal(w8.matmul(x, p), reference))))
            thread.start()
            thread.join()
            os._exit(0 if ok and seen == [(2, True)] else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), np.array_equal(w8.matmul(x, p), reference))
    """, OMP_NUM_THREADS="2")
    assert out.split() == ["0", "True"]


def test_the_command_line_reports_this_checkout_s_version(env):
    """The installed command runs, and the wheel is of the version under test."""
    status, stdout, stderr = env.run(["-m", "pyw8a8", "--version"])
    assert (status, stdout, stderr) == (0, f"pyw8a8 {pyw8a8.__version__}\n", "")


def test_the_fast_subset_passes_under_numpy_1_26(envs):
    status, stdout, stderr = envs("numpy1").run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         *[os.path.join(TESTS, name) for name in NUMPY1_SUBSET]])
    assert status == 0, stdout[-6000:] + stderr[-3000:]
