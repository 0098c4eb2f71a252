"""``bench``'s command line: its parser, and the parse functions of its values (each a
ValueError naming what is expected, which the parser reports as the option's error)."""
import argparse
import math

from .. import _cpu
from ..lab import record


def parse_shape(text):
    """One ``M,K,N``: (M, K, N), each >= 1; else a ValueError quoting `text`."""
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"expected M,K,N (three integers >= 1), got {text!r}")
    return shape


def parse_shapes(text):
    """``--shapes``' ``M,K,N;M,K,N;...``: a list of :func:`parse_shape`'s."""
    return [parse_shape(item) for item in text.split(";")]


def parse_count(text):
    """A count (``--rounds``, ``--dask-chunk``): an integer >= 1, else a ValueError."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_seconds(text):
    """A duration (``--min-time``): a finite number of seconds > 0, else a ValueError."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


def option_type(parse):
    """`parse` as an argparse type whose ValueError message is the option's error."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def checked_isas(parser, names, option):
    """The ISAs `names` of `option`, or a usage error for one unknown or that this CPU lacks."""
    try:
        return [_cpu.checked_ops(name, option).name for name in names]
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))


#: ``bench``'s switches that run another measurement instead of the table, and their help.
MODE_FLAGS = (
    ("--mixed", "only a small numpy transformer (attention in numpy) with its linear layers in "
                "float32 numpy and in pyw8a8, default thread settings, taking turns"),
    ("--mca", "only llvm-mca's cycles per iteration of each x86 microkernel against its dot "
              "instruction's bound (any x86 machine)"),
    ("--amx-model", "only the AMX cost model's estimates of today's loop nest and of the "
                    "designs it compares, at each shape (any machine; no measurement)"),
    ("--overhead", "only the time around the kernels: matmul with a microkernel that does no "
                   "arithmetic, against the product's time at VNNI and AMX speeds"),
    ("--dask", "instead: a large M on local dask clusters of 1 and 2 worker processes against "
               "the in-process call (needs the dask extra)"),
    ("--check-isolation", "only the table's contenders, each timed alone in a process of "
                          "its own (as the table is) and beside the others in one process, "
                          "in the same rounds, with their ratio"),
    ("--torch", "only real PyTorch models (the sentence encoder all-MiniLM-L6-v2, the causal "
                "LM Gemma 3 270M): float32, torch's dynamic int8, torchao + Inductor and "
                "pyw8a8.torch eager and compiled, fidelity, speed and compile time (options "
                "below)"),
    ("--ffn", "only the gated FFN block gelu_tanh(x @ Wg.T) * (x @ Wu.T): numpy float32, "
              "pyw8a8 matmul_pair then numpy, pyw8a8 fused (glu=), torch int8"),
    ("--torch-layer", "only one nn.Linear as a PyTorch user runs it, microseconds a call: "
                      "pyw8a8.matmul, pyw8a8.torch eager, compiled and on the Python "
                      "operator, and torchao compiled by Inductor (freezing, max-autotune)"),
)


def parse_args(argv, quick):
    """``bench``'s options (`quick`: ``info``'s), every one checked: (args, the checked
    --isa); a bad one exits with status 2.  ``args.torch_settings`` holds the --torch
    options (torch_contenders.Settings, or None without --torch)."""
    parser = argparse.ArgumentParser(
        prog="python -m pyw8a8 " + ("info" if quick else "bench"),
        description=("A quick table: GOPS (2*M*N*K/s) of pyw8a8's ISAs and numpy float32 "
                     "at a few shapes, medians of interleaved rounds." if quick else
                     "Side-by-side GOPS (2*M*N*K/s) of pyw8a8 and its peers, medians of "
                     "interleaved rounds."))
    parser.add_argument("--rounds", type=option_type(parse_count),
                        default=5 if quick else 9)
    parser.add_argument("--min-time", type=option_type(parse_seconds),
                        default=0.02 if quick else 0.05,
                        help="seconds of calls per contender per round")
    parser.add_argument("--isa", action="append",
                        help="pyw8a8 ISA(s) to time (default: every available SIMD ISA)")
    if not quick:  # info: the short table alone, pyw8a8's ISAs against numpy float32
        _add_bench_options(parser)
        _add_torch_options(parser)
    args = parser.parse_args(argv)
    isas = checked_isas(parser, args.isa or [], "--isa")
    if quick:
        return args, isas
    checked_isas(parser, args.crossover or [], "--crossover")
    args.torch_settings = _torch_settings(parser, args) if args.torch else None
    if args.record is not None:
        try:
            record.checked_directory(args.record)
        except ValueError as exc:
            parser.error(f"--record: {exc}")
    return args, isas


def _add_bench_options(parser):
    """``bench``'s options beyond ``info``'s, but those of --torch."""
    parser.add_argument("--no-peers", action="store_true",
                        help="only numpy float32 and pyw8a8")
    parser.add_argument("--shapes", type=option_type(parse_shapes),
                        help="M,K,N;M,K,N;... (default: the standard grid)")
    for flag, text in MODE_FLAGS:
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--dask-shape", type=option_type(parse_shape),
                        default="32768,1152,6912",
                        help="M,K,N of --dask (default: 32768,1152,6912)")
    parser.add_argument("--dask-large", action="store_true",
                        help="--dask with M = 2**20 (1048576 x 1152 x 6912)")
    parser.add_argument("--dask-chunk", type=option_type(parse_count), default=4096,
                        help="rows per chunk of --dask (default 4096)")
    parser.add_argument("--crossover", nargs=2, metavar=("WIDE", "NARROW"),
                        help="only the M from which ISA WIDE beats ISA NARROW (amx "
                             "avx512vnni: the small-M fallback's threshold)")
    parser.add_argument("--record", metavar="DIR",
                        help="also keep the run (any mode) in DIR/YYYY-MM-DD-<cpu kind>.md "
                             "(e.g. docs/benchmarks/): what it printed, its tables as "
                             "markdown, with the CPU model and features, the thread count, "
                             "the versions of Python, numpy, pyw8a8 and the peers found, the "
                             "commit of the source tree and the command line; a later run "
                             "on the same day and CPU kind is appended to that file")


def _add_torch_options(parser):
    """``bench``'s options of --torch."""
    from .contenders import MODEL_CONTENDERS
    from .torch_contenders import DEFAULT_CONTENDERS, parse_contenders, parse_models
    group = parser.add_argument_group("--torch")
    group.add_argument("--torch-models", type=option_type(parse_models),
                       default=["sharing", "encoder", "lm"],
                       help="what --torch measures, comma-separated (default: all): sharing "
                            "(the encoder's float32, torch int8 and pyw8a8 taking turns in one "
                            "process, and each library's share beside the other and alone), "
                            "encoder and lm (the model-level table, a process per contender: "
                            "all-MiniLM-L6-v2, Gemma 3 270M); also kvcache (Int8Cache against "
                            "the default KV cache, decode speed, bytes and KL) and checkpoint "
                            "(Gemma 3 270M loaded with W8A8Config, saved in int8 and reloaded: "
                            "bytes, memory, bits); those two not in the default")
    group.add_argument("--torch-contenders", type=option_type(parse_contenders),
                       default=list(DEFAULT_CONTENDERS),
                       help="the model-level table's contenders, comma-separated, float always "
                            f"(default: {','.join(DEFAULT_CONTENDERS)}; of "
                            f"{','.join(MODEL_CONTENDERS)}: -compiled is torch.compile's defaults, "
                            "-max freezing + max-autotune)")
    group.add_argument("--texts", type=int, default=64,
                       help="the encoder's texts: this many MMLU questions (default 64)")
    group.add_argument("--tokens", type=int, default=24,
                       help="the LM's new tokens per prompt (default 24, at least 2)")
    group.add_argument("--prompt-tokens", type=int, default=192,
                       help="the LM's prompt length in tokens (default 192)")
    group.add_argument("--prompts", type=int, default=3,
                       help="the LM's prompts (default 3)")
    group.add_argument("--lm-layers", type=int, default=None,
                       help="only the LM's first this many layers (a quick check, not the "
                            "model; default all 18)")
    from .torch_kv_bench import DEFAULT_CONTEXT, MODELS
    from .torch_kv_bench import parse_models as parse_kv_models
    group.add_argument("--kv-models", type=option_type(parse_kv_models), default=list(MODELS),
                       help="kvcache's models, comma-separated (default: llama,gemma): a "
                            "Llama-shaped model of random weights, Gemma 3 270M")
    group.add_argument("--kv-context", type=int, default=None,
                       help="kvcache's prompt in tokens (default: " +
                            ", ".join(f"{m} {c}" for m, c in DEFAULT_CONTEXT.items()) + ")")
    group.add_argument("--kv-tokens", type=int, default=32,
                       help="kvcache's one-token decode steps per round and cache (default 32)")
    group.add_argument("--kv-layers", type=int, default=None,
                       help="kvcache's layers (default: llama 8, gemma all 18)")


def _torch_settings(parser, args):
    """The --torch options as torch_contenders.Settings; a usage error for one out of range."""
    from .torch_contenders import Settings
    from .torch_kv_bench import KVSettings
    checks = [(args.texts >= 1, "--texts must be at least 1"),
              (args.tokens >= 2, "--tokens must be at least 2"),
              (args.prompt_tokens >= 2, "--prompt-tokens must be at least 2"),
              (args.prompts >= 1, "--prompts must be at least 1"),
              (args.lm_layers is None or args.lm_layers >= 1, "--lm-layers must be at least 1"),
              # Gemma 3's sliding window: the decode's cache holds it whole (torch_lm.Decoder)
              (args.prompt_tokens + args.tokens <= 512,
               "--prompt-tokens plus --tokens must be at most 512 (Gemma 3's sliding window)"),
              (args.kv_context is None or args.kv_context >= 1, "--kv-context must be at least 1"),
              (args.kv_tokens >= 1, "--kv-tokens must be at least 1"),
              (args.kv_layers is None or args.kv_layers >= 1, "--kv-layers must be at least 1")]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    return Settings(models=args.torch_models, contenders=args.torch_contenders,
                    rounds=args.rounds, texts=args.texts, tokens=args.tokens,
                    prompt_tokens=args.prompt_tokens, prompts=args.prompts,
                    layers=args.lm_layers,
                    kv=KVSettings(models=args.kv_models, context=args.kv_context,
                                  tokens=args.kv_tokens, layers=args.kv_layers,
                                  rounds=args.rounds))
