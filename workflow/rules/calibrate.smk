# Calibration from a cache's calibration rows: the score matrix L, bias matrix B, gain k,
# attention prior per layer and PriDe priors. Pure numpy; milliseconds. Independent of
# LAD's test-time settings (K, tau, layer range), so changing those never refits it.


rule calibrate:
    input:
        cache_file("{model}", "{benchmark}", "{variant}"),
    output:
        calibration_file("{model}", "{benchmark}", "{variant}", "{seed}", "{n_cal}"),
    params:
        average=config["calibration"]["score_average"],
        pride_logs=config["calibration"]["pride_original_logs"],
        empty_positions=config["calibration"]["empty_positions"],
    log:
        log_file("calibrate", "{model}", "{benchmark}", "{variant}", "dcal{n_cal}_seed{seed}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench calibrate --cache {input:q} --n-cal {wildcards.n_cal:q} --seed {wildcards.seed:q} "
        "--score-average {params.average:q} --pride-original-logs {params.pride_logs:q} "
        "--empty-positions {params.empty_positions:q} --out {output:q} > {log:q} 2>&1"
