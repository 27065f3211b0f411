#!/usr/bin/env bash
# The GPU measurements issue #32 still asks for (items 4 and 5), as ONE call on a lent GPU
# (`device` tool; ../shared/recipes/gpu/README.md says how to carry the paper lane's wheels in
# .whl/), bfloat16, full-size random weights:
#   scoring   Qwen2.5-VL-3B: infer rows/s and GPU utilisation at N = 4 and 8, batch 32 (at N = 4
#             also one batch at a time, --no-score-ahead: the ratio of scoring one batch ahead), and
#             the per-row split at batch 8 with one torch.profiler trace per N (traces/): scoring.json
#   cot, sc   Qwen2.5-VL-3B at the paper's batch size 4 (CoT 64 rows; SC 16 rows x 10 samples):
#             the decode loop at its GPU default of 64 sequences in flight against plain generate
#             on the same rows (tokens/s, rows/s), then the loop with only the prefill group's
#             4 x S in flight, the loop with transformers' repeat_kv attention instead of the one
#             query packed on the KV heads, its static shapes, replies equal, host syncs, KV
#             copies, and the rows in chunks of 8 one chunk at a time against one loop across them:
#             generation_cot.json, generation_sc.json
#   internvl  InternVL3-8B: infer rows/s at N = 4, batch 8, and the split with a trace:
#             scoring_internvl.json (not in the default run: about 4 minutes; run it as a second
#             call on the warm machine when the device budget still has 5 minutes)
#   and last, whatever the parts: the patch embedding of the Qwen vision configs as cuDNN's
#             Conv3d against one matrix product (bench_patch_embed.py, 30 s at most):
#             patch_embed.json
# then `ladbench plan` at the rates measured (plan.txt; it runs anywhere: rerun it here with every
# call's files). Each part has its own time limit and file, and each file is rewritten after
# every measurement (most wanted first), so a part that runs out of time keeps what it measured;
# a measurement that fails (a compilation, the profiler) is listed in its file's "failed" and
# under its table, and the part goes on.
# The parts of a call share one model build per architecture (--arch-dir, outside $OUT). Replies
# stop at 64 tokens to fit the time; the paper's run to 512 (SC) and 1,024 (CoT), whose longer
# KV caches make late decode steps slower, so the generation rates are an upper bound for the
# study's. The default parts take under 10 minutes by their limits; not yet run on a GPU. The
# limits are estimates: scoring is three infer runs of about 35 s and two split workers of about
# 25 s (from the H100 runs of 2026-11-25); cot decodes its 16 groups of 4 rows one group at a time
# twice (plain generate, the prefill group's width: about 25 s each, launch-bound) before the
# static shapes compile (a minute or two), and once more after (the reference), so it gets the most.
#   run: bash benchmarks/gpu_session.sh [PART ...]   (default: scoring cot sc; carry: .whl)
#   GPU_SESSION_SMOKE=1: the same commands on the CPU at the small architectures, 56 px images
#   and a few rows (tests/test_benchmarks.py runs every part), so that a flag renamed between GPU
#   sessions fails CI instead of a lent GPU's few minutes; its plan.txt is plan's refusal of CPU rates.
set -euo pipefail
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(scoring cot sc)
for part in "${parts[@]}"; do
  case $part in
    scoring|internvl|cot|sc) ;;
    *) echo "gpu_session.sh: unknown part '$part' (scoring, cot, sc, internvl)" >&2; exit 2 ;;
  esac
done
out=${OUT:-/tmp/gpu-session}
python=${PYTHON:-python3}
mkdir -p "$out"
if [ -n "${GPU_SESSION_SMOKE:-}" ]; then
  device=cpu size=(--arch-scale small --image-size 56 --reps 1 --batch 2)      # --batch: the split's
  scoring_rows=8 scoring_batch=4 internvl_batch=4 cot_rows=4 sc_rows=2 samples=2 new_tokens=4
  patch_args=(--rows 64 --reps 1)
else
  device=cuda size=()
  scoring_rows=256 scoring_batch=32 internvl_batch=8 cot_rows=64 sc_rows=16 samples=10 new_tokens=64
  patch_args=(--reps 5)
fi
if [ "$device" = cuda ] && compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
models=$(mktemp -d)       # the builds the parts share (7.5 GB for the 3B: not under $OUT, removed on exit)
trap 'rm -rf "$models"' EXIT
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
else
  echo "no nvidia-smi ($device)" > "$out/gpu.txt"
fi
bench=("$python" benchmarks/bench_inference.py --device "$device" --arch-dir "$models" "${size[@]}")
# run NAME SECONDS ARGS...: one part under its time limit, its table in NAME.md and log in NAME.log
run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "${bench[@]}" "$@" --json "$out/$name.json" > "$out/$name.md" 2> "$out/$name.log" \
    || echo "$name: exit $?" >> "$out/gpu.txt"
}
rates=()
for part in "${parts[@]}"; do
  case $part in
    scoring) run scoring 200 --arch qwen2_5_vl_3b --n 4 8 --gpu-parts throughput split --batches "$scoring_batch" \
               --gpu-rows "$scoring_rows" --trace "$out/traces" --one-at-a-time ;;
    internvl) run scoring_internvl 240 --arch internvl3_8b --n 4 --gpu-parts throughput split --batches "$internvl_batch" \
               --gpu-rows "$scoring_rows" --trace "$out/traces" ;;
    cot|sc) run "generation_$part" "$([ "$part" = cot ] && echo 210 || echo 150)" --arch qwen2_5_vl_3b --generation --gen-variants "$part" \
              --gen-rows "$([ "$part" = cot ] && echo "$cot_rows" || echo "$sc_rows")" --gen-batch 4 \
              --gen-samples "$samples" --gen-max-new-tokens "$new_tokens" ;;
  esac
done
# the paper study's GPU hours at the rates measured (the measured models' jobs; the others stay assumed)
for name in scoring generation_cot generation_sc scoring_internvl; do
  model=$([ "$name" = scoring_internvl ] && echo internvl3_8b || echo qwen2_5_vl_3b)
  [ -s "$out/$name.json" ] && rates+=(--rates "$model=$out/$name.json")
done
"$python" -m ladbench plan --gpus 8 "${rates[@]}" > "$out/plan.txt" 2>&1 || echo "plan: exit $?" >> "$out/gpu.txt"
# last, seconds: the patch embedding as cuDNN's Conv3d against the matrix product infer runs on a GPU
timeout 30 "$python" benchmarks/bench_patch_embed.py --device "$device" "${patch_args[@]}" --json "$out/patch_embed.json" \
  > "$out/patch_embed.md" 2> "$out/patch_embed.log" || echo "patch_embed: exit $?" >> "$out/gpu.txt"
cat "$out/gpu.txt" "$out"/*.md
tail -4 "$out/plan.txt"
