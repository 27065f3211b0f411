# The demo's model organism: a tiny Qwen2.5-VL trained on CPU, from a seed, to have a planted
# position-conditional bias (docs/organism.md). A model with an `organism` section is built
# here; the other tiny models by demo_model (random weights). The weights are a build
# product: retrained only when the settings (or the training code) change.


rule train_organism:
    output:
        directory(study.tiny_model_dir("{model}")),
    input:
        code=workflow.source_path("../../src/ladbench/organism.py"),
        # the settings' defaults: what the config leaves out (organism_flags hands over only its keys)
        settings=workflow.source_path("../../src/ladbench/organism_settings.py"),
    params:
        options=study.organism_flags,
    wildcard_constraints:
        model=name_pattern(study.organisms),
    threads: 1
    log:
        study.log_file("train_organism", "{model}"),
    conda:
        "../../envs/gpu.yaml"
    shell:
        "ladbench train-organism --out {output:q} {params.options} > {log:q} 2>&1"
