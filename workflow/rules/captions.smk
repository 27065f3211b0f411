# One caption (the first listed) and the category-id set per image, from the official
# annotation files (or the demo's files in the same format).


rule captions:
    input:
        study.captions_inputs,
    output:
        study.image_table("{dataset}"),
    params:
        options=study.captions_flags,
    log:
        study.log_file("captions", "{dataset}"),
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench captions --dataset {wildcards.dataset:q} {params.options} --out {output:q} > {log:q} 2>&1"
