"""tilelang's language, plus tilescale's distributed ops. Import it as ``T``::

    import tilescale.language as T

Everything of ``tilelang.language`` is here unchanged (``T.Kernel``, ``T.copy``, ``T.gemm``, ...);
the distributed ops (``T.put_block``, ``T.wait_until``, ``T.remote``, ...) live in
:mod:`tilescale.language.distributed`, the tile copies between global and shared memory and their
mbarriers (``T.load_async``, ``T.store_tile``, ``T.init_barrier``, ...) in :mod:`tilescale.language.tiles`;
the profiler's in-kernel timestamps (``T.timestamp``, ``T.smid``) in :mod:`tilescale.language.profile`.
"""
import tilelang.language as _tl
from tilelang.language import *  # noqa: F401,F403

from . import distributed, profile, tiles  # noqa: F401
from .distributed import *  # noqa: F401,F403
from .profile import *  # noqa: F401,F403
from .tiles import *  # noqa: F401,F403

globals().update({k: v for k, v in vars(_tl).items() if not k.startswith("__") and k not in globals()})
