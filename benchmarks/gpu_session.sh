#!/usr/bin/env bash
# The GPU measurements issue #32 still asks for (items 4 and 5), as ONE call on a lent GPU
# (`device` tool; ../shared/recipes/gpu/README.md says how to carry the paper lane's wheels in
# .whl/). Writes under $OUT: scoring.json (infer rows/s and GPU utilisation at N = 4 and 8,
# batch 32; the per-row split at batch 8) with one torch.profiler trace per N (traces/), and
# generation.json (CoT and self-consistency, 10 samples: plain generate / the decode loop /
# its static shapes, tokens/s and rows/s on the same rows; and the rows in 4 chunks of 8, decoded
# one chunk at a time against one loop across them: seconds and decode steps). Full-size random Qwen2.5-VL-3B,
# bfloat16. Then `ladbench plan` at those rates (plan.txt). About 8 minutes on an H100 by the
# plan; not yet run (written without a GPU).
#   run: bash benchmarks/gpu_session.sh   (carry: .whl)
set -euo pipefail
out=${OUT:-/tmp/gpu-session}
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
timeout 290 python3 benchmarks/bench_inference.py --device cuda --arch qwen2_5_vl_3b --n 4 8 \
  --gpu-parts throughput split --batches 32 --gpu-rows 256 --trace "$out/traces" \
  --json "$out/scoring.json" > "$out/scoring.md" 2> "$out/scoring.log" || echo "scoring: exit $?" >> "$out/gpu.txt"
timeout 230 python3 benchmarks/bench_inference.py --generation --device cuda --arch qwen2_5_vl_3b \
  --gen-rows 32 --gen-batch 8 --gen-samples 10 --gen-max-new-tokens 128 \
  --json "$out/generation.json" > "$out/generation.md" 2> "$out/generation.log" || echo "generation: exit $?" >> "$out/gpu.txt"
# the paper study's GPU hours at these rates (the Qwen2.5-VL-3B model's jobs; the others stay assumed)
python3 -m ladbench plan --gpus 8 --rates "qwen2_5_vl_3b=$out/scoring.json" \
  --rates "qwen2_5_vl_3b=$out/generation.json" > "$out/plan.txt" 2>&1 || echo "plan: exit $?" >> "$out/gpu.txt"
cat "$out/gpu.txt" "$out/scoring.md" "$out/generation.md"
tail -4 "$out/plan.txt"
