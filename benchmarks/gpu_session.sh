#!/usr/bin/env bash
# The GPU measurements issue #32 still asks for, as ONE call on a lent GPU (`device` tool), bfloat16,
# full-size random weights; each part its own time limit and files:
#   attention Qwen2.5-VL-3B's and InternVL3-8B's one-query attention per decode step, transformers'
#             repeat_kv against the query packed on the KV heads, each with and without cuDNN, warm
#             and over fresh KV lengths (bench_one_query_attention.py, 50 s): attention.json
#   cot, sc   Qwen2.5-VL-3B at the paper's batch size 4 (CoT 64 rows; SC 16 rows x 10 samples):
#             the decode loop at its GPU default of 64 sequences in flight, its first run over the
#             rows (shapes new to the kernels) and its second, against plain generate on the same
#             rows (tokens/s, rows/s), then its static shapes as CUDA graphs of the eager step
#             (--decode graphs: never run on a GPU before), the loop with transformers' repeat_kv
#             attention instead of the one query packed on the KV heads, without cuDNN's attention
#             (each a first run and a second), one decode step's profile (traces/), the loop with
#             only the prefill group's 4 x S in flight, its static shapes compiled, every sequence
#             in flight at once (SC: 160),
#             replies equal, host syncs, KV copies, and
#             the rows in chunks of 8 one chunk at a time against one loop across them; each run's
#             prefills' seconds (CUDA events) apart from its decode steps', which `ladbench plan`
#             prices the study's longer replies with: generation_cot.json, generation_sc.json
#   cot_study, sc_study  Qwen2.5-VL-3B, cot's and sc's rows with every reply at the study's own limit
#             (CoT 1,024 tokens, SC 512; the end-of-turn logit zeroed, as `ladbench plan` prices a job),
#             so that each decode step reads the KV cache of a study's reply: the decode loop's first
#             and second run (64 in flight), then its static shapes as CUDA graphs, and for SC plain
#             generate on the same rows (the issue's ratio at the study's lengths), each file rewritten
#             as they come: generation_{cot,sc}_study.json (210 s and 240 s; plan takes, per job, the run
#             whose reply limit is nearest its own)
#   internvl_gen  InternVL3-8B (an 8B decoder, as the study's other two models have): CoT (32 rows)
#             and SC (16 rows x 10 samples), each with 150 s, through the decode loop against plain
#             generate: the measurements of cot and sc in their order, each file rewritten as they
#             come, so that the limit keeps the first rates: generation_internvl_{cot,sc}.json
#   internvl_study  InternVL3-8B, internvl_gen's rows with every reply at the study's own limit, as
#             cot_study and sc_study: the loop's two runs, then its CUDA graphs, 180 s each (an 8B
#             decoder: its KV cache holds 56 KB a position in bfloat16, 1.6 times the 3B's):
#             generation_internvl_{cot,sc}_study.json
#   internvl  InternVL3-8B: infer rows/s at N = 4, batch 8 (also with transformers reading the
#             padding and the image-token count back, --no-decide-on-host), and the split with a
#             trace: scoring_internvl.json (about 5 minutes: a second call when the device budget allows)
#   scoring   Qwen2.5-VL-3B: infer rows/s and GPU utilisation at N = 4 and 8, batch 32 (at N = 4
#             also one batch at a time, --no-score-ahead, with transformers' read-backs,
#             --no-decide-on-host, with the vision blocks compiled, --vision-tower compiled, and
#             without cuDNN's attention, --no-cudnn-attention), and the per-row split at batch 8 with
#             one torch.profiler trace per N (traces/): scoring.json (measured on an H200 2026-11-27,
#             before the read-backs went; 380 s)
#   patch     the patch embedding as cuDNN's Conv3d against one matrix product (bench_patch_embed.py,
#             30 s): patch_embed.json (measured on an H200 2026-11-27)
#   widths    products of an unaligned width as shipped against the same weights padded: Qwen2.5-VL's
#             vision MLP (3,420 wide; infer pads it on a GPU) and InternVL3-8B's LM head (151,674
#             tokens; not padded yet) (bench_aligned_widths.py, 40 s): aligned_widths.json
#   vision    one vision block of Qwen2.5-VL-3B as infer runs it, eager against torch.compile: does
#             fusing its elementwise work (a third of the tower's kernel time in the H200 trace)
#             pay? (bench_vision_block.py, 90 s, most of it compiling): vision_block.json
#   norms     transformers' RMSNorm against torch's fused kernel (infer's on a GPU since 2026-11-27,
#             unmeasured there), the study's shapes: time, kernels a call, bits equal to
#             transformers' (bench_norms.py, 30 s): norms.json
# then `ladbench plan` at the rates measured (plan.txt; it runs anywhere: rerun it here with every
# call's files). Each file is rewritten after every measurement (most wanted first), so a part that
# runs out of time keeps what it measured; a measurement that fails (a compilation, the profiler)
# is listed in its file's "failed" and under its table, and the part goes on.
# The parts of a call share one model build per architecture (--arch-dir, outside the results).
# In cot, sc and internvl_gen replies stop at 64 tokens to fit their many comparisons; the paper's
# run to 512 (SC) and 1,024 (CoT), whose longer KV caches make late decode steps read more: the
# study parts time the loop and the CUDA graphs there (each run's prefills are timed apart from its
# decode steps, so `ladbench plan` prices a job by its steps; the slots loop's sequences live in a
# slab since 2026-11-28: no GPU has run it before this script's next call).
# The default parts (sc_study cot_study attention norms) take 9 minutes by their limits (530 s;
# a study part's warm-up on 2 rows runs its replies to the limit too); `cot sc widths` (the
# comparisons at 64-token replies: attention, cuDNN, static shapes compiled, sequences in flight,
# syncs, chunks, launches; and the padded widths; 450 s) is the next call. On an H200 (2026-11-27)
# the scoring part took about 3 minutes; cot ran out of its 210 s in its last measurement (the
# chunks) and sc out of its 150 s likewise.
#   run: bash benchmarks/gpu_session.sh [PART ...]   (carry: .whl, made by `make gpu-wheels`: the
#   packages of benchmarks/gpu_wheels.txt, which the GPU machine's python lacks)
# Results go to $GPU_SESSION_DIR (default /tmp/gpu-session). Where $OUT is set (the device tool's
# folder, which brings back at most 8 files), that folder is also kept packed as $OUT/session.tgz,
# every 15 s ($GPU_SESSION_PACK_EVERY) and at the end, so a call stopped at its limit still brings
# back what it measured.
# Before any part, the python must import what the parts import (2026-11-27: a machine without
# jsonschema failed every infer run of a call): else exit 3, naming the missing module.
#   GPU_SESSION_SMOKE=1: the same commands on the CPU at the small architectures, 56 px images
#   and a few rows (tests/test_benchmarks.py runs every part), so that a flag renamed between GPU
#   sessions fails CI instead of a lent GPU's few minutes; its plan.txt is plan's refusal of CPU rates.
set -euo pipefail
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(sc_study cot_study attention norms)
for part in "${parts[@]}"; do
  case $part in
    attention|cot|sc|cot_study|sc_study|internvl_gen|internvl_study|internvl|scoring|patch|widths|vision|norms) ;;
    *) echo "gpu_session.sh: unknown part '$part' (attention, cot, sc, cot_study, sc_study, internvl_gen," \
            "internvl_study, internvl," \
            "scoring, patch, widths, vision, norms)" >&2
       exit 2 ;;
  esac
done
out=${GPU_SESSION_DIR:-/tmp/gpu-session}
python=${PYTHON:-python3}
mkdir -p "$out"
if [ -n "${GPU_SESSION_SMOKE:-}" ]; then
  device=cpu size=(--arch-scale small --image-size 56 --reps 1 --batch 2)      # --batch: the split's
  scoring_rows=8 scoring_batch=4 internvl_batch=4 cot_rows=4 sc_rows=2 samples=2 new_tokens=4 internvl_cot_rows=2
  study_tokens=$new_tokens
  patch_args=(--rows 64 --reps 1) widths_args=(--rows 64 --reps 1 --small) attention_args=(--batches 2 --keys 64 --reps 1 --fresh-steps 1)
  vision_args=(--rows 576 --reps 1 --small --backend eager) norms_args=(--reps 1 --small)
else
  device=cuda size=()
  scoring_rows=256 scoring_batch=32 internvl_batch=8 cot_rows=64 sc_rows=16 samples=10 new_tokens=64
  study_tokens=study          # each variant's own reply limit (CoT 1,024, SC 512)
  internvl_cot_rows=32
  patch_args=(--reps 5) widths_args=(--reps 10) attention_args=(--reps 10) vision_args=(--rows 18432 2304 --reps 10)
  norms_args=(--reps 20)
fi
if [ "$device" = cuda ] && compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if ! missing=$("$python" -c "import ladbench.config, ladbench.inference.runner, ladbench.models, ladbench.plan" 2>&1); then
  echo "gpu_session.sh: $python cannot import the benchmark's modules: ${missing##*$'\n'} (carry the wheels of" \
       "benchmarks/gpu_wheels.txt: make gpu-wheels, then name .whl in carry)" | tee -a "$out/gpu.txt" >&2
  exit 3
fi
pack() {                  # $OUT/session.tgz: everything $out holds (the device tool brings back 8 files)
  [ -n "${OUT:-}" ] || return 0
  local status=0
  mkdir -p "$OUT"
  tar czf "$OUT/session.tgz.part" --warning=no-file-changed --warning=no-file-removed -C "$out" . || status=$?
  # GNU tar's 1: a file changed or went while it was read (a part writing it); the archive is whole
  [ "$status" -gt 1 ] || mv "$OUT/session.tgz.part" "$OUT/session.tgz"
}
models=$(mktemp -d)       # the builds the parts share (7.5 GB for the 3B: not under $out, removed on exit)
packer=
# on exit the packer is told to stop and waited for (at most a second, or the pack it is in), so
# that no two packs write the same file; packing never changes the script's exit status
trap 'touch "$models/.stop-packing"; [ -z "$packer" ] || wait "$packer" || true; rm -rf "$models"; pack || true' EXIT
if [ -n "${OUT:-}" ]; then
  (while :; do
     for _ in $(seq "${GPU_SESSION_PACK_EVERY:-15}"); do [ ! -e "$models/.stop-packing" ] || exit 0; sleep 1; done
     pack
   done) &
  packer=$!
fi
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
else
  echo "no nvidia-smi ($device)" > "$out/gpu.txt"
fi
bench=("$python" benchmarks/bench_inference.py --device "$device" --arch-dir "$models" "${size[@]}")
# limited NAME SECONDS COMMAND...: one command under its time limit, its table in NAME.md and log in NAME.log
limited() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" --json "$out/$name.json" > "$out/$name.md" 2> "$out/$name.log" \
    || echo "$name: exit $?" >> "$out/gpu.txt"
}
run() { local name=$1 limit=$2; shift 2; limited "$name" "$limit" "${bench[@]}" "$@"; }
# generation NAME SECONDS ARCH VARIANT ROWS: one variant's generation, the decode loop against plain generate
generation() {
  run "$1" "$2" --arch "$3" --generation --gen-variants "$4" --gen-rows "$5" --gen-batch 4 \
    --gen-samples "$samples" --gen-max-new-tokens "$new_tokens" --trace "$out/traces"
}
# study NAME SECONDS ARCH VARIANT ROWS MEASUREMENT...: the loop with every reply at the study's limit
# (the end-of-turn logit zeroed), then only the measurements named, in their order
study() {
  run "$1" "$2" --arch "$3" --generation --gen-variants "$4" --gen-rows "$5" --gen-batch 4 \
    --gen-samples "$samples" --gen-max-new-tokens "$study_tokens" --end-boost 0 --gen-measure "${@:6}"
}
rates=()
for part in "${parts[@]}"; do
  case $part in
    attention) limited attention 50 "$python" benchmarks/bench_one_query_attention.py --device "$device" \
                 "${attention_args[@]}" ;;
    cot|sc) generation "generation_$part" "$([ "$part" = cot ] && echo 240 || echo 170)" qwen2_5_vl_3b "$part" \
              "$([ "$part" = cot ] && echo "$cot_rows" || echo "$sc_rows")" ;;
    cot_study) study generation_cot_study 210 qwen2_5_vl_3b cot "$cot_rows" graphs ;;
    sc_study) study generation_sc_study 240 qwen2_5_vl_3b sc "$sc_rows" graphs plain ;;
    internvl_study)
      for variant in cot sc; do
        study "generation_internvl_${variant}_study" 180 internvl3_8b "$variant" \
          "$([ "$variant" = cot ] && echo "$internvl_cot_rows" || echo "$sc_rows")" graphs
      done ;;
    internvl_gen)
      for variant in cot sc; do
        generation "generation_internvl_$variant" 150 internvl3_8b "$variant" \
          "$([ "$variant" = cot ] && echo "$internvl_cot_rows" || echo "$sc_rows")"
      done ;;
    internvl) run scoring_internvl 300 --arch internvl3_8b --n 4 --gpu-parts throughput split --batches "$internvl_batch" \
               --gpu-rows "$scoring_rows" --trace "$out/traces" --read-back ;;
    scoring) run scoring 380 --arch qwen2_5_vl_3b --n 4 8 --gpu-parts throughput split --batches "$scoring_batch" \
               --gpu-rows "$scoring_rows" --trace "$out/traces" --one-at-a-time --read-back --compiled-vision --no-cudnn ;;
    patch) limited patch_embed 30 "$python" benchmarks/bench_patch_embed.py --device "$device" "${patch_args[@]}" ;;
    widths) limited aligned_widths 40 "$python" benchmarks/bench_aligned_widths.py --device "$device" "${widths_args[@]}" ;;
    vision) limited vision_block 90 "$python" benchmarks/bench_vision_block.py --device "$device" "${vision_args[@]}" ;;
    norms) limited norms 30 "$python" benchmarks/bench_norms.py --device "$device" "${norms_args[@]}" ;;
  esac
done
# the paper study's GPU hours at the rates measured (the measured models' jobs; the others stay
# assumed): every scoring and generation file the parts wrote, each of its part's architecture
for file in "$out"/scoring*.json "$out"/generation*.json; do
  model=$(case $file in *internvl*) echo internvl3_8b ;; *) echo qwen2_5_vl_3b ;; esac)
  [ -s "$file" ] && rates+=(--rates "$model=$file")
done
if [ ${#rates[@]} -gt 0 ]; then
  "$python" -m ladbench plan --gpus 8 "${rates[@]}" > "$out/plan.txt" 2>&1 || echo "plan: exit $?" >> "$out/gpu.txt"
fi
cat "$out/gpu.txt" "$out"/*.md
[ ! -f "$out/plan.txt" ] || tail -4 "$out/plan.txt"
