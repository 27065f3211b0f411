# One caption (the first listed) and the category-id set per image, from the official
# annotation files (or the demo's files in the same format).


def captions_inputs(wildcards):
    """Downloaded datasets wait for the download; local copies must already exist."""
    ds = dataset_config(wildcards.dataset)
    if ds["source"] != "synthetic" and ds["download"]:
        return [f"{OUT}/data/{wildcards.dataset}/download.done"]
    return [f for f in raw_dataset_files(wildcards.dataset).values() if f is not None]


def captions_flags(wildcards):
    files = raw_dataset_files(wildcards.dataset)
    return flags(
        captions_json=files["captions"], instances_json=files["instances"], image_root=files["images"],
    )


rule captions:
    input:
        captions_inputs,
    output:
        f"{OUT}/data/{{dataset}}/images.json",
    params:
        options=captions_flags,
    log:
        f"{LOGS}/captions/{{dataset}}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "{LADBENCH} captions --dataset {wildcards.dataset} {params.options} --out {output} > {log} 2>&1"
