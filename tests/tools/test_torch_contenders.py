"""``bench --torch``'s model-level table (pyw8a8/tools/torch_contenders.py and
torch_model_runs.py): its options, what it reads from Inductor's code, the order of its
processes and its table.  No model runs here (tests/pytorch/test_torch_bench_models.py
runs the smallest configuration of each)."""
import collections

import pytest

from pyw8a8.tools import bench, torch_contenders, torch_model_runs

WRAPPER = '''
cpp_fused_0 = async_compile.cpp_pybinding(['float*'], r\'\'\'
template <bool accum> inline void kernel_micro_gemm(const uint8_t* A) {
    vc[i] = _mm512_dpbusd_epi32(vc[i], va, vb[col]);
}
\'\'\')
cpp_fused_1 = async_compile.cpp_pybinding(['float*'], r\'\'\'
inline void kernel_micro_gemm(const int8_t* A) {
    for (int64_t k = 0; k < K; ++k) { result += (int32_t)A[k] * (int32_t)B[k]; }
}
\'\'\')
cpp_fused_2 = async_compile.cpp_pybinding(['float*'], r\'\'\'
void kernel(const float* x) { auto v = at::vec::Vectorized<float>::loadu(x); }
\'\'\')
def call(args):
    # Topologically Sorted Source Nodes: [linear], Original ATen: [aten._int_mm]
    extern_kernels._int_mm(buf3, _frozen_param62, out=buf4)
    buf7 = torch.ops.pyw8a8.linear.default(buf6, arg1_1, arg2_1)
    buf10 = torch.ops.pyw8a8.float_attention.default(buf7, buf7, buf7, None, 0.5, False)
    # pyw8a8.linear in a comment is not a call
    buf9 = torch.ops.onednn.qlinear_pointwise.tensor(buf8, 1.0, 0)
'''


def test_kernel_report_reads_the_micro_kernels_and_the_calls_of_compiled_code():
    counters = {"inductor": collections.Counter(cpp_templated_kernel_counter=2,
                                                pattern_matcher_count=9,
                                                qlinear_weight_prepack_matcher_count=1),
                "graph_break": collections.Counter({"a reason": 2})}
    report = torch_model_runs.kernel_report([WRAPPER, WRAPPER], counters)
    assert report == {
        "graphs": 2, "template_amx": 0, "template_vnni": 2, "template_ref": 2,
        "template_other": 0, "int_mm": 2, "onednn_qlinear": 2, "pyw8a8_ops": 2,
        "pyw8a8_attention": 2,
        "counters": {"cpp_templated_kernel_counter": 2,
                     "qlinear_weight_prepack_matcher_count": 1},
        "graph_breaks": 2}
    cell = torch_contenders.kernels_text({"contender": "torchao-max", "kernels": report})
    assert cell.startswith("C++ GEMM template: 2 AVX-512 VNNI, 2 reference loop; "
                           "ATen _int_mm: 2; oneDNN qlinear: 2; pyw8a8 ops: 2; "
                           "pyw8a8 attention: 2; 2 graphs, 2 breaks; "
                           "cpp_templated_kernel_counter=2")
    # an eager contender compiles nothing: only the operator pyw8a8 ran on
    assert torch_contenders.kernels_text({"contender": "pyw8a8", "kernels": report,
                                          "operator": "native"}) == "native operator"


def test_contender_and_model_options_parse_with_float_first():
    assert torch_contenders.parse_contenders("pyw8a8-max, torchao-compiled,pyw8a8-max") == [
        "float", "pyw8a8-max", "torchao-compiled"]
    assert torch_contenders.label("pyw8a8-max") == \
        "pyw8a8 compiled (freezing + max-autotune)"
    assert torch_contenders.label("torchao") == "torchao eager"
    assert torch_contenders.parse_models("lm,encoder") == ["lm", "encoder"]
    with pytest.raises(ValueError, match="unknown contender pyw8a8-fast"):
        torch_contenders.parse_contenders("pyw8a8-fast")
    with pytest.raises(ValueError, match="unknown model bert"):
        torch_contenders.parse_models("bert")


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "1"], "--tokens must be at least 2"),
    (["--prompt-tokens", "500", "--tokens", "24"], "at most 512"),
    (["--torch-models", "gpt"], "unknown model gpt"),
    (["--torch-contenders", "numpy"], "unknown contender numpy"),
])
def test_bad_torch_options_are_usage_errors_before_any_measurement(argv, message, capsys,
                                                                   monkeypatch):
    def measured(*args, **kwargs):
        raise AssertionError("nothing is measured with a bad option")
    monkeypatch.setattr(bench.torch_bench, "main", measured)
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--torch", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _result(speed, **more):
    return {"first_call_s": 1.5, "warm_calls": 1, "load_s": 1.0, "prepare_s": 0.1,
            "kernels": {"graphs": 0, "template_amx": 0, "template_vnni": 0, "template_ref": 0,
                        "template_other": 0, "int_mm": 0, "onednn_qlinear": 0,
                        "pyw8a8_ops": 0, "pyw8a8_attention": 0, "counters": {},
                        "graph_breaks": 0},
            "speed": speed, "spread": 0.1, "prefill_s": 0.2, "tokens": [[1, 2]],
            "split": {"total": 100 / speed, "products": 50 / speed, "head": 20 / speed,
                      "rest": 30 / speed}, **more}


def _fake_contenders(monkeypatch, results):
    """Contender replaced by a stand-in that logs its phases: `results` maps a contender
    to its result, or to {"error": why} for one that fails while preparing."""
    events = []

    class FakeContender:
        def __init__(self, spec):
            self.key, self.spec = spec["contender"], spec
            events.append(("prepare", self.key))
            self.error = results[self.key].get("error")

        def round(self):
            if self.error is None:
                events.append(("round", self.key))

        def finish(self):
            events.append(("finish", self.key))
            return results[self.key]
    monkeypatch.setattr(torch_contenders, "Contender", FakeContender)
    return events


def test_each_contender_runs_in_its_own_process_float_first(monkeypatch):
    """The LM's contenders: float first (the reference), each a Contender (process) of its
    own, preparing one after another, then their rounds taking turns; torchao's left out
    where it is not installed; speed as a ratio to float's."""
    events = _fake_contenders(monkeypatch, {
        "float": _result(10.0), "pyw8a8-compiled": {"error": "compile failed"},
        "pyw8a8": _result(25.0, kl=0.01, kl_max=0.05, top1=0.9, same_tokens=1.0)})
    monkeypatch.setattr(torch_contenders, "torchao_available", lambda: False)
    settings = torch_contenders.Settings(
        models=["lm"], contenders=["float", "torchao-max", "pyw8a8", "pyw8a8-compiled"],
        rounds=2, tokens=3, prompt_tokens=8, prompts=1, layers=1)
    progress = []
    rows = torch_contenders.run(settings, progress=progress.append)
    keys = ["float", "pyw8a8", "pyw8a8-compiled"]
    assert events == ([("prepare", k) for k in keys] + [("round", k) for k in keys[:2]] * 2
                      + [("finish", k) for k in keys])
    assert [r["contender"] for r in rows] == keys
    assert rows[1]["ratio"] == 2.5 and rows[1]["fidelity"]["kl"] == 0.01
    assert len(progress) == 3 and "failed: compile failed" in progress[2]
    table = torch_contenders.format_table(rows, settings, None)
    assert "only its first 1 layers (a quick check, not the model)" in "\n".join(table)
    assert "medians of 2 rounds, the contenders taking turns" in "\n".join(table)
    body = [line for line in table if line.startswith("| lm")]
    assert body[0].split(" | ")[2:6] == ["10.0 (±5%), prefill 200 ms", "1.00x", "reference",
                                         "1.50"]
    assert body[1].split(" | ")[3:5] == ["2.50x", "KL 0.0100 (0.050), top-1 0.900"]
    assert "failed: compile failed" in body[2]
    split = table[table.index("| contender | step | products | LM head | rest |") + 2:]
    assert split == ["| float eager | 10.00 | 5.00 | 2.00 | 3.00 |",
                     "| pyw8a8 eager | 4.00 | 2.00 | 0.80 | 1.20 |"]


def test_a_failed_float_contender_stops_the_model(monkeypatch):
    events = _fake_contenders(monkeypatch, {"float": {"error": "no model"}})
    settings = torch_contenders.Settings(models=["lm"], contenders=["float", "pyw8a8"],
                                         rounds=1)
    rows = torch_contenders.run(settings, progress=lambda line: None)
    assert events == [("prepare", "float"), ("finish", "float")]
    assert rows == [{"model": "lm", "set": "", "contender": "float", "error": "no model"}]


def test_a_contender_process_that_fails_reports_its_error():
    """A real process: a spec it cannot run ends it at once; its stderr's last lines are
    the error, and no phase after it runs."""
    contender = torch_contenders.Contender({"model": "lm", "outdir": "."}, timeout=120)
    assert "KeyError: 'contender'" in contender.error
    contender.round()
    assert contender.finish() == {"error": contender.error}
