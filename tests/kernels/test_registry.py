"""The registry of ISAs (``_simd/dispatch.h``): every compiled ISA is
reachable, the Python lists come from it, and the ISA table of the internals page
(docs/guide/internals.md) names the same ISAs.

The kernels of the ISAs this CPU lacks run in the emulated C build
(test_c_kernels.py::test_every_x86_isa_emulated)."""
import importlib
import os
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pyw8a8
from pyw8a8 import _dispatch
from pyw8a8._kernels import CALL_ONE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FEATURES = pyw8a8.cpu_features()
X86 = platform.machine().lower() in ("x86_64", "amd64")
ARM64 = platform.machine().lower() in ("aarch64", "arm64")
# The registry's ISAs per architecture, most preferred first: the expectation that
# dispatch.h and the internals page's table are both checked against.
ARCH_ISAS = {"x86": ["amx", "avx512vnni", "avxvnni", "avx2"],
              "arm": ["neondot", "neon"]}
PORTABLE_ISAS = ["scalar", "scalar_u8s8"]


def _cpu_supports(name):
    """What the CPU features say about an ISA, independently of the registry's predicates
    (the amx permission request aside, which only the OS can answer)."""
    f = FEATURES
    avx2 = f["avx2"] and f["fma"]
    avx512 = avx2 and f["avx512f"] and f["avx512bw"] and f["avx512vl"] and f["avx512_vnni"]
    return {
        "amx": avx512 and f["amx_tile"] and f["amx_int8"],
        "avx512vnni": avx512,
        "avxvnni": avx2 and f["avx_vnni"],
        "avx2": avx2,
        "neondot": f["asimd"] and f["asimddp"],
        "neon": f["asimd"],
        "scalar": True,
        "scalar_u8s8": True,
    }[name]


def test_every_isa_this_cpu_supports_is_available():
    available = pyw8a8.available_isas()
    missing = [name for name in pyw8a8.compiled_isas()
               if _cpu_supports(name) and name not in available]
    assert not missing, (f"compiled ISAs this CPU supports but pyw8a8 cannot use: "
                         f"{missing} (features: {FEATURES})")
    extra = [name for name in available if not _cpu_supports(name)]
    assert not extra, f"ISAs offered although the CPU lacks them: {extra}"


def test_the_registry_lists_each_architecture_s_isas():
    expected = ARCH_ISAS["x86"] if X86 else ARCH_ISAS["arm"] if ARM64 else []
    assert pyw8a8.compiled_isas() == expected + PORTABLE_ISAS


def test_the_default_is_the_first_available_isa_that_is_not_test_only():
    default = next(i for i in pyw8a8.available_isas() if not _dispatch.isa_explicit_only(i))
    code = "import pyw8a8; print(pyw8a8.isa())"
    env = {k: v for k, v in os.environ.items() if k != "PYW8A8_ISA"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert out == default
    assert _dispatch.isa_explicit_only("scalar_u8s8")


def test_each_isa_s_ops_come_from_its_entry(any_isa):
    ops = _dispatch.IsaOps(any_isa)
    # The name in the tile's description is the registry entry's own.
    noop = _dispatch.IsaOps("scalar", noop_kernel=True, tile_of=any_isa)
    assert noop.name == f"scalar+noop({any_isa} tile)"
    assert (noop.mr, noop.npanels) == (ops.mr, ops.npanels)
    assert ops.auto_encoding == ("signed" if any_isa.startswith("neon") else "biased")
    with pytest.raises(ValueError, match="unknown ISA"):
        _dispatch.IsaOps("avx9000")


def test_amx_tile_configuration_reads_back_whole():
    """The configuration must reach ldtilecfg whole: GCC 12 declares the intrinsic's operand
    as 8 bytes, and a compiler that drops the other stores makes the tiles fault."""
    if "amx" not in pyw8a8.available_isas():
        pytest.skip("needs a CPU with AMX-INT8 (and the tile permission)")
    assert _dispatch.amx_config_roundtrip() is True


def test_internals_isa_table_names_the_registry():
    with open(os.path.join(ROOT, "docs", "guide", "internals.md"), encoding="utf-8") as f:
        page = f.read()
    section = page.split("## ISAs", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    assert names == ARCH_ISAS["x86"] + ARCH_ISAS["arm"] + PORTABLE_ISAS
    compiled = pyw8a8.compiled_isas()
    assert [n for n in names if n in compiled] == compiled


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils) to read symbols")
def test_only_the_dispatch_module_links_the_kernels():
    """The registry's table, and with it every kernel, is compiled into one binary
    (_dispatch); the other compiled modules reach the kernels through its IsaOps."""
    kernel = re.compile(r" [tT] w8_\w+_ukernel(_f32)?_(biased|signed)$", re.M)
    linking = []
    for module in ("_dispatch", "_kernels", "_outputs", "_rows", "_probes"):
        binary = importlib.import_module(f"pyw8a8.{module}").__file__
        symbols = subprocess.run(["nm", binary], capture_output=True, text=True).stdout
        if module == "_dispatch" and not symbols.strip():
            pytest.skip("the compiled modules are stripped of their symbols")
        linking += [module] if kernel.search(symbols) else []
    assert linking == ["_dispatch"]


# avx2 has no small-M fallback: its own kernels run every size.
@pytest.mark.parametrize("wide, narrow", [("amx", "avx512vnni"), ("avx2", "avx2")])
def test_isa_of_a_call_size_names_the_isa_that_runs_it(wide, narrow):
    """isa(rows=M) is the ISA a product of M rows runs (the one the tuner times it on):
    the small-M fallback below 8 rows and the chosen ISA from 8 rows on, set_isa's or
    use_isa's alike; an ISA without a fallback at every size."""
    if wide not in pyw8a8.available_isas():
        pytest.skip(f"needs a CPU that runs {wide}")
    rng = np.random.default_rng(0)

    def isa_that_ran(rows):
        """The ISAs a fresh weight settled a blocking on, called until it settles."""
        fresh = pyw8a8.pack_weight(rng.standard_normal((32, 128), dtype=np.float32))
        x = rng.standard_normal((rows, 128), dtype=np.float32)
        nthreads = pyw8a8._threads.threads_for(rows * 128 * 32)

        def settled_on():
            return {name for name in pyw8a8.available_isas()
                    if fresh.plan().settled_blocking(CALL_ONE, _dispatch.IsaOps(name),
                                                     rows, nthreads) is not None}
        for _ in range(400):
            pyw8a8.matmul(x, fresh)
            if settled_on():
                return settled_on()
        pytest.fail(f"no blocking settled for {rows} rows")

    before = pyw8a8.isa()
    pyw8a8.set_isa(wide)
    try:
        for rows, expected in [(1, narrow), (7, narrow), (8, wide), (64, wide)]:
            assert pyw8a8.isa(rows=rows) == expected
            assert isa_that_ran(rows) == {expected}
        assert pyw8a8.isa() == wide
        pyw8a8.set_isa("scalar")
        with pyw8a8.use_isa(wide):
            assert pyw8a8.isa() == wide
            assert pyw8a8.isa(rows=1) == narrow
            assert isa_that_ran(1) == {narrow}
            assert isa_that_ran(8) == {wide}
        assert pyw8a8.isa(rows=1) == "scalar"
        assert isa_that_ran(1) == {"scalar"}
    finally:
        pyw8a8.set_isa(before)
    with pytest.raises(ValueError, match="rows must be at least 0"):
        pyw8a8.isa(rows=-1)
    with pytest.raises(TypeError, match="rows must be an int"):
        pyw8a8.isa(rows=1.5)
