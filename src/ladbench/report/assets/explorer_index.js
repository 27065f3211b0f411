// The explorer index's script (ladbench.report.explorer.explorer_index): one row per explorer
// page, filterable by setting, model and N, with the count of pages behind every option.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("explorer-data").textContent);
  const el = (tag, attrs, ...children) => {
    const node = document.createElement(tag);
    for (const [key, val] of Object.entries(attrs || {})) {
      if (key === "text") node.textContent = val; else node.setAttribute(key, val);
    }
    for (const child of children) if (child != null) node.append(child);
    return node;
  };
  document.getElementById("title").textContent = D.title;
  const columns = [["model", (r) => r.model + (r.kind_label ? ` (demo: ${r.kind_label})` : "")], ["benchmark", (r) => r.benchmark],
    ["setting", (r) => r.setting], ["N", (r) => r.n_candidates], ["variant", (r) => r.variant], ["cards", (r) => r.cards],
    ["Vanilla right", (r) => r.counts.right_vanilla ?? "–"], ["LAD right", (r) => r.counts.right_lad ?? "–"],
    ["attention right, logits wrong (raw)", (r) => r.counts.divergence_raw_attention ?? "–"],
    ["(purified)", (r) => r.counts.divergence_purified_attention ?? "–"]];
  const table = document.getElementById("pages");
  table.append(el("tr", null, ...columns.map(([name]) => el("th", { text: name }))));
  const rows = D.pages.map((r) => {
    const tr = el("tr", { "data-setting": r.setting, "data-model": r.model, "data-n": r.n_candidates },
      ...columns.map(([name, get], k) => k === 1 ? el("td", null, el("a", { href: r.href, text: get(r) })) : el("td", { text: get(r) })));
    table.append(tr);
    return tr;
  });
  const groups = [["setting", "setting"], ["model", "model"], ["n", "N"]].map(([key, label]) => {
    const values = [...new Set(D.pages.map((r) => String(key === "n" ? r.n_candidates : r[key])))];
    const select = el("select", { id: "filter-" + key }, el("option", { value: "any", "data-label": "any", text: "any" }),
      ...values.map((v) => el("option", { value: v, "data-label": v, text: v })));
    document.getElementById("filters").append(el("label", null, label, select));
    return { key, select };
  });
  function update() {
    const pass = (tr, except) => groups.every((g) => g === except || g.select.value === "any" || tr.dataset[g.key] === g.select.value);
    for (const g of groups) {
      for (const option of g.select.options) {
        const count = rows.filter((tr) => pass(tr, g) && (option.value === "any" || tr.dataset[g.key] === option.value)).length;
        option.dataset.count = count;
        option.textContent = `${option.dataset.label} (${count})`;
      }
    }
    let shown = 0;
    for (const tr of rows) { tr.hidden = !pass(tr, null); shown += tr.hidden ? 0 : 1; }
    const match = document.getElementById("match-count");
    match.dataset.count = shown;
    match.textContent = `${shown} of ${rows.length} pages`;
  }
  for (const g of groups) g.select.addEventListener("change", update);
  update();
  document.body.dataset.ready = "1";
})();
