# Every method as a pure function of cached arrays and a calibration, with metrics and
# bootstrap confidence intervals. The calibration may come from another benchmark
# (transfer); one file per calibration draw (seed) is read.


rule evaluate:
    input:
        unpack(evaluation_inputs),
    output:
        metrics=f"{OUT}/eval/{{model}}/{{benchmark}}/{{variant}}/cal-{{cal_benchmark}}.json",
        predictions=f"{OUT}/eval/{{model}}/{{benchmark}}/{{variant}}/cal-{{cal_benchmark}}.npz",
    params:
        options=evaluation_flags,
        calibrations=lambda w, input: input.get("calibrations", ""),
    log:
        f"{LOGS}/evaluate/{{model}}/{{benchmark}}/{{variant}}/cal-{{cal_benchmark}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench evaluate --cache {input.cache:q} --calibration {params.calibrations:q} "
        "{params.options} --out {output.metrics:q} > {log:q} 2>&1"
