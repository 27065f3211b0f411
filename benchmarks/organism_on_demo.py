"""Throw-away: evaluate saved organism variants (/tmp/org/NAME.pt) on the demo's own benchmarks
(results/demo/benchmarks, cyclic shifts, first 10 instances calibrate). Usage: NAME..."""
import json, sys, dataclasses
import numpy as np, torch
from PIL import Image
from ladbench import organism as O, methods, calibration as C
from ladbench.models.base import resize_square
from ladbench.models.qwen2_5_vl import Qwen25VLAdapter
from ladbench.inference.prompts import identifiers
DEMO = "/work/main/results/demo"
torch.set_num_threads(1)
images = {im["image_id"]: im for im in json.load(open(f"{DEMO}/data/scenes/images.json"))["images"]}
runs = {json.loads(l)["name"]: json.loads(l) for l in open("/tmp/org/results.jsonl")}
for name in sys.argv[1:]:
    ov = dict(runs[name]["overrides"])
    for k in ("n_candidates", "look_layers"):
        if k in ov: ov[k] = tuple(ov[k])
    s = O.OrganismSettings(**ov)
    model, processor, adapter = O.build_untrained(s)
    model.load_state_dict(torch.load(f"/tmp/org/{name}.pt")); model.eval()
    digit_ids = torch.tensor([adapter.tokenizer.convert_tokens_to_ids(i) for i in identifiers("digits", 9)])
    cache = {}
    def pixels(image_id):
        if image_id not in cache:
            with Image.open(f"{DEMO}/data/scenes/raw/images/{images[image_id]['file_name']}") as im:
                out = processor.image_processor(images=[resize_square(im.convert("RGB"), s.image_size)], return_tensors="pt")
            cache[image_id] = (out["pixel_values"], out["image_grid_thw"])
        return cache[image_id]
    prompts = O.PromptBuilder(adapter, 4)
    res = {"name": name}
    for bench in ("random_N4", "adversarial_N4", "random_N8", "adversarial_N8"):
        b = json.load(open(f"{DEMO}/benchmarks/scenes_{bench}.json"))
        n = b["n_candidates"]; n_inst = 70 if n == 4 else 35
        scores, attn, target = [], [], []
        for inst in b["eval"][:n_inst]:
            cands = inst["candidates"]; t = cands.index(inst["target"])
            others = [c for c in cands if c != inst["target"]]
            for shift in range(n):
                order = others[:]; order.insert(shift, inst["target"])
                ids, _ = prompts.encode(inst["caption"], n)
                pv = torch.cat([pixels(i)[0] for i in order]); grid = torch.cat([pixels(i)[1] for i in order])
                with torch.no_grad():
                    out = model.model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      pixel_values=pv, image_grid_thw=grid, output_attentions=True, return_dict=True)
                    lg = model.lm_head(out.last_hidden_state[:, -1])[0, digit_ids[:n]]
                spans = torch.tensor([adapter.image_spans(ids)])
                a = []
                for layer in out.attentions:
                    row = layer[:, :, -1].mean(1); cum = torch.nn.functional.pad(row.cumsum(-1), (1, 0))
                    a.append((cum.gather(1, spans[..., 1]) - cum.gather(1, spans[..., 0]))[0])
                scores.append(torch.log_softmax(lg, -1).numpy()); attn.append(torch.stack(a).numpy()); target.append(shift)
        scores, attn, target = np.array(scores, float), np.array(attn, float), np.array(target)
        ncal = 10 * n
        cal = C.fit_calibration(scores[:ncal].reshape(10, n, n), attn[:ncal].reshape(10, n, attn.shape[1], n),
                                target[:ncal].reshape(10, n), n_cal=5, seed=0)
        S, A, T = scores[ncal:], attn[ncal:], target[ncal:]
        acc = lambda p: round(float((p.argmax(-1) == T).mean() * 100), 1)
        rec = [round(float((S.argmax(-1)[T == i] == i).mean() * 100)) for i in range(n)]
        res[bench] = {"V": acc(S), "rstd": round(float(np.std(rec, ddof=1)), 1), "P": acc(methods.pride(S, cal.pride_prior)),
                      "attn": acc(methods.raw_attention(A, top_k=2)), "LAD": acc(methods.lad(S, A, cal, top_k=2, tau=5.0)), "recall": rec}
        r = res[bench]
        print(name, bench, r, "LAD-V %.1f LAD-P %.1f att-V %.1f" % (r["LAD"] - r["V"], r["LAD"] - r["P"], r["attn"] - r["V"]), flush=True)
    open("/tmp/org/demo_results.jsonl", "a").write(json.dumps(res) + "\n")
