// The dashboard: polls the admin API and draws what a collection is doing. Plain ES module,
// no build step; every request carries the admin token as a bearer header (api.js).
import * as api from "./api.js";
import { bars, forDisplay, graph, heatmap, histogram, timeline } from "./charts.js";

const POLL_MS = 2000;
/** Reports/s is measured over this window of polls. */
const RATE_WINDOW_MS = 15000;
/** Heat maps drawn at first (the strongest edges of the graph). */
const DEFAULT_HEATMAPS = 3;
/** Most 1-way charts drawn. */
const MAX_ONEWAYS = 24;
/** Most active pairs drawn while collecting (the strongest): no hairball of every pair. */
const maxActiveDrawn = (d) => Math.max(6, d - 1);

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
  /** The model description drawn (final or provisional): edge weights, why no standard errors. */
  desc: null,
  provisionalBusy: false,
  /** The view of the collection shown (its schema places numeric values on their axes). */
  collection: null,
  /** id of the collection being finalized from the page: no provisional loads meanwhile. */
  finalizing: null,
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
    const cells = [idCell, protocolText(c), epsilonText(c), c.status.phase.replaceAll("_", " ")];
    for (const v of cells) tr.insertCell().append(v);
    tr.appendChild(progressCell(c));
    tr.insertCell().textContent = fmtRate(rate(c.id));
    tr.addEventListener("click", (e) => {
      if (e.target.tagName !== "A") location.hash = `c=${c.id}`;
    });
    body.appendChild(tr);
  }
}

const KIND = { one_ways: "1-ways", pairs: "pairs", screening: "screening", phase2: "phase 2" };

/**
 * The timeline's steps: the rounds the collection's state holds (`status.rounds`: closed,
 * open, to come; a finalized collection's are the rounds that ran), then "finalized".
 */
function steps(c) {
  const st = c.status;
  const done = st.phase === "finalized";
  const out = [];
  if (st.rounds?.length) {
    for (const r of st.rounds) {
      const current = r.state === "open";
      let detail, share;
      if (r.state === "planned") {
        detail = "to come";
      } else if (current && st.round_quota !== null) {
        detail = `${num(r.reports)} / ${num(st.round_quota)} reports`;
        share = st.round_quota ? r.reports / st.round_quota : 0;
      } else {
        detail = `${num(r.reports)} reports`;
        if (r.pruned) detail += r.kind === "screening" ? ` · ${r.pruned} not selected` : ` · ${r.pruned} pruned`;
      }
      out.push({
        label: `round ${r.round}`, what: KIND[r.kind] ?? r.kind, detail, share, round: r.round, kind: r.kind,
        state: current ? "current" : r.state === "closed" ? "done" : "todo",
      });
    }
  } else if (c.protocol === "samprivsyn") {
    out.push({
      label: "pair sampling",
      detail: done ? `${st.round + 1} batch(es)` : `batch ${st.round}: ${num(st.round_accepted)} / ${st.round_quota === null ? "–" : num(st.round_quota)}`,
      state: done ? "done" : "current",
    });
  } else {
    out.push({ label: "1-ways", detail: `${num(st.reports_accepted)} reports`, state: done ? "done" : "current" });
  }
  out.push({ label: "finalized", detail: { ready: "model ready", building: "building the model", failed: "model fit failed" }[st.model] ?? "", state: done ? "done" : "todo" });
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

/** One key for a pair in either order: the heat map of a × b is that of b × a. */
const pairKey = (a, b) => [a, b].sort().join("\u0000");

/** The tables of model description `desc` that hold both attributes `a` and `b` (by name). */
function tablesHolding(desc, a, b) {
  const ia = desc?.attributes.indexOf(a), ib = desc?.attributes.indexOf(b);
  return (desc?.model.rounds ?? []).flatMap((r) => r.factors)
    .filter((f) => f.factor.includes(ia) && f.factor.includes(ib))
    .map((f) => ({ ...f, ia, ib }));
}

/**
 * What the standard errors of the model's marginal of `a × b` are, or why there are none,
 * from what the rounds of `desc` (the model description) measured. The engine gives them from
 * the tables where a table holds both attributes at full resolution, else from a parametric
 * bootstrap of the fit, except where the model's split of the pair rests on bins no table
 * resolves (or, in a vertical collection, on tables of the same records).
 */
function stdErrorsNote(desc, a, b, has) {
  const holding = tablesHolding(desc, a, b);
  const binned = (f, i) => (f.bins?.[f.factor.indexOf(i)] ?? []).length > 0;
  const onlyBinned = holding.length && holding.every((f) => binned(f, f.ia) || binned(f, f.ib));
  if (has) {
    return desc && !holding.length
      ? `± from a bootstrap of the model's fit: no table measured ${a} and ${b} together, so these bars are the estimate's error if the model's graph is right (a dependence it leaves out is not in them).`
      : null;
  }
  if (onlyBinned) {
    return `No standard errors: ${a} × ${b} was measured only in coarser bins than these cells.`;
  }
  if (desc && !holding.length) {
    return `No standard errors: no table measured ${a} and ${b} together, and the model's split of them rests on bins no table resolves (or on tables of the same records).`;
  }
  return "No standard errors for these cells.";
}

/** The schema of attribute `name` of the collection shown. */
const attributeOf = (name) => state.collection?.schema.attributes.find((x) => x.name === name);

/**
 * A heat map figure of marginal `m` (or the error loading it) captioned `a × b`: numeric
 * axes in value order, large axes summed into at most 64 display cells (`forDisplay`).
 */
function heatmapFigure(a, b, m, desc) {
  const box = document.createElement("figure");
  box.className = "heatmap-box";
  box.dataset.pair = pairKey(a, b);
  const caption = document.createElement("figcaption");
  caption.textContent = `${a} × ${b}`;
  box.appendChild(caption);
  if (m instanceof Error) {
    box.append(`cannot load: ${m.message}`);
  } else {
    const shown = forDisplay(m, [attributeOf(a), attributeOf(b)]);
    box.appendChild(heatmap(shown));
    if (shown.dims.join() !== m.dims.join() && shown.frequencies.length < m.frequencies.length) {
      box.append(para(`${m.dims[0]} × ${m.dims[1]} cells drawn as ${shown.dims[0]} × ${shown.dims[1]}: neighbouring values summed.`, "note"));
    }
    const note = stdErrorsNote(desc, a, b, Boolean(m.std_errors));
    if (note) box.append(para(note, m.std_errors ? "note se-model" : "note se-none"));
  }
  return box;
}

/**
 * Shows the heat map of `a × b` (`provisional`: from the model refitted so far); one already
 * shown moves to the front instead of being drawn twice.
 */
async function showHeatmap(id, a, b, { prepend = true, provisional = false } = {}) {
  const holder = $("#heatmaps");
  const key = pairKey(a, b);
  const shown = [...holder.children].find((f) => f.dataset.pair === key);
  if (shown) {
    if (prepend) holder.prepend(shown);
    return;
  }
  const placeholder = document.createElement("figure");
  placeholder.dataset.pair = key;
  if (prepend) holder.prepend(placeholder); else holder.appendChild(placeholder);
  while (holder.children.length > 6) holder.lastElementChild.remove();
  const m = await api.marginal(id, [a, b], { provisional }).catch((e) => e);
  placeholder.replaceWith(heatmapFigure(a, b, m, state.desc));
}

/** A 1-way bar chart figure of marginal `m` (or the error loading attribute `name`). */
function onewayFigure(name, m) {
  const fig = document.createElement("figure");
  fig.className = "oneway-box";
  const attr = attributeOf(name);
  if (m instanceof Error) fig.append(`${name}: ${m.message}`);
  else fig.appendChild(attr?.type === "numeric" ? histogram(m, attr) : bars(m));
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
  state.desc = desc;
  const attrs = desc.attributes;
  const edges = modelEdges(desc);
  const sorted = [...edges].sort((x, y) => (y[2] ?? 0) - (x[2] ?? 0));
  $("#graph").replaceChildren(graph(attrs, edges, {
    onEdge: (a, b) => showHeatmap(c.id, attrs[a], attrs[b]),
  }));
  $("#graph-note").textContent = desc.model.structure
    ? `${edges.length} edge(s) in the model graph; width: estimated dependence. Click an edge for its heat map.`
    : "SamPrivSyn: the pairs with the largest MI weights.";
  $("#timeline").replaceChildren(timeline(steps(c)));
  fillPairForm(attrs);
  $("#heatmaps").replaceChildren();
  for (const [a, b] of sorted.slice(0, DEFAULT_HEATMAPS)) {
    await showHeatmap(c.id, attrs[a], attrs[b], { prepend: false });
  }
  if (!sorted.length && attrs.length > 1) await showHeatmap(c.id, attrs[0], attrs[1]);
  await showOneways(c.id, attrs);
  $("#model-check").replaceChildren(...modelCheck(desc.model, attrs));
  $("#fitness").replaceChildren(...fitnessView(desc.fitness));
  for (const b of document.querySelectorAll("#download-form button")) b.disabled = false;
  $("#download-note").textContent = "Rows are drawn from the fitted model; the same seed gives the same file.";
  $("#detail").dataset.ready = "true";
}


// The fitness report (`fitness` of GET …/model): each declared target with the columns it
// depends on in the model and the share of its uncertainty they explain, then the warnings,
// written for people by the server.
function fitnessView(fitness) {
  const out = [];
  for (const t of fitness?.targets ?? []) {
    const share = t.explained == null ? "" : ` (they explain ${(100 * t.explained).toFixed(0)}% of its uncertainty)`;
    out.push(para(t.neighbours.length
      ? `Target ${t.name}: the model predicts it from ${t.neighbours.join(", ")}${share}.`
      : `Target ${t.name}: the model predicts it from nothing.`));
  }
  for (const w of fitness?.warnings ?? []) out.push(para(w.message, "warning"));
  if (!out.length) out.push(para("No warnings: every column has an edge in the model.", "note"));
  return out;
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
    state.desc = null;
    provisionalTags(null);
    delete $("#detail").dataset.provisional;
    $("#heatmaps").replaceChildren("Provisional estimates appear with the first reports.");
    $("#oneways").replaceChildren("Provisional estimates appear with the first reports.");
    $("#model-check").replaceChildren("Checked once the collection is finalized.");
    $("#fitness").replaceChildren("Said of the provisional model, with the first reports.");
    for (const b of document.querySelectorAll("#download-form button")) b.disabled = true;
    $("#download-note").textContent = "Synthetic data is available once the collection is finalized.";
    fillPairForm(names(c));
    delete $("#detail").dataset.ready;
  }
  drawCollectingGraph(c);
  // Once finalized the final model answers, when built (the poll then draws it).
  if (c.status.phase !== "finalized" && c.status.reports_accepted > 0 && !state.provisionalBusy && state.finalizing !== c.id) {
    state.provisionalBusy = true;
    drawProvisional(c)
      .catch((e) => message(`cannot load the provisional estimates: ${e.message}`, "error"))
      .finally(() => { state.provisionalBusy = false; });
  }
}

/** How many standard deviations of an independent pair's estimate a dependence must exceed to be drawn. */
const BEYOND_NOISE_SD = 2;

/**
 * Estimated dependence of each pair "a,b" (a < b) of model description `desc` that is beyond
 * noise: above BEYOND_NOISE_SD standard deviations of what an independent pair would show
 * (a pair without that deviation: above zero).
 */
function dependentPairs(desc) {
  const weight = new Map();
  for (const g of desc?.model.model_graph ?? []) {
    const floor = g.dependence_sd > 0 ? BEYOND_NOISE_SD * g.dependence_sd : 0;
    if (g.dependence > floor) weight.set(`${g.a},${g.b}`, g.dependence);
  }
  return weight;
}

/**
 * The graph of collecting collection `c`. Two-phase protocols: "k of n pairs still active"
 * and the strongest active ones by the provisional model's estimated dependence (no
 * hairball of every pair); others: the provisional model's graph.
 */
function drawCollectingGraph(c) {
  const desc = state.desc;
  const key = `${c.id}|${JSON.stringify(c.status.active_edges)}|${state.drawnProvisional}`;
  if (state.drawnActive === key) return;
  state.drawnActive = key;
  const attrs = names(c);
  const onEdge = desc ? (a, b) => showHeatmap(c.id, attrs[a], attrs[b], { provisional: true }) : undefined;
  const fitted = desc ? `Provisional (${num(desc.reports)} reports): ` : "";
  let edges = [], note;
  if (c.status.rounds?.length) {
    const d = attrs.length, n = (d * (d - 1)) / 2;
    const active = c.status.active_edges;
    const open = c.status.rounds.find((r) => r.state === "open");
    const weight = dependentPairs(desc);
    const ranked = active.map(([a, b]) => [a, b, weight.get(`${Math.min(a, b)},${Math.max(a, b)}`)])
      .filter((e) => typeof e[2] === "number" && e[2] > 0)
      .sort((x, y) => y[2] - x[2]);
    edges = ranked.slice(0, maxActiveDrawn(d));
    if (open?.kind === "one_ways") {
      note = `Round ${open.round} measures every attribute alone; the ${num(n)} pairs are screened from round ${open.round + 1}.`;
    } else {
      note = `${fitted}${num(active.length)} of ${num(n)} pairs still active (not pruned). `;
      note += !desc ? "Their dependence is estimated once the first reports are fitted."
        : edges.length ? `Drawn: ${edges.length < ranked.length ? `the ${edges.length} strongest of the ${ranked.length}` : `the ${edges.length}`} ` +
          "dependent beyond noise (width: estimated dependence). Click an edge for its heat map."
        : "None is dependent beyond noise yet.";
    }
  } else if (desc) {
    edges = modelEdges(desc);
    note = `${fitted}the model graph refitted from the reports so far (${edges.length} edge(s); width: estimated dependence). Click an edge for its heat map.`;
  } else {
    note = "The graph is learned from the reports; it appears with the first ones.";
  }
  $("#graph").replaceChildren(graph(attrs, edges, { dashed: true, onEdge }));
  $("#graph-note").textContent = `${note}${desc ? " The final model is built at finalize." : ""}`;
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
  state.desc = desc;
  drawCollectingGraph(c);
  $("#heatmaps").replaceChildren(...pairs.map(([a, b], i) => heatmapFigure(attrs[a], attrs[b], heat[i], desc)));
  $("#oneways").replaceChildren(...ones.map((m, i) => onewayFigure(attrs[i], m)));
  $("#fitness").replaceChildren(...fitnessView(desc.fitness));
  provisionalTags(`provisional (${num(desc.reports)} reports)`);
  $("#detail").dataset.provisional = String(desc.reports);
}

// A vertical collection's encoding changes what its parties send (local models, one sampled
// attribute per record); the config leaves out the default, `fo`.
function protocolText(c) {
  if (c.protocol !== "vertical") return c.protocol;
  return `vertical (${c.encoding ?? "fo"})`;
}

// ε per person: a vertical collection's parties' reports are joined by record id, so they
// compose (the sum over parties); `epsilon` is only the largest party's share there.
function epsilonText(c) {
  if (c.composed_epsilon === undefined) return String(c.epsilon);
  return `${c.composed_epsilon} (Σ over parties)`;
}

/** Whether the collection finalizes by itself when `target_users` reports are in. */
const stopsAtTarget = (c) => c.auto_finalize_at_target === true && c.protocol !== "vertical";

/** The call to action once the target is reached and the collection still collects. */
function targetCta(c) {
  const st = c.status;
  const cta = $("#target-cta");
  cta.hidden = st.phase === "finalized" || st.reports_accepted < c.target_users;
  if (cta.hidden) return;
  cta.dataset.collection = c.id;
  const refused = c.past_target === "refuse" && c.protocol !== "vertical";
  $("#target-cta-text").textContent =
    `Target reached: ${num(st.reports_accepted)} of ${num(c.target_users)} reports. ` +
    "Finalize to build the model and the synthetic data" +
    (refused ? "; until then new reports are refused." : "; reports that arrive until then are still taken.");
  $("#finalize-command").textContent = `ldpsyn-aggregator collections finalize ${c.id}`;
}

async function finalizeSelected() {
  const id = $("#target-cta").dataset.collection;
  if (!id || !confirm("Finalize this collection? It then takes no more reports; this cannot be undone.")) return;
  const button = $("#finalize");
  button.disabled = true;
  button.textContent = "finalizing…";
  // A provisional load still in flight would ask for estimates finalize then refuses.
  state.finalizing = id;
  while (state.provisionalBusy) await new Promise((r) => setTimeout(r, 100));
  try {
    // 202 (the fit outlasted the server's wait) names where the model will answer.
    const answer = await api.finalize(id);
    message(typeof answer.model === "string"
      ? "Finalized: the model is being built; it shows here when it is ready."
      : "Finalized: the model is built.");
  } catch (e) {
    message(`finalize refused: ${e.message}`, "error");
  } finally {
    state.finalizing = null;
    button.disabled = false;
    button.textContent = "Finalize now";
  }
  refresh();
}

function renderDetail(c) {
  state.collection = c;
  const detail = $("#detail");
  detail.hidden = false;
  $("#detail-title").textContent =
    `${c.name ? `${c.name} · ` : ""}${protocolText(c)} at ε = ${epsilonText(c)} · ${c.id}`;
  const st = c.status;
  $("#progress-bar").style.width = `${pct(st.reports_accepted, c.target_users)}%`;
  $("#progress-text").textContent =
    `${num(st.reports_accepted)} of ${num(c.target_users)} reports (${pct(st.reports_accepted, c.target_users).toFixed(1)}%) · ` +
    `${fmtRate(rate(c.id))} reports/s · ${st.phase.replaceAll("_", " ")}, round ${st.round}` +
    (st.phase === "finalized" ? "" : ` · ${stopsAtTarget(c) ? "finalizes by itself at the target" : "finalized by hand"}`);
  targetCta(c);
  if (st.model_ready) {
    if (state.drawnModel !== c.id) {
      drawModel(c).catch((e) => {
        state.drawnModel = null;
        message(`cannot load the model: ${e.message}`, "error");
      });
    }
  } else {
    $("#timeline").replaceChildren(timeline(steps(c)));
    drawCollecting(c);
    if (st.model === "building") $("#graph-note").textContent = "Finalized: the model is being built.";
    if (st.model === "failed") $("#graph-note").textContent = `Finalized, but fitting the model failed (${st.model_error}); finalize again to retry.`;
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
  // A message about the collection shown before (e.g. "Finalized") is not about this one.
  if ($("#message").dataset.kind !== "error") message("");
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
$("#finalize").addEventListener("click", finalizeSelected);
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
