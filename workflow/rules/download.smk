# Downloads of the real datasets (resumable, verified, atomic; outputs already in place
# are kept without downloading again). Used for datasets with `download: true`; with an existing copy the
# captions rule reads it directly.


rule download:
    output:
        touch(study.download_marker("{dataset}")),
    params:
        source=lambda w: study.dataset(w.dataset)["source"],
        root=lambda w: study.dataset(w.dataset)["root"],
    log:
        study.log_file("download", "{dataset}"),
    resources:
        runtime=240,
    conda:
        "../../envs/cpu.yaml"
    shell:
        "ladbench download --dataset {params.source:q} --dest {params.root:q} > {log:q} 2>&1"
