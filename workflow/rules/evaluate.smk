# Every method as a pure function of cached arrays and a calibration, with metrics and
# bootstrap confidence intervals. The calibration may come from another benchmark
# (transfer); one file per calibration draw (seed) is read.


rule evaluate:
    input:
        unpack(study.evaluation_inputs),
    output:
        metrics=study.evaluation_file("{model}", "{benchmark}", "{variant}", "{cal_benchmark}"),
        predictions=study.evaluation_file("{model}", "{benchmark}", "{variant}", "{cal_benchmark}", "npz"),
    params:
        options=study.evaluation_flags,
        calibrations=lambda w, input: input.get("calibrations", ""),
    log:
        study.log_file("evaluate", "{model}", "{benchmark}", "{variant}", "cal-{cal_benchmark}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench evaluate --cache {input.cache:q} --calibration {params.calibrations:q} "
        "{params.options} --out {output.metrics:q} > {log:q} 2>&1"
