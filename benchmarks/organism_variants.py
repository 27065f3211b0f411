"""Throw-away: train an organism variant (JSON overrides of OrganismSettings), evaluate Vanilla,
raw attention, PriDe and LAD on held-out scenes. Usage: python variants.py NAME JSON."""
import json, sys, time, dataclasses, logging
import numpy as np, torch
logging.basicConfig(level=logging.INFO, format="%(message)s")
from ladbench import organism as O
from ladbench import methods, calibration as C

name, overrides = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
ov = dict(overrides)
for k in ("n_candidates", "look_layers"):
    if k in ov: ov[k] = tuple(ov[k])
s = O.OrganismSettings(**ov)
t0 = time.process_time()
model, processor, tr = O.train_organism(s)
cpu = time.process_time() - t0
torch.save(model.state_dict(), f"/tmp/org/{name}.pt")
from ladbench.models.qwen2_5_vl import Qwen25VLAdapter
adapter = Qwen25VLAdapter(model, processor, model_path="", attention="eager")
torch.set_num_threads(1)
rng = np.random.default_rng(777)
pool = O.draw_scenes(dataclasses.replace(s, n_scenes=400), processor, rng)
prompts = O.PromptBuilder(adapter, int(pool.grid_thw[0].prod()) // 4)
from ladbench.inference.prompts import identifiers
digit_ids = torch.tensor([adapter.tokenizer.convert_tokens_to_ids(i) for i in identifiers("digits", 9)])
res = {"name": name, "overrides": overrides, "train_cpu_s": round(cpu), "train": {k: round(v, 3) for k, v in tr.items()}}
for n, hard in [(n, False) for n in s.n_candidates] + [(4, True)]:
    n_inst = 60 if n == 4 else 30
    scores, attn, target = [], [], []
    for inst in range(n_inst):
        chosen = O._distinct_scenes(pool, n, rng, hard=hard)
        for shift in range(n):
            order = chosen[1:]; order.insert(shift, chosen[0])
            ids, _ = prompts.encode(pool.captions[chosen[0]], n)
            inp = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                   "pixel_values": pool.pixel_values[order].reshape(-1, pool.pixel_values.shape[-1]),
                   "image_grid_thw": pool.grid_thw.repeat(n, 1)}
            with torch.no_grad():
                out = model.model(**inp, output_attentions=True, return_dict=True)
                lg = model.lm_head(out.last_hidden_state[:, -1])[0, digit_ids[:n]]
            spans = torch.tensor([adapter.image_spans(ids)])
            a = []
            for layer in out.attentions:
                row = layer[:, :, -1].mean(1)
                cum = torch.nn.functional.pad(row.cumsum(-1), (1, 0))
                a.append((cum.gather(1, spans[..., 1]) - cum.gather(1, spans[..., 0]))[0])
            scores.append(torch.log_softmax(lg, -1).numpy()); attn.append(torch.stack(a).numpy()); target.append(shift)
    scores, attn, target = np.array(scores, float), np.array(attn, float), np.array(target)
    ncal = 10 * n
    cs, ca, ct = scores[:ncal].reshape(10, n, n), attn[:ncal].reshape(10, n, attn.shape[1], n), target[:ncal].reshape(10, n)
    cal = C.fit_calibration(cs, ca, ct, n_cal=5, seed=0)
    S, A, T = scores[ncal:], attn[ncal:], target[ncal:]
    van = S.argmax(-1)
    pri = methods.pride(S, cal.pride_prior).argmax(-1)
    ladp = methods.lad(S, A, cal, top_k=2, tau=5.0).argmax(-1)
    raw = methods.raw_attention(A, top_k=2).argmax(-1)
    perlayer = [round(float((A[:, l].argmax(-1) == T).mean() * 100)) for l in range(A.shape[1])]
    rec = lambda p: [round(float((p[T == i] == i).mean() * 100)) for i in range(n)]
    res[f"N{n}" + ("hard" if hard else "")] = {"vanilla": round(float((van == T).mean() * 100), 1), "recall": rec(van),
                    "rstd": round(float(np.std(rec(van), ddof=1)), 1),
                    "pride": round(float((pri == T).mean() * 100), 1), "lad": round(float((ladp == T).mean() * 100), 1),
                    "raw_attn": round(float((raw == T).mean() * 100), 1), "attn_per_layer": perlayer,
                    "img_mass": [round(float(x), 2) for x in A.sum(-1).mean(0)]}
print(json.dumps(res))
open("/tmp/org/results.jsonl", "a").write(json.dumps(res) + "\n")
