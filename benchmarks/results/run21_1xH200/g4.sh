# run G4 (session 26): multi-rank regression on the push path (ranks sharing the GPU): TP layer, bad input,
# non-default configs at 4, the remote path (pull) at 2 ranks with TILESCALE_NODE_SIZE=1
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/g4; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d); L=$((580 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
E=examples/distributed
run a2 --ranks 2 $E/example_tp_layer.py tests/test_gpu_runtime.py::test_bad_input_matrix "tests/test_gpu_remote.py::test_every_op_on_the_remote_path[2r-k1]"
run b4 --ranks 4 $E/example_tp_layer.py tests/test_gemm_config.py
wait
rm -rf $B
for f in $D/a2.log $D/b4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -8; done
grep -a -h -E "OK:|Error:|GemmRS" $D/jobs/*.log 2>/dev/null | cut -c1-220 | sort | uniq | tail -24
echo "shm: $(ls /dev/shm | grep -c cuda.shm)"
cd $OUT && tar czf g4jobs.tgz g4/jobs && rm -rf g4/jobs
