#!/usr/bin/env bash
# Profile one of our kernels with Nsight Compute.
#
#   scripts/profile_ncu.sh KERNEL [OUT_DIR]     KERNEL: rmsnorm softmax swiglu rope flash_attention
#                                               matmul decode_attention (scripts/profile_target.py)
#
# Writes OUT_DIR/KERNEL.ncu-rep (open it in the Nsight Compute GUI) and OUT_DIR/KERNEL.txt (the
# sections as text) and prints the handful of figures docs/profiling.md explains. OUT_DIR defaults
# to build/profile. The first launches compile (and autotune) the kernel; only the launch inside
# profile_target.py's NVTX range "profile" is profiled. --clock-control none keeps the GPU's
# normal boost clock, so times match what do_bench measures (ncu otherwise locks the base clock).
set -euo pipefail
kernel=${1:?usage: scripts/profile_ncu.sh KERNEL [OUT_DIR]}
out=${2:-build/profile}
cd "$(dirname "$0")/.."
command -v ncu >/dev/null || { echo "ncu (Nsight Compute) not found on PATH" >&2; exit 1; }
regex=$(python3 -c "import llmk.scripts.profile_target as p; \
t = p.TARGETS.get('$kernel'); print(t[1] if t else '')")
[ -n "$regex" ] || { python3 scripts/profile_target.py "$kernel"; exit 1; }   # prints the usage
mkdir -p "$out"
ncu --clock-control none --target-processes all \
    --nvtx --nvtx-include "profile/" -k "regex:$regex" --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -f -o "$out/$kernel" python3 scripts/profile_target.py "$kernel"
ncu -i "$out/$kernel.ncu-rep" --page details > "$out/$kernel.txt"
# the figures that matter, in one place
grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|L1/TEX Hit Rate|L2 Hit Rate|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Size|Grid Size|Warp Cycles Per Issued Instruction|dram__bytes_read.sum|dram__bytes_write.sum|lts__t_sector_hit_rate.pct|sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active) " \
    "$out/$kernel.txt" | sed -E 's/ +/ /g' || true
echo "report: $out/$kernel.ncu-rep, text: $out/$kernel.txt"
