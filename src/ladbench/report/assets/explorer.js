// The instance explorer's page script (ladbench.report.explorer). Every number it shows was
// computed in Python by the project's own functions and embedded in #explorer-data; this
// script only decodes, draws, filters, sorts and counts.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("explorer-data").textContent);
  const I = D.n_instances, T = D.n_orderings, N = D.n_candidates, LYR = D.n_layers, CARDS = I * T;
  const TYPES = { uint8: Uint8Array, int8: Int8Array, uint16: Uint16Array, int16: Int16Array };

  function unpack(entry) {
    const text = atob(entry.data), bytes = new Uint8Array(text.length);
    for (let k = 0; k < text.length; k++) bytes[k] = text.charCodeAt(k);
    return { values: new TYPES[entry.dtype](bytes.buffer), scale: entry.scale || 1 };
  }
  const A = {};
  for (const [name, entry] of Object.entries(D.arrays)) A[name] = unpack(entry);
  const value = (name, k) => A[name].values[k] / A[name].scale;
  const target = (c) => A.target_pos.values[c];
  const pred = (method, c) => A["pred_" + method].values[c];
  const METHODS = D.methods.map((m) => m.name);
  const LABEL = Object.fromEntries(D.methods.map((m) => [m.name, m.label]));
  const pct = (x) => (x * 100).toFixed(1);
  const el = (tag, attrs, ...children) => {
    const node = document.createElement(tag);
    for (const [key, val] of Object.entries(attrs || {})) {
      if (key === "text") node.textContent = val;
      else if (key === "class") node.className = val;
      else node.setAttribute(key, val);
    }
    for (const child of children) if (child != null) node.append(child);
    return node;
  };

  // viridis at 9 stops, linearly interpolated (colour-blind safe, readable in grey)
  const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
                   [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  function viridis(x) {
    const t = Math.min(1, Math.max(0, x)) * (VIRIDIS.length - 1), k = Math.min(VIRIDIS.length - 2, Math.floor(t));
    const f = t - k, a = VIRIDIS[k], b = VIRIDIS[k + 1];
    return "rgb(" + a.map((v, j) => Math.round(v + f * (b[j] - v))).join(",") + ")";
  }
  const heatCell = (x, text) => {
    const cell = el("td", { text: text, title: text });
    cell.style.background = viridis(x);
    if (x > 0.6) cell.className = "light";
    return cell;
  };

  // ------------------------------------------------------------------ header and summary
  document.getElementById("title").textContent = D.title;
  if (D.kind_label) {
    const banner = document.getElementById("kind-banner");
    banner.textContent = "DEMO: " + D.model + " is a " + D.kind_label + ".";
    banner.hidden = false;
  }
  document.getElementById("identity").textContent =
    `${D.n_instances} instances x ${D.n_orderings} orderings, N = ${N}, ${LYR} layers; LAD: K = ${D.settings.top_k}, ` +
    `tau = ${D.settings.tau}, layer range ${D.settings.layer_range == null ? "all" : JSON.stringify(D.settings.layer_range)}. From ${D.inputs.evaluation}.`;
  const positions = Array.from({ length: N }, (_, p) => p + 1);
  (function summary() {
    const recall = el("table", { class: "grid", id: "recall-table" },
      el("tr", null, el("th", { text: "method" }), el("th", { text: "Acc" }), ...positions.map((p) => el("th", { text: "pos " + p }))));
    for (const m of D.methods) {
      recall.append(el("tr", null, el("th", { text: m.label }), el("td", { text: m.acc_mean == null ? "–" : m.acc_mean.toFixed(1) }),
        ...(m.recall_per_position || []).map((r) => el("td", { text: r == null ? "–" : r.toFixed(1) }))));
    }
    document.getElementById("recall").append(recall);
    const holder = document.getElementById("confusion");
    for (const m of D.methods) {
      if (!m.confusion) continue;
      const table = el("table", { class: "grid heat" }, el("tr", null, el("th", { text: "gt \\ pred" }), ...positions.map((p) => el("th", { text: p }))));
      m.confusion.forEach((row, i) => {
        const total = row.reduce((a, b) => a + b, 0) || 1;
        table.append(el("tr", null, el("th", { text: i + 1 }), ...row.map((v) => heatCell(v / total, (v / total).toFixed(2)))));
      });
      holder.append(el("figure", null, el("figcaption", { text: m.label }), table));
    }
  })();

  // ------------------------------------------------------------------ filters and counts
  // Each filter group: options (value, label) and match(option value, card) -> bool. An option's
  // count is the number of cards that pass every OTHER group's current choice and match it.
  const groups = [];
  for (const m of METHODS) {
    groups.push({ id: "filter-right-" + m, label: LABEL[m], options: [["any", "any"], ["right", "right ✓"], ["wrong", "wrong ✗"]],
      match: (v, c) => v === "any" || (v === "right") === (pred(m, c) === target(c)) });
  }
  const readouts = ["raw_attention", "purified_attention"].filter((m) => METHODS.includes(m) && METHODS.includes("vanilla"));
  if (readouts.length) {
    groups.push({ id: "filter-divergence", label: "attention right, logits wrong",
      options: [["any", "any"], ...readouts.map((m) => [m, LABEL[m] + " right, Vanilla wrong"])],
      match: (v, c) => v === "any" || (pred(v, c) === target(c) && pred("vanilla", c) !== target(c)) });
  }
  groups.push({ id: "filter-target", label: "target position", options: [["any", "any"], ...positions.map((p) => [String(p - 1), "position " + p])],
    match: (v, c) => v === "any" || target(c) === Number(v) });
  groups.push({ id: "filter-ordering", label: "ordering", options: [["any", "any"], ...Array.from({ length: T }, (_, t) => [String(t), "ordering " + (t + 1)])],
    match: (v, c) => v === "any" || c % T === Number(v) });

  const filters = document.getElementById("filters");
  for (const g of groups) {
    g.select = el("select", { id: g.id, "data-group": g.id });
    for (const [v, label] of g.options) g.select.append(el("option", { value: v, "data-label": label, text: label }));
    g.select.addEventListener("change", update);
    filters.append(el("label", null, g.label, g.select));
  }
  const sort = el("select", { id: "sort" },
    el("option", { value: "instance", text: "instance, ordering" }),
    el("option", { value: "gap-desc", text: "gap, largest first" }),
    el("option", { value: "gap-asc", text: "gap, smallest first" }));
  const pageSize = el("select", { id: "page-size" }, ...[25, 50, 200].map((n) => el("option", { value: n, text: n })),
    el("option", { value: "all", text: "all" }));
  pageSize.value = "50";
  sort.addEventListener("change", update);
  pageSize.addEventListener("change", () => { page = 0; render(); });
  filters.append(el("label", null, "sort by", sort), el("label", null, "cards per page", pageSize));
  document.getElementById("reset").addEventListener("click", () => {
    for (const g of groups) g.select.value = "any";
    sort.value = "instance";
    update();
  });

  let matching = [], page = 0;
  function update() {
    const choice = groups.map((g) => g.select.value);
    const counts = groups.map((g) => new Array(g.options.length).fill(0));
    matching = [];
    for (let c = 0; c < CARDS; c++) {
      let failed = -1, failures = 0;
      for (let g = 0; g < groups.length && failures < 2; g++) {
        if (!groups[g].match(choice[g], c)) { failed = g; failures++; }
      }
      if (failures === 0) matching.push(c);
      if (failures > 1) continue;
      for (let g = 0; g < groups.length; g++) {
        if (failures === 1 && g !== failed) continue;
        groups[g].options.forEach(([v], o) => { if (groups[g].match(v, c)) counts[g][o]++; });
      }
    }
    groups.forEach((g, gi) => Array.from(g.select.options).forEach((option, o) => {
      option.dataset.count = counts[gi][o];
      option.textContent = `${option.dataset.label} (${counts[gi][o]})`;
    }));
    if (sort.value !== "instance") {
      const sign = sort.value === "gap-desc" ? -1 : 1, gap = A.gap.values;
      matching.sort((a, b) => sign * (gap[a] - gap[b]) || a - b);
    }
    const shown = document.getElementById("match-count");
    shown.dataset.count = matching.length;
    shown.textContent = `${matching.length} of ${CARDS} instance x ordering cards match`;
    page = 0;
    render();
  }

  // ------------------------------------------------------------------ cards
  function thumbnail(imageIndex) {
    if (D.thumbnails.length) return el("img", { class: "thumb", src: D.thumbnails[imageIndex], alt: "image " + D.image_ids[imageIndex] });
    return el("div", { class: "thumb placeholder", text: "image " + D.image_ids[imageIndex] });
  }
  const imageAt = (c, p) => D.candidates[Math.floor(c / T)][A.order.values[c * N + p]];

  function answers(c) {
    return el("div", { class: "answers" }, ...METHODS.map((m) => {
      const p = pred(m, c), right = p === target(c);
      return el("span", { class: "answer " + (right ? "right" : "wrong"), "data-method": m,
        text: `${right ? "✓" : "✗"} ${LABEL[m]}: ${p < 0 ? "unparsed" : p + 1}` });
    }));
  }

  function positionTable(c, rows) {
    const table = el("table", { class: "positions" });
    const images = el("tr", null, el("th", { text: "" }));
    const labels = el("tr", null, el("th", { text: "position" }));
    for (let p = 0; p < N; p++) {
      const isTarget = p === target(c);
      images.append(el("td", { class: isTarget ? "target" : "" }, thumbnail(imageAt(c, p))));
      labels.append(el("td", { class: "pos-label" + (isTarget ? " target" : ""), text: isTarget ? `${p + 1} ★ target` : String(p + 1) }));
    }
    table.append(images, labels);
    for (const { name, label } of rows) {
      const tr = el("tr", { "data-row": name }, el("th", { text: label }));
      let best = 0;
      for (let p = 1; p < N; p++) if (value(name, c * N + p) > value(name, c * N + best)) best = p;
      for (let p = 0; p < N; p++) {
        const x = value(name, c * N + p), bar = el("div", { class: "bar" });
        bar.style.width = (100 * x).toFixed(1) + "%";
        tr.append(el("td", { class: p === target(c) ? "target" : "" },
          el("div", { class: "value" + (p === best ? " top" : "") }, bar, el("span", { class: "num", text: x.toFixed(3) }))));
      }
      table.append(tr);
    }
    return table;
  }

  function card(c) {
    const i = Math.floor(c / T), t = c % T;
    const node = el("article", { class: "card", tabindex: "0", "data-instance": i, "data-ordering": t, "data-card": c,
      "aria-label": `instance ${i}, ordering ${t + 1}` },
      el("header", null, el("strong", { text: `#${i} · ordering ${t + 1}` }), el("span", { class: "caption", text: "“" + D.captions[i] + "”" }),
        el("span", { class: "muted", text: `gap ${value("gap", c).toFixed(3)}` })),
      answers(c), positionTable(c, D.per_position));
    node.addEventListener("click", () => openDetail(c));
    return node;
  }

  function render() {
    const size = pageSize.value === "all" ? Math.max(1, matching.length) : Number(pageSize.value);
    const pages = Math.max(1, Math.ceil(matching.length / size));
    page = Math.min(page, pages - 1);
    const slice = matching.slice(page * size, (page + 1) * size);
    const main = document.getElementById("cards");
    main.replaceChildren(...slice.map(card));
    for (const info of document.querySelectorAll(".page-info")) {
      info.textContent = matching.length ? `cards ${page * size + 1}–${page * size + slice.length} of ${matching.length} (page ${page + 1} of ${pages})` : "no card matches";
    }
    for (const button of document.querySelectorAll(".pager .prev")) button.disabled = page === 0;
    for (const button of document.querySelectorAll(".pager .next")) button.disabled = page >= pages - 1;
  }
  for (const button of document.querySelectorAll(".pager .prev")) button.addEventListener("click", () => { page--; render(); });
  for (const button of document.querySelectorAll(".pager .next")) button.addEventListener("click", () => { page++; render(); });

  // keyboard: move between cards, open the detail
  document.getElementById("cards").addEventListener("keydown", (event) => {
    const current = event.target.closest(".card");
    if (!current) return;
    let next = null;
    if (event.key === "ArrowDown" || event.key === "j") next = current.nextElementSibling;
    else if (event.key === "ArrowUp" || event.key === "k") next = current.previousElementSibling;
    else if (event.key === "Enter" || event.key === " ") { openDetail(Number(current.dataset.card)); event.preventDefault(); return; }
    else return;
    event.preventDefault();
    if (next) next.focus();
  });

  // ------------------------------------------------------------------ detail
  const dialog = document.getElementById("detail");
  let opener = null;
  dialog.addEventListener("close", () => { if (opener) opener.focus(); });

  function heatMap(c) {
    const table = el("table", { class: "grid heat", id: "heat-map" },
      el("tr", null, el("th", { text: "layer" }), ...positions.map((p) => el("th", { text: p - 1 === target(c) ? `${p} ★` : p }))));
    for (let l = 0; l < LYR; l++) {
      const selected = A.selected.values[c * LYR + l] === 1;
      const row = el("tr", { "data-layer": l }, el("th", { text: selected ? `★ ${l} (LAD)` : String(l) }));
      for (let p = 0; p < N; p++) {
        const x = value("layer_share", (c * LYR + l) * N + p);
        row.append(heatCell(x, x.toFixed(2)));
      }
      table.append(row);
    }
    return table;
  }

  function openDetail(c) {
    const i = Math.floor(c / T), t = c % T;
    opener = document.querySelector(`.card[data-card="${c}"]`);
    document.getElementById("detail-title").textContent = `Instance #${i}, ordering ${t + 1}: “${D.captions[i]}”`;
    const others = el("div", { class: "orderings" });
    for (let u = 0; u < T; u++) {
      const d = i * T + u;
      others.append(el("div", { class: u === t ? "current" : "", "data-ordering": u },
        el("strong", { text: `ordering ${u + 1}${u === t ? " (this card)" : ""}` }), answers(d),
        positionTable(d, D.per_position.filter((r) => ["probability", "attention_share", "lad"].includes(r.name)))));
    }
    document.getElementById("detail-body").replaceChildren(
      el("h3", { text: "Attention share per layer and position (each layer's image attention sums to 1; ★ layers: LAD's selection)" }),
      el("div", { class: "positions-head" }, positionTable(c, [])), heatMap(c),
      el("h3", { text: "The same instance under every ordering: does the attention follow the image when the image moves?" }),
      others);
    if (!dialog.open) dialog.showModal();
  }

  update();
  void document.body.offsetHeight;          // lay the first page out before saying ready (the load time counts it)
  document.body.dataset.ready = "1";
  window.explorerReadyAt = performance.now();
})();
