"""The exceptions tilescale raises. Each message names the argument, what was received and what was
expected, and where it makes sense, the line of the user's kernel and the fix."""
from __future__ import annotations

import os
import sys


class TileScaleError(Exception):
    """Base class of every tilescale error."""


class NvshmemNotFoundError(TileScaleError, ImportError):
    """No NVSHMEM installation was found (the message lists every place looked)."""


class SettingError(TileScaleError, ValueError):
    """An environment setting with an invalid value: the message names the variable, the value and what is
    expected (a ValueError, as these checks raised before)."""


class BackendError(TileScaleError, ValueError):
    """An execution backend or build mode that cannot build this kernel."""


class BuildError(TileScaleError, RuntimeError):
    """nvcc could not build a distributed kernel."""


class LanguageError(TileScaleError, ValueError):
    """A distributed op was used with invalid arguments (raised while tracing the kernel)."""


class NotInitializedError(TileScaleError, RuntimeError):
    """The distributed runtime is needed but tilescale.init_distributed() has not run."""


class AlreadyInitializedError(TileScaleError, RuntimeError):
    """tilescale.init_distributed() was called twice."""


class ArchMismatchError(TileScaleError, RuntimeError):
    """A kernel compiled for one GPU architecture, about to be loaded on a GPU of another."""


class WorldSizeMismatchError(TileScaleError, RuntimeError):
    """A kernel compiled for one world size launched in a job of another."""


class SymmetricMismatchError(TileScaleError, RuntimeError):
    """Ranks disagree on a collective call (sizes, dtypes, order of symmetric allocations...)."""


class CollectiveMismatchError(SymmetricMismatchError, ValueError):
    """Ranks called a collective with different arguments (shape, dtype, split sizes, root...)."""


class OpArgumentError(TileScaleError, ValueError):
    """An op, a collective or a symmetric allocation called with an invalid argument (wrong shape, dtype,
    device, strides, value...). The message names the op, the argument, what was received and what was
    expected. A ValueError, as these checks raised before."""


class OpArgumentTypeError(OpArgumentError, TypeError):
    """An :class:`OpArgumentError` where the argument has the wrong type (a float where an int is expected,
    a list where a tensor is expected...): also a TypeError."""


class SymmetricHeapExhaustedError(TileScaleError, MemoryError):
    """The NVSHMEM symmetric heap has no room for an allocation."""


class NotSymmetricError(TileScaleError, ValueError):
    """A tensor that must live on the symmetric heap does not."""


class WaitTimeoutError(TileScaleError, RuntimeError):
    """A device-side wait gave up in debug mode (TILESCALE_WAIT_TIMEOUT_S)."""


class GraphCaptureError(TileScaleError, RuntimeError):
    """A call that a CUDA graph cannot hold was made during capture: an op that is not declared graph-safe
    (``Op.GRAPH_SAFE``), an op constructed during capture, or variable split sizes (tilescale/ops/capture.py)."""


class RemoteRankError(TileScaleError, RuntimeError):
    """Another rank failed; this one stops instead of waiting for it forever."""


_INTERNAL_DIRS = None


def _internal_dirs() -> tuple[str, ...]:
    global _INTERNAL_DIRS
    if _INTERNAL_DIRS is None:
        dirs = [os.path.dirname(os.path.abspath(__file__))]
        for mod in ("tilelang", "tvm", "tvm_ffi"):
            m = sys.modules.get(mod)
            if m is not None and getattr(m, "__file__", None):
                dirs.append(os.path.dirname(os.path.abspath(m.__file__)))
        dirs.append(os.path.dirname(os.__file__))
        _INTERNAL_DIRS = tuple(dirs)
    return _INTERNAL_DIRS


def user_location(kernel_line: bool = False) -> str:
    """'file.py:LINE' of the innermost stack frame outside tilescale, tilelang, tvm and the stdlib: the
    caller's line. With ``kernel_line``, only tilescale's language module counts as internal, so the
    line of a kernel that tilescale itself defines (tilescale/ops) is reported."""
    internal = _internal_dirs()
    if kernel_line:
        internal = (os.path.join(internal[0], "language"),) + internal[1:]
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(tuple(d + os.sep for d in internal)) and not fn.startswith("<"):
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "<unknown location>"
