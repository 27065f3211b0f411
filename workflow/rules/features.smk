# open_clip image and caption embeddings (L2-normalised, float16) into HDF5; resumable.


rule features:
    input:
        images=study.image_table("{dataset}"),
        clip=study.clip_inputs,
    output:
        study.features_file("{dataset}"),
    params:
        options=study.clip_flags(),
    threads: study.features_threads
    resources:
        gpu=lambda w: 0 if study.config["clip"]["tiny"] else 1,
        mem_mb=16000,
        runtime=120,
    log:
        study.log_file("features", "{dataset}"),
    conda:
        "../../envs/gpu.yaml"
    shell:
        "OMP_NUM_THREADS={threads} ladbench features --images {input.images:q} --out {output:q} "
        "{params.options} > {log:q} 2>&1"
