#!/usr/bin/env bash
# The GPU measurements issue #32 still asks for (items 4 and 5), as ONE call on a lent GPU
# (`device` tool; ../shared/recipes/gpu/README.md says how to carry the paper lane's wheels in
# .whl/). Writes under $OUT: scoring.json (infer rows/s and GPU utilisation at N = 4 and 8,
# batch 32; the per-row split at batch 8) with one torch.profiler trace per N (traces/), and
# generation_cot.json / generation_sc.json (10 samples), each at the paper's batch size 4: plain
# generate / the decode loop at its GPU default of 64 sequences in flight / the same loop with
# only the prefill group's 4 x S in flight / its static shapes, tokens/s and rows/s on the same
# rows; and the rows in chunks of 8, decoded one chunk at a time against one loop across them:
# seconds and decode steps). Each part has its own time limit and file, so one that runs out of
# time loses only itself. Full-size random Qwen2.5-VL-3B, bfloat16. Replies stop at 64 tokens to fit
# the time; the paper's run to 512 (SC) and 1,024 (CoT), whose longer KV caches make late decode
# steps slower, so the generation rates are an upper bound for the study's. Then `ladbench plan` at
# those rates (plan.txt). Under 10 minutes by the limits; not yet run (written without a GPU).
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
timeout 260 python3 benchmarks/bench_inference.py --device cuda --arch qwen2_5_vl_3b --n 4 8 \
  --gpu-parts throughput split --batches 32 --gpu-rows 256 --trace "$out/traces" \
  --json "$out/scoring.json" > "$out/scoring.md" 2> "$out/scoring.log" || echo "scoring: exit $?" >> "$out/gpu.txt"
for variant in cot sc; do     # CoT: 64 rows (64 sequences); SC: 16 rows x 10 samples
  rows=$([ "$variant" = cot ] && echo 64 || echo 16)
  timeout 150 python3 benchmarks/bench_inference.py --generation --device cuda --arch qwen2_5_vl_3b \
    --gen-variants "$variant" --gen-rows "$rows" --gen-batch 4 --gen-samples 10 --gen-max-new-tokens 64 \
    --json "$out/generation_$variant.json" > "$out/generation_$variant.md" 2> "$out/generation_$variant.log" \
    || echo "generation $variant: exit $?" >> "$out/gpu.txt"
done
# the paper study's GPU hours at the rates measured (the Qwen2.5-VL-3B model's jobs; the others stay assumed)
rates=()
for part in scoring generation_cot generation_sc; do
  [ -s "$out/$part.json" ] && rates+=(--rates "qwen2_5_vl_3b=$out/$part.json")
done
python3 -m ladbench plan --gpus 8 "${rates[@]}" > "$out/plan.txt" 2>&1 || echo "plan: exit $?" >> "$out/gpu.txt"
cat "$out/gpu.txt" "$out/scoring.md" "$out"/generation_*.md
tail -4 "$out/plan.txt"
