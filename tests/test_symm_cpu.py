"""Symmetric-heap bookkeeping and runtime-less behaviour (no GPU, no NVSHMEM initialisation)."""
from __future__ import annotations

import pytest

import tilescale
from tilescale import runtime, symm
from tilescale.errors import NotInitializedError
from tilescale.heap import Allocation, Registry


def _alloc(base, nbytes, seq=0):
    return Allocation(base=base, nbytes=nbytes, shape=(nbytes,), dtype="uint8", seq=seq, where="test")


def test_registry_find_add_remove():
    reg = Registry()
    a, b, c = _alloc(0x10000, 4096, 0), _alloc(0x30000, 256, 1), _alloc(0x20000, 0, 2)
    for x in (a, b, c):  # added out of address order
        reg.add(x)
    assert reg.bases == sorted(reg.bases) == [0x10000, 0x20000, 0x30000]
    assert reg.live_bytes == 4096 + 256

    # views inside an allocation are found
    assert reg.find(0x10000) is a
    assert reg.find(0x10000, 4096) is a
    assert reg.find(0x10000 + 1024, 1024) is a
    assert reg.find(0x10000 + 4095, 1) is a
    assert reg.find(0x30000 + 128, 128) is b
    assert reg.find(0x20000, 1) is c            # a zero-byte allocation still owns its base address
    # out of range: before the first, across the end, in a gap, past the last
    assert reg.find(0x10000 - 1) is None
    assert reg.find(0x10000 + 4000, 97) is None
    assert reg.find(0x10000 + 4096) is None
    assert reg.find(0x20000 + 1) is None
    assert reg.find(0x30000 + 256) is None
    assert reg.find(0x30000 + 200, 57) is None

    reg.remove(a)
    assert a.live is False
    assert reg.find(0x10000 + 8) is None
    assert reg.bases == [0x20000, 0x30000] and 0x10000 not in reg.by_base
    assert reg.live_bytes == 256
    assert reg.find(0x30000) is b


def test_not_initialised_errors():
    assert not tilescale.is_initialized()
    calls = {
        "symm.empty": lambda: symm.empty((4,)),
        "symm.zeros": lambda: symm.zeros(4),
        "create_symmetric_tensor": lambda: tilescale.create_symmetric_tensor((4,)),
        "barrier": lambda: tilescale.barrier(),
        "runtime.current": runtime.current,
        "symm.is_symmetric": lambda: symm.is_symmetric(object()),
        "symm.handle": lambda: symm.handle(object()),
        "get_remote_ptr": lambda: tilescale.get_remote_ptr(object(), 0),
        "symm.free": lambda: symm.free(object()),
    }
    for what, call in calls.items():
        with pytest.raises(NotInitializedError) as ei:
            call()
        assert "tilescale.init_distributed()" in str(ei.value), (what, str(ei.value))


def test_finalize_without_runtime_does_nothing():
    tilescale.finalize()
    tilescale.finalize()
    assert not tilescale.is_initialized()


def test_init_module_needs_the_runtime():
    with pytest.raises(NotInitializedError, match=r"init_distributed"):
        runtime.init_module(object(), "k")


def test_shape_and_dtype_checks():
    import torch

    assert symm._shape(4) == (4,) and symm._shape([2, 3]) == (2, 3)
    with pytest.raises(TypeError, match="shape"):
        symm._shape("abc")
    with pytest.raises(ValueError, match="non-negative"):
        symm._shape((2, -1))
    assert symm._dtype("bfloat16") is torch.bfloat16 and symm._dtype(torch.uint64) is torch.uint64
    with pytest.raises(TypeError, match=r"dtype: got 'floaty'"):
        symm._dtype("floaty")


def test_init_distributed_without_gpu_says_so(monkeypatch):
    """On a machine without GPUs init_distributed fails with a clear message and leaves no runtime."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    with pytest.raises(tilescale.errors.TileScaleError, match="needs CUDA GPUs"):
        tilescale.init_distributed()
    assert not tilescale.is_initialized()


def test_peer_arguments_raise_op_argument_errors(monkeypatch):
    from types import SimpleNamespace

    from tilescale import heap
    from tilescale.errors import OpArgumentError

    rt = SimpleNamespace(info=SimpleNamespace(world_size=2, rank=0), closed=False)
    monkeypatch.setattr(symm, "current", lambda: rt)
    heap.registry(rt).add(_alloc(0x10000, 64))
    t = SimpleNamespace(is_cuda=True, data_ptr=lambda: 0x10000, numel=lambda: 16, element_size=lambda: 4)
    with pytest.raises(OpArgumentError, match=r"pe: got 2, expected an int in \[0, 2\)"):
        symm.get_remote_ptr(t, 2)
    assert issubclass(OpArgumentError, ValueError)


def test_free_all_frees_newest_first_and_finalize_hooks_are_registered_once():
    from types import SimpleNamespace

    from tilescale import heap
    from tilescale.ops import op_cache

    freed = []
    rt = SimpleNamespace(shim=SimpleNamespace(ts_free=freed.append))
    reg = heap.registry(rt)
    for seq, base in enumerate((0x30000, 0x10000, 0x20000)):
        reg.add(_alloc(base, 16, seq))
    heap.free_all(rt)
    assert freed == [0x20000, 0x10000, 0x30000] and reg.live_bytes == 0 and not reg.by_base
    assert runtime._at_finalize.count(op_cache.clear_all) == 1   # the ops' caches are emptied by finalize
    runtime.at_finalize(op_cache.clear_all)
    assert runtime._at_finalize.count(op_cache.clear_all) == 1
