# The embedded offline demo's inputs, built deterministically from seeds: synthetic
# scenes in the MS-COCO format, a tiny random open_clip model, tiny random VLMs.


rule demo_scenes:
    output:
        directory(scenes_dir("{dataset}")),
    params:
        options=lambda w: flags(
            n_images=dataset_config(w.dataset)["n_images"],
            image_size=dataset_config(w.dataset)["image_size"],
            seed=dataset_config(w.dataset)["seed"],
        ),
    log:
        log_file("demo_scenes", "{dataset}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench demo-scenes --out {output:q} {params.options} > {log:q} 2>&1"


rule demo_clip:
    output:
        directory(TINY_CLIP_DIR),
    log:
        log_file("demo_clip"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench demo-clip --out {output:q} --seed 0 > {log:q} 2>&1"


rule demo_model:
    output:
        directory(tiny_model_dir("{model}")),
    params:
        family=lambda w: config["models"][w.model]["family"],
    wildcard_constraints:
        model=RANDOM_TINY_PATTERN,
    log:
        log_file("demo_model", "{model}"),
    conda:
        "../../envs/gpu.yaml"
    shell:
        "ladbench demo-model --family {params.family:q} --out {output:q} --seed 0 > {log:q} 2>&1"
