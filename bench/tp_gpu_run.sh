#!/usr/bin/env bash
# tp_gpu_run.sh - on the GPU machine, from the repository root, after
# bench/tp_gpu_pack.sh here and `tar xJf .devwork/tp-pkg.tar.xz -C .devwork`
# there: the NCCL communicator test (one rank per visible GPU; with one GPU
# a one-rank communicator and the refusal of two ranks on one device), the
# tensor-parallel test on the CPU and on CUDA (TP_TEST_BACKEND=cuda: TP 2,
# 3, 4 with every rank on GPU 0, host-staged exchange, vs one device).
# Logs to $OUT (default ./tp-gpu-out). About a minute.
set -u
P=${PKG:-.devwork/tp-pkg}
out=${OUT:-tp-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$P/lib:${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ cat "$P/commit.txt"; nvidia-smi -L; ls -la /usr/local/cuda/lib64/libnccl* 2>&1; } > "$out/machine.txt" 2>&1
rc=0
timeout 70 "$P/tests/test_cuda_comm" > "$out/test_cuda_comm.log" 2>&1 || rc=1
timeout 70 "$P/tests/test_tensor_parallel" > "$out/test_tensor_parallel.log" 2>&1 || rc=1
TP_TEST_BACKEND=cuda timeout 70 "$P/tests/test_tensor_parallel" > "$out/test_tensor_parallel_cuda.log" 2>&1 || rc=1
grep -H 'RESULT\|FAIL\|SKIP\|skip\|refused\|rank\|max|dlogit|\|agreement\|backend' "$out"/*.log
exit $rc
