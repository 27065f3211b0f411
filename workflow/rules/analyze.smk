# Everything the ablation tables and Figures 2, 3 and 6 need beyond one evaluation run,
# from one vanilla-prompt cache: the calibration is refitted in-process (milliseconds) for
# every |D_cal| size, draw and score average. Never runs a model.


rule analyze:
    input:
        study.cache_file("{model}", "{benchmark}", "{variant}"),
    output:
        json=study.analysis_file("{model}", "{benchmark}", "{variant}"),
        npz=study.analysis_file("{model}", "{benchmark}", "{variant}", "npz"),
    params:
        options=study.analysis_flags,
    log:
        study.log_file("analyze", "{model}", "{benchmark}", "{variant}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench analyze --cache {input:q} {params.options} --out {output.json:q} > {log:q} 2>&1"
