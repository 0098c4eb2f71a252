"""Command line: ``python -m pyw8a8 [info|bench|eval|quality] [options]``."""
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and not argv[0].startswith("-") else "info"
    if command in ("info", "bench"):
        from .bench import main as run
        return run(argv, quick=command == "info")
    if command == "eval":
        from .evaluate import main as run
        return run(argv)
    if command == "quality":
        from .quality import main as run
        return run(argv)
    print(f"unknown command {command!r}; expected info, bench, eval or quality",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
