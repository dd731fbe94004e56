"""Co-residency probe (run 30, M1): can all `blocks` CTAs of a 2-CTA-cluster launch with the push kernel's shared
memory be resident at once? Each CTA counts itself in, then waits (at most ~1 s) for all: ok[0] = CTAs that saw all."""
import tilescale
import tilescale.language as T

SRC = r"""
#ifndef PROBEM1_CUH_
#define PROBEM1_CUH_
__device__ __forceinline__ void probe_all(int* cnt, int* ok, int n) {
  if (threadIdx.x == 0) {
    atomicAdd(cnt, 1);
    long long t0 = clock64();
    while (atomicAdd(cnt, 0) < n && clock64() - t0 < 2000000000LL) {}
    if (atomicAdd(cnt, 0) >= n) atomicAdd(ok, 1);
  }
}
#endif
"""


@tilescale.jit
def probe_kernel(blocks: int, smem_elems: int, cluster: int = 2):
    @T.prim_func
    def probe(cnt: T.Tensor((2,), "int32")):
        with T.Kernel(blocks, threads=384, cluster_dims=cluster) as bid:
            T.import_source(SRC)
            S = T.alloc_shared((smem_elems,), "bfloat16")
            tx = T.get_thread_binding()
            S[tx] = T.cast(bid, "bfloat16")
            T.evaluate(T.call_extern("handle", "probe_all", T.address_of(cnt[0]), T.address_of(cnt[1]), blocks))
            if tx == 0:
                if S[1] > T.cast(1e9, "bfloat16"):
                    cnt[0] = 0
    return probe
