# Every method as a pure function of cached arrays and a calibration, with metrics and
# bootstrap confidence intervals. The calibration may come from another benchmark
# (transfer); one file per calibration draw (seed) is read.


def evaluation_inputs(wildcards):
    return {
        "cache": cache_file(wildcards.model, wildcards.benchmark, wildcards.variant),
        "calibrations": [
            calibration_file(wildcards.model, wildcards.cal_benchmark, wildcards.variant, seed)
            for seed in CAL_SEEDS
        ],
    }


def evaluation_flags(wildcards):
    lad = config["lad"]
    evaluation = config["evaluation"]
    return flags(
        layer_range=layer_range_arg(config["models"][wildcards.model]["layer_range"]),
        top_k=lad["top_k"], tau=lad["tau"], layer_mean=lad["layer_mean"], mixture=lad["mixture"],
        methods=evaluation["methods"], bootstrap=evaluation["bootstrap"], ci=evaluation["ci"],
        seed=evaluation["seed"],
    )


rule evaluate:
    input:
        unpack(evaluation_inputs),
    output:
        metrics=f"{OUT}/eval/{{model}}/{{benchmark}}/{{variant}}/cal-{{cal_benchmark}}.json",
        predictions=f"{OUT}/eval/{{model}}/{{benchmark}}/{{variant}}/cal-{{cal_benchmark}}.npz",
    params:
        options=evaluation_flags,
    log:
        f"{LOGS}/evaluate/{{model}}/{{benchmark}}/{{variant}}/cal-{{cal_benchmark}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "{LADBENCH} evaluate --cache {input.cache} --calibration {input.calibrations} "
        "{params.options} --out {output.metrics} > {log} 2>&1"
