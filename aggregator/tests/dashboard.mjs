// Browser test of the dashboard (run by tests/dashboard.rs): headless Debian chromium, driven
// by playwright-core, opens /ui/ on a real aggregator whose collection is finalized, enters the
// admin token, opens the collection and checks what is drawn: the dependency graph (SVG with at
// least one edge), heat maps, 1-way bars with error bars, the timeline; downloads a CSV through
// the page (fetch with the bearer header, saved from a Blob); checks that the token is in
// sessionStorage and in no URL, survives a reload of the tab, and that the console saw no
// error. Writes a screenshot.
//
// What is drawn is true and whole: the timeline's steps are the rounds of the collection's
// state (`status.rounds`, which for the finalized collection are the rounds its model
// summarizes), one step each; at 1400 and at 1024 px wide no text overflows its box (an
// element whose content is wider than it, an SVG text outside its SVG); the graph's labels
// are the whole attribute names; every heat map has its colour scale; clicking an edge whose
// heat map is shown adds none; while collecting the graph says "k of n pairs still active"
// and draws only the strongest of them. A collection at its target, finalized by hand, calls
// for finalize; the test finalizes it from the page. Screenshots at both widths.
//
// The model check says the finalized collection's rounds agree and its fit agrees with its
// tables; a collection whose people arrived sorted by region shows the drift warning. A
// collection still collecting shows its open round and, from the model refitted from its
// reports so far, the provisional graph, heat maps and 1-way bars with error bars, each panel
// labelled "provisional (N reports)", and offers no download yet (screenshot beside the other,
// `-provisional.png`).
//
// usage: node dashboard.mjs <dashboard URL> <finalized collection id> <collecting collection id>
//        <drifted collection id> <independence collection id> <admin token> <screenshot.png>
//        <profile dir> <vertical collection id (sampled+locmrf)>
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(process.env.LDPSYN_NPM_DIR + "/");
const { chromium } = require("playwright-core");

const [url, collection, live, drifted, independent, token, screenshot, profile, vertical] = process.argv.slice(2);
const log = (...a) => console.log("[dashboard]", ...a);
const fail = (msg) => { console.log("[dashboard] FAIL:", msg); process.exitCode = 1; throw new Error(msg); };

const at1024 = (p) => p.replace(/\.png$/, "-1024.png");

/** Every text that overflows its box on the page: an HTML element whose content is wider than
 * it (cut, or scrolled out of sight), an SVG text outside its SVG. */
const overflowing = (page) => page.evaluate(() => {
  const bad = [];
  const shown = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";
  const name = (e) => `${e.tagName.toLowerCase()}${e.id ? `#${e.id}` : ""}${e.className?.baseVal ?? (e.className ? `.${e.className}` : "")}`;
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) bad.push(`the page: ${root.scrollWidth} > ${root.clientWidth} px`);
  for (const e of document.querySelectorAll("body *")) {
    if (e instanceof SVGElement || !shown(e)) continue;
    if (e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0) {
      bad.push(`${name(e)} "${e.textContent.trim().slice(0, 40)}": ${e.scrollWidth} > ${e.clientWidth} px`);
    }
  }
  for (const t of document.querySelectorAll("svg text")) {
    // An empty label (a category named "") has nothing to cut.
    if (!shown(t) || !t.textContent) continue;
    const r = t.getBoundingClientRect(), b = t.ownerSVGElement.getBoundingClientRect();
    if (r.left < b.left - 0.5 || r.right > b.right + 0.5 || r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5) {
      bad.push(`svg text "${t.textContent}" in ${name(t.ownerSVGElement)}: [${r.left.toFixed(1)}, ${r.right.toFixed(1)}] outside [${b.left.toFixed(1)}, ${b.right.toFixed(1)}]`);
    }
  }
  return bad;
});

/** Fails when any text overflows (`where` names the view). */
async function noOverflow(page, where) {
  const bad = await overflowing(page);
  log(`${where}: ${bad.length} overflowing text(s)`);
  if (bad.length) fail(`text overflows its box (${where}):\n  ${bad.join("\n  ")}`);
}

/** The collection `id` as its public view (its status with its rounds). */
const view = (page, id) => page.evaluate(async ([id, token]) => {
  const r = await fetch(`/v1/collections/${id}`, { headers: { authorization: `Bearer ${token}` } });
  return r.json();
}, [id, token]);

/** The timeline's steps against `status.rounds`: one step per round, same index, kind, state. */
async function timelineIsTheRounds(page, id) {
  const rounds = (await view(page, id)).status.rounds;
  const drawn = await page.$$eval("#timeline ol.timeline li.step", (l) => l.map((li) =>
    ({ round: li.dataset.round, kind: li.dataset.kind, cls: li.className, text: li.textContent })));
  const state = { closed: "done", open: "current", planned: "todo" };
  const roundSteps = drawn.filter((s) => s.round !== undefined);
  log(`timeline: ${drawn.map((s) => `${s.text} [${s.cls}]`).join(" | ")}`);
  if (roundSteps.length !== rounds.length) fail(`${roundSteps.length} round steps drawn, the state holds ${rounds.length} rounds`);
  rounds.forEach((r, i) => {
    const s = roundSteps[i];
    if (Number(s.round) !== r.round || s.kind !== r.kind || !s.cls.includes(state[r.state])) {
      fail(`step ${i} is ${JSON.stringify(s)}, the state's round is ${JSON.stringify(r)}`);
    }
  });
  if (drawn.length !== rounds.length + 1 || !drawn[drawn.length - 1].text.startsWith("finalized")) fail("the timeline does not end with finalized");
  return rounds;
}

const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  acceptDownloads: true,
  viewport: { width: 1400, height: 900 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const errors = [];
const urls = [];
try {
  const page = context.pages()[0] ?? await context.newPage();
  page.on("console", (m) => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  page.on("requestfailed", (r) => {
    // A download's blob: URL is revoked later on purpose; everything else must load.
    if (!r.url().startsWith("blob:")) errors.push(`request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  page.on("request", (r) => urls.push(r.url()));
  // Names the request behind a console's "Failed to load resource".
  page.on("response", (r) => { if (r.status() >= 400) errors.push(`${r.status()} ${r.request().method()} ${r.url()}`); });

  await page.goto(url);
  await page.waitForSelector("#token-form:not([hidden])");
  await page.fill("#token", token);
  await page.click("#token-form button[type=submit]");
  const row = `#collections tr[data-collection="${collection}"]`;
  await page.waitForSelector(row, { timeout: 15000 });
  const rowText = (await page.textContent(row)).replace(/\s+/g, " ").trim();
  log("collections list:", rowText);
  // The collection's name beside its id (dashboard.rs names it "<protocol> survey").
  if (!rowText.includes(`${collection.slice(0, 8)} auto survey`)) fail(`no name beside the id: ${rowText}`);
  // A vertical collection's row names its encoding beside the protocol.
  const verticalRow = (await page.textContent(`#collections tr[data-collection="${vertical}"]`)).replace(/\s+/g, " ").trim();
  log("vertical collection:", verticalRow);
  if (!verticalRow.includes("vertical (sampled+locmrf)")) fail(`no encoding in the vertical row: ${verticalRow}`);
  await page.click(`${row} a`);

  await page.waitForSelector("#detail[data-ready=true]", { timeout: 30000 });
  const title = await page.textContent("#detail-title");
  if (!title.startsWith("auto survey · ") || !title.includes(collection)) fail(`detail title: ${title}`);
  const edges = await page.$$eval("#graph svg.graph line.edge", (l) => l.length);
  const nodes = await page.$$eval("#graph svg.graph g.node", (l) => l.length);
  const heatmaps = await page.$$eval("#heatmaps svg.heatmap", (l) => l.length);
  const cells = await page.$$eval("#heatmaps svg.heatmap rect.cell", (l) => l.length);
  const barCharts = await page.$$eval("#oneways svg.bars", (l) => l.length);
  const whiskers = await page.$$eval("#oneways svg.bars line.err", (l) => l.length);
  const steps = await page.$$eval("#timeline ol.timeline li.step", (l) => l.map((g) => g.getAttribute("class")));
  const scales = await page.$$eval("#heatmaps svg.heatmap", (l) => l.filter((s) => s.querySelectorAll("g.scale rect").length > 2 && s.querySelectorAll("g.scale text").length === 3).length);
  const labels = await page.$$eval("#graph svg.graph g.node text", (l) => l.map((t) => t.textContent));
  log(`graph: ${nodes} attributes, ${edges} edge(s), labels ${labels.join(", ")}; ${heatmaps} heat map(s), ${cells} cells, ${scales} with a colour scale; ` +
      `${barCharts} 1-way chart(s), ${whiskers} whisker lines; timeline: ${steps.join(", ")}`);
  if (labels.join() !== "region,spoken-language,age,income,smoking-status") fail(`graph labels cut: ${labels}`);
  if (scales !== heatmaps) fail(`${heatmaps - scales} heat map(s) without a colour scale`);
  if (edges < 1) fail("the graph has no edge");
  if (nodes !== 5) fail(`expected 5 attributes in the graph, got ${nodes}`);
  if (heatmaps < 1 || cells < 4) fail("no heat map drawn");
  if (barCharts !== 5) fail(`expected 5 1-way charts, got ${barCharts}`);
  if (whiskers < 1) fail("no error bars");
  // Numeric 1-ways on a value axis: income's point mass at 0 is a stem at the axis's left end
  // (it used to be drawn after the last cell, at the right), ticks are round and level.
  const numeric = await page.$$eval("#oneways svg.bars.numeric", (l) => l.map((s) => ({
    title: s.querySelector(".axis-title").textContent,
    point: [...s.querySelectorAll("g.point circle")].map((c) => Number(c.getAttribute("cx"))),
    firstBar: Math.min(...[...s.querySelectorAll("rect.bar")].map((r) => Number(r.getAttribute("x")))),
    ticks: [...s.querySelectorAll("text.tick")].filter((t) => Number(t.getAttribute("y")) > 155).map((t) => [t.textContent, t.getAttribute("transform")]),
  })));
  log("numeric 1-ways:", JSON.stringify(numeric));
  if (numeric.map((n) => n.title).join() !== "age,income") fail(`numeric charts: ${numeric.map((n) => n.title)}`);
  const income = numeric[1];
  if (income.point.length !== 1 || !(income.point[0] <= income.firstBar + 0.5)) fail(`income's point mass at 0 is not at the left end: ${JSON.stringify(income)}`);
  for (const n of numeric) {
    if (n.ticks.length < 3 || n.ticks.some(([, t]) => t)) fail(`${n.title}: ticks missing or turned: ${JSON.stringify(n.ticks)}`);
  }
  if (income.ticks.map(([t]) => t).join() !== "0,20K,40K,60K,80K,100K") fail(`income ticks: ${JSON.stringify(income.ticks)}`);
  // A pair too large to draw cell by cell (a 1,024-cell grid and a point mass at 0, by 3
  // labels) is summed into at most 64 display cells per axis, in value order, mass kept.
  const large = await page.evaluate(async () => {
    const { forDisplay } = await import(new URL("charts.js", location.href).href);
    const k = 1025, n = k * 3;
    const m = { dims: [k, 3], labels: [Array.from({ length: k }, (_, i) => String(i)), ["a", "b", "c"]],
      frequencies: Array.from({ length: n }, (_, i) => (i + 1) / ((n * (n + 1)) / 2)), std_errors: null };
    const d = forDisplay(m, [{ type: "numeric", min: 0, max: 1024, bins: "auto", points: [0] }, { type: "categorical" }]);
    return { dims: d.dims, first: d.labels[0].slice(0, 2), sum: d.frequencies.reduce((a, b) => a + b, 0), point: d.frequencies[0] };
  });
  log("a 1025 × 3 pair drawn as:", JSON.stringify(large));
  if (large.dims.join() !== "62,3" || large.first[0] !== "= 0" || Math.abs(large.sum - 1) > 1e-9) fail(`large pair: ${JSON.stringify(large)}`);
  if (!steps.length || !steps[steps.length - 1].includes("done")) fail("the timeline does not show the collection finalized");
  // auto ran round 0, its screening round and phase 2: no round that never ran is drawn.
  const ran = await timelineIsTheRounds(page, collection);
  if (ran.length !== 3) fail(`expected auto's 3 rounds, got ${JSON.stringify(ran)}`);
  const seNote = (await page.textContent("#se-note")).trim();
  if (!/^Standard errors are those of the model's estimate/.test(seNote)) fail(`standard-error note: ${seNote}`);
  const progress = await page.textContent("#progress-text");
  log("progress:", progress);
  if (!/12,000 of 12,000 reports \(100\.0%\)/.test(progress)) fail(`progress: ${progress}`);

  // The model check: rounds and fit within noise.
  const check = (await page.textContent("#model-check")).replace(/\s+/g, " ").trim();
  log("model check:", check);
  if (await page.$("#model-check .warning")) fail(`a warning on an i.i.d. collection: ${check}`);
  if (!/agree within noise/.test(check) || !/measured tables within noise/.test(check)) fail(`model check: ${check}`);

  // Clicking an edge whose heat map is shown adds none; a pair asked for is added once.
  await page.click("#graph svg.graph line.edge");
  await page.waitForTimeout(300);
  const afterClick = await page.$$eval("#heatmaps figure", (l) => l.length);
  if (afterClick !== heatmaps) fail(`clicking a shown edge made ${afterClick} heat maps of ${heatmaps}`);
  for (let i = 0; i < 2; i++) {
    await page.selectOption("#pair-a", "smoking-status");
    await page.selectOption("#pair-b", "region");
    await page.click("#pair-form button[type=submit]");
    await page.waitForFunction((n) => document.querySelectorAll("#heatmaps svg.heatmap").length === n, heatmaps + 1);
    await page.waitForTimeout(300);
  }
  if ((await page.$$eval("#heatmaps figure", (l) => l.length)) !== heatmaps + 1) fail("a pair asked for twice was drawn twice");
  const seNotes = await page.$$eval("#heatmaps figure", (l) => l.map((f) => [f.querySelector("figcaption").textContent, f.querySelector(".se-none, .se-model")?.textContent ?? "± in the cells"]));
  log("heat maps:", JSON.stringify(seNotes));

  // A CSV download: 50 rows with a seed.
  await page.fill("#dl-rows", "50");
  await page.fill("#dl-seed", "9");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#dl-csv")]);
  const csv = readFileSync(await download.path(), "utf8").trimEnd().split("\n");
  log(`download ${download.suggestedFilename()}: ${csv.length} lines, header ${csv[0]}`);
  if (csv[0] !== "region,spoken-language,age,income,smoking-status") fail(`CSV header: ${csv[0]}`);
  if (csv.length !== 51) fail(`expected 50 rows, got ${csv.length - 1}`);

  // The same at 1024 px: the layout wraps, nothing is cut.
  await noOverflow(page, "finalized, 1400 px");
  await page.setViewportSize({ width: 1024, height: 900 });
  await page.waitForTimeout(300);
  await noOverflow(page, "finalized, 1024 px");
  await page.screenshot({ path: at1024(screenshot), fullPage: true });
  await page.setViewportSize({ width: 1400, height: 900 });

  // At its target, finalized by hand: the page calls for finalize, which the test does there.
  // Its people arrived sorted by region: the drift warning names the region.
  await page.click(`#collections tr[data-collection="${drifted}"] a`);
  await page.waitForFunction((id) => document.querySelector("#detail-title")?.textContent.includes(id), drifted);
  await page.waitForSelector("#target-cta:not([hidden])", { timeout: 10000 });
  const cta = (await page.textContent("#target-cta")).replace(/\s+/g, " ").trim();
  log("at the target:", cta);
  if (!/^Target reached: 12,000 of 12,000 reports\. Finalize to build the model/.test(cta) || !cta.includes(`collections finalize ${drifted}`)) fail(`call to action: ${cta}`);
  if (!/finalized by hand/.test(await page.textContent("#progress-text"))) fail("the progress does not say the collection is finalized by hand");
  page.once("dialog", (d) => d.accept());
  await page.click("#finalize");
  await page.waitForSelector("#detail[data-ready=true]", { timeout: 60000 });
  if (!(await page.isHidden("#target-cta"))) fail("the call to action stays after finalize");
  await page.waitForSelector("#model-check .warning", { timeout: 10000 });
  const warning = (await page.textContent("#model-check .warning")).trim();
  log("drifted:", warning);
  if (!/population changed between rounds/.test(warning) || !/region/.test(warning)) fail(`drift warning: ${warning}`);

  // The independence model measured no pair together: its heat map's bars come from the
  // bootstrap of the fit, and it says what they are, in words.
  await page.click(`#collections tr[data-collection="${independent}"] a`);
  await page.waitForFunction((id) => document.querySelector("#detail-title")?.textContent.includes(id), independent);
  await page.waitForSelector("#detail[data-ready=true]", { timeout: 30000 });
  await page.waitForSelector("#heatmaps svg.heatmap");
  // The fitness report says, in words, that this model keeps no relationship between columns
  // (drawn after the heat maps: waited for).
  await page.waitForFunction(() => /the model has no edges/.test(document.querySelector("#fitness")?.textContent ?? ""), null, { timeout: 10000 })
    .catch(() => {});
  const fitness = (await page.textContent("#fitness")).replace(/\s+/g, " ").trim();
  log("fitness:", fitness);
  if (!/the model has no edges/.test(fitness) || !(await page.$("#fitness .warning"))) fail(`fitness report: ${fitness}`);
  const why = (await page.textContent("#heatmaps .se-model")).trim();
  const independentSteps = await page.$$eval("#timeline ol.timeline li.step", (l) => l.map((li) => li.textContent));
  log(`independence: ${why}; timeline ${independentSteps.join(" | ")}`);
  if (why !== "± from a bootstrap of the model's fit: no table measured region and spoken-language together, so these bars are the estimate's error if the model's graph is right (a dependence it leaves out is not in them).") fail(`standard-error note: ${why}`);
  if (independentSteps.length !== 2 || (await view(page, independent)).status.rounds.length) fail(`independence timeline: ${independentSteps}`);
  await noOverflow(page, "independence, 1400 px");

  // The collection still collecting: its open round, no model views, no download.
  await page.click(`#collections tr[data-collection="${live}"] a`);
  await page.waitForFunction((id) => document.querySelector("#detail-title")?.textContent.includes(id), live);
  await page.waitForSelector("#timeline ol.timeline li.step.current");
  const current = (await page.textContent("#timeline ol.timeline li.step.current")).trim();
  const liveProgress = await page.textContent("#progress-text");
  log(`collecting: current step "${current}"; ${liveProgress}`);
  if (!/^round 1/.test(current)) fail(`expected round 1 open, got ${current}`);
  if (!/1,000 of 10,000 reports/.test(liveProgress)) fail(`progress: ${liveProgress}`);
  if (!/finalizes by itself at the target/.test(liveProgress)) fail(`progress: ${liveProgress}`);
  if (!(await page.isHidden("#target-cta"))) fail("a call to finalize before the target");
  await timelineIsTheRounds(page, live);
  if (await page.$("#detail[data-ready=true]")) fail("final model views shown before finalization");
  if (!(await page.isDisabled("#dl-csv"))) fail("download offered before finalization");
  // Provisional estimates from the 1,000 reports so far, labelled as such in every panel.
  await page.waitForSelector("#detail[data-provisional]", { timeout: 30000 });
  const tags = await page.$$eval(".provisional-tag", (l) => l.filter((t) => !t.hidden).map((t) => t.textContent.trim()));
  const liveBars = await page.$$eval("#oneways svg.bars", (l) => l.length);
  const liveWhiskers = await page.$$eval("#oneways svg.bars line.err", (l) => l.length);
  const liveHeatmaps = await page.$$eval("#heatmaps svg.heatmap", (l) => l.length);
  const liveNote = (await page.textContent("#graph-note")).trim();
  log(`provisional: tags ${JSON.stringify(tags)}; ${liveBars} 1-way chart(s), ${liveWhiskers} whisker lines, ` +
      `${liveHeatmaps} heat map(s); graph: ${liveNote}`);
  // The fitness report, the graph, the 2-way and the 1-way panels.
  if (tags.length !== 4 || tags.some((t) => t !== "provisional (1,000 reports)")) fail(`provisional labels: ${JSON.stringify(tags)}`);
  if (liveBars !== 5) fail(`expected 5 provisional 1-way charts, got ${liveBars}`);
  if (liveWhiskers < 1) fail("no error bars on the provisional 1-ways");
  if (liveHeatmaps < 1) fail("no provisional heat map");
  // "k of n pairs still active", and only the strongest of those drawn, each an active pair.
  const active = (await view(page, live)).status.active_edges.map(([a, b]) => `${a},${b}`);
  const liveEdges = await page.$$eval("#graph svg.graph line.edge", (l) => l.map((e) => `${e.dataset.a},${e.dataset.b}`));
  log(`active pairs ${active.length}; drawn ${liveEdges.join(" ")}`);
  if (!liveNote.startsWith(`Provisional (1,000 reports): ${active.length} of 10 pairs still active (not pruned).`)) fail(`graph note: ${liveNote}`);
  if (liveEdges.length > 6 || liveEdges.some((e) => !active.includes(e))) fail(`drawn while collecting: ${liveEdges}`);
  if (liveEdges.length && !new RegExp(`Drawn: the ${liveEdges.length} (strongest of the \\d+ )?dependent beyond noise`).test(liveNote)) fail(`graph note: ${liveNote}`);
  if (await page.$("#detail[data-ready=true]")) fail("the provisional model was drawn as the final one");
  if (!(await page.isDisabled("#dl-csv"))) fail("download offered from a provisional model");
  await noOverflow(page, "collecting, 1400 px");
  await page.screenshot({ path: screenshot.replace(/\.png$/, "-provisional.png"), fullPage: true });
  await page.setViewportSize({ width: 1024, height: 900 });
  await page.waitForTimeout(300);
  await noOverflow(page, "collecting, 1024 px");
  await page.screenshot({ path: at1024(screenshot.replace(/\.png$/, "-provisional.png")), fullPage: true });
  await page.setViewportSize({ width: 1400, height: 900 });
  await page.click(`#collections tr[data-collection="${collection}"] a`);
  await page.waitForSelector("#detail[data-ready=true]", { timeout: 30000 });
  const leftOver = await page.$$eval(".provisional-tag", (l) => l.filter((t) => !t.hidden).length);
  if (leftOver) fail("provisional labels left on the finalized collection");

  // The token: in sessionStorage, in no URL; a reload of the tab keeps it.
  const stored = await page.evaluate(() => sessionStorage.getItem("ldpsyn-admin-token"));
  if (stored !== token) fail("the token is not in sessionStorage");
  if (urls.some((u) => u.includes(token)) || page.url().includes(token)) fail("the token appeared in a URL");
  const storedElsewhere = await page.evaluate((t) => JSON.stringify(localStorage).includes(t) || document.cookie.includes(t), token);
  if (storedElsewhere) fail("the token leaked into localStorage or a cookie");
  await page.reload();
  await page.waitForSelector("#detail[data-ready=true]", { timeout: 30000 });
  if (!(await page.isHidden("#token-form"))) fail("the token was not kept for the tab");

  await page.waitForTimeout(300);
  await page.screenshot({ path: screenshot, fullPage: true });
  log("screenshot:", screenshot);
  if (errors.length) fail(`errors in the page:\n  ${errors.join("\n  ")}`);
  log(`OK: graph with ${edges} edge(s), ${heatmaps} heat map(s), ${barCharts} 1-way charts; no console errors; ${urls.length} requests without the token in a URL`);
} finally {
  await context.close();
}
