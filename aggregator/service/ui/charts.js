// Plain SVG charts: the dependency graph, a heat map of a 2-way marginal, bars of a 1-way
// marginal with error bars, and the round/phase timeline. No library.

const NS = "http://www.w3.org/2000/svg";

/** An SVG element with attributes (and optional text). */
export function el(name, attrs = {}, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function svg(width, height, cls) {
  return el("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: cls, role: "img" });
}

function title(node, text) {
  node.appendChild(el("title", {}, text));
  return node;
}

const fmt = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
/** A label cut to `n` characters; a number with a long fraction (a bin's midpoint) rounded. */
function short(s, n = 10) {
  const x = Number(s);
  if (s !== "" && Number.isFinite(x) && !Number.isInteger(x)) s = String(Number(x.toPrecision(4)));
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}

/**
 * The dependency graph: attributes on a circle, `edges` as lines ([a, b, weight?] with
 * attribute indices; weight sets the stroke width), `dashed` for a provisional graph.
 * `onEdge(a, b)` is called when an edge is clicked.
 */
export function graph(names, edges, { dashed = false, onEdge } = {}) {
  const size = 420, r = 150, cx = size / 2, cy = size / 2;
  const s = svg(size, size, "graph");
  const pos = names.map((_, i) => {
    const t = (2 * Math.PI * i) / names.length - Math.PI / 2;
    return [cx + r * Math.cos(t), cy + r * Math.sin(t)];
  });
  const weights = edges.map((e) => e[2]).filter((w) => typeof w === "number" && w > 0);
  const wmax = weights.length ? Math.max(...weights) : 1;
  const g = el("g", { class: "edges" });
  for (const [a, b, w] of edges) {
    const width = typeof w === "number" && w > 0 ? 1.5 + 4.5 * (w / wmax) : 2.5;
    const line = el("line", {
      class: `edge${dashed ? " provisional" : ""}${onEdge ? " clickable" : ""}`, x1: pos[a][0], y1: pos[a][1], x2: pos[b][0], y2: pos[b][1],
      "stroke-width": width.toFixed(2), "data-a": a, "data-b": b,
    });
    title(line, `${names[a]} — ${names[b]}${typeof w === "number" ? ` (${fmt(w, 4)})` : ""}`);
    if (onEdge) line.addEventListener("click", () => onEdge(a, b));
    g.appendChild(line);
  }
  s.appendChild(g);
  names.forEach((name, i) => {
    const [x, y] = pos[i];
    const node = el("g", { class: "node", transform: `translate(${x.toFixed(1)},${y.toFixed(1)})` });
    node.appendChild(el("circle", { r: 7 }));
    const out = x >= cx ? 1 : -1;
    node.appendChild(el("text", { x: 11 * out, y: 4, "text-anchor": out > 0 ? "start" : "end" }, short(name, 14)));
    title(node, name);
    s.appendChild(node);
  });
  return s;
}

/** Cell colour for a share t in [0, 1]: white to deep blue. */
function blue(t) {
  const c = Math.max(0, Math.min(1, t));
  const mix = (from, to) => Math.round(from + (to - from) * c);
  return `rgb(${mix(247, 8)},${mix(251, 69)},${mix(255, 148)})`;
}

/** Most cells drawn in one heat map. */
export const MAX_HEATMAP_CELLS = 4096;

/**
 * A heat map of a 2-way marginal (`m` as answered by `/marginals`: attributes, labels, dims,
 * frequencies row-major, std_errors or null).
 */
export function heatmap(m) {
  const [ka, kb] = m.dims;
  const cell = Math.max(6, Math.min(34, Math.floor(360 / Math.max(ka, kb))));
  const left = 90, top = 80;
  const width = left + kb * cell + 10, height = top + ka * cell + 10;
  const s = svg(width, height, "heatmap");
  const max = Math.max(...m.frequencies, 1e-12);
  s.appendChild(el("text", { x: left, y: 14, class: "axis-title" }, `${m.attributes[1]} →`));
  s.appendChild(el("text", { x: 4, y: top - 6, class: "axis-title" }, `${m.attributes[0]} ↓`));
  const labelEvery = Math.ceil(14 / cell);
  m.labels[1].forEach((label, j) => {
    if (j % labelEvery) return;
    const x = left + j * cell + cell / 2;
    s.appendChild(el("text", { x, y: top - 6, transform: `rotate(-55 ${x} ${top - 6})`, class: "tick" }, short(label)));
  });
  m.labels[0].forEach((label, i) => {
    if (i % labelEvery) return;
    s.appendChild(el("text", { x: left - 4, y: top + i * cell + cell / 2 + 4, "text-anchor": "end", class: "tick" }, short(label)));
  });
  for (let i = 0; i < ka; i++) {
    for (let j = 0; j < kb; j++) {
      const k = i * kb + j;
      const f = m.frequencies[k];
      const se = m.std_errors ? m.std_errors[k] : null;
      const rect = el("rect", {
        class: "cell", x: left + j * cell, y: top + i * cell, width: cell - 1, height: cell - 1,
        fill: blue(Math.max(0, f) / max),
      });
      title(rect, `${m.attributes[0]}=${m.labels[0][i]}, ${m.attributes[1]}=${m.labels[1][j]}: ${fmt(f, 4)}${se === null ? "" : ` ± ${fmt(1.96 * se, 4)}`}`);
      s.appendChild(rect);
    }
  }
  return s;
}

/** Bars of a 1-way marginal with ±1.96 standard-error whiskers where the API gives them. */
export function bars(m) {
  const k = m.dims[0];
  const bw = Math.max(3, Math.min(28, Math.floor(300 / k)));
  const left = 36, top = 18, plotH = 120, bottom = 58;
  const width = left + k * bw + 10, height = top + plotH + bottom;
  const s = svg(width, height, "bars");
  const hi = m.frequencies.map((f, i) => f + (m.std_errors ? 1.96 * m.std_errors[i] : 0));
  const max = Math.max(...hi, 1e-12);
  const y = (v) => top + plotH - (Math.max(0, v) / max) * plotH;
  s.appendChild(el("text", { x: 2, y: 12, class: "axis-title" }, m.attributes[0]));
  s.appendChild(el("line", { x1: left, y1: top + plotH, x2: left + k * bw, y2: top + plotH, class: "axis" }));
  s.appendChild(el("text", { x: left - 4, y: top + 4, "text-anchor": "end", class: "tick" }, fmt(max, 2)));
  s.appendChild(el("text", { x: left - 4, y: top + plotH, "text-anchor": "end", class: "tick" }, "0"));
  const labelEvery = Math.ceil(12 / bw);
  for (let i = 0; i < k; i++) {
    const f = m.frequencies[i];
    const x = left + i * bw;
    const bar = el("rect", { class: "bar", x: x + 1, y: y(f), width: bw - 2, height: top + plotH - y(f) });
    const se = m.std_errors ? m.std_errors[i] : null;
    title(bar, `${m.labels[0][i]}: ${fmt(f, 4)}${se === null ? "" : ` ± ${fmt(1.96 * se, 4)} (95%)`}`);
    s.appendChild(bar);
    if (se !== null) {
      const cx = x + bw / 2, lo = y(f - 1.96 * se), up = y(f + 1.96 * se);
      s.appendChild(el("line", { class: "err", x1: cx, x2: cx, y1: lo, y2: up }));
      s.appendChild(el("line", { class: "err", x1: cx - bw / 4, x2: cx + bw / 4, y1: up, y2: up }));
      s.appendChild(el("line", { class: "err", x1: cx - bw / 4, x2: cx + bw / 4, y1: lo, y2: lo }));
    }
    if (i % labelEvery === 0) {
      const lx = x + bw / 2, ly = top + plotH + 10;
      s.appendChild(el("text", { x: lx, y: ly, transform: `rotate(-50 ${lx} ${ly})`, "text-anchor": "end", class: "tick" }, short(m.labels[0][i], 9)));
    }
  }
  return s;
}

/**
 * The timeline: `steps` are {label, detail, state: "done" | "current" | "todo", share?} in
 * order; `share` (0..1) fills the current step.
 */
export function timeline(steps) {
  const w = 118, h = 58, gap = 10;
  const s = svg(Math.max(1, steps.length) * (w + gap), h + 30, "timeline");
  steps.forEach((step, i) => {
    const x = i * (w + gap);
    const g = el("g", { class: `step ${step.state}` });
    g.appendChild(el("rect", { x, y: 4, width: w, height: h, rx: 6 }));
    if (step.state === "current" && typeof step.share === "number") {
      g.appendChild(el("rect", { class: "fill", x, y: 4 + h - 6, width: w * Math.min(1, step.share), height: 6 }));
    }
    g.appendChild(el("text", { x: x + 8, y: 24, class: "label" }, step.label));
    g.appendChild(el("text", { x: x + 8, y: 42, class: "detail" }, step.detail ?? ""));
    if (i + 1 < steps.length) {
      g.appendChild(el("line", { x1: x + w, y1: 4 + h / 2, x2: x + w + gap, y2: 4 + h / 2, class: "link" }));
    }
    title(g, `${step.label}: ${step.detail ?? ""}`);
    s.appendChild(g);
  });
  return s;
}
