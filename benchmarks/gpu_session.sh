#!/usr/bin/env bash
# The GPU measurements issue #32 still asks for (items 4 and 5), as ONE call on a lent GPU
# (`device` tool; ../shared/recipes/gpu/README.md says how to carry the paper lane's wheels in
# .whl/). Writes under $OUT: scoring.json (infer rows/s and GPU utilisation at N = 4 and 8,
# batch 32; the per-row split at batch 8) with one torch.profiler trace per N (traces/), and
# generation_cot.json / generation_sc.json (10 samples), each at the paper's batch size 4: the
# decode loop at its GPU default of 64 sequences in flight against plain generate on the same
# rows (tokens/s, rows/s), then the loop with only the prefill group's 4 x S in flight, its
# static shapes, replies equal, host syncs, and the rows in chunks of 8 decoded one chunk at a
# time against one loop across them. Each part has its own time limit and file, and each file is
# rewritten after every measurement (most wanted first), so a part that runs out of time keeps
# what it measured. Full-size random Qwen2.5-VL-3B, bfloat16, built once (--arch-dir) for all
# parts. Replies stop at 64 tokens to fit the time; the paper's run to 512 (SC) and 1,024 (CoT),
# whose longer KV caches make late decode steps slower, so the generation rates are an upper
# bound for the study's. Then `ladbench plan` at those rates (plan.txt). Under 10 minutes by the
# limits; not yet run on a GPU (written without one).
#   run: bash benchmarks/gpu_session.sh   (carry: .whl)
#   GPU_SESSION_SMOKE=1: the same commands on the CPU at the small architecture, 56 px images and
#   a few rows (tests/test_benchmarks.py), so that a flag renamed between GPU sessions fails CI
#   instead of a lent GPU's few minutes; its plan.txt is plan's refusal of CPU rates.
set -euo pipefail
out=${OUT:-/tmp/gpu-session}
python=${PYTHON:-python3}
mkdir -p "$out"
if [ -n "${GPU_SESSION_SMOKE:-}" ]; then
  device=cpu size=(--arch-scale small --image-size 56)
  scoring_rows=8 scoring_batch=4 cot_rows=4 sc_rows=2 samples=2 new_tokens=4
else
  device=cuda size=()
  scoring_rows=256 scoring_batch=32 cot_rows=64 sc_rows=16 samples=10 new_tokens=64
fi
if [ "$device" = cuda ] && compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
models=$(mktemp -d)       # the one random build all parts share (7.5 GB: not under $OUT, removed on exit)
trap 'rm -rf "$models"' EXIT
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
else
  echo "no nvidia-smi ($device)" > "$out/gpu.txt"
fi
bench=("$python" benchmarks/bench_inference.py --device "$device" --arch qwen2_5_vl_3b --arch-dir "$models" "${size[@]}")
timeout 260 "${bench[@]}" --n 4 8 --gpu-parts throughput split --batches "$scoring_batch" --gpu-rows "$scoring_rows" \
  --trace "$out/traces" --json "$out/scoring.json" > "$out/scoring.md" 2> "$out/scoring.log" \
  || echo "scoring: exit $?" >> "$out/gpu.txt"
for variant in cot sc; do     # CoT: 64 rows (64 sequences); SC: 16 rows x 10 samples
  rows=$([ "$variant" = cot ] && echo "$cot_rows" || echo "$sc_rows")
  timeout 150 "${bench[@]}" --generation --gen-variants "$variant" --gen-rows "$rows" --gen-batch 4 \
    --gen-samples "$samples" --gen-max-new-tokens "$new_tokens" --json "$out/generation_$variant.json" \
    > "$out/generation_$variant.md" 2> "$out/generation_$variant.log" || echo "generation $variant: exit $?" >> "$out/gpu.txt"
done
# the paper study's GPU hours at the rates measured (the Qwen2.5-VL-3B model's jobs; the others stay assumed)
rates=()
for part in scoring generation_cot generation_sc; do
  [ -s "$out/$part.json" ] && rates+=(--rates "qwen2_5_vl_3b=$out/$part.json")
done
"$python" -m ladbench plan --gpus 8 "${rates[@]}" > "$out/plan.txt" 2>&1 || echo "plan: exit $?" >> "$out/gpu.txt"
cat "$out/gpu.txt" "$out/scoring.md" "$out"/generation_*.md
tail -4 "$out/plan.txt"
