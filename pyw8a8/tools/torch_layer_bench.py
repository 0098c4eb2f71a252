"""``bench --torch-layer``: one ``nn.Linear`` as a PyTorch user runs it, at the bench's
shapes: pyw8a8's layer eager and compiled against ``pyw8a8.matmul`` and torchao's int8
Linear compiled by Inductor, unrotated, each in a process of its own
(:mod:`~pyw8a8.tools.contenders`' ``torch layer`` table).

A compiled layer called alone also pays Dynamo's entry into the graph (tens of
microseconds), which a model pays once a forward: so each compiled contender is also timed
as one graph of :data:`GRAPH_CALLS` calls, and the difference over the calls it adds is
the layer's time inside a compiled model."""
from ..lab.record import markdown_table
from ..lab.turns import isolated, measure
from .contenders import (
    BUILD,
    COMPILED,
    COMPILED_GRAPH,
    EAGER,
    GRAPH_CALLS,
    MATMUL,
    TORCHAO,
    TORCHAO_GRAPH,
    torch_layer_names,
)

#: A layer call's target: PER_CALL_FACTOR x pyw8a8.matmul's time + PER_CALL_US.
PER_CALL_FACTOR = 1.25
PER_CALL_US = 3.0


def in_graph(us, alone, graph):
    """Microseconds of a layer call inside a compiled graph: (`us[graph]` - `us[alone]`) over
    the calls the graph adds."""
    return (us[graph] - us[alone]) / (GRAPH_CALLS - 1)


def format_table(rows, names, kernels) -> list[str]:
    """Markdown: microseconds per call of each contender, the layers' cost beyond
    ``pyw8a8.matmul``, a call inside a compiled graph, the target, and pyw8a8's layer
    against torchao's inside a graph."""
    torchao = TORCHAO in names
    cols = ["M", "K", "N"] + [f"{name} (us)" for name in names]
    cols += [f"{EAGER} - matmul (us)", f"{COMPILED}, in a graph (us)"]
    cols += [f"{TORCHAO}, in a graph (us)"] if torchao else []
    cols += [f"target: {PER_CALL_FACTOR:g} x matmul + {PER_CALL_US:g} us"]
    cols += ["in a graph, pyw8a8.torch vs torchao"] if torchao else []
    table = []
    for (m, k, n), seconds in rows:
        us = {name: seconds[name] * 1e6 for name in names}
        ours = in_graph(us, COMPILED, COMPILED_GRAPH)
        cells = [m, k, n] + [f"{us[name]:.1f}" for name in names]
        cells += [f"{us[EAGER] - us[MATMUL]:+.1f}", f"{ours:.1f}"]
        if torchao:
            theirs = in_graph(us, TORCHAO, TORCHAO_GRAPH)
            cells.append(f"{theirs:.1f}")
        cells.append(f"{PER_CALL_FACTOR * us[MATMUL] + PER_CALL_US:.1f}")
        if torchao:
            cells.append(f"{theirs / ours:.2f}x")
        table.append(cells)
    out = markdown_table(cols, table) + [""]
    out.append("Kernels: " + "; ".join(f"{name}: {kernels[name]}" for name in names
                                       if kernels.get(name)))
    out.append(f"A call in a graph: (the graph of {GRAPH_CALLS} calls - the graph of one) / "
               f"{GRAPH_CALLS - 1}, Dynamo's entry into the graph left out, as a model pays "
               f"it once a forward")
    return out


def run(shapes, rounds, min_time, nthreads) -> list[str]:
    """The table's lines: each contender in its own process, at each shape, taking turns."""
    names = torch_layer_names()
    rows, kernels = [], {}
    with isolated(BUILD, names, nthreads) as workers:
        for m, k, n in shapes:
            built = {name: worker.build("torch layer", name, m, k, n)
                     for name, worker in workers.items()}
            kernels.update({name: worker.kernel for name, worker in built.items()})
            rows.append(((m, k, n), measure(built, rounds, min_time)))
    return format_table(rows, names, kernels)
