"""pyw8a8.torch's layers saved and copied: state_dict through torch.save / torch.load bit
exact, the saved header, damaged or foreign state refused with the layer kept, deepcopy and
pickle, buffers written in place, a layer freed with its model, threads sharing a layer.
Skipped, with the reason shown, where torch is not installed (.ci/run installs it)."""
import copy
import gc
import io
import mmap
import pickle
import threading
import weakref

import pytest
from memory_maps import smaps_field

from pyw8a8._layout import HUGE_PAGE_FROM_BYTES

from torch_helpers import dense, torch

pt = pytest.importorskip("pyw8a8.torch")


def saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("block", [64, 128])
def test_state_dict_round_trips_bit_exact_through_torch_save(block):
    layer = pt.Linear.from_float(dense(300, 40), activation="silu")
    x = torch.randn(5, 300)
    with torch.no_grad():
        y = layer(x)
    # A fresh layer of another layout (block) takes the saved one whole.
    fresh = pt.Linear(300, 40, activation="silu", block=block)
    result = fresh.load_state_dict(torch.load(saved(layer.state_dict()), weights_only=True))
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        assert torch.equal(fresh(x), y)
    assert set(layer.state_dict()) == {"weight_panels", "weight_psum", "weight_scales",
                                       "weight_header", "bias"}


def test_the_saved_header_records_the_format_and_settings():
    layer = pt.Linear.from_float(dense(100, 24), block=64, seed=7)
    header = dict(zip(pt._ops.HEADER_FIELDS, layer.weight_header.tolist()))
    assert header == {"format_version": layer.packed("weight")._format_version(),
                      "out_features": 24, "in_features": 100, "encoding": header["encoding"],
                      "rotate": 1, "block": 64, "seed": 7}


def test_a_whole_model_round_trips_through_torch_save_and_load():
    model = pt.quantize(torch.nn.Sequential(dense(64, 128), torch.nn.ReLU(), dense(128, 8)))
    x = torch.randn(3, 64)
    with torch.no_grad():
        y = model(x)
        again = torch.load(saved(model), weights_only=False)
        assert torch.equal(again(x), y)


def state_with(layer, **changes):
    state = layer.state_dict()
    for key, fn in changes.items():
        state[key] = fn(state[key].clone())
    return state


@pytest.mark.parametrize("changes, match", [
    ({"weight_header": lambda h: h.index_fill_(0, torch.tensor([0]), 99)},
     "format 99 is not supported"),
    ({"weight_panels": lambda p: p.index_put_((torch.tensor([0]),) * p.dim(),
                                               torch.tensor(0, dtype=p.dtype))},
     "-128|inconsistent"),  # biased byte 0 is -128; a signed 0 breaks the sums
    ({"weight_scales": lambda s: s.neg_()}, "negative or non-finite"),
    ({"weight_header": lambda h: h[:3]}, "header: expected 7 int64 values"),
    ({"weight_panels": lambda p: p[:-1]}, "panels"),
    ({"bias": lambda b: b.fill_(float("nan"))}, "bias holds NaN"),
])
def test_a_damaged_or_foreign_state_dict_is_refused_and_the_layer_kept(changes, match):
    layer = pt.Linear.from_float(dense(64, 16))
    x = torch.randn(2, 64)
    with torch.no_grad():
        y = layer(x)
    with pytest.raises(RuntimeError, match=match):
        layer.load_state_dict(state_with(layer, **changes))
    with torch.no_grad():
        assert torch.equal(layer(x), y)


def test_a_state_dict_of_another_shape_or_with_missing_keys_is_refused():
    layer = pt.Linear.from_float(dense(64, 16))
    other = pt.Linear.from_float(dense(64, 24))
    with pytest.raises(RuntimeError, match=r"shape \(24, 64\), this module's is \(16, 64\)"):
        layer.load_state_dict(other.state_dict())
    state = layer.state_dict()
    del state["weight_psum"]
    state["extra"] = torch.zeros(1)
    result = layer.load_state_dict(state, strict=False)
    assert result.missing_keys == ["weight_psum"] and result.unexpected_keys == ["extra"]
    with pytest.raises(RuntimeError, match="Missing key"):
        layer.load_state_dict(state)
    no_bias = pt.Linear(64, 16, bias=False)
    with pytest.raises(RuntimeError, match="Unexpected key.*bias"):
        no_bias.load_state_dict(layer.state_dict())


def test_deepcopy_and_pickle_give_independent_bit_exact_layers():
    layer = pt.Linear.from_float(dense(96, 32), activation="gelu")
    x = torch.randn(4, 96)
    with torch.no_grad():
        y = layer(x)
        for again in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert torch.equal(again(x), y)
            assert again.weight_panels.data_ptr() != layer.weight_panels.data_ptr()
    # Only the tensors travel, not the numpy-side weight kept for the kernels.
    assert len(pickle.dumps(layer)) < 1.5 * sum(b.nbytes for b in layer.buffers())


def _in_a_weight_mapping(tensor):
    """Whether a tensor's memory is advised for huge pages (_layout.empty_aligned): "hg"
    among the VmFlags of the mapping holding it."""
    return "hg" in (smaps_field(tensor.data_ptr(), "VmFlags") or "").split()


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="huge-page advice is Linux's")
def test_a_large_weight_stays_in_memory_eligible_for_huge_pages():
    # torch's allocator asks for no huge pages: built, copied, unpickled or loaded, a large
    # weight's panels live in a mapping of their own, advised for them.
    layer = pt.Linear.from_float(dense(1024, 4096), rotate=False)
    assert layer.weight_panels.nbytes >= HUGE_PAGE_FROM_BYTES
    loaded = pt.Linear(1024, 4096)
    loaded.load_state_dict(torch.load(saved(layer.state_dict())))
    x = torch.randn(2, 1024)
    with torch.no_grad():
        y = layer(x)
        for other in (layer, copy.deepcopy(layer), pickle.loads(pickle.dumps(layer)), loaded):
            assert _in_a_weight_mapping(other.weight_panels)
            assert torch.equal(other(x), y)


def test_writing_a_buffer_in_place_is_seen_by_the_next_call():
    layer = pt.Linear.from_float(dense(64, 16))
    other = pt.Linear.from_float(dense(64, 16, seed=3))
    x = torch.randn(2, 64)
    with torch.no_grad():
        for name, buf in other.named_buffers():
            getattr(layer, name).copy_(buf)
        assert torch.equal(layer(x), other(x))


def test_layers_built_and_loaded_inside_inference_mode():
    # Their buffers were inference tensors, whose missing version counter ended every call
    # (and the build itself) in "Inference tensors do not track version counter".
    model = torch.nn.Sequential(dense(64, 48), torch.nn.GELU(), dense(48, 16, seed=1))
    other = pt.quantize(torch.nn.Sequential(dense(64, 48, seed=2), torch.nn.GELU(),
                                            dense(48, 16, seed=3)))
    x = torch.randn(3, 64)
    with torch.inference_mode():
        quantized = pt.quantize(model)
        expected = pt.quantize(model)(x)
        assert torch.equal(quantized(x), expected)
        compiled = torch.compile(quantized)
        assert torch.equal(compiled(x), expected)
        quantized.load_state_dict(other.state_dict())
        assert torch.equal(quantized(x), other(x))
        assert torch.equal(compiled(x), other(x))
    assert not any(b.is_inference() for b in quantized.buffers())


def test_inference_tensors_as_buffers_and_written_in_place():
    layer = pt.Linear.from_float(dense(64, 16))
    x = torch.randn(2, 64)
    with torch.inference_mode():
        buffers = {name: buf.clone() for name, buf in layer.named_buffers()}
        assert all(buf.is_inference() for buf in buffers.values())
        assert torch.equal(torch.func.functional_call(layer, buffers, (x,)), layer(x))
        # An inference tensor has no version counter: a header written in place (another
        # rotation) is told by its values.
        other = pt.Linear.from_float(dense(64, 16, seed=3), rotate=False)
        for name, buf in other.named_buffers():
            buffers[name].copy_(buf)
        assert torch.equal(torch.func.functional_call(layer, buffers, (x,)), other(x))


def test_share_memory_moves_the_buffers_and_the_next_call_reads_them_there():
    # share_memory_() moves a tensor's memory and keeps its version counter: the weight
    # kept for the kernels viewed the freed memory, and the next call read it.
    model = pt.quantize(torch.nn.Sequential(dense(64, 96), torch.nn.GELU(), dense(96, 16)))
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = model(x)
        addresses = [b.data_ptr() for b in model.buffers()]
        model.share_memory()
        assert all(b.is_shared() for b in model.buffers())
        assert [b.data_ptr() for b in model.buffers()] != addresses
        assert torch.equal(model(x), before)
        assert model[0].packed("weight").panels.ctypes.data == model[0].weight_panels.data_ptr()


def test_a_layer_is_freed_with_its_model():
    layer = pt.Linear.from_float(dense(64, 16))
    with torch.no_grad():
        layer(torch.randn(2, 64))
    panels = weakref.ref(layer.weight_panels)
    del layer
    gc.collect()
    assert panels() is None


def test_threads_share_one_layer():
    layer = pt.Linear.from_float(dense(256, 128))
    xs = [torch.randn(8, 256) for _ in range(4)]
    with torch.no_grad():
        expected = [layer(x) for x in xs]
    results = {}

    def work(i):
        with torch.no_grad():
            results[i] = all(torch.equal(layer(xs[i]), expected[i]) for _ in range(20))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: True for i in range(4)}
