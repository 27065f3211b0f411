# The only GPU stage: one forward pass per benchmark row (evaluation instance x ordering,
# calibration instance x cyclic shift), caching candidate scores and the last token's
# attention mass per layer per image. Resumable by chunks.
#
# inference.shards: K > 1 makes `infer` write K shard caches over contiguous row ranges
# (K GPU jobs, each resumable on its own) and `merge_shards` join them into the cache.


rule infer:
    input:
        benchmark=study.benchmark_file("{benchmark}"),
        images=study.benchmark_images,
        model=study.model_inputs,
    output:
        study.infer_output(),
    params:
        options=study.infer_flags,
        # what the job claims: the model's gpus_per_job (not the `gpu` resource, which a
        # SLURM profile may override; a job given fewer devices stops with an error)
        gpus=study.infer_gpus,
    threads: study.infer_threads
    resources:
        gpu=study.infer_gpus,
        mem_mb=32000,
        runtime=720,
    log:
        study.infer_log(),
    conda:
        "../../envs/gpu.yaml"
    shell:
        "OMP_NUM_THREADS={threads} ladbench infer --benchmark {input.benchmark:q} --images {input.images:q} "
        "{params.options} --gpus {params.gpus} --out {output:q} > {log:q} 2>&1"


if study.shards > 1:

    rule merge_shards:
        input:
            study.shard_files,
        output:
            study.cache_file("{model}", "{benchmark}", "{variant}"),
        log:
            study.log_file("merge_shards", "{model}", "{benchmark}", "{variant}"),
        shell:
            "ladbench merge-shards {input:q} --out {output:q} > {log:q} 2>&1"
