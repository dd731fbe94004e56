"""Command line: ``python -m tilescale {run,doctor,env}`` (also installed as ``tilescale``).

    python -m tilescale run -n 4 script.py [args...]     # tilescale/launch.py
    python -m tilescale doctor [--gpus N] [--quiet] [--json] [--markdown]
    python -m tilescale env
"""
from __future__ import annotations

import argparse
import json
import sys


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="tilescale",
        description="tilescale: distributed tile kernels (tilelang + NVSHMEM). Command-line tools.",
        epilog="`tilescale run -n 4 script.py` runs a program on 4 GPUs (`tilescale run --help`); it runs "
               "`tilescale doctor --gpus 4` first.")
    p.add_argument("--version", action="version", version=f"tilescale {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", add_help=False,   # its own parser: tilescale/launch.py (dispatched before this one)
                   help="start a program on N ranks of this node (torchrun underneath); without GPUs, compile it")
    d = sub.add_parser(
        "doctor", help="pre-flight check of this machine for a distributed run",
        description="Check GPUs, peer access, NVSHMEM (install, versions, bootstrap), the symmetric heap size, "
                    "multicast and module-loading settings, cache directories, nvcc, tilelang and the CUDA driver. "
                    "Prints one line per check (ok / warn / FAIL, what was found, and the fix when not ok). "
                    "Exit status 1 if any check FAILs (a run would fail); warnings do not fail.")
    d.add_argument("--gpus", type=_positive_int, metavar="N", default=None,
                   help="number of GPUs (ranks) the run will use on this node; FAIL if fewer are visible")
    d.add_argument("--quiet", "-q", action="store_true", help="print only the checks that are not ok, and a summary")
    d.add_argument("--json", action="store_true", help="print a JSON list of the check results")
    d.add_argument("--markdown", action="store_true",
                   help="print docs/troubleshooting.md (Markdown) generated from the checks, and run nothing")
    sub.add_parser("env", help="print every TILESCALE_* setting with its current value and meaning",
                   description="Print every setting tilescale reads from the environment, its current value "
                               "(or why it is invalid) and what it does.")
    return p


def _doctor(args) -> int:
    from . import doctor

    if args.markdown:
        sys.stdout.write(doctor.troubleshooting_markdown())
        return 0
    checks = doctor.run_checks(gpus=args.gpus)
    if args.json:
        print(json.dumps([c.to_dict() for c in checks], indent=2))
        return doctor.exit_code(checks)
    for c in checks:
        if not args.quiet or c.status != doctor.OK:
            print(doctor.format_check(c))
    print(doctor.summary(checks))
    return doctor.exit_code(checks)


def _env() -> int:
    import os

    from .env import RELATED_ENV, describe

    print("# tilescale settings")
    for name, value, doc in describe():
        print(f"{name} = {value}")
        print(f"    {doc}")
    print()
    print("# read by NVSHMEM, CUDA, NCCL, torch or the launcher (checked by `python -m tilescale doctor`)")
    for name, doc in RELATED_ENV:
        value = os.environ.get(name)
        print(f"{name} = {'<unset>' if value is None else repr(value)}")
        print(f"    {doc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:   # everything after `run` is the launcher's (and the program's) own
        from .launch import main as run

        return run(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "env":
        return _env()
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
