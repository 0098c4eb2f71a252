"""A run kept as a dated record (``bench --record DIR``, ``eval --record DIR``): each run
goes to ``DIR/YYYY-MM-DD-<cpu kind>.md`` (:func:`record_path`), a later one of the same
day and CPU kind appended: what it printed (tables as markdown), the CPU, its ISA
features, the threads, the versions, the commit and the command line."""
import contextlib
import datetime
import io
import os
import platform
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from .. import _cpu, _threads

#: The distributions of the bench's int8 peers whose versions a record names, where found.
PEERS = ("onnxruntime", "onnx", "torch", "torchao", "ai-edge-litert")
#: Variables that change what the bench runs (threads, an ISA held, Inductor), named in a
#: record when set.
_ENV_PREFIXES = ("PYW8A8_", "OMP_", "GOMP_", "KMP_", "ATEN_CPU_CAPABILITY",
                 "FBGEMM_ENABLE_INSTRUCTIONS", "ONEDNN_", "DNNL_", "MKL_ENABLE_INSTRUCTIONS",
                 "OPENBLAS_CORETYPE", "TORCHINDUCTOR_")
#: ... but those torch sets itself.
_ENV_SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)

# AMD family 25 (0x19), Zen 3 and Zen 4 by model ranges; family 26 (0x1a) is Zen 5.
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))
_ZEN3_MODELS = (range(0x00, 0x10), range(0x20, 0x60))


def cpuinfo_fields(text=None):
    """{name: value} of the first processor of /proc/cpuinfo (`text`, read when None); {}
    where there is none."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return {}
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the end of the first processor's block
            continue
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_model(fields):
    """The CPU's model name: /proc/cpuinfo's, or platform's where it has none."""
    return (fields.get("model name") or fields.get("Model") or platform.processor()
            or platform.machine() or "unknown CPU")


def _number(text):
    try:
        return int(text, 0)
    except (TypeError, ValueError):
        return None


def _slug(text):
    text = re.sub(r"\((?:r|tm|c)\)|\bcpu\b|\bprocessor\b|@.*$|\d+-core", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def cpu_kind(fields, features, isa):
    """A short name for the CPU kind: ``zen3``, ``zen4``, ``zen5``, ``xeon-amx``, else the model
    name's slug and `isa` (the best ISA of pyw8a8 it runs), e.g.
    ``intel-xeon-platinum-8259cl-avx512vnni``.

    Parameters
    ----------
    fields : dict of str to str
        /proc/cpuinfo's fields (:func:`cpuinfo_fields`).
    features : dict of str to bool
        :func:`pyw8a8.cpu_features`.
    isa : str

    Returns
    -------
    str
        Lower-case letters, digits and hyphens."""
    vendor = fields.get("vendor_id", "")
    family, model = _number(fields.get("cpu family")), _number(fields.get("model"))
    if vendor == "AuthenticAMD" and model is not None:
        if family == 26:
            return "zen5"
        if family == 25 and any(model in r for r in _ZEN4_MODELS):
            return "zen4"
        if family == 25 and any(model in r for r in _ZEN3_MODELS):
            return "zen3"
    if vendor == "GenuineIntel" and features.get("amx_int8"):
        return "xeon-amx"
    return f"{_slug(cpu_model(fields)) or 'cpu'}-{_slug(isa)}"


def _identity(fields):
    """"<vendor>, family F, model M; " as /proc/cpuinfo gives them ("" where it does not)."""
    parts = [fields.get("vendor_id", "")]
    parts += [f"{label} {fields[name]}" for label, name in
              (("family", "cpu family"), ("model", "model")) if fields.get(name)]
    parts = [p for p in parts if p]
    return f"{', '.join(parts)}; " if parts else ""


def record_path(directory, day, kind):
    """``directory/YYYY-MM-DD-<kind>.md`` for date `day`."""
    return Path(directory) / f"{day.isoformat()}-{kind}.md"


def source_commit(package_dir=None, ignore=None):
    """The commit of the git checkout pyw8a8 runs from (``-dirty`` with uncommitted changes to
    tracked files, those under the directory `ignore` aside: a record's own, which its run
    has just written); ``unknown`` where pyw8a8 is not tracked there (an installed wheel) or
    git is missing."""
    package_dir = Path(package_dir or Path(__file__).resolve().parents[1])

    def git(*args):
        return subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True,
                              text=True, timeout=60)
    try:
        tracked = git("ls-files", "--error-unmatch", "__init__.py")
        head = git("rev-parse", "HEAD")
        if tracked.returncode or head.returncode:
            return "unknown"
        top = Path(git("rev-parse", "--show-toplevel").stdout.strip()).resolve()
        ignored = Path(ignore).resolve() if ignore is not None else None
        # git refuses a pathspec outside its work tree
        beside = (["--", ":/", f":(exclude){ignored}"]
                  if ignored is not None and ignored.is_relative_to(top) else [])
        changes = git("status", "--porcelain", "--untracked-files=no", *beside)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = head.stdout.strip()
    return f"{commit}-dirty" if changes.returncode or changes.stdout.strip() else commit


def versions():
    """(name, version) of Python, numpy, pyw8a8 and each peer of PEERS installed."""
    import numpy

    # the package is loaded: its version read, not imported back from its __init__
    found = [("python", platform.python_version()), ("numpy", numpy.__version__),
             ("pyw8a8", sys.modules[__name__.split(".")[0]].__version__)]
    for name in PEERS:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            pass
    return found


def command_line(command, argv):
    """This run's command line: the interpreter's own where it ran ``python -m pyw8a8
    <command> <argv>``, else that command rebuilt."""
    tail = [command, *argv]
    orig = list(getattr(sys, "orig_argv", []))
    if len(orig) > len(tail) and orig[-len(tail):] == tail and "pyw8a8" in orig[:-len(tail)]:
        return shlex.join(orig)
    return shlex.join(["python", "-m", "pyw8a8", *tail])


def checked_directory(path):
    """`path` as a writable directory, made where missing; else a ValueError naming it."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot make the directory {str(path)!r}: {exc.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"the directory {str(path)!r} is not writable")
    return directory


class _Tee(io.TextIOBase):
    """Writes to `stream` and keeps a copy."""

    def __init__(self, stream):
        self._stream = stream
        self.copy = io.StringIO()

    def write(self, text):
        self.copy.write(text)
        return self._stream.write(text)

    def flush(self):
        self._stream.flush()

    def isatty(self):
        return self._stream.isatty()

    def fileno(self):
        return self._stream.fileno()


@contextlib.contextmanager
def captured_stdout():
    """Prints go to stdout as before; the context's value (a StringIO) keeps a copy."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee.copy


def markdown_table(columns, rows, align=None):
    """A markdown table's lines: the header of `columns`, its rule (``--:`` for each "r"
    of `align`), then one line per row of cells."""
    rule = "".join("--:|" if a == "r" else "---|" for a in align or "l" * len(columns))
    return [f"| {' | '.join(columns)} |", "|" + rule,
            *(f"| {' | '.join(map(str, cells))} |" for cells in rows)]


def markdown_output(text):
    """What the bench printed as markdown: its ``|`` lines as tables, the others in ``text``
    blocks."""
    out, block = [], []

    def close_block():
        while block and not block[-1].strip():
            block.pop()
        if block:
            out.extend(["```text", *block, "```", ""])
        block.clear()

    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|"):
            if block or (out and not out[-1].startswith("|")):
                close_block()
            out.append(line)
            if i + 1 == len(lines) or not lines[i + 1].startswith("|"):
                out.append("")
        elif block or line.strip():
            block.append(line)
    close_block()
    return out


def this_cpu_kind():
    """This machine's CPU kind as the record's file names say it (:func:`cpu_kind`)."""
    return cpu_kind(cpuinfo_fields(), _cpu.cpu_features(), _cpu.available_isas()[0])


def chart_path(directory, now=None):
    """``directory/YYYY-MM-DD-<cpu kind>.svg``: the picture of the day's record."""
    now = (now or datetime.datetime.now()).astimezone()
    return record_path(directory, now.date(), this_cpu_kind()).with_suffix(".svg")


def write_chart(directory, svg, now=None):
    """Write `svg` as the day's chart (:func:`chart_path`), replacing an earlier one; the
    path written."""
    path = chart_path(directory, now)
    path.write_text(svg, encoding="utf-8")
    return path


def write(directory, output, command, now=None):
    """Add a run to ``directory/YYYY-MM-DD-<cpu kind>.md``, made with a title where new.

    Parameters
    ----------
    directory : str or Path
        The record's directory (:func:`checked_directory`).
    output : str
        What the run printed.
    command : str
        The command line (:func:`command_line`).
    now : datetime.datetime, optional
        The run's time (default: now, local time).

    Returns
    -------
    Path
        The file written."""
    now = (now or datetime.datetime.now()).astimezone()
    fields = cpuinfo_fields()
    features = _cpu.cpu_features()
    isa = _cpu.isa()
    kind = this_cpu_kind()
    path = record_path(directory, now.date(), kind)
    enabled = [name for name, on in features.items() if on]
    env = [f"{k}={v}" for k, v in sorted(os.environ.items())
           if k.startswith(_ENV_PREFIXES) and k not in _ENV_SET_BY_TORCH]
    lines = [f"## Run of {now:%H:%M:%S} (UTC{now:%z})", "",
             f"- command: `{command}`",
             f"- date: {now:%Y-%m-%d %H:%M:%S %z}",
             f"- commit: {source_commit(ignore=directory)}",
             f"- CPU: {cpu_model(fields)} ({_identity(fields)}kind: {kind})",
             f"- ISA features: {', '.join(enabled) or 'none detected'}; pyw8a8's ISA by "
             f"default: {isa}",
             f"- threads: {_threads.get_num_threads()} ({os.cpu_count()} logical CPUs)",
             "- versions: " + ", ".join(f"{name} {v}" for name, v in versions())]
    if env:
        lines.append(f"- environment: {' '.join(env)}")
    lines += ["", *markdown_output(output)]
    new = not path.exists()
    with open(path, "a", encoding="utf-8") as f:
        if new:
            f.write(f"# pyw8a8 bench on {kind}, {now.date().isoformat()}\n\n")
        else:
            f.write("\n")
        f.write("\n".join(lines).rstrip("\n") + "\n")
    return path
