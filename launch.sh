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
# GPUs, and exits 2. Ctrl-C, SIGTERM, SIGHUP or a failing rank ends every process it started (the compile
# included, whose temporary files go to a directory of the launch, removed at its end).
set -u
GPUS=${GPUS:-4}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
RPG=${TILESCALE_RANKS_PER_GPU:-1}
PY=${PYTHON:-python3}
usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [ $# -lt 1 ]; then
  echo "usage: GPUS=4 bash launch.sh script.py [args...]   (bash launch.sh --help: every setting)" >&2
  exit 2
fi
case "$1" in -h|--help) usage; exit 0 ;; esac
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
case "$1" in
  -*) ;;   # an option of the interpreter (python -m module ...): passed on as it is
  *) if [ ! -f "$1" ]; then echo "launch.sh: $1: no such file (expected the Python script to run)" >&2; exit 2; fi ;;
esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-4G}
# tilescale does not use NVLink multicast (NVLS); keep it off in NVSHMEM, NCCL and torch unless asked.
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
# Lazy module loading deadlocks a kernel that spins on a signal set by a kernel loaded later.
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}

# When the launch ends (normally, Ctrl-C, TERM, HUP), nothing the job started stays behind. torchrun starts
# each rank in a session of its own, so no process group holds the whole job: every process of it carries
# LAUNCH_SH_JOB_ID in its environment instead (ranks and what they start, also once reparented).
JOB_ID="$$-$RANDOM$RANDOM"
MPS_DIR=""
COMPILE_TMP=""   # the compile-only run's TMPDIR
SHARED=0         # more ranks than GPUs on this node (TILESCALE_RANKS_PER_GPU)
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
mps_pids() {  # the MPS daemon and servers this launch started: an nvidia-cuda-mps process with its pipe directory
  local f pid
  [ -n "$MPS_DIR" ] || return 0
  for f in $(grep -lzx "CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${f#/proc/}; pid=${pid%/environ}
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q '^nvidia-cuda-mps' && echo "$pid"
  done
}
stop_mps() {  # only the daemon this launch started: quit, wait up to 10 s for its processes, else TERM them
  [ -n "$MPS_DIR" ] || return 0
  local i pids ok=1
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1 || ok=0
  for i in $(seq 100); do
    pids=$(mps_pids)
    [ -n "$pids" ] || break
    sleep 0.1
  done
  if [ -n "$pids" ]; then
    echo "launch.sh: the MPS daemon this job started did not stop on quit (pids $(echo $pids)): stopping it with SIGTERM" >&2
    kill -TERM $pids 2>/dev/null
    ok=0
  fi
  if [ "$ok" = 1 ]; then
    rm -rf "$MPS_DIR"
  else   # keep what the daemon said
    echo "launch.sh: stopping the MPS daemon failed; its log is kept in $MPS_DIR/log" >&2
  fi
  MPS_DIR=""
}
clean_shm() {  # the CUDA inter-process event files of this job's own ended ranks (shared-GPU mode; tilescale/shm_leftovers.py)
  [ "$SHARED" = 1 ] && [ -n "$JOB_DIR" ] || return 0
  timeout 20 "$PY" -m tilescale.shm_leftovers --job-dir "$JOB_DIR" >&2 || true
  rm -rf "$JOB_DIR"
  JOB_DIR=""
}
clean_tmp() { [ -z "$COMPILE_TMP" ] || rm -rf "$COMPILE_TMP"; COMPILE_TMP=""; }
cleanup() { end_job; stop_mps; clean_shm; clean_tmp; }
# Traps first: a signal that arrives while the job starts still ends it.
trap 'cleanup' EXIT
trap 'cleanup; trap - EXIT; exit 130' INT
trap 'cleanup; trap - EXIT; exit 143' TERM
trap 'cleanup; trap - EXIT; exit 129' HUP

found=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$found" = 0 ]; then
  echo "launch.sh: no GPU visible; compiling the kernels of $1 for $GPUS ranks instead of running them"
  # In the background, so that a signal runs the traps at once (bash runs them only after a foreground child
  # ends); its temporaries (tilelang's sources, nvcc's files) in a directory of the launch, which cleanup removes.
  COMPILE_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tilescale-compile.XXXXXX") || exit 2
  LAUNCH_SH_JOB_ID=$JOB_ID TMPDIR=$COMPILE_TMP TILESCALE_COMPILE_ONLY=1 WORLD_SIZE=$GPUS "$PY" -m tilescale.compile_only "$@" &
  wait $!
  rc=$?
  if [ $rc != 0 ]; then echo "launch.sh: compiling failed (exit $rc)" >&2; exit $rc; fi
  echo "launch.sh: $1 needs $GPUS GPUs, found 0: kernels compiled, nothing run. Run it on a machine with $GPUS GPUs." >&2
  exit 2
fi
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
      echo "launch.sh: could not start the MPS daemon (nvidia-cuda-mps-control -d); its log is kept in $MPS_DIR/log" >&2
      MPS_DIR=""   # (nothing of it to stop; the directory stays for its log)
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
