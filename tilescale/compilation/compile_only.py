"""Compile-only runs: on a machine without GPUs, a script started by the launcher builds every ``@tilescale.jit``
kernel it reaches, then stops where it would need a GPU.

    python -m tilescale.compilation.compile_only script.py [args...]   # what `tilescale run` starts without GPUs
    python -m tilescale.compilation.compile_only -m package.module [args...]

The script runs once, as rank 0 of ``WORLD_SIZE`` ranks, with ``TILESCALE_COMPILE_ONLY=1``:

* ``tilescale.init_distributed()`` returns rank 0's ``DistInfo`` and starts nothing;
  ``tilescale.synchronize()``, ``tilescale.barrier()`` and ``tilescale.finalize()`` do nothing;
* tensors made on a CUDA device, and ``tilescale.symm`` tensors, are meta tensors: shape and dtype, no data;
* a kernel (``@tilescale.jit``, ``tilescale.compile``) is compiled and linked as :func:`tilescale.build` does
  (cached; nothing loaded) and comes back as a :class:`BuiltKernel`, whose calls run nothing;
* the first thing that needs a GPU ends the run (:class:`NeedsGpu`): reading a tensor's data (``bool``, ``item``,
  ``tolist``, ``cpu``...), CUDA's initialisation (streams, ``torch.cuda.synchronize``, ``set_device``), the
  runtime of ``tilescale.ops``. The run says where, and exits 0: the kernels after that line are not reached.

The examples' ``tilescale.testing.example_main`` builds every kernel of an example by its ``build(world_size)``
instead of running it, so their compile-only runs never stop early.
"""
from __future__ import annotations

import linecache
import os
import runpy
import sys
from pathlib import Path

USAGE = "usage: python -m tilescale.compilation.compile_only (script.py | -m module) [args...]"

_built: list[str] = []     # "name: library" of each kernel this run built, in order
_mode = None               # the meta-device mode, once entered


class NeedsGpu(BaseException):  # noqa: N818  (a stop, not an error: BaseException, so `except Exception` lets it by)
    """What a compile-only run cannot do without a GPU; ends the run where it is raised."""

    def __init__(self, what: str):
        self.what = what
        self.where = _user_line()
        super().__init__(f"{self.where}: {what} needs a GPU")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank_zero() -> dict:
    """The fields of init_distributed()'s DistInfo in a compile-only run: rank 0 of WORLD_SIZE ranks, one GPU each
    (LOCAL_WORLD_SIZE of them on its node). Enters the run's meta-device mode."""
    enter()
    world = world_size()
    local = min(int(os.environ.get("LOCAL_WORLD_SIZE", world)), world)
    return dict(rank=0, world_size=world, local_rank=0, local_world_size=local, device=0,
                node_devices=tuple(range(local)))


def meta_tensor(shape: tuple, dtype):
    """tilescale.symm.empty / zeros in a compile-only run: a tensor of that shape and dtype, without memory."""
    import torch

    return torch.empty(shape, dtype=dtype, device="meta")


class BuiltKernel:
    """A kernel compiled and linked, not loaded (a compile-only run): calling it runs nothing and returns its
    outputs (``out_idx``) as meta tensors."""

    def __init__(self, func, result, out_idx=None, name: str | None = None):
        from .kernel_build import func_name

        self.func, self.result, self.name = func, result, name or func_name(func)
        self.library, self.source = result.library, result.source
        self.out_idx = [] if out_idx is None else [out_idx] if isinstance(out_idx, int) else list(out_idx)
        _built.append(f"{self.name}: {self.library}")
        print(f"compile-only: built {self.name} for world size {world_size()}: {self.library}", flush=True)

    def get_kernel_source(self) -> str:
        return self.source

    def __call__(self, *args, **kwargs):
        outs = [self._meta_output(i) for i in self.out_idx]
        return None if not outs else outs[0] if len(outs) == 1 else outs

    def _meta_output(self, index: int):
        import torch

        params = list(self.func.params)
        buf = self.func.buffer_map[params[index]]
        if not all(hasattr(d, "value") for d in buf.shape):
            raise NeedsGpu(f"the output {buf.name} of {self.name} (its shape depends on the inputs)")
        return torch.empty([int(d.value) for d in buf.shape], dtype=getattr(torch, str(buf.dtype)), device="meta")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        raise NeedsGpu(f"{self.name}.{name} (the loaded kernel)")


def enter() -> None:
    """Make CUDA tensors meta tensors and turn CUDA's initialisation into :class:`NeedsGpu`, for the rest of the
    process (idempotent)."""
    global _mode
    if _mode is not None:
        return
    from .. import compat

    _mode = _meta_device_mode()
    _mode.__enter__()
    compat.replace_torch_cuda_init(lambda: _raise(NeedsGpu("CUDA's initialisation (torch.cuda)")))


def _raise(e: BaseException):
    raise e


def _meta_device_mode():
    import torch
    from torch.overrides import TorchFunctionMode

    T = torch.Tensor
    reads = {T.__bool__: "bool(tensor)", T.item: "tensor.item()", T.tolist: "tensor.tolist()",
             T.numpy: "tensor.numpy()", T.cpu: "tensor.cpu()", T.__int__: "int(tensor)",
             T.__float__: "float(tensor)", T.__index__: "a tensor as an index"}

    def on_cuda(d) -> bool:
        if isinstance(d, int) and not isinstance(d, bool):
            return True
        return isinstance(d, (str, torch.device)) and str(d).startswith("cuda")

    def meta_arg(x):
        return "meta" if on_cuda(x) and not isinstance(x, int) else x

    class MetaDevice(TorchFunctionMode):
        """Tensors made on (or moved to) a CUDA device are made on the meta device; reading a meta tensor's
        data is a :class:`NeedsGpu` stop."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            what = reads.get(func)
            if what is not None and args and isinstance(args[0], T) and args[0].is_meta:
                raise NeedsGpu(f"reading a tensor's data ({what})")
            if func is T.cuda:
                return args[0].to("meta")
            if func is T.to:
                dest = kwargs.get("device", args[1] if len(args) > 1 else None)
                if args[0].is_meta and isinstance(dest, (str, torch.device)) and str(dest).startswith("cpu"):
                    raise NeedsGpu(f"reading a tensor's data (tensor.to({str(dest)!r}))")
                args = (args[0], *map(meta_arg, args[1:]))
            if "device" in kwargs and on_cuda(kwargs["device"]):
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    return MetaDevice()


# What torch raises where it needs a GPU or a tensor's data in ways the mode above does not see (a driver call
# without CUDA's lazy initialisation; an operator that reads a meta tensor's data in C++, as torch.allclose does).
_GPU_ERRORS = ("meta tensor", "no nvidia driver", "cuda driver version is insufficient")


def _as_stop(e: BaseException) -> NeedsGpu | None:
    text = str(e).lower()
    if isinstance(e, (RuntimeError, NotImplementedError)) and any(s in text for s in _GPU_ERRORS):
        stop = NeedsGpu(f"{type(e).__name__}: {str(e).splitlines()[0]}")
        stop.where = _user_line(e.__traceback__)
        return stop
    return None


def _internal_dirs() -> tuple[str, ...]:
    dirs = {os.path.dirname(os.__file__), str(Path(__file__).resolve().parent.parent)}   # tilescale/
    for name in ("torch", "tilelang", "tvm", "tvm_ffi"):
        m = sys.modules.get(name)
        if m is not None and getattr(m, "__file__", None):
            dirs.add(os.path.dirname(os.path.abspath(m.__file__)))
    return tuple(d + os.sep for d in dirs)


def _user_line(tb=None) -> str:
    """'file:line: source' of the innermost frame of the script's own code (outside tilescale, torch, tilelang and
    the standard library): of the traceback `tb`, or of the current stack."""
    frames = []
    if tb is not None:
        while tb is not None:
            frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
        frames.reverse()
    else:
        f = sys._getframe(1)
        while f is not None:
            frames.append((f.f_code.co_filename, f.f_lineno))
            f = f.f_back
    internal = _internal_dirs()
    for filename, line in frames:
        if not filename.startswith("<") and not os.path.abspath(filename).startswith(internal):
            return f"{filename}:{line}: {linecache.getline(filename, line).strip()}"
    return "<unknown location>"


def _run(argv: list[str]) -> None:
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(f"{USAGE}\n\n{__doc__}", file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    if argv[0].startswith("-") and argv[0] != "-m":
        print(f"{USAGE}: got the interpreter option {argv[0]!r}", file=sys.stderr)
        return 2
    os.environ["TILESCALE_COMPILE_ONLY"] = "1"
    enter()
    try:
        _run(argv)
    except NeedsGpu as stop:
        _stopped(stop)
    except (RuntimeError, NotImplementedError) as e:
        stop = _as_stop(e)
        if stop is None:
            raise
        _stopped(stop)
    return 0


def _stopped(stop: NeedsGpu) -> None:
    print(f"compile-only: stopped at {stop.where}: {stop.what} needs a GPU; the rest of the script is not run "
          f"({len(_built)} kernel(s) built before it)", flush=True)


if __name__ == "__main__":   # run as the package's module, not as a second copy named __main__ (one NeedsGpu class)
    from tilescale.compilation.compile_only import main as _main

    sys.exit(_main())
