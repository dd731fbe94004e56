#!/usr/bin/env bash
# Start a tilescale program on GPUS ranks of this node: `tilescale run` (tilescale/launch.py) with its settings
# from the environment, for a checkout without an install.
#
#   GPUS=4 bash launch.sh examples/distributed/example_allgather.py [args...]
#   GPUS=4 TILESCALE_RANKS_PER_GPU=4 bash launch.sh x.py     # 4 ranks on one GPU (shared-GPU mode)
#   GPUS=2 bash launch.sh -m package.module [args...]
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
# `python -m tilescale run --help` lists the same settings as options.
set -u
usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [ $# -lt 1 ]; then
  echo "usage: GPUS=4 bash launch.sh script.py [args...]   (bash launch.sh --help: every setting)" >&2
  exit 2
fi
case "$1" in -h|--help) usage; exit 0 ;; esac
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m tilescale run "$@"
