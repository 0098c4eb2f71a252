"""Command line: ``python -m pyw8a8 [info|bench|eval|quality] [options]``, or
``--help``, or ``--version``.

A usage or environment error ends with one line on stderr and exit status 2, never a
traceback: an unknown command here, a bad option in the command's parser (argparse's
usage and one error line), a bad ``PYW8A8_*`` setting in ``pyw8a8/__init__.py`` (the
package is imported before this module runs).
"""
import sys

COMMANDS = {
    "info": "a quick speed table: pyw8a8's ISAs against numpy float32 (the default)",
    "bench": "side-by-side GOPS of pyw8a8, numpy float32 and the int8 peers",
    "eval": "accuracy, KL and speed of W8A8 configurations of Gemma 3 270M",
    "quality": "SQNR of plain, rotated and scaled W8A8 on synthetic FFN data",
}


def usage():
    """The top-level help: the commands, one line each.

    Returns
    -------
    str
    """
    lines = ["usage: python -m pyw8a8 [--version] [COMMAND] [options]", "", "commands:"]
    lines += [f"  {name:<9}{text}" for name, text in COMMANDS.items()]
    lines += ["", "python -m pyw8a8 COMMAND --help shows the options of a command;",
              "--version prints pyw8a8's version."]
    return "\n".join(lines)


def main(argv=None):
    """Run a command of ``python -m pyw8a8``.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after ``python -m pyw8a8`` (default: the command line's). Without a
        command (nothing, or options first) the command is ``info``.

    Returns
    -------
    int
        The exit status: the command's, 0 for ``--help`` and ``--version``, 2 for an
        unknown command.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv[:1] == ["--version"]:
        # The package is imported before this module runs (``-m`` and ``import
        # pyw8a8.__main__`` both import it first); read from it, not imported back.
        print(f"pyw8a8 {sys.modules[__package__].__version__}")
        return 0
    command = argv.pop(0) if argv and not argv[0].startswith("-") else "info"
    if command in ("info", "bench"):
        from .tools.bench import main as run
        return run(argv, quick=command == "info")
    if command == "eval":
        from .evaluate import main as run
        return run(argv)
    if command == "quality":
        from .tools.quality import main as run
        return run(argv)
    print(f"pyw8a8: unknown command {command!r}; expected one of {', '.join(COMMANDS)} "
          "(python -m pyw8a8 --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
