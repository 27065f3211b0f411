# The only GPU stage: one forward pass per benchmark row (evaluation instance x ordering,
# calibration instance x cyclic shift), caching candidate scores and the last token's
# attention mass per layer per image. Resumable by chunks.


rule infer:
    input:
        benchmark=f"{OUT}/benchmarks/{{benchmark}}.json",
        images=lambda w: image_table(benchmark_dataset(w.benchmark)),
        model=model_inputs,
    output:
        f"{OUT}/cache/{{model}}/{{benchmark}}/{{variant}}.h5",
    params:
        options=infer_flags,
    threads: infer_threads
    resources:
        gpu=lambda w: int(infer_on_gpu(w)),
        mem_mb=32000,
        runtime=720,
    log:
        f"{LOGS}/infer/{{model}}/{{benchmark}}/{{variant}}.log",
    conda:
        "../../envs/gpu.yaml"
    shell:
        "OMP_NUM_THREADS={threads} ladbench infer --benchmark {input.benchmark:q} --images {input.images:q} "
        "{params.options} --out {output:q} > {log:q} 2>&1"
