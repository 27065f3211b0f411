# Tables and figures from evaluation files, analysis files and the caches' attributes
# alone: no rule here runs a model or fits a calibration, so deleting the report folder
# and rerunning regenerates it in seconds. Outputs flagged with report() (HTML tables,
# PNG figures) make up `snakemake --report report.html`, captioned from workflow/report/.


rule report_table:
    input:
        evaluations=study.evaluations,
        transfers=study.transfers,
        analyses=study.analyses,
        caches=study.caches,
    output:
        study.table_files(),
    params:
        study=study.study_flags(),
        options=study.table_flags(),
        out_dir=output_folder,
    log:
        study.log_file("report", "tables"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report tables {params.study} {params.options} --evaluations {input.evaluations:q} "
        "{input.transfers:q} --analyses {input.analyses:q} --caches {input.caches:q} "
        "--out-dir {params.out_dir:q} > {log:q} 2>&1"


rule report_confusion:
    input:
        study.evaluation_file("{model}", "{benchmark}", "{variant}", ext="npz"),
    output:
        study.figure_files("confusion", "Fig. 1/8: position confusion"),
    params:
        title=lambda w: flags(title=f"{w.model}: {w.benchmark} ({w.variant} cache)"),
    log:
        study.log_file("report", "confusion_{model}_{benchmark}_{variant}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report confusion --predictions {input:q} {params.title} --out {output:q} > {log:q} 2>&1"


rule report_figures:
    input:
        json=study.analysis_file("{model}", "{benchmark}", "{variant}"),
        npz=study.analysis_file("{model}", "{benchmark}", "{variant}", "npz"),
    output:
        profile=study.figure_files("score_profile", "Fig. 2: score profiles"),
        attention=study.figure_files("attention_vs_scores", "Fig. 3: attention vs scores"),
        sweeps=study.figure_files("calibration_sweeps", "Fig. 6: |D_cal| and tau"),
    params:
        title=lambda w: flags(title=f"{w.model}, {w.benchmark}"),
    log:
        study.log_file("report", "figures_{model}_{benchmark}_{variant}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report figures --analysis {input.json:q} {params.title} --profile {output.profile:q} "
        "--attention {output.attention:q} --sweeps {output.sweeps:q} > {log:q} 2>&1"


rule report_model_figures:
    input:
        evaluations=study.model_evaluations,
        analyses=study.model_analyses,
        arrays=study.model_analysis_arrays,
    output:
        accuracy=study.figure_files("accuracy_vs_n", "Fig. 5: accuracy vs N"),
        divergence=study.figure_files("divergence", "Divergence: logits vs attention"),
    params:
        study=study.study_flags(),
    log:
        study.log_file("report", "model_figures_{model}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report model-figures --model {wildcards.model:q} {params.study} --evaluations {input.evaluations:q} "
        "--analyses {input.analyses:q} --accuracy-vs-n {output.accuracy:q} --divergence {output.divergence:q} > {log:q} 2>&1"


rule report_explorer:
    input:
        unpack(study.explorer_inputs),
    output:
        report(
            study.explorer_file("{model}", "{benchmark}", "{variant}"),
            caption="../report/explorer.rst",
            category="Instance explorer",
            subcategory="{model}",
            labels={"benchmark": "{benchmark}", "variant": "{variant}"},
        ),
    params:
        options=study.explorer_flags(),
    log:
        study.log_file("report", "explorer_{model}_{benchmark}_{variant}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench explore --cache {input.cache:q} --calibration {input.calibration:q} --evaluation {input.evaluation:q} "
        "--benchmark {input.benchmark:q} --images {input.images:q} {params.options} --out {output:q} > {log:q} 2>&1"


rule report_explorer_index:
    input:
        pages=study.explorers,
        evaluations=[study.evaluation_file(*key) for key in study.explorer_keys],
        predictions=[study.evaluation_file(*key, ext="npz") for key in study.explorer_keys],
    output:
        report(
            study.explorer_index,
            caption="../report/explorer_index.rst",
            category="Instance explorer",
            subcategory="index",
            labels={"page": "index of every explorer page"},
        ),
    log:
        study.log_file("report", "explorer_index"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench explore-index --pages {input.pages:q} --evaluations {input.evaluations:q} --out {output:q} > {log:q} 2>&1"


rule report_all:
    input:
        rules.report_table.output,
        study.report_figures(),
        study.transfers,
        study.explorers,
        study.explorer_index if study.explorers else [],
