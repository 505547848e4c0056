// Browser test of the dashboard (run by tests/dashboard.rs): headless Debian chromium, driven
// by playwright-core, opens /ui/ on a real aggregator whose collection is finalized, enters the
// admin token, opens the collection and checks what is drawn: the dependency graph (SVG with at
// least one edge), heat maps, 1-way bars with error bars, the timeline; downloads a CSV through
// the page (fetch with the bearer header, saved from a Blob); checks that the token is in
// sessionStorage and in no URL, survives a reload of the tab, and that the console saw no
// error. Writes a screenshot.
//
// The model check says the finalized collection's rounds agree and its fit agrees with its
// tables; a collection whose people arrived sorted by region shows the drift warning. A
// collection still collecting shows its open round and, from the model refitted from its
// reports so far, the provisional graph, heat maps and 1-way bars with error bars, each panel
// labelled "provisional (N reports)", and offers no download yet (screenshot beside the other,
// `-provisional.png`).
//
// usage: node dashboard.mjs <dashboard URL> <finalized collection id> <collecting collection id>
//        <drifted collection id> <admin token> <screenshot.png> <profile dir>
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(process.env.LDPSYN_NPM_DIR + "/");
const { chromium } = require("playwright-core");

const [url, collection, live, drifted, token, screenshot, profile] = process.argv.slice(2);
const log = (...a) => console.log("[dashboard]", ...a);
const fail = (msg) => { console.log("[dashboard] FAIL:", msg); process.exitCode = 1; throw new Error(msg); };

const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  acceptDownloads: true,
  viewport: { width: 1280, height: 900 },
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
  const steps = await page.$$eval("#timeline svg.timeline g.step", (l) => l.map((g) => g.getAttribute("class")));
  log(`graph: ${nodes} attributes, ${edges} edge(s); ${heatmaps} heat map(s), ${cells} cells; ` +
      `${barCharts} 1-way chart(s), ${whiskers} whisker lines; timeline: ${steps.join(", ")}`);
  if (edges < 1) fail("the graph has no edge");
  if (nodes !== 5) fail(`expected 5 attributes in the graph, got ${nodes}`);
  if (heatmaps < 1 || cells < 4) fail("no heat map drawn");
  if (barCharts !== 5) fail(`expected 5 1-way charts, got ${barCharts}`);
  if (whiskers < 1) fail("no error bars");
  if (!steps.length || !steps[steps.length - 1].includes("done")) fail("the timeline does not show the collection finalized");
  // auto ran round 0, its screening round and phase 2: no round that never ran is drawn.
  if (steps.length !== 4) fail(`expected 4 timeline steps (2 rounds, cliques, finalized), got ${steps.length}`);
  const progress = await page.textContent("#progress-text");
  log("progress:", progress);
  if (!/12,000 of 12,000 reports \(100\.0%\)/.test(progress)) fail(`progress: ${progress}`);

  // The model check: rounds and fit within noise.
  const check = (await page.textContent("#model-check")).replace(/\s+/g, " ").trim();
  log("model check:", check);
  if (await page.$("#model-check .warning")) fail(`a warning on an i.i.d. collection: ${check}`);
  if (!/agree within noise/.test(check) || !/measured tables within noise/.test(check)) fail(`model check: ${check}`);

  // Clicking an edge adds its heat map.
  await page.click("#graph svg.graph line.edge");
  await page.waitForFunction((n) => document.querySelectorAll("#heatmaps svg.heatmap").length > n, heatmaps);

  // A CSV download: 50 rows with a seed.
  await page.fill("#dl-rows", "50");
  await page.fill("#dl-seed", "9");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#dl-csv")]);
  const csv = readFileSync(await download.path(), "utf8").trimEnd().split("\n");
  log(`download ${download.suggestedFilename()}: ${csv.length} lines, header ${csv[0]}`);
  if (csv[0] !== "region,language,age,income,smoker") fail(`CSV header: ${csv[0]}`);
  if (csv.length !== 51) fail(`expected 50 rows, got ${csv.length - 1}`);

  // People who arrived sorted by region: the drift warning names the region.
  await page.click(`#collections tr[data-collection="${drifted}"] a`);
  await page.waitForFunction((id) => document.querySelector("#detail-title")?.textContent.includes(id), drifted);
  await page.waitForSelector("#detail[data-ready=true]", { timeout: 30000 });
  await page.waitForSelector("#model-check .warning", { timeout: 10000 });
  const warning = (await page.textContent("#model-check .warning")).trim();
  log("drifted:", warning);
  if (!/population changed between rounds/.test(warning) || !/region/.test(warning)) fail(`drift warning: ${warning}`);

  // The collection still collecting: its open round, no model views, no download.
  await page.click(`#collections tr[data-collection="${live}"] a`);
  await page.waitForFunction((id) => document.querySelector("#detail-title")?.textContent.includes(id), live);
  await page.waitForSelector("#timeline svg.timeline g.step.current");
  const current = (await page.textContent("#timeline svg.timeline g.step.current")).trim();
  const liveProgress = await page.textContent("#progress-text");
  log(`collecting: current step "${current}"; ${liveProgress}`);
  if (!/^round 1/.test(current)) fail(`expected round 1 open, got ${current}`);
  if (!/1,000 of 10,000 reports/.test(liveProgress)) fail(`progress: ${liveProgress}`);
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
  if (tags.length !== 3 || tags.some((t) => t !== "provisional (1,000 reports)")) fail(`provisional labels: ${JSON.stringify(tags)}`);
  if (liveBars !== 5) fail(`expected 5 provisional 1-way charts, got ${liveBars}`);
  if (liveWhiskers < 1) fail("no error bars on the provisional 1-ways");
  if (liveHeatmaps < 1) fail("no provisional heat map");
  if (!/^Provisional: the model graph refitted from 1,000 reports/.test(liveNote)) fail(`graph note: ${liveNote}`);
  if (await page.$("#detail[data-ready=true]")) fail("the provisional model was drawn as the final one");
  if (!(await page.isDisabled("#dl-csv"))) fail("download offered from a provisional model");
  await page.screenshot({ path: screenshot.replace(/\.png$/, "-provisional.png"), fullPage: true });
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
