# The only GPU stage: one forward pass per benchmark row (evaluation instance x ordering,
# calibration instance x cyclic shift), caching candidate scores and the last token's
# attention mass per layer per image. Resumable by chunks.
#
# inference.shards: K > 1 makes `infer` write K shard caches over contiguous row ranges
# (K GPU jobs, each resumable on its own) and `merge_shards` join them into the cache.


rule infer:
    input:
        benchmark=benchmark_file("{benchmark}"),
        images=lambda w: image_table(benchmark_dataset(w.benchmark)),
        model=model_inputs,
    output:
        cache_file("{model}", "{benchmark}", "{variant}") if SHARDS == 1 else shard_file(
            "{model}", "{benchmark}", "{variant}", "{shard}"
        ),
    params:
        options=infer_flags,
        # what the job claims: the model's gpus_per_job (not the `gpu` resource, which a
        # SLURM profile may override; a job given fewer devices stops with an error)
        gpus=infer_gpus,
    threads: infer_threads
    resources:
        gpu=infer_gpus,
        mem_mb=32000,
        runtime=720,
    log:
        log_file("infer", "{model}", "{benchmark}", "{variant}") if SHARDS == 1 else (
            log_file("infer", "{model}", "{benchmark}", "{variant}", f"{{shard}}-of-{SHARDS}")
        ),
    conda:
        "../../envs/gpu.yaml"
    shell:
        "OMP_NUM_THREADS={threads} ladbench infer --benchmark {input.benchmark:q} --images {input.images:q} "
        "{params.options} --gpus {params.gpus} --out {output:q} > {log:q} 2>&1"


if SHARDS > 1:

    rule merge_shards:
        input:
            shard_files,
        output:
            cache_file("{model}", "{benchmark}", "{variant}"),
        log:
            log_file("merge_shards", "{model}", "{benchmark}", "{variant}"),
        shell:
            "ladbench merge-shards {input:q} --out {output:q} > {log:q} 2>&1"
