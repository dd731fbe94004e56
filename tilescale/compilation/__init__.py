"""The compile side: from a tilelang kernel to a built library, with or without a GPU.

Lowering and the distributed build's flags (:mod:`.kernel_build`, :mod:`.backend`, :mod:`.analysis`,
:mod:`.codegen`), the target GPU (:mod:`.arch`), nvcc and the kernel caches (:mod:`.toolchain`, :mod:`.cache_files`),
NVSHMEM's install (:mod:`.discovery`, :mod:`.nvshmem_host`), builds without a GPU (:mod:`.build_only`,
:mod:`.compile_only`) and many kernels at once (:mod:`.batch`). It imports nothing of the runtime: the runtime
builds its own kernels through it, and ``tilescale.jit`` (:mod:`tilescale.compiler`) joins the two.
"""
