# Tables and figures, from evaluation files and caches alone (never reruns a model).


rule report_table:
    input:
        EVALUATIONS,
    output:
        markdown=f"{OUT}/report/table1.md",
    params:
        models=MODELS,
        benchmarks=BENCHMARKS,
        variant=VARIANTS[0],
    log:
        f"{LOGS}/report/table1.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report table --evaluations {input} --models {params.models} "
        "--benchmarks {params.benchmarks} --variant {params.variant} --out {output.markdown} > {log} 2>&1"


rule report_confusion:
    input:
        evaluation_file("{model}", "{benchmark}", "{variant}").replace(".json", ".npz"),
    output:
        expand(
            f"{OUT}/report/figures/confusion_{{{{model}}}}_{{{{benchmark}}}}_{{{{variant}}}}.{{ext}}",
            ext=config["report"]["figure_formats"],
        ),
    log:
        f"{LOGS}/report/confusion_{{model}}_{{benchmark}}_{{variant}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench report confusion --predictions {input} --out {output} > {log} 2>&1"


FIGURES = expand(
    f"{OUT}/report/figures/confusion_{{model}}_{{benchmark}}_{{variant}}.{{ext}}",
    model=MODELS, benchmark=BENCHMARKS, ext=config["report"]["figure_formats"],
    variant=[v for v in VARIANTS if config["inference"]["variants"][v]["prompt"] == "vanilla"],
)


rule report_all:
    input:
        rules.report_table.output,
        FIGURES,
        TRANSFERS,
