# Tables and figures from evaluation files, analysis files and the caches' attributes
# alone: no rule here runs a model or fits a calibration, so deleting the report folder
# and rerunning regenerates it in seconds. Outputs flagged with report() (HTML tables,
# PNG figures) make up `snakemake --report report.html`, captioned from workflow/report/.


rule report_table:
    input:
        evaluations=EVALUATIONS,
        transfers=TRANSFERS,
        analyses=ANALYSES,
        caches=CACHES,
    output:
        table_files(),
    params:
        study=study_flags(),
        options=table_flags(),
        out_dir=output_folder,
    log:
        log_file("report", "tables"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report tables {params.study} {params.options} --evaluations {input.evaluations:q} "
        "{input.transfers:q} --analyses {input.analyses:q} --caches {input.caches:q} "
        "--out-dir {params.out_dir:q} > {log:q} 2>&1"


rule report_confusion:
    input:
        evaluation_file("{model}", "{benchmark}", "{variant}", ext="npz"),
    output:
        figure_files("confusion_{model}_{benchmark}_{variant}", "confusion", "Fig. 1/8: position confusion"),
    params:
        title=lambda w: flags(title=f"{w.model}: {w.benchmark} ({w.variant} cache)"),
    log:
        log_file("report", "confusion_{model}_{benchmark}_{variant}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report confusion --predictions {input:q} {params.title} --out {output:q} > {log:q} 2>&1"


rule report_figures:
    input:
        json=analysis_file("{model}", "{benchmark}", "{variant}"),
        npz=analysis_file("{model}", "{benchmark}", "{variant}", "npz"),
    output:
        profile=figure_files("score_profile_{model}_{benchmark}_{variant}", "score_profile", "Fig. 2: score profiles"),
        attention=figure_files(
            "attention_vs_scores_{model}_{benchmark}_{variant}", "attention_vs_scores", "Fig. 3: attention vs scores"
        ),
        sweeps=figure_files(
            "calibration_sweeps_{model}_{benchmark}_{variant}", "calibration_sweeps", "Fig. 6: |D_cal| and tau"
        ),
    params:
        title=lambda w: flags(title=f"{w.model}, {w.benchmark}"),
    log:
        log_file("report", "figures_{model}_{benchmark}_{variant}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report figures --analysis {input.json:q} {params.title} --profile {output.profile:q} "
        "--attention {output.attention:q} --sweeps {output.sweeps:q} > {log:q} 2>&1"


rule report_model_figures:
    input:
        evaluations=model_evaluations,
        analyses=model_analyses,
        arrays=model_analysis_arrays,
    output:
        accuracy=figure_files("accuracy_vs_n_{model}", "accuracy_vs_n", "Fig. 5: accuracy vs N"),
        divergence=figure_files("divergence_{model}", "divergence_figure", "Divergence: logits vs attention"),
    params:
        study=study_flags(),
    log:
        log_file("report", "model_figures_{model}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report model-figures --model {wildcards.model:q} {params.study} --evaluations {input.evaluations:q} "
        "--analyses {input.analyses:q} --accuracy-vs-n {output.accuracy:q} --divergence {output.divergence:q} > {log:q} 2>&1"


rule report_explorer:
    input:
        unpack(explorer_inputs),
    output:
        report(explorer_file("{model}", "{benchmark}", "{variant}"), caption="../report/explorer.rst",
               category="Instance explorer", subcategory="{model}", labels={"benchmark": "{benchmark}", "variant": "{variant}"}),
    params:
        options=explorer_flags(),
    log:
        log_file("report", "explorer_{model}_{benchmark}_{variant}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench explore --cache {input.cache:q} --calibration {input.calibration:q} --evaluation {input.evaluation:q} "
        "--benchmark {input.benchmark:q} --images {input.images:q} {params.options} --out {output:q} > {log:q} 2>&1"


rule report_explorer_index:
    input:
        pages=EXPLORERS,
        evaluations=[evaluation_file(*key) for key in EXPLORER_KEYS],
        predictions=[evaluation_file(*key, ext="npz") for key in EXPLORER_KEYS],
    output:
        report(EXPLORER_INDEX, caption="../report/explorer_index.rst", category="Instance explorer",
               subcategory="index", labels={"page": "index of every explorer page"}),
    log:
        log_file("report", "explorer_index"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench explore-index --pages {input.pages:q} --evaluations {input.evaluations:q} --out {output:q} > {log:q} 2>&1"


rule report_all:
    input:
        rules.report_table.output,
        [
            expand_figures(f"{figure}_{{model}}_{{benchmark}}_{{variant}}", model=MODELS, benchmark=BENCHMARKS,
                           variant=VANILLA_VARIANTS)
            for figure in ("confusion", "score_profile", "attention_vs_scores", "calibration_sweeps")
        ],
        expand_figures("accuracy_vs_n_{model}", model=MODELS),
        expand_figures("divergence_{model}", model=MODELS),
        TRANSFERS,
        EXPLORERS,
        EXPLORER_INDEX if EXPLORERS else [],
