# Calibration from a cache's calibration rows: the score matrix L, bias matrix B, gain k,
# attention prior per layer and PriDe priors. Pure numpy; milliseconds. Independent of
# LAD's test-time settings (K, tau, layer range), so changing those never refits it.


rule calibrate:
    input:
        study.cache_file("{model}", "{benchmark}", "{variant}"),
    output:
        study.calibration_file("{model}", "{benchmark}", "{variant}", "{seed}", "{n_cal}"),
    params:
        options=study.calibration_flags(),
    log:
        study.log_file("calibrate", "{model}", "{benchmark}", "{variant}", "dcal{n_cal}_seed{seed}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench calibrate --cache {input:q} --n-cal {wildcards.n_cal:q} --seed {wildcards.seed:q} "
        "{params.options} --out {output:q} > {log:q} 2>&1"
