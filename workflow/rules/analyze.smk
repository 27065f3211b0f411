# Everything the ablation tables and Figures 2, 3 and 6 need beyond one evaluation run,
# from one vanilla-prompt cache: the calibration is refitted in-process (milliseconds) for
# every |D_cal| size, draw and score average. Never runs a model.


rule analyze:
    input:
        f"{OUT}/cache/{{model}}/{{benchmark}}/{{variant}}.h5",
    output:
        json=f"{OUT}/analysis/{{model}}/{{benchmark}}/{{variant}}.json",
        npz=f"{OUT}/analysis/{{model}}/{{benchmark}}/{{variant}}.npz",
    params:
        options=analysis_flags,
    log:
        f"{LOGS}/analyze/{{model}}/{{benchmark}}/{{variant}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench analyze --cache {input:q} {params.options} --out {output.json:q} > {log:q} 2>&1"
