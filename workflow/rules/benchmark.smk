# Benchmark sets: evaluation instances, a disjoint calibration pool and the orderings,
# fixed by seed.


rule benchmark:
    input:
        unpack(study.benchmark_inputs),
    output:
        study.benchmark_file("{dataset}_{setting}_N{n}"),
    params:
        options=study.benchmark_flags,
    log:
        study.log_file("benchmark", "{dataset}_{setting}_N{n}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench benchmark --dataset {wildcards.dataset:q} --setting {wildcards.setting:q} "
        "--n-candidates {wildcards.n:q} --images {input.images:q} --features {input.features:q} "
        "{params.options} --out {output:q} > {log:q} 2>&1"
