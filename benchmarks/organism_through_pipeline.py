"""Throw-away: a saved variant (/tmp/org/NAME.pt) through the pipeline on the demo's adversarial benchmarks."""
import json, sys, pathlib
sys.path.insert(0, "/work/main/tests")
import numpy as np, torch
from ladbench import organism as O
from ladbench.organism import paper_outcomes
from test_organism import organism_config
from workflow_runner import snakemake
name = sys.argv[1]
runs = {json.loads(l)["name"]: json.loads(l) for l in open("/tmp/org/results.jsonl")}
ov = dict(runs[name]["overrides"])
for k in ("n_candidates", "look_layers"):
    if k in ov: ov[k] = tuple(ov[k])
s = O.OrganismSettings(**ov)
model, processor, _ = O.build_untrained(s)
model.load_state_dict(torch.load(f"/tmp/org/{name}.pt"))
work = pathlib.Path(f"/tmp/org/pipe_{name}"); work.mkdir(exist_ok=True)
folder = O.save_organism(model, processor, s, {}, str(work / "model"))
config = organism_config(work / "config", {"family": "qwen2_5_vl", "path": folder, "layer_range": "all"})
benchmarks = sys.argv[2:] or ["scenes_adversarial_N4", "scenes_adversarial_N8"]
out = work / "results" / "demo"
ev = {b: out / "eval" / "organism" / b / "vanilla" / f"cal-{b}.json" for b in benchmarks}
an = {b: out / "analysis" / "organism" / b / "vanilla.json" for b in benchmarks}
snakemake(work, *[str(p.relative_to(work)) for p in [*ev.values(), *an.values()]], configfile=config)
for b in benchmarks:
    r = paper_outcomes(json.loads(ev[b].read_text()), dict(np.load(ev[b].with_suffix(".npz"))), json.loads(an[b].read_text()))
    v, a = r["values"], r["accuracy"]
    print(name, b, "V %.1f (RStd %.1f) P %.1f attn %.1f LAD %.1f | LAD-V %.1f %s LAD-P %.1f %s" % (a["vanilla"], v["vanilla_rstd"], a["pride"], a["raw_attention"], a["lad"], v["lad_over_vanilla"], [round(x, 1) for x in r["lad_over_vanilla_ci"]], v["lad_over_pride"], [round(x, 1) for x in r["lad_over_pride_ci"]]), "PASS" if all(r["passed"].values()) else {k for k, ok in r["passed"].items() if not ok}, flush=True)
