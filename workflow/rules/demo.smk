# The embedded offline demo's inputs, built deterministically from seeds: synthetic
# scenes in the MS-COCO format, a tiny random open_clip model, tiny random VLMs.


rule demo_scenes:
    output:
        directory(f"{OUT}/data/{{dataset}}/raw"),
    params:
        options=lambda w: flags(
            n_images=dataset_config(w.dataset)["n_images"],
            image_size=dataset_config(w.dataset)["image_size"],
            seed=dataset_config(w.dataset)["seed"],
        ),
    log:
        f"{LOGS}/demo_scenes/{{dataset}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench demo-scenes --out {output:q} {params.options} > {log:q} 2>&1"


rule demo_clip:
    output:
        directory(TINY_CLIP_DIR),
    log:
        f"{LOGS}/demo_clip.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench demo-clip --out {output:q} --seed 0 > {log:q} 2>&1"


rule demo_model:
    output:
        directory(f"{OUT}/models/{{model}}"),
    params:
        family=lambda w: config["models"][w.model]["family"],
    log:
        f"{LOGS}/demo_model/{{model}}.log",
    conda:
        "../../envs/gpu.yaml"
    shell:
        "ladbench demo-model --family {params.family:q} --out {output:q} --seed 0 > {log:q} 2>&1"
