extern "C" __global__ void __launch_bounds__(128, 1) order_barrier_kernel(float* dst, const float* src) {
tilescale::put<2, true>((&(src[0])), (&(dst[0])), 1, 1024, 1024, 1024, 1);
nvshmem_fence();
tilescale::put<2, true>((&(src[0])), (&(dst[0])), 1, 1024, 1024, 1024, 1);
nvshmem_quiet();
nvshmemx_barrier_all_block();
nvshmemx_barrier_all_warp();
nvshmem_barrier_all();
nvshmemx_sync_all_block();
nvshmemx_sync_all_warp();
tilescale::barrier_all_first_block();
}
