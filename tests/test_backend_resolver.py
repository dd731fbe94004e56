"""Backend resolution from the IR (no compile): tilescale.resolve_backend / resolve_execution_backend."""

import pytest

import tilescale
import tilescale.language as T
from tilescale.errors import BackendError


@tilescale.jit
def ring(n: int = 256, world_size: int = 2):
    @T.prim_func
    def main(src: T.Tensor((n,), "float32"), dst: T.Tensor((world_size, n), "float32"),
             sig: T.Tensor((world_size,), "uint64")):
        with T.Kernel(1, threads=128):
            me = T.get_rank()
            T.put_signal_block(src, dst[me, :], sig[me], value=1, dst_pe=(me + 1) % world_size)
            T.wait_until(sig[(me + world_size - 1) % world_size], cmp="eq", value=1)

    return main


@tilescale.jit
def add(n: int = 1024):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
            for i in T.Parallel(128):
                C[bx * 128 + i] = A[bx * 128 + i] + B[bx * 128 + i]

    return main


@pytest.fixture(scope="module")
def dist_func():
    return ring.get_tir(256, 2)


@pytest.fixture(scope="module")
def plain_func():
    return add.get_tir(1024)


def test_distributed_kernel_defaults_to_cython_inlined(clean_ts_env, dist_func):
    spec = tilescale.resolve_backend(dist_func)
    assert spec.name == "cython" and spec.execution_backend == "cython"
    assert spec.distributed is True
    assert spec.build_mode == "inlined"
    assert "nvshmem_my_pe" in spec.reason and "tilescale::put_signal" in spec.reason
    assert tilescale.resolve_execution_backend(dist_func) == "cython"


def test_plain_kernel_keeps_tvm_ffi(clean_ts_env, plain_func):
    spec = tilescale.resolve_backend(plain_func)
    assert (spec.name, spec.distributed, spec.build_mode) == ("tvm_ffi", False, None)
    assert tilescale.resolve_execution_backend(plain_func) == "tvm_ffi"
    # a @tilescale.jit factory whose arguments all have defaults is accepted too
    assert tilescale.resolve_execution_backend(add) == "tvm_ffi"
    assert tilescale.resolve_execution_backend(ring) == "cython"


def test_explicit_cython_on_plain_kernel_is_honoured(clean_ts_env, plain_func):
    spec = tilescale.resolve_backend(plain_func, "cython")
    assert (spec.name, spec.distributed) == ("cython", False)
    assert tilescale.resolve_execution_backend(plain_func, "cython") == "cython"


@pytest.mark.parametrize("requested", ["tvm_ffi", "nvrtc"])
def test_non_cython_backend_on_distributed_kernel_is_refused(clean_ts_env, dist_func, requested):
    with pytest.raises(BackendError) as ei:
        tilescale.resolve_backend(dist_func, requested)
    msg = str(ei.value)
    assert "execution_backend" in msg and repr(requested) in msg and "'cython'" in msg, msg
    with pytest.raises(BackendError, match="execution_backend"):
        tilescale.resolve_execution_backend(dist_func, requested)


def test_unknown_backend_is_refused(clean_ts_env, plain_func):
    with pytest.raises(BackendError, match=r"execution_backend: got 'cuda_magic'"):
        tilescale.resolve_backend(plain_func, "cuda_magic")


@pytest.mark.parametrize("value,mode", [(False, "rdc"), (True, "inlined"), ("false", "rdc"), (1, "inlined")])
def test_pass_config_disable_rdc_picks_build_mode(clean_ts_env, dist_func, value, mode):
    spec = tilescale.resolve_backend(dist_func, pass_configs={"tl.disable_rdc": value})
    assert spec.build_mode == mode and spec.name == "cython"


def test_pass_config_bad_value_is_refused(clean_ts_env, dist_func):
    with pytest.raises(BackendError, match=r"tl.disable_rdc.*'maybe'.*True or False"):
        tilescale.resolve_backend(dist_func, pass_configs={"tl.disable_rdc": "maybe"})


def test_use_distributed_pass_config_forces_distributed(clean_ts_env, plain_func):
    spec = tilescale.resolve_backend(plain_func, pass_configs={"tl.use_distributed": True})
    assert spec.distributed and spec.name == "cython" and spec.build_mode in ("inlined", "rdc")
    assert "forced" in spec.reason


def test_use_distributed_false_on_distributed_kernel_is_refused(clean_ts_env, dist_func):
    with pytest.raises(BackendError) as ei:
        tilescale.resolve_backend(dist_func, pass_configs={"tl.use_distributed": False})
    assert "tl.use_distributed" in str(ei.value) and "nvshmem_my_pe" in str(ei.value)


@pytest.mark.parametrize("var", ["TILESCALE_USE_DISTRIBUTED", "TILELANG_USE_DISTRIBUTED"])
def test_env_use_distributed_and_alias(clean_ts_env, plain_func, var):
    assert not tilescale.resolve_backend(plain_func).distributed
    clean_ts_env.setenv(var, "1")
    spec = tilescale.resolve_backend(plain_func)
    assert spec.distributed and spec.name == "cython"
    # pass_configs override the environment
    assert not tilescale.resolve_backend(plain_func, pass_configs={"tl.use_distributed": False}).distributed


def test_env_build_mode_rdc(clean_ts_env, dist_func):
    clean_ts_env.setenv("TILESCALE_BUILD_MODE", "rdc")
    assert tilescale.resolve_backend(dist_func).build_mode == "rdc"
    # an explicit argument and the pass config both beat the environment
    assert tilescale.resolve_backend(dist_func, build_mode="inlined").build_mode == "inlined"
    assert tilescale.resolve_backend(dist_func, pass_configs={"tl.disable_rdc": True}).build_mode == "inlined"
    clean_ts_env.setenv("TILESCALE_BUILD_MODE", "inlined")
    assert tilescale.resolve_backend(dist_func).build_mode == "inlined"


def test_explicit_build_mode_beats_pass_config(clean_ts_env, dist_func):
    spec = tilescale.resolve_backend(dist_func, pass_configs={"tl.disable_rdc": True}, build_mode="rdc")
    assert spec.build_mode == "rdc"


def test_invalid_build_mode_is_an_error(clean_ts_env, dist_func, plain_func):
    with pytest.raises(BackendError, match=r"build_mode: got 'fast'"):
        tilescale.resolve_backend(dist_func, build_mode="fast")
    with pytest.raises(ValueError, match=r"build_mode: got 'fast'"):
        tilescale.jit(build_mode="fast")
    clean_ts_env.setenv("TILESCALE_BUILD_MODE", "fast")
    with pytest.raises(ValueError, match="TILESCALE_BUILD_MODE"):
        tilescale.resolve_backend(dist_func)
    clean_ts_env.delenv("TILESCALE_BUILD_MODE")
    # a build mode for a kernel without distributed ops is a mistake, said as such
    with pytest.raises(BackendError, match="distributed kernels only"):
        tilescale.resolve_backend(plain_func, build_mode="rdc")


def test_inlined_refused_without_header_support():
    from tilescale.backend import resolve_build_mode

    assert resolve_build_mode(None, {}, inlined_supported=False) == "rdc"
    with pytest.raises(BackendError, match="NVSHMEM_ENABLE_ALL_DEVICE_INLINING"):
        resolve_build_mode("inlined", {}, inlined_supported=False)


def test_resolve_execution_backend_rejects_other_objects():
    with pytest.raises(BackendError, match="kernel_or_func: got int"):
        tilescale.resolve_execution_backend(42)


def test_pass_configs_are_split_for_tilelang():
    from tilescale.backend import split_pass_configs

    rest, ours = split_pass_configs({"tl.disable_rdc": False, "tl.use_distributed": True, "tl.enable_fast_math": 1})
    assert rest == {"tl.enable_fast_math": 1}
    assert ours == {"tl.disable_rdc": False, "tl.use_distributed": True}
    assert split_pass_configs({"tl.disable_rdc": True}) == (None, {"tl.disable_rdc": True})
