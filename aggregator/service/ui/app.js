// The dashboard: polls the admin API and draws what a collection is doing. Plain ES module,
// no build step; every request carries the admin token as a bearer header (api.js).
import * as api from "./api.js";
import { bars, graph, heatmap, timeline, MAX_HEATMAP_CELLS } from "./charts.js";

const POLL_MS = 2000;
/** Reports/s is measured over this window of polls. */
const RATE_WINDOW_MS = 15000;
/** Heat maps drawn at first (the strongest edges of the graph). */
const DEFAULT_HEATMAPS = 3;
/** Most 1-way charts drawn. */
const MAX_ONEWAYS = 24;

const $ = (sel) => document.querySelector(sel);
const state = {
  selected: null,
  /** id → [{t, n}] samples of reports_accepted. */
  samples: new Map(),
  /** id of the collection whose final model views are drawn. */
  drawnModel: null,
  /** id of the collecting collection whose panels are set up, and its active-edge graph drawn. */
  drawnCollecting: null,
  drawnActive: null,
  /** "id:reports:fitted_at" of the provisional model drawn; one provisional load at a time. */
  drawnProvisional: null,
  provisionalBusy: false,
  timer: null,
};

function message(text, kind = "info") {
  const m = $("#message");
  m.textContent = text;
  m.dataset.kind = kind;
}

function showSignedIn(on) {
  $("#token-form").hidden = on;
  $("#signed-in").hidden = !on;
}

function rate(id) {
  const s = state.samples.get(id) ?? [];
  if (s.length < 2) return null;
  const a = s[0], b = s[s.length - 1];
  const dt = (b.t - a.t) / 1000;
  return dt >= 1 ? (b.n - a.n) / dt : null;
}

function record(id, n) {
  const now = performance.now();
  const s = state.samples.get(id) ?? [];
  s.push({ t: now, n });
  while (s.length > 2 && now - s[0].t > RATE_WINDOW_MS) s.shift();
  state.samples.set(id, s);
}

const para = (text, className = "") => Object.assign(document.createElement("p"), { className, textContent: text });
const pct = (n, target) => (target > 0 ? Math.min(100, (100 * n) / target) : 0);
const num = (x) => Number(x).toLocaleString("en-US");
const fmtRate = (r) => (r === null ? "–" : r.toLocaleString("en-US", { maximumFractionDigits: 1 }));

function progressCell(c) {
  const n = c.status.reports_accepted;
  const td = document.createElement("td");
  const bar = document.createElement("div");
  bar.className = "progress small";
  const fill = document.createElement("div");
  fill.style.width = `${pct(n, c.target_users)}%`;
  bar.appendChild(fill);
  td.append(bar, `${num(n)} / ${num(c.target_users)}`);
  return td;
}

function renderList(list) {
  const body = $("#collections tbody");
  body.replaceChildren();
  if (!list.length) {
    const tr = body.insertRow();
    const td = tr.insertCell();
    td.colSpan = 6;
    td.textContent = "no collections yet";
    return;
  }
  for (const c of list) {
    const tr = document.createElement("tr");
    tr.dataset.collection = c.id;
    if (c.id === state.selected) tr.className = "selected";
    const link = document.createElement("a");
    link.href = `#c=${c.id}`;
    link.textContent = c.id.slice(0, 8);
    link.title = c.id;
    const idCell = document.createElement("span");
    idCell.append(link);
    if (c.name) {
      // textContent: the name is the operator's text, never markup.
      const name = document.createElement("span");
      name.className = "collection-name";
      name.textContent = c.name;
      idCell.append(" ", name);
    }
    const cells = [idCell, c.protocol, epsilonText(c), c.status.phase.replaceAll("_", " ")];
    for (const v of cells) tr.insertCell().append(v);
    tr.appendChild(progressCell(c));
    tr.insertCell().textContent = fmtRate(rate(c.id));
    tr.addEventListener("click", (e) => {
      if (e.target.tagName !== "A") location.hash = `c=${c.id}`;
    });
    body.appendChild(tr);
  }
}

/** The timeline's steps from the public config and status (and the model, when built). */
function steps(c, model) {
  const st = c.status;
  const done = st.phase === "finalized";
  const out = [];
  if (["privincr", "noincremental", "auto"].includes(c.protocol) && st.phase !== "one_way") {
    // auto: round 0 (1-ways) and its screening round; PrivIncr: its configured rounds.
    let rounds = c.protocol === "noincremental" ? 1 : c.protocol === "auto" ? 2 : (c.rounds ?? 6);
    // Finalized: the rounds that ran (the model's last round summary is phase 2's).
    if (c.protocol === "auto" && model?.rounds?.length) rounds = model.rounds.length - 1;
    if (st.phase === "graph_construction") rounds = Math.max(rounds, st.round + 1);
    const pruned = new Map();
    for (const e of model?.edges ?? []) {
      if (e.pruned_in !== null && e.pruned_in !== undefined) pruned.set(e.pruned_in, (pruned.get(e.pruned_in) ?? 0) + 1);
    }
    for (let r = 0; r < rounds; r++) {
      const current = st.phase === "graph_construction" && st.round === r;
      const past = done || st.phase === "clique_measurement" || (st.phase === "graph_construction" && st.round > r);
      const label = c.protocol !== "auto" ? `round ${r}` : r === 0 ? "round 0 · 1-ways" : `round ${r} · screening`;
      let detail = past ? (pruned.has(r) ? `closed · ${pruned.get(r)} pruned` : "closed") : "";
      let share;
      if (current) {
        detail = `${num(st.round_accepted)} / ${st.round_quota === null ? "–" : num(st.round_quota)}`;
        share = st.round_quota ? st.round_accepted / st.round_quota : 0;
      }
      out.push({ label, detail, state: current ? "current" : past ? "done" : "todo", share });
    }
    const measuring = st.phase === "clique_measurement";
    out.push({
      label: "cliques",
      detail: measuring ? `${num(st.round_accepted)} reports` : done ? "measured" : "phase 2",
      state: measuring ? "current" : done ? "done" : "todo",
    });
  } else if (c.protocol === "samprivsyn") {
    out.push({
      label: "pair sampling",
      detail: done ? `${st.round} batches` : `batch ${st.round}`,
      state: done ? "done" : "current",
    });
  } else {
    out.push({ label: "1-ways", detail: done ? "measured" : `${num(st.reports_accepted)} reports`, state: done ? "done" : "current" });
  }
  out.push({ label: "finalized", detail: st.model_ready ? "model ready" : done ? "building" : "", state: done ? "done" : "todo" });
  return out;
}

function names(c) {
  return c.schema.attributes.map((a) => a.name);
}

/** Model graph edges [a, b, weight]: the structure's edges weighted by phase-1 MI or dependence. */
function modelEdges(desc) {
  const m = desc.model;
  const weight = new Map();
  for (const e of m.edges ?? []) {
    const w = e.score ?? e.mi;
    if (typeof w === "number") weight.set(`${e.a},${e.b}`, w);
  }
  for (const g of m.model_graph ?? []) weight.set(`${g.a},${g.b}`, g.dependence);
  if (m.structure) {
    return m.structure.edges.map(([a, b]) => [a, b, weight.get(`${Math.min(a, b)},${Math.max(a, b)}`)]);
  }
  // SamPrivSyn: no graph; its strongest pairs by MI weight.
  const pairs = [...(m.pair_weights ?? [])].sort((x, y) => y[2] - x[2]);
  return pairs.slice(0, Math.max(1, desc.attributes.length - 1));
}

/** A heat map figure of marginal `m` (or the error loading it) captioned `a × b`. */
function heatmapFigure(a, b, m) {
  const box = document.createElement("figure");
  box.className = "heatmap-box";
  const caption = document.createElement("figcaption");
  caption.textContent = `${a} × ${b}`;
  box.appendChild(caption);
  if (m instanceof Error) {
    box.append(`cannot load: ${m.message}`);
  } else if (m.dims[0] * m.dims[1] > MAX_HEATMAP_CELLS) {
    box.append(`${m.dims[0]} × ${m.dims[1]} cells: too many to draw`);
  } else {
    box.appendChild(heatmap(m));
    if (!m.std_errors) box.append(para("no standard errors: no table measured this pair", "note"));
  }
  return box;
}

/** Adds the heat map of `a × b` (`provisional`: from the model refitted so far). */
async function showHeatmap(id, a, b, { prepend = true, provisional = false } = {}) {
  const holder = $("#heatmaps");
  const placeholder = document.createElement("figure");
  if (prepend) holder.prepend(placeholder); else holder.appendChild(placeholder);
  while (holder.children.length > 6) holder.lastElementChild.remove();
  const m = await api.marginal(id, [a, b], { provisional }).catch((e) => e);
  placeholder.replaceWith(heatmapFigure(a, b, m));
}

/** A 1-way bar chart figure of marginal `m` (or the error loading attribute `name`). */
function onewayFigure(name, m) {
  const fig = document.createElement("figure");
  fig.className = "oneway-box";
  if (m instanceof Error) fig.append(`${name}: ${m.message}`);
  else fig.appendChild(bars(m));
  return fig;
}

async function showOneways(id, attrs) {
  const holder = $("#oneways");
  holder.replaceChildren();
  for (const name of attrs.slice(0, MAX_ONEWAYS)) {
    holder.appendChild(onewayFigure(name, await api.marginal(id, [name]).catch((e) => e)));
  }
}

/** Shows `text` in every panel's provisional tag, or hides them (`null`). */
function provisionalTags(text) {
  for (const t of document.querySelectorAll(".provisional-tag")) {
    t.textContent = text ?? "";
    t.hidden = text === null;
  }
}

function fillPairForm(attrs) {
  for (const [sel, pick] of [["#pair-a", 0], ["#pair-b", 1]]) {
    const s = $(sel);
    s.replaceChildren(...attrs.map((n) => new Option(n, n)));
    s.selectedIndex = Math.min(pick, attrs.length - 1);
  }
}

async function drawModel(c) {
  state.drawnModel = c.id;
  state.drawnCollecting = null;
  state.drawnProvisional = null;
  provisionalTags(null);
  delete $("#detail").dataset.provisional;
  const desc = await api.model(c.id);
  if (state.selected !== c.id) return;
  const attrs = desc.attributes;
  const edges = modelEdges(desc);
  const sorted = [...edges].sort((x, y) => (y[2] ?? 0) - (x[2] ?? 0));
  $("#graph").replaceChildren(graph(attrs, edges, {
    onEdge: (a, b) => showHeatmap(c.id, attrs[a], attrs[b]),
  }));
  $("#graph-note").textContent = desc.model.structure
    ? `${edges.length} edge(s) in the model graph; width: estimated dependence. Click an edge for its heat map.`
    : "SamPrivSyn: the pairs with the largest MI weights.";
  $("#timeline").replaceChildren(timeline(steps(c, desc.model)));
  fillPairForm(attrs);
  $("#heatmaps").replaceChildren();
  for (const [a, b] of sorted.slice(0, DEFAULT_HEATMAPS)) {
    await showHeatmap(c.id, attrs[a], attrs[b], { prepend: false });
  }
  if (!sorted.length && attrs.length > 1) await showHeatmap(c.id, attrs[0], attrs[1]);
  await showOneways(c.id, attrs);
  $("#model-check").replaceChildren(...modelCheck(desc.model, attrs));
  for (const b of document.querySelectorAll("#download-form button")) b.disabled = false;
  $("#download-note").textContent = "Rows are drawn from the fitted model; the same seed gives the same file.";
  $("#detail").dataset.ready = "true";
}


// The model's own check (`drift` and `residuals` of GET …/model): whether the people of
// different rounds differed beyond noise, and whether the fit agrees with its tables.
function modelCheck(model, attrs) {
  const out = [];
  const d = model.drift, r = model.residuals;
  if (d && d.population_changed) {
    const beyond = d.attributes.filter((a) => a.p_value * d.attributes.length <= d.level);
    const moved = beyond.slice(0, 3)
      .map((a) => `${attrs[a.attribute]} (moved by up to ${a.largest_shift.toFixed(3)})`);
    out.push(para(
      `The population changed between rounds: people who arrived in different rounds differ ` +
      `beyond noise, most in ${moved.join(", ")}. The model treats the rounds as strata of the ` +
      `population (post-stratification).`, "warning"));
  } else if (d) {
    out.push(para(`The ${d.round_weights.length} rounds' people agree within noise.`));
  } else {
    out.push(para("One round: no rounds to compare."));
  }
  if (r) {
    const ratio = `Σq/Σdf = ${r.mean_ratio.toFixed(2)}, about 1 within noise`;
    out.push(r.beyond_noise
      ? para(`${r.beyond_noise} of ${r.tables_checked} measured tables disagree with the fitted model beyond noise (${ratio}).`, "warning")
      : para(`The fitted model agrees with its ${r.tables_checked} measured tables within noise (${ratio}).`));
    if (r.worst.length) {
      out.push(para("Largest standardized residuals (q/df, about 1 within noise):", "note"));
      const list = document.createElement("ul");
      list.className = "note";
      for (const t of r.worst.slice(0, 3)) {
        const li = document.createElement("li");
        li.textContent = `${t.factor.map((a) => attrs[a]).join(" × ")}, round ${t.round}: ` +
          `q/df = ${(t.q / Math.max(t.df, 1)).toFixed(2)} on ${num(t.reports)} reports`;
        list.append(li);
      }
      out.push(list);
    }
  }
  return out;
}

// While collecting: the panels wait for reports, then show the provisional model (refitted
// from the reports so far, GET …?provisional=true), redrawn when a new refit comes in.
function drawCollecting(c) {
  if (state.drawnCollecting !== c.id) {
    state.drawnCollecting = c.id;
    state.drawnModel = null;
    state.drawnActive = null;
    state.drawnProvisional = null;
    provisionalTags(null);
    delete $("#detail").dataset.provisional;
    $("#heatmaps").replaceChildren("Provisional estimates appear with the first reports.");
    $("#oneways").replaceChildren("Provisional estimates appear with the first reports.");
    $("#model-check").replaceChildren("Checked once the collection is finalized.");
    for (const b of document.querySelectorAll("#download-form button")) b.disabled = true;
    $("#download-note").textContent = "Synthetic data is available once the collection is finalized.";
    fillPairForm(names(c));
    delete $("#detail").dataset.ready;
  }
  const active = JSON.stringify(c.status.active_edges);
  if (!state.drawnProvisional && state.drawnActive !== active) {
    state.drawnActive = active;
    $("#graph").replaceChildren(graph(names(c), c.status.active_edges, { dashed: true }));
    $("#graph-note").textContent = c.status.active_edges.length
      ? "Collecting: pairs still active (not pruned); the provisional model graph follows with the first reports."
      : "The graph is learned from the reports; it appears with the first ones.";
  }
  // Once finalized the final model answers, when built (the poll then draws it).
  if (c.status.phase !== "finalized" && c.status.reports_accepted > 0 && !state.provisionalBusy) {
    state.provisionalBusy = true;
    drawProvisional(c)
      .catch((e) => message(`cannot load the provisional estimates: ${e.message}`, "error"))
      .finally(() => { state.provisionalBusy = false; });
  }
}

/** Draws the provisional model of collecting collection `c` unless that refit is drawn already. */
async function drawProvisional(c) {
  const desc = await api.model(c.id, { provisional: true });
  const current = () => state.selected === c.id && state.drawnCollecting === c.id;
  const key = `${c.id}:${desc.reports}:${desc.fitted_at}`;
  if (!current() || !desc.provisional || state.drawnProvisional === key) return;
  const attrs = desc.attributes;
  const edges = modelEdges(desc);
  const sorted = [...edges].sort((x, y) => (y[2] ?? 0) - (x[2] ?? 0));
  const pairs = sorted.length ? sorted.slice(0, DEFAULT_HEATMAPS) : attrs.length > 1 ? [[0, 1]] : [];
  // Loaded first, then swapped in whole: no flicker on the poll's redraws.
  const opts = { provisional: true };
  const heat = await Promise.all(pairs.map(([a, b]) => api.marginal(c.id, [attrs[a], attrs[b]], opts).catch((e) => e)));
  const ones = await Promise.all(attrs.slice(0, MAX_ONEWAYS).map((n) => api.marginal(c.id, [n], opts).catch((e) => e)));
  if (!current()) return;
  state.drawnProvisional = key;
  $("#graph").replaceChildren(graph(attrs, edges, {
    dashed: true,
    onEdge: (a, b) => showHeatmap(c.id, attrs[a], attrs[b], opts),
  }));
  const active = c.status.active_edges.length;
  $("#graph-note").textContent =
    `Provisional: the model graph refitted from ${num(desc.reports)} reports (${edges.length} edge(s); ` +
    `width: estimated dependence; ${active} pair(s) still active in the collection). ` +
    "Click an edge for its heat map; the final model is built at finalize.";
  $("#heatmaps").replaceChildren(...pairs.map(([a, b], i) => heatmapFigure(attrs[a], attrs[b], heat[i])));
  $("#oneways").replaceChildren(...ones.map((m, i) => onewayFigure(attrs[i], m)));
  provisionalTags(`provisional (${num(desc.reports)} reports)`);
  $("#detail").dataset.provisional = String(desc.reports);
}

// ε per person: a vertical collection's parties' reports are joined by record id, so they
// compose (the sum over parties); `epsilon` is only the largest party's share there.
function epsilonText(c) {
  if (c.composed_epsilon === undefined) return String(c.epsilon);
  return `${c.composed_epsilon} (Σ over parties)`;
}

function renderDetail(c) {
  const detail = $("#detail");
  detail.hidden = false;
  $("#detail-title").textContent =
    `${c.name ? `${c.name} · ` : ""}${c.protocol} at ε = ${epsilonText(c)} · ${c.id}`;
  const st = c.status;
  $("#progress-bar").style.width = `${pct(st.reports_accepted, c.target_users)}%`;
  $("#progress-text").textContent =
    `${num(st.reports_accepted)} of ${num(c.target_users)} reports (${pct(st.reports_accepted, c.target_users).toFixed(1)}%) · ` +
    `${fmtRate(rate(c.id))} reports/s · ${st.phase.replaceAll("_", " ")}, round ${st.round}`;
  if (st.model_ready) {
    if (state.drawnModel !== c.id) {
      drawModel(c).catch((e) => {
        state.drawnModel = null;
        message(`cannot load the model: ${e.message}`, "error");
      });
    }
  } else {
    $("#timeline").replaceChildren(timeline(steps(c, null)));
    drawCollecting(c);
    if (st.phase === "finalized") $("#graph-note").textContent = "Finalized: the model is being built.";
  }
}

async function refresh() {
  if (!api.token()) return;
  try {
    const list = await api.collections();
    for (const c of list) record(c.id, c.status.reports_accepted);
    renderList(list);
    const sel = list.find((c) => c.id === state.selected);
    if (sel) renderDetail(sel);
    else $("#detail").hidden = true;
    if ($("#message").dataset.kind === "error") message("");
  } catch (e) {
    if (e.status === 401) {
      api.forgetToken();
      showSignedIn(false);
      stop();
      message("The admin token was refused; enter it again.", "error");
    } else {
      message(`cannot reach the aggregator: ${e.message}`, "error");
    }
  }
}

function start() {
  stop();
  showSignedIn(true);
  refresh();
  state.timer = setInterval(refresh, POLL_MS);
}

function stop() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

function selectFromHash() {
  const m = /^#c=([0-9a-fA-F-]{36})$/.exec(location.hash);
  state.selected = m ? m[1].toLowerCase() : null;
  state.drawnModel = null;
  state.drawnCollecting = null;
  state.drawnProvisional = null;
  if (!state.selected) $("#detail").hidden = true;
  refresh();
}

async function download(format) {
  const id = state.selected;
  const rows = $("#dl-rows").value, seed = $("#dl-seed").value, numeric = $("#dl-numeric").value;
  const buttons = document.querySelectorAll("#download-form button");
  for (const b of buttons) b.disabled = true;
  $("#download-note").textContent = `preparing ${num(rows)} rows…`;
  try {
    const blob = await api.synthetic(id, { rows, seed, format, numeric });
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = `synthetic-${id.slice(0, 8)}-seed${seed}.${format}`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    $("#download-note").textContent = `${a.download}: ${num(blob.size)} bytes`;
  } catch (e) {
    $("#download-note").textContent = `download refused: ${e.message}`;
  } finally {
    for (const b of buttons) b.disabled = false;
  }
}

$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = $("#token");
  const value = input.value.trim();
  input.value = "";
  if (!value) return;
  api.setToken(value);
  message("");
  start();
});
$("#forget").addEventListener("click", () => {
  api.forgetToken();
  stop();
  showSignedIn(false);
  $("#collections tbody").replaceChildren();
  $("#detail").hidden = true;
  message("Token forgotten.");
});
$("#pair-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const a = $("#pair-a").value, b = $("#pair-b").value;
  // While collecting, from the provisional model.
  const provisional = state.drawnModel !== state.selected;
  if (state.selected && a && b && a !== b) showHeatmap(state.selected, a, b, { provisional });
});
$("#dl-csv").addEventListener("click", () => download("csv"));
$("#dl-ndjson").addEventListener("click", () => download("ndjson"));
$("#dl-parquet").addEventListener("click", () => download("parquet"));
window.addEventListener("hashchange", selectFromHash);

selectFromHash();
if (api.token()) start();
else {
  showSignedIn(false);
  message("Enter the admin token to see the collections.");
}
