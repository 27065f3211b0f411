# Position bias of multimodal LLMs in multi-image retrieval, and LAD debiasing.
#
#   snakemake --cores N                                   the study in config.yaml
#   snakemake --cores 2 --configfile workflow/demo/config.yaml   the offline demo
#   snakemake --workflow-profile workflow/profiles/slurm  on a SLURM cluster
#
# A --configfile replaces config.yaml entirely (it is not merged into it).
# Snakemake reads a --configfile before this file; the profiles (profiles/default, found by
# itself, and workflow/profiles/*) check first that it is data (no YTE): see README.

from snakemake.utils import min_version

min_version("9.0")

if not workflow.overwrite_configfiles:
    from ladbench.config import ConfigError, read_yaml

    try:
        read_yaml("config.yaml")  # a syntax error or duplicate key: one line with its line number
    except ConfigError as error:
        raise WorkflowError(f"invalid configuration: {error}")

    configfile: "config.yaml"


include: "workflow/rules/common.smk"


report: "workflow/report/workflow.rst"


wildcard_constraints:
    dataset=r"[A-Za-z0-9][A-Za-z0-9.-]*",
    setting=r"random|adversarial",
    n=r"\d+",
    model="|".join(study.models),
    variant="|".join(study.variants),
    benchmark=r"[A-Za-z0-9.-]+_(random|adversarial)_N\d+",
    cal_benchmark=r"[A-Za-z0-9.-]+_(random|adversarial)_N\d+",
    seed=r"\d+",
    shard=r"\d+",


include: "workflow/rules/demo.smk"
include: "workflow/rules/organism.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/captions.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/infer.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report_all.input,
