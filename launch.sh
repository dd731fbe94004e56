#!/usr/bin/env bash
# Start a tilescale program on GPUS ranks of this node (torchrun underneath).
#
#   GPUS=4 bash launch.sh examples/distributed/example_allgather.py [args...]
#
# Settings (environment):
#   GPUS                    ranks per node (default 4)
#   PORT / MASTER_PORT      rendezvous port (default: a free one)
#   NNODES, NODE_RANK, MASTER_ADDR   for several nodes (default 1, 0, 127.0.0.1)
#   NVSHMEM_SYMMETRIC_SIZE  symmetric heap per rank (default 4G)
#   TILESCALE_SKIP_DOCTOR=1 skip the pre-flight check
#   PYTHON                  interpreter (default python3)
# On a machine without GPUs it compiles the program's kernels for GPUS ranks, says that running needs
# GPUs, and exits 2. Ctrl-C or a failing rank ends every process it started.
set -u
GPUS=${GPUS:-4}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PY=${PYTHON:-python3}
if [ $# -lt 1 ]; then
  echo "usage: GPUS=4 bash launch.sh script.py [args...]" >&2
  exit 2
fi
case "$GPUS" in ''|*[!0-9]*|0) echo "launch.sh: GPUS=$GPUS: expected a positive integer" >&2; exit 2 ;; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-4G}
# tilescale does not use NVLink multicast (NVLS); keep it off in NVSHMEM, NCCL and torch unless asked.
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
# Lazy module loading deadlocks a kernel that spins on a signal set by a kernel loaded later.
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}

found=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$found" = 0 ]; then
  echo "launch.sh: no GPU visible; compiling the kernels of $1 for $GPUS ranks instead of running them"
  TILESCALE_COMPILE_ONLY=1 WORLD_SIZE=$GPUS $PY "$@"
  rc=$?
  if [ $rc != 0 ]; then echo "launch.sh: compiling failed (exit $rc)" >&2; exit $rc; fi
  echo "launch.sh: $1 needs $GPUS GPUs, found 0: kernels compiled, nothing run. Run it on a machine with $GPUS GPUs." >&2
  exit 2
fi
if [ "$found" -lt "$GPUS" ]; then
  echo "launch.sh: GPUS=$GPUS but this node has only $found visible GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<all>}); use GPUS<=$found" >&2
  exit 2
fi
if [ "${TILESCALE_SKIP_DOCTOR:-0}" != 1 ]; then
  $PY -m tilescale doctor --gpus "$GPUS" --quiet || { echo "launch.sh: pre-flight check failed (see above; TILESCALE_SKIP_DOCTOR=1 skips it)" >&2; exit 3; }
fi
if [ -z "${PORT:-}" ]; then
  PORT=${MASTER_PORT:-$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
fi

cmd=($PY -m torch.distributed.run --nproc_per_node="$GPUS" --nnodes="$NNODES" --node_rank="$NODE_RANK"
     --master_addr="$MASTER_ADDR" --master_port="$PORT" "$@")
echo "+ ${cmd[*]}"
# On Ctrl-C / TERM, or when torchrun exits, nothing the job started stays behind. torchrun starts each
# rank in a session of its own, so no process group holds the whole job: every process of it carries
# LAUNCH_SH_JOB_ID in its environment instead (ranks and what they start, also once reparented).
JOB_ID="$$-$RANDOM$RANDOM"
job_pids() { grep -lzx "LAUNCH_SH_JOB_ID=$JOB_ID" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }
end_job() {  # TERM every process of the job; KILL what is left after 10 s
  local pids i
  pids=$(job_pids)
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null
  for i in $(seq 100); do
    sleep 0.1
    pids=$(job_pids)
    [ -n "$pids" ] || return 0
  done
  echo "launch.sh: killing processes that did not end on SIGTERM: $(echo $pids)" >&2
  kill -KILL $pids 2>/dev/null
}
set -m
LAUNCH_SH_JOB_ID=$JOB_ID "${cmd[@]}" &
child=$!
trap 'end_job; exit 130' INT
trap 'end_job; exit 143' TERM
wait "$child"
rc=$?
end_job
exit $rc
