#!/usr/bin/env bash
# Start a tilescale program on GPUS ranks of this node (torchrun underneath).
#
#   GPUS=4 bash launch.sh examples/distributed/example_allgather.py [args...]
#   GPUS=4 TILESCALE_RANKS_PER_GPU=4 bash launch.sh x.py     # 4 ranks on one GPU (shared-GPU mode)
#
# Settings (environment):
#   GPUS                    ranks per node (default 4)
#   TILESCALE_RANKS_PER_GPU shared-GPU mode: up to this many ranks on one GPU when GPUS exceeds the GPUs
#                           found (default 1: GPUS above the GPUs found is an error). For developing and
#                           testing multi-rank kernels on one GPU: correct, but timings mean nothing.
#   TILESCALE_MPS=1         in shared-GPU mode, start the CUDA MPS daemon for the job (when none runs) so
#                           the ranks' kernels run side by side, and stop it after
#   PORT / MASTER_PORT      rendezvous port (default on one node: torchrun --standalone, a port the OS
#                           picks; required when NNODES > 1)
#   NNODES, NODE_RANK, MASTER_ADDR   for several nodes (default 1, 0, 127.0.0.1; MASTER_ADDR and PORT required
#                           when NNODES > 1: docs/multinode.md)
#   NVSHMEM_SYMMETRIC_SIZE  symmetric heap per rank (default 4G)
#   TILESCALE_SKIP_DOCTOR=1 skip the pre-flight check
#   PYTHON                  interpreter (default python3)
# On a machine without GPUs it compiles the program's kernels for GPUS ranks, says that running needs
# GPUs, and exits 2. Ctrl-C, SIGTERM, SIGHUP or a failing rank ends every process it started.
set -u
GPUS=${GPUS:-4}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
RPG=${TILESCALE_RANKS_PER_GPU:-1}
PY=${PYTHON:-python3}
if [ $# -lt 1 ]; then
  echo "usage: GPUS=4 bash launch.sh script.py [args...]" >&2
  exit 2
fi
case "$GPUS" in ''|*[!0-9]*|0) echo "launch.sh: GPUS=$GPUS: expected a positive integer" >&2; exit 2 ;; esac
case "$RPG" in ''|*[!0-9]*|0) echo "launch.sh: TILESCALE_RANKS_PER_GPU=$RPG: expected a positive integer" >&2; exit 2 ;; esac
case "$NNODES" in ''|*[!0-9]*|0) echo "launch.sh: NNODES=$NNODES: expected a positive integer" >&2; exit 2 ;; esac
if [ -z "${PORT:-}" ] && [ -n "${MASTER_PORT:-}" ]; then PORT=$MASTER_PORT; fi
if [ "$NNODES" -gt 1 ] && [ -z "${PORT:-}" ]; then
  echo "launch.sh: NNODES=$NNODES: set PORT (the same free port on every node, e.g. PORT=29500); each node would pick its own otherwise" >&2
  exit 2
fi
case "$NODE_RANK" in ''|*[!0-9]*) echo "launch.sh: NODE_RANK=$NODE_RANK: expected an integer from 0 to NNODES-1" >&2; exit 2 ;; esac
if [ "$NODE_RANK" -ge "$NNODES" ]; then
  echo "launch.sh: NODE_RANK=$NODE_RANK with NNODES=$NNODES: expected 0 to $((NNODES - 1))" >&2
  exit 2
fi
if [ "$NNODES" -gt 1 ] && [ -z "${MASTER_ADDR:-}" ]; then
  echo "launch.sh: NNODES=$NNODES: set MASTER_ADDR (the address of node 0, the same on every node); the default 127.0.0.1 would make every node wait for itself" >&2
  exit 2
fi
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-4G}
# tilescale does not use NVLink multicast (NVLS); keep it off in NVSHMEM, NCCL and torch unless asked.
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
# Lazy module loading deadlocks a kernel that spins on a signal set by a kernel loaded later.
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}

found=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$found" = 0 ]; then
  echo "launch.sh: no GPU visible; compiling the kernels of $1 for $GPUS ranks instead of running them"
  TILESCALE_COMPILE_ONLY=1 WORLD_SIZE=$GPUS "$PY" "$@"
  rc=$?
  if [ $rc != 0 ]; then echo "launch.sh: compiling failed (exit $rc)" >&2; exit $rc; fi
  echo "launch.sh: $1 needs $GPUS GPUs, found 0: kernels compiled, nothing run. Run it on a machine with $GPUS GPUs." >&2
  exit 2
fi
SHARED=0
if [ "$found" -lt "$GPUS" ]; then
  need=$(( (GPUS + found - 1) / found ))
  if [ "$need" -gt "$RPG" ]; then
    echo "launch.sh: GPUS=$GPUS but this node has only $found visible GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<all>}); use GPUS<=$found, or share GPUs for development and testing with TILESCALE_RANKS_PER_GPU=$need (correct, timings mean nothing)" >&2
    exit 2
  fi
  SHARED=1
  echo "launch.sh: shared-GPU mode: $GPUS ranks on $found GPU(s), up to $need per GPU (TILESCALE_RANKS_PER_GPU=$RPG); torch.distributed on gloo only; timings mean nothing"
fi
export TILESCALE_RANKS_PER_GPU=$RPG
if [ "${TILESCALE_SKIP_DOCTOR:-0}" != 1 ]; then
  "$PY" -m tilescale doctor --gpus "$GPUS" --quiet || { echo "launch.sh: pre-flight check failed (see above; TILESCALE_SKIP_DOCTOR=1 skips it)" >&2; exit 3; }
fi
if [ -z "${PORT:-}" ]; then
  # One node and no port given: torchrun's standalone rendezvous listens on a port the OS picks as it binds.
  # (A free port picked here could be taken by another job before torchrun listens on it: EADDRINUSE.)
  rdzv=(--standalone)
else
  rdzv=(--nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="$PORT")
fi
cmd=("$PY" -m torch.distributed.run --nproc_per_node="$GPUS" "${rdzv[@]}" "$@")
# When the launch ends (normally, Ctrl-C, TERM, HUP), nothing the job started stays behind. torchrun starts
# each rank in a session of its own, so no process group holds the whole job: every process of it carries
# LAUNCH_SH_JOB_ID in its environment instead (ranks and what they start, also once reparented).
JOB_ID="$$-$RANDOM$RANDOM"
MPS_DIR=""
JOB_DIR=""   # shared-GPU mode: each rank records its pid here (TILESCALE_JOB_DIR), for clean_shm
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
stop_mps() {  # only the daemon this launch started
  [ -n "$MPS_DIR" ] || return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1
  local i
  for i in $(seq 100); do
    pgrep -f "nvidia-cuda-mps-(control -d|server)" >/dev/null 2>&1 || break
    sleep 0.1
  done
  rm -rf "$MPS_DIR"
  MPS_DIR=""
}
clean_shm() {  # the CUDA inter-process event files of this job's own ended ranks (shared-GPU mode; tilescale/shm_leftovers.py)
  [ "$SHARED" = 1 ] && [ -n "$JOB_DIR" ] || return 0
  timeout 20 "$PY" -m tilescale.shm_leftovers --job-dir "$JOB_DIR" >&2 || true
  rm -rf "$JOB_DIR"
  JOB_DIR=""
}
cleanup() { end_job; stop_mps; clean_shm; }
# Traps first: a signal that arrives while the job starts still ends it.
trap 'cleanup' EXIT
trap 'cleanup; trap - EXIT; exit 130' INT
trap 'cleanup; trap - EXIT; exit 143' TERM
trap 'cleanup; trap - EXIT; exit 129' HUP

if [ "${TILESCALE_MPS:-0}" = 1 ] && [ "$SHARED" = 1 ]; then
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "launch.sh: TILESCALE_MPS=1 but nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA driver); unset TILESCALE_MPS to run the ranks time-sliced" >&2
    exit 2
  fi
  if pgrep -f "nvidia-cuda-mps-control -d" >/dev/null 2>&1; then
    echo "launch.sh: an MPS daemon already runs: using it as it is (CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-<default>}); not stopping it after"
  else
    MPS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tilescale-mps.XXXXXX") || exit 2
    mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
    export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"
    if ! nvidia-cuda-mps-control -d; then
      echo "launch.sh: could not start the MPS daemon (nvidia-cuda-mps-control -d); logs in $MPS_DIR/log" >&2
      rm -rf "$MPS_DIR"; MPS_DIR=""
      exit 2
    fi
    echo "launch.sh: started the MPS daemon for this job (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY); stopped when it ends"
  fi
fi

if [ "$SHARED" = 1 ]; then
  JOB_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tilescale-job.XXXXXX") || exit 2
  export TILESCALE_JOB_DIR="$JOB_DIR"
fi

echo "+ ${cmd[*]}"
set -m
LAUNCH_SH_JOB_ID=$JOB_ID "${cmd[@]}" &
child=$!
wait "$child"
rc=$?
exit $rc
