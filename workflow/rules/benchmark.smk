# Benchmark sets: evaluation instances, a disjoint calibration pool and the orderings,
# fixed by seed. Only the adversarial setting needs CLIP features.


def benchmark_inputs(wildcards):
    inputs = {"images": image_table(wildcards.dataset)}
    if wildcards.setting == "adversarial":
        inputs["features"] = features_file(wildcards.dataset)
    return inputs


def benchmark_flags(wildcards):
    bench = config["benchmarks"]
    return flags(
        n_eval=bench["n_eval"], n_calibration=bench["n_calibration_pool"],
        n_orderings=bench["n_orderings"], pool_size=bench["pool_size"], seed=bench["seed"],
        caption_sim_max=bench["caption_sim_max"], category_rule=bench["category_rule"],
    )


rule benchmark:
    input:
        unpack(benchmark_inputs),
    output:
        f"{OUT}/benchmarks/{{dataset}}_{{setting}}_N{{n}}.json",
    params:
        options=benchmark_flags,
        features=lambda w, input: f"--features {input.features}" if "features" in input.keys() else "",
    log:
        f"{LOGS}/benchmark/{{dataset}}_{{setting}}_N{{n}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "{LADBENCH} benchmark --dataset {wildcards.dataset} --setting {wildcards.setting} "
        "--n-candidates {wildcards.n} --images {input.images} {params.features} "
        "{params.options} --out {output} > {log} 2>&1"
