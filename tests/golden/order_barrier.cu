extern "C" __global__ void __launch_bounds__(128, 1) order_barrier_kernel(float* dst, const float* src) {
tilescale::put<2, true>((&(src[0])), (&(dst[0])), 1, 1024, 1024, 1024, 1);
nvshmem_fence();
tilescale::put<2, true>((&(src[0])), (&(dst[0])), 1, 1024, 1024, 1024, 1);
nvshmem_quiet();
tilescale::barrier_all<2>();
tilescale::barrier_all<1>();
tilescale::barrier_all<0>();
tilescale::sync_all<2>();
tilescale::sync_all<1>();
cooperative_groups::this_grid().sync();
tilescale::barrier_all_first_block();
cooperative_groups::this_grid().sync();
}
