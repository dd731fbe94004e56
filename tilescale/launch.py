"""``tilescale run``: start a tilescale program on the GPUs of this node, one rank per GPU (torchrun underneath).

    tilescale run -n 4 examples/distributed/example_allgather_gemm.py [args...]
    python -m tilescale run -n 4 -m package.module [args...]
    GPUS=4 bash launch.sh script.py [args...]                   # the same, settings from the environment

What it does, in order: checks its settings; finds the GPUs (asking the interpreter that runs the ranks); without
GPUs, compiles the program's kernels instead of running it (:mod:`tilescale.compile_only`) and exits 2 saying how
many GPUs it needs; with fewer GPUs than ranks, refuses unless ranks may share GPUs (``--ranks-per-gpu``); runs the
pre-flight check (``tilescale doctor``); starts the CUDA MPS daemon when asked; then torchrun. Every process it
starts carries ``TILESCALE_LAUNCH_JOB_ID`` (a marker, not a setting): when the launch ends (normally, Ctrl-C,
SIGTERM, SIGHUP, a failing rank) every process of the job is ended, the MPS daemon it started is stopped, the
/dev/shm files of killed ranks are removed (:mod:`tilescale.shm_leftovers`) and its temporary directories go.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from . import launch_job
from .launch_job import Job, Stop, say

ENV_DEFAULTS = {
    "NVSHMEM_SYMMETRIC_SIZE": "4G",
    # tilescale does not use NVLink multicast (NVLS); off in NVSHMEM, NCCL and torch unless asked
    "NVSHMEM_DISABLE_NVLS": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    # lazy module loading deadlocks a kernel that spins on a signal set by a kernel loaded later
    "CUDA_MODULE_LOADING": "EAGER",
}

SETTINGS_HELP = """settings (an option wins over its variable):
  -n / GPUS                       ranks on this node (default 4)
  --ranks-per-gpu / TILESCALE_RANKS_PER_GPU
                                  shared-GPU mode: up to this many ranks on one GPU when there are fewer GPUs
                                  than ranks (default 1: an error). For developing and testing multi-rank
                                  kernels on one GPU: correct, but timings mean nothing
  --mps / TILESCALE_MPS=1         in shared-GPU mode, start the CUDA MPS daemon for the job (when none runs) so
                                  the ranks' kernels run side by side, and stop it after
  --port / PORT (or MASTER_PORT)  rendezvous port (one node: default torchrun --standalone, a port the OS
                                  picks; required with several nodes)
  --nnodes / NNODES, --node-rank / NODE_RANK, --master-addr / MASTER_ADDR
                                  several nodes (default 1, 0, 127.0.0.1; MASTER_ADDR and PORT required with
                                  several nodes: docs/multinode.md)
  --skip-doctor / TILESCALE_SKIP_DOCTOR=1   skip the pre-flight check
  NVSHMEM_SYMMETRIC_SIZE          symmetric heap per rank (default 4G)
  PYTHON                          interpreter of the ranks (default: this one)

On a machine without GPUs it compiles the program's kernels for its ranks (rank 0's arguments), says that
running needs GPUs, and exits 2."""


class UsageError(Exception):
    """A setting or argument that is wrong: said in one line, exit 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tilescale run", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="tilescale run [-n N] [options] (script.py | -m module) [args...]",
        description="Start a tilescale program on N ranks of this node (torchrun underneath), with NVSHMEM's "
                    "settings, a pre-flight check, and nothing left running when it ends. Without GPUs: compile "
                    "its kernels instead.", epilog=SETTINGS_HELP)
    p.add_argument("-n", "--gpus", dest="gpus", metavar="N", help="ranks on this node (GPUS; default 4)")
    p.add_argument("--ranks-per-gpu", metavar="K", help="shared-GPU mode: up to K ranks on one GPU")
    p.add_argument("--mps", action="store_true", default=None, help="start the CUDA MPS daemon (shared-GPU mode)")
    p.add_argument("--nnodes", metavar="N", help="nodes of the job (NNODES; default 1)")
    p.add_argument("--node-rank", metavar="R", help="this node's rank (NODE_RANK; default 0)")
    p.add_argument("--master-addr", metavar="ADDR", help="address of node 0 (MASTER_ADDR)")
    p.add_argument("--port", metavar="PORT", help="rendezvous port (PORT or MASTER_PORT)")
    p.add_argument("--skip-doctor", action="store_true", default=None, help="skip the pre-flight check")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module (python -m MODULE) instead of a script")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the script and its arguments")
    return p


def _count(value, option: str, var: str, default: int, zero: str = "") -> int:
    """A count from `option` (when given) or the variable `var`; the error names the one it came from. `zero`:
    0 is allowed, and this is what is expected."""
    shown, raw = (f"{option} {value}", value) if value is not None else (f"{var}={os.environ.get(var)}",
                                                                           os.environ.get(var))
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or (int(raw) == 0 and not zero):
        raise UsageError(f"{shown}: expected {zero or 'a positive integer'}")
    return int(raw)


def _flag(value, var: str) -> bool:
    return bool(value) if value is not None else os.environ.get(var, "0") == "1"


class Plan:
    """What a launch will do, from its arguments and the environment (checked before anything starts)."""

    def __init__(self, args):
        self.gpus = _count(args.gpus, "-n", "GPUS", 4)
        self.rpg = _count(args.ranks_per_gpu, "--ranks-per-gpu", "TILESCALE_RANKS_PER_GPU", 1)
        self.nnodes = _count(args.nnodes, "--nnodes", "NNODES", 1)
        self.node_rank = _count(args.node_rank, "--node-rank", "NODE_RANK", 0, zero="an integer from 0 to NNODES-1")
        self.port = args.port or os.environ.get("PORT") or os.environ.get("MASTER_PORT") or None
        self.master_addr = args.master_addr or os.environ.get("MASTER_ADDR") or None
        self.mps = _flag(args.mps, "TILESCALE_MPS")
        self.skip_doctor = _flag(args.skip_doctor, "TILESCALE_SKIP_DOCTOR")
        self.python = os.environ.get("PYTHON") or sys.executable
        if self.nnodes > 1 and not self.port:
            raise UsageError(f"NNODES={self.nnodes}: set PORT (the same free port on every node, e.g. PORT=29500); "
                             "each node would pick its own otherwise")
        if self.node_rank >= self.nnodes:
            raise UsageError(f"NODE_RANK={self.node_rank} with NNODES={self.nnodes}: expected 0 to {self.nnodes - 1}")
        if self.nnodes > 1 and not self.master_addr:
            raise UsageError(f"NNODES={self.nnodes}: set MASTER_ADDR (the address of node 0, the same on every node); "
                             "the default 127.0.0.1 would make every node wait for itself")
        if args.module:
            self.program, self.name = ["-m", args.module, *args.program], args.module
        elif args.program:
            self.program, self.name = list(args.program), args.program[0]
            if not Path(self.name).is_file():
                raise UsageError(f"{self.name}: no such file (expected the Python script to run)")
        else:
            raise UsageError("no program: tilescale run [-n N] (script.py | -m module) [args...]")

    def torchrun(self) -> list[str]:
        if self.port is None:   # one node: torchrun's rendezvous binds a port the OS picks (none to be taken first)
            rdzv = ["--standalone"]
        else:
            rdzv = [f"--nnodes={self.nnodes}", f"--node_rank={self.node_rank}",
                    f"--master_addr={self.master_addr or '127.0.0.1'}", f"--master_port={self.port}"]
        return [self.python, "-m", "torch.distributed.run", f"--nproc_per_node={self.gpus}", *rdzv, *self.program]


def gpu_count(python: str) -> int:
    """GPUs that `python` (the ranks' interpreter) sees; 0 when it cannot tell. Asked in a process of its own: the
    launcher itself neither imports torch nor touches CUDA."""
    try:
        r = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True,
                           text=True, timeout=300)
        return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else 0
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0


def _environment() -> None:
    """The ranks' environment: this tilescale importable (the ranks import the launcher's copy), NVSHMEM's and
    CUDA's settings unless set."""
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    for k, v in ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)


def _compile_only(plan: Plan, job: Job) -> int:
    say(f"no GPU visible; compiling the kernels of {plan.name} for {plan.gpus * plan.nnodes} ranks instead of "
        "running them")
    # tilelang's sources and nvcc's files go to a directory of the launch, removed at its end
    tmp = job.temp_dir("tilescale-compile.")
    env = {"TMPDIR": tmp, "TILESCALE_COMPILE_ONLY": "1", "WORLD_SIZE": str(plan.gpus * plan.nnodes),
           "LOCAL_WORLD_SIZE": str(plan.gpus)}
    rc = job.run([plan.python, "-m", "tilescale.compilation.compile_only", *plan.program], env)
    if rc != 0:
        say(f"compiling failed (exit {rc})", err=True)
        return rc
    say(f"{plan.name} needs {plan.gpus} GPUs, found 0: kernels compiled, nothing run. Run it on a machine with "
        f"{plan.gpus} GPUs.", err=True)
    return 2


def _launch(plan: Plan, job: Job) -> int:
    _environment()
    found = gpu_count(plan.python)
    if found == 0:
        return _compile_only(plan, job)
    shared = False
    if found < plan.gpus:
        need = -(-plan.gpus // found)
        if need > plan.rpg:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<all>")
            raise UsageError(f"GPUS={plan.gpus} but this node has only {found} visible GPU(s) (CUDA_VISIBLE_DEVICES="
                             f"{visible}); use GPUS<={found}, or share GPUs for development and testing with "
                             f"TILESCALE_RANKS_PER_GPU={need} (correct, timings mean nothing)")
        shared = True
        say(f"shared-GPU mode: {plan.gpus} ranks on {found} GPU(s), up to {need} per GPU (TILESCALE_RANKS_PER_GPU="
            f"{plan.rpg}); torch.distributed on gloo only; timings mean nothing")
    os.environ["TILESCALE_RANKS_PER_GPU"] = str(plan.rpg)
    if not plan.skip_doctor:
        if subprocess.run([plan.python, "-m", "tilescale", "doctor", "--gpus", str(plan.gpus), "--quiet"]).returncode:
            say("pre-flight check failed (see above; TILESCALE_SKIP_DOCTOR=1 skips it)", err=True)
            return 3
    if plan.mps and shared:
        job.start_mps()
    if shared:   # each rank records its pid here, so that the files of killed ranks can be removed
        os.environ["TILESCALE_JOB_DIR"] = job.shm_dir()
    cmd = plan.torchrun()
    say("+ " + " ".join(cmd))
    return job.run(cmd, own_group=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        plan = Plan(args)
    except UsageError as e:
        say(str(e), err=True)
        return 2
    job = Job()
    codes = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}

    def on_signal(signum, frame):
        raise Stop(codes[signum])

    previous = {s: signal.signal(s, on_signal) for s in codes}   # first: a signal while the job starts still ends it
    try:
        return _launch(plan, job)
    except UsageError as e:
        say(str(e), err=True)
        return 2
    except launch_job.LaunchError as e:
        say(str(e), err=True)
        return 2
    except Stop as s:
        return s.code
    finally:
        for s in codes:   # a second signal does not interrupt the cleanup
            signal.signal(s, signal.SIG_IGN)
        job.cleanup()
        for s, h in previous.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
