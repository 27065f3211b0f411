# Benchmark sets: evaluation instances, a disjoint calibration pool and the orderings,
# fixed by seed.


rule benchmark:
    input:
        unpack(benchmark_inputs),
    output:
        f"{OUT}/benchmarks/{{dataset}}_{{setting}}_N{{n}}.json",
    params:
        options=benchmark_flags,
    log:
        f"{LOGS}/benchmark/{{dataset}}_{{setting}}_N{{n}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench benchmark --dataset {wildcards.dataset} --setting {wildcards.setting} "
        "--n-candidates {wildcards.n} --images {input.images} --features {input.features} "
        "{params.options} --out {output} > {log} 2>&1"
