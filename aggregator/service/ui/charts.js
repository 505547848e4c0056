// Plain SVG charts: the dependency graph, a heat map of a 2-way marginal, bars of a 1-way
// marginal with error bars (SVG), and the round/phase timeline (HTML). No library.

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

let measureCtx = null;
/**
 * Width in px of `text` drawn at `size` px (and `weight`) in the page's font: layouts place
 * every label inside its SVG's view box from it, with a few px to spare for font hinting.
 */
export function textWidth(text, size = 11, weight = 400) {
  measureCtx ??= document.createElement("canvas").getContext("2d");
  measureCtx.font = `${weight} ${size}px ${getComputedStyle(document.documentElement).fontFamily}`;
  return measureCtx.measureText(String(text)).width + 2;
}

/**
 * The dependency graph: attributes on a circle, `edges` as lines ([a, b, weight?] with
 * attribute indices; weight sets the stroke width), `dashed` for a provisional graph.
 * `onEdge(a, b)` is called when an edge is clicked. The view box is the box of the nodes
 * and their whole labels, so no label is cut at the sides.
 */
export function graph(names, edges, { dashed = false, onEdge } = {}) {
  // Wide enough that labels on the sides, ~14 px apart vertically, do not overlap.
  const r = Math.max(110, 2.6 * names.length);
  const pos = names.map((_, i) => {
    const t = (2 * Math.PI * i) / names.length - Math.PI / 2;
    return [r * Math.cos(t), r * Math.sin(t)];
  });
  const pad = 6;
  let x0 = -r - 9, x1 = r + 9, y0 = -r - 9, y1 = r + 9;
  const labels = names.map((name, i) => {
    const [x, y] = pos[i];
    const out = x >= -1e-9 ? 1 : -1;
    const w = textWidth(name);
    x0 = Math.min(x0, out > 0 ? x : x - 11 - w);
    x1 = Math.max(x1, out > 0 ? x + 11 + w : x);
    y0 = Math.min(y0, y - 10);
    y1 = Math.max(y1, y + 8);
    return out;
  });
  const width = x1 - x0 + 2 * pad, height = y1 - y0 + 2 * pad;
  const s = el("svg", {
    viewBox: `${(x0 - pad).toFixed(1)} ${(y0 - pad).toFixed(1)} ${width.toFixed(1)} ${height.toFixed(1)}`,
    width: Math.ceil(width), height: Math.ceil(height), class: "graph", role: "img",
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
    const out = labels[i];
    node.appendChild(el("text", { x: 11 * out, y: 4, "text-anchor": out > 0 ? "start" : "end" }, name));
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

/** Most px of a heat map's rows or columns. */
const MAX_GRID = 480;

/**
 * A heat map of a 2-way marginal (`m` as answered by `/marginals`: attributes, labels, dims,
 * frequencies row-major, std_errors or null), with its colour scale below it. Margins are
 * measured from the labels, so every label lies inside the view box.
 */
export function heatmap(m) {
  const [ka, kb] = m.dims;
  // Each axis's cells 6 to 34 px; an axis of many bins (a numeric attribute's 1,024 codes)
  // is squeezed to MAX_GRID px instead, its cells thinner, with no gap between them.
  const size = (k) => (k * 6 > MAX_GRID ? MAX_GRID / k : Math.max(6, Math.min(34, Math.floor(360 / k))));
  const ch = size(ka), cw = size(kb);
  const gapH = ch >= 6 ? 1 : 0, gapW = cw >= 6 ? 1 : 0;
  const rowEvery = Math.ceil(14 / ch), colEvery = Math.ceil(14 / cw);
  const rows = m.labels[0].map((l) => short(l)), cols = m.labels[1].map((l) => short(l));
  const rowTitle = `${m.attributes[0]} ↓`, colTitle = `${m.attributes[1]} →`;
  // Column labels are turned 55° up from their foot.
  const cos = Math.cos((55 * Math.PI) / 180), sin = Math.sin((55 * Math.PI) / 180);
  const colW = Math.max(0, ...cols.filter((_, j) => j % colEvery === 0).map((l) => textWidth(l, 10)));
  // Level when every shown label fits the columns it stands for.
  const flat = colW <= cw * colEvery - 2;
  const left = Math.max(40, 8 + Math.max(...rows.filter((_, i) => i % rowEvery === 0).map((l) => textWidth(l, 10))), 8 + textWidth(rowTitle, 11, 600));
  const top = flat ? 40 : Math.max(34, 28 + colW * sin);
  const gridW = kb * cw, gridH = ka * ch;
  const scaleW = 150, scaleTop = top + gridH + 12;
  const width = Math.ceil(Math.max(left + gridW - cw / 2 + 6 + (flat ? colW / 2 : colW * cos), left + textWidth(colTitle, 11, 600), left + scaleW) + 8);
  const height = Math.ceil(scaleTop + 10 + 16);
  const s = svg(width, height, "heatmap");
  const max = Math.max(...m.frequencies, 1e-12);
  s.appendChild(el("text", { x: left, y: 14, class: "axis-title" }, colTitle));
  s.appendChild(el("text", { x: 4, y: top - 6, class: "axis-title" }, rowTitle));
  cols.forEach((label, j) => {
    if (j % colEvery) return;
    const x = left + j * cw + cw / 2;
    s.appendChild(flat
      ? el("text", { x, y: top - 6, "text-anchor": "middle", class: "tick" }, label)
      : el("text", { x, y: top - 6, transform: `rotate(-55 ${x} ${top - 6})`, class: "tick" }, label));
  });
  rows.forEach((label, i) => {
    if (i % rowEvery) return;
    s.appendChild(el("text", { x: left - 4, y: top + i * ch + ch / 2 + 4, "text-anchor": "end", class: "tick" }, label));
  });
  for (let i = 0; i < ka; i++) {
    for (let j = 0; j < kb; j++) {
      const k = i * kb + j;
      const f = m.frequencies[k];
      const se = m.std_errors ? m.std_errors[k] : null;
      const rect = el("rect", {
        class: "cell", x: left + j * cw, y: top + i * ch, width: cw - gapW, height: ch - gapH,
        fill: blue(Math.max(0, f) / max),
      });
      title(rect, `${m.attributes[0]}=${m.labels[0][i]}, ${m.attributes[1]}=${m.labels[1][j]}: ${fmt(f, 4)}${se === null ? "" : ` ± ${fmt(1.96 * se, 4)} (95%)`}`);
      s.appendChild(rect);
    }
  }
  // The colour scale: white at 0 to the darkest cell at the largest frequency.
  const scale = el("g", { class: "scale" });
  const steps = 30;
  for (let i = 0; i < steps; i++) {
    scale.appendChild(el("rect", { x: left + (i * scaleW) / steps, y: scaleTop, width: scaleW / steps + 0.5, height: 8, fill: blue(i / (steps - 1)) }));
  }
  scale.appendChild(el("rect", { x: left, y: scaleTop, width: scaleW, height: 8, class: "scale-frame" }));
  scale.appendChild(el("text", { x: left, y: scaleTop + 20, class: "tick" }, "0"));
  scale.appendChild(el("text", { x: left + scaleW / 2, y: scaleTop + 20, "text-anchor": "middle", class: "tick" }, "frequency"));
  scale.appendChild(el("text", { x: left + scaleW, y: scaleTop + 20, "text-anchor": "end", class: "tick" }, fmt(max, 3)));
  title(scale, `colour scale: 0 (white) to ${fmt(max, 4)}, the largest cell`);
  s.appendChild(scale);
  return s;
}

/** Bars of a 1-way marginal with ±1.96 standard-error whiskers where the API gives them. */
export function bars(m) {
  const k = m.dims[0];
  // Bars of 3 to 28 px; past 100 bins (a numeric attribute's codes) they share 300 px, and
  // the 95% intervals become a band instead of whiskers.
  const bw = k > 100 ? 300 / k : Math.max(3, Math.min(28, Math.floor(300 / k)));
  const gap = bw >= 4 ? 1 : 0;
  const band = bw < 3 && m.std_errors;
  const labelEvery = Math.ceil(12 / bw);
  const hi = m.frequencies.map((f, i) => f + (m.std_errors ? 1.96 * m.std_errors[i] : 0));
  const max = Math.max(...hi, 1e-12);
  // Bar labels are turned 50° down from their end: measured, they set the margins.
  const names = m.labels[0].map((l) => short(l, 9));
  const cos = Math.cos((50 * Math.PI) / 180), sin = Math.sin((50 * Math.PI) / 180);
  const labelW = Math.max(0, ...names.filter((_, i) => i % labelEvery === 0).map((l) => textWidth(l, 10)));
  // Level when every shown label fits the bars it stands for.
  const flat = labelW <= bw * labelEvery - 2;
  const left = Math.max(36, 8 + textWidth(fmt(max, 2), 10), flat ? 0 : labelW * cos - bw / 2 + 6);
  const top = 18, plotH = 120, bottom = flat ? 30 : Math.max(30, 18 + labelW * sin);
  const width = Math.ceil(Math.max(left + k * bw + 10 + (flat ? labelW / 2 : 0), 4 + textWidth(m.attributes[0], 11, 600)));
  const height = Math.ceil(top + plotH + bottom);
  const s = svg(width, height, "bars");
  const y = (v) => top + plotH - (Math.max(0, v) / max) * plotH;
  s.appendChild(el("text", { x: 2, y: 12, class: "axis-title" }, m.attributes[0]));
  s.appendChild(el("line", { x1: left, y1: top + plotH, x2: left + k * bw, y2: top + plotH, class: "axis" }));
  s.appendChild(el("text", { x: left - 4, y: top + 4, "text-anchor": "end", class: "tick" }, fmt(max, 2)));
  s.appendChild(el("text", { x: left - 4, y: top + plotH, "text-anchor": "end", class: "tick" }, "0"));
  for (let i = 0; i < k; i++) {
    const f = m.frequencies[i];
    const x = left + i * bw;
    // At least 1 px wide: a point mass among 1,024 codes stays visible.
    const bar = el("rect", { class: "bar", x: x + gap, y: y(f), width: Math.max(1, bw - 2 * gap), height: top + plotH - y(f) });
    const se = m.std_errors ? m.std_errors[i] : null;
    title(bar, `${m.labels[0][i]}: ${fmt(f, 4)}${se === null ? "" : ` ± ${fmt(1.96 * se, 4)} (95%)`}`);
    s.appendChild(bar);
    if (se !== null && !band) {
      const cx = x + bw / 2, lo = y(f - 1.96 * se), up = y(f + 1.96 * se);
      s.appendChild(el("line", { class: "err", x1: cx, x2: cx, y1: lo, y2: up }));
      s.appendChild(el("line", { class: "err", x1: cx - bw / 4, x2: cx + bw / 4, y1: up, y2: up }));
      s.appendChild(el("line", { class: "err", x1: cx - bw / 4, x2: cx + bw / 4, y1: lo, y2: lo }));
    }
    if (i % labelEvery === 0) {
      const lx = x + bw / 2, ly = top + plotH + 10;
      s.appendChild(flat
        ? el("text", { x: lx, y: ly + 4, "text-anchor": "middle", class: "tick" }, names[i])
        : el("text", { x: lx, y: ly, transform: `rotate(-50 ${lx} ${ly})`, "text-anchor": "end", class: "tick" }, names[i]));
    }
  }
  if (band) {
    // Upper ends left to right, then lower ends back.
    const at = (i, v) => `${(left + i * bw + bw / 2).toFixed(2)},${y(v).toFixed(2)}`;
    const up = m.frequencies.map((f, i) => at(i, f + 1.96 * m.std_errors[i]));
    const lo = m.frequencies.map((f, i) => at(i, f - 1.96 * m.std_errors[i])).reverse();
    s.appendChild(title(el("polygon", { class: "err-band", points: [...up, ...lo].join(" ") }), "±1.96 standard errors"));
  }
  return s;
}

/**
 * About `count` round tick values within [lo, hi]: multiples of 1, 2 or 5 × 10^k (the
 * "nice numbers" of Heckbert, Graphics Gems 1990, as d3's ticks pick them).
 */
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((st) => raw <= st * (1 + 1e-9));
  const ticks = [];
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) ticks.push(Number((i * step).toPrecision(12)));
  return ticks;
}

/** A tick value in few characters: 40, 2.5, 20K, 1.5M. */
const compact = new Intl.NumberFormat("en", { notation: "compact", maximumSignificantDigits: 3 });
export const tickText = (v) => compact.format(v);

/**
 * Where a numeric attribute's codes lie (`attr`: its schema, `k`: its domain size): the grid
 * cells `0..k − points`, equal-width between `min` and `max` in the attribute's scale (linear
 * or `{"asinh": unit}`), then its point masses, each a code of its own at its value; `pos`
 * maps a value to [0, 1] along the scale, and `ticks` are round values along it.
 */
export function numericLayout(attr, k) {
  const unit = attr.scale && typeof attr.scale === "object" ? attr.scale.asinh : null;
  const fwd = (x) => (unit ? Math.asinh(x / unit) : x);
  const inv = (t) => (unit ? unit * Math.sinh(t) : t);
  const points = attr.points ?? [];
  const grid = Math.max(1, k - points.length);
  const t0 = fwd(attr.min), t1 = fwd(attr.max);
  const cells = Array.from({ length: grid }, (_, i) => ({
    code: i, lo: inv(t0 + ((t1 - t0) * i) / grid), hi: inv(t0 + ((t1 - t0) * (i + 1)) / grid),
  }));
  const pos = (x) => (t1 > t0 ? (fwd(x) - t0) / (t1 - t0) : 0.5);
  let ticks;
  if (unit) {
    // Along asinh: 0 and the powers of ten (in the value's units) that fall inside.
    const mags = [];
    for (let e = Math.floor(Math.log10(unit)); e <= 15; e++) mags.push(10 ** e);
    ticks = [0, ...mags, ...mags.map((m) => -m)].filter((v) => v >= attr.min && v <= attr.max).sort((a, b) => a - b);
    while (ticks.length > 7) ticks = ticks.filter((v, i) => v === 0 || i % 2 === 0);
  } else {
    ticks = niceTicks(attr.min, attr.max, 5);
  }
  return { cells, points: points.map((value, j) => ({ code: grid + j, value })), pos, ticks };
}

/**
 * A numeric attribute's 1-way marginal on a value axis: each grid cell a bar over its
 * interval (95% whiskers where they fit, else a band), each point mass a stem with a dot at
 * its value labelled with its share (a stem taller than the bars is cut, its share printed),
 * round ticks below. `attr` is the attribute's schema.
 */
export function histogram(m, attr) {
  const k = m.dims[0];
  const { cells, points, pos, ticks } = numericLayout(attr, k);
  const se = m.std_errors;
  const plotW = 320, plotH = 120, top = 34;
  const hi = cells.map((c) => m.frequencies[c.code] + (se ? 1.96 * se[c.code] : 0));
  const max = Math.max(...hi, 1e-12);
  const left = Math.max(36, 8 + textWidth(fmt(max, 2), 10));
  const bottom = 34;
  const width = Math.ceil(Math.max(left + plotW + 24, 4 + textWidth(m.attributes[0], 11, 600)));
  const height = top + plotH + bottom;
  const s = svg(width, height, "bars numeric");
  const x = (v) => left + pos(v) * plotW;
  const y = (v) => top + plotH - (Math.max(0, Math.min(v, max)) / max) * plotH;
  s.appendChild(el("text", { x: 2, y: 12, class: "axis-title" }, m.attributes[0]));
  s.appendChild(el("line", { x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, class: "axis" }));
  s.appendChild(el("text", { x: left - 4, y: top + 4, "text-anchor": "end", class: "tick" }, fmt(max, 2)));
  s.appendChild(el("text", { x: left - 4, y: top + plotH, "text-anchor": "end", class: "tick" }, "0"));
  const narrow = cells.length && x(cells[0].hi) - x(cells[0].lo) < 3;
  for (const c of cells) {
    const f = m.frequencies[c.code];
    const x0 = x(c.lo), w = Math.max(1, x(c.hi) - x0 - (narrow ? 0 : 1));
    const bar = el("rect", { class: "bar", x: x0, y: y(f), width: w, height: top + plotH - y(f) });
    const e = se ? se[c.code] : null;
    title(bar, `${tickText(c.lo)} to ${tickText(c.hi)}: ${fmt(f, 4)}${e === null ? "" : ` ± ${fmt(1.96 * e, 4)} (95%)`}`);
    s.appendChild(bar);
    if (e !== null && !narrow) {
      const cx = x0 + w / 2, lo = y(f - 1.96 * e), up = y(f + 1.96 * e);
      s.appendChild(el("line", { class: "err", x1: cx, x2: cx, y1: lo, y2: up }));
    }
  }
  if (se && narrow) {
    const at = (c, v) => `${((x(c.lo) + x(c.hi)) / 2).toFixed(2)},${y(v).toFixed(2)}`;
    const up = cells.map((c) => at(c, m.frequencies[c.code] + 1.96 * se[c.code]));
    const lo = cells.map((c) => at(c, m.frequencies[c.code] - 1.96 * se[c.code])).reverse();
    s.appendChild(title(el("polygon", { class: "err-band", points: [...up, ...lo].join(" ") }), "±1.96 standard errors"));
  }
  for (const p of points) {
    const f = m.frequencies[p.code];
    const px = x(p.value), py = f > max ? top - 6 : y(f);
    const g = el("g", { class: "point", "data-value": p.value });
    g.appendChild(el("line", { class: "stem", x1: px, x2: px, y1: top + plotH, y2: py }));
    g.appendChild(el("circle", { class: "point", cx: px, cy: py, r: 3.5 }));
    // Above the plot, on the side of the stem with room: clear of the bars and the y axis.
    const right = px < left + plotW - 60;
    g.appendChild(el("text", { x: px + (right ? 4 : -4), y: top - 12, "text-anchor": right ? "start" : "end", class: "tick point-label" }, `${tickText(p.value)}: ${(100 * f).toFixed(f >= 0.1 ? 0 : 1)}%`));
    title(g, `exactly ${p.value} (a point mass): ${fmt(f, 4)}`);
    s.appendChild(g);
  }
  for (const v of ticks) {
    const tx = x(v);
    s.appendChild(el("line", { x1: tx, x2: tx, y1: top + plotH, y2: top + plotH + 4, class: "axis" }));
    s.appendChild(el("text", { x: tx, y: top + plotH + 16, "text-anchor": "middle", class: "tick" }, tickText(v)));
  }
  return s;
}

/**
 * Marginal `m` with every numeric axis in value order and every axis of more than
 * `maxPerAxis` codes summed into at most that many display cells (`attrs`: the attributes'
 * schemas, in `m`'s order). Numeric grid cells are grouped in runs of neighbouring values
 * and each point mass stays a cell of its own at its value; categorical codes are grouped in
 * runs of codes. Standard errors are kept only where nothing was summed.
 */
export function forDisplay(m, attrs, maxPerAxis = 64) {
  const groups = m.dims.map((k, ax) => {
    const a = attrs[ax];
    let items;
    if (a && a.type === "numeric") {
      const { cells, points } = numericLayout(a, k);
      const per = Math.ceil(cells.length / Math.max(1, maxPerAxis - points.length));
      const runs = [];
      for (let i = 0; i < cells.length; i += per) {
        const run = cells.slice(i, i + per);
        runs.push({ codes: run.map((c) => c.code), at: run[0].lo, label: per === 1 ? m.labels[ax][run[0].code] : `${tickText(run[0].lo)}–${tickText(run[run.length - 1].hi)}` });
      }
      // A point mass at a run's lower end goes before it.
      items = [...points.map((p) => ({ codes: [p.code], at: p.value, label: `= ${tickText(p.value)}` })), ...runs];
      items.sort((u, v) => u.at - v.at);
    } else {
      const per = Math.ceil(k / maxPerAxis);
      items = [];
      for (let i = 0; i < k; i += per) {
        const codes = Array.from({ length: Math.min(per, k - i) }, (_, j) => i + j);
        items.push({ codes, label: per === 1 ? m.labels[ax][i] : `${m.labels[ax][i]}…${m.labels[ax][codes[codes.length - 1]]}` });
      }
    }
    return items;
  });
  const same = groups.every((g, ax) => g.length === m.dims[ax] && g.every((it, i) => it.codes[0] === i));
  if (same) return m;
  const merged = groups.every((g, ax) => g.length === m.dims[ax]);
  const dims = groups.map((g) => g.length);
  const frequencies = new Array(dims.reduce((p, d) => p * d, 1)).fill(0);
  const stdErrors = merged && m.std_errors ? new Array(frequencies.length).fill(0) : null;
  const stride = m.dims.map((_, ax) => m.dims.slice(ax + 1).reduce((p, d) => p * d, 1));
  const walk = (ax, out, src) => {
    if (ax === dims.length) {
      frequencies[out] += m.frequencies[src];
      if (stdErrors) stdErrors[out] = m.std_errors[src];
      return;
    }
    groups[ax].forEach((it, gi) => {
      for (const c of it.codes) walk(ax + 1, out * dims[ax] + gi, src + c * stride[ax]);
    });
  };
  walk(0, 0, 0);
  return { ...m, dims, frequencies, std_errors: stdErrors, labels: groups.map((g) => g.map((it) => String(it.label))) };
}

/**
 * The timeline, in HTML so that its steps wrap onto more lines in a narrow window: `steps`
 * are {label, what?, detail, state: "done" | "current" | "todo", share?, round?, kind?} in order;
 * `share` (0..1) fills the current step; `round` and `kind` are kept as data attributes.
 */
export function timeline(steps) {
  const list = document.createElement("ol");
  list.className = "timeline";
  for (const step of steps) {
    const li = document.createElement("li");
    li.className = `step ${step.state}`;
    if (step.round !== undefined) li.dataset.round = step.round;
    if (step.kind !== undefined) li.dataset.kind = step.kind;
    const label = Object.assign(document.createElement("span"), { className: "label", textContent: step.label });
    const detail = Object.assign(document.createElement("span"), { className: "detail", textContent: step.detail ?? "" });
    li.append(label);
    if (step.what) li.append(Object.assign(document.createElement("span"), { className: "what", textContent: step.what }));
    li.append(detail);
    if (step.state === "current" && typeof step.share === "number") {
      const fill = document.createElement("span");
      fill.className = "fill";
      fill.style.width = `${(100 * Math.min(1, step.share)).toFixed(1)}%`;
      li.append(fill);
    }
    li.title = `${step.label}${step.what ? ` · ${step.what}` : ""}: ${step.detail ?? ""}`;
    list.append(li);
  }
  return list;
}
