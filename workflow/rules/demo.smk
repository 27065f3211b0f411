# The embedded offline demo's inputs, built deterministically from seeds: synthetic
# scenes in the MS-COCO format, a tiny random open_clip model, tiny random VLMs.


rule demo_scenes:
    output:
        directory(study.scenes_dir("{dataset}")),
    params:
        options=study.scenes_flags,
    log:
        study.log_file("demo_scenes", "{dataset}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench demo-scenes --out {output:q} {params.options} > {log:q} 2>&1"


rule demo_clip:
    output:
        directory(study.tiny_clip_dir),
    log:
        study.log_file("demo_clip"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench demo-clip --out {output:q} --seed 0 > {log:q} 2>&1"


rule demo_model:
    output:
        directory(study.tiny_model_dir("{model}")),
    params:
        family=lambda w: study.config["models"][w.model]["family"],
    wildcard_constraints:
        model=name_pattern(study.random_tiny),
    log:
        study.log_file("demo_model", "{model}"),
    conda:
        "../../envs/gpu.yaml"
    shell:
        "ladbench demo-model --family {params.family:q} --out {output:q} --seed 0 > {log:q} 2>&1"
