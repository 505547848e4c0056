// End-to-end browser test (run by test.sh): headless Debian chromium, driven by playwright-core,
// opens the demo page against a real aggregator in two tabs, fills the 15 Adult fields, submits
// from both tabs at once, and checks through the aggregator's API that exactly one report was
// accepted (the other tab refused by the shared ledger); a second submit (and one after a
// reload: the ledger is in localStorage) is refused by the ledger and the count stays.
//
// usage: node e2e.mjs <page URL> <aggregator URL> <collection id> <admin token> <profile dir>
import { createRequire } from "node:module";

const require = createRequire(process.env.LDPSYN_NPM_DIR + "/");
const { chromium } = require("playwright-core");

const [pageUrl, server, collection, adminToken, profile] = process.argv.slice(2);
const log = (...a) => console.log("[e2e]", ...a);
const fail = (msg) => { console.error("[e2e] FAIL:", msg); process.exitCode = 1; throw new Error(msg); };

// The first row of the Adult data set.
const RECORD = {
  "age": "39", "workclass": "State-gov", "fnlwgt": "77516", "education": "Bachelors",
  "education-num": "13", "marital-status": "Never-married", "occupation": "Adm-clerical",
  "relationship": "Not-in-family", "race": "White", "sex": "Male", "capital-gain": "2174",
  "capital-loss": "0", "hours-per-week": "40", "native-country": "United-States", "income": "<=50K",
};

async function acceptedReports() {
  const r = await fetch(`${server}/v1/collections/${collection}`, {
    headers: { authorization: `Bearer ${adminToken}` },
  });
  if (!r.ok) fail(`GET collection: HTTP ${r.status} ${await r.text()}`);
  const body = await r.json();
  const n = body?.status?.reports_accepted;
  if (typeof n !== "number") fail(`no status.reports_accepted in ${JSON.stringify(body)}`);
  return n;
}

async function waitForStatus(page, states) {
  await page.waitForFunction(
    (s) => s.includes(document.querySelector("#status")?.dataset.state),
    states, { timeout: 30000 });
  return page.$eval("#status", (el) => ({ state: el.dataset.state, code: el.dataset.code ?? null, text: el.textContent }));
}

const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = context.pages()[0] ?? await context.newPage();
  page.on("console", (m) => log(`console.${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => log(`pageerror: ${e.message}`));
  const url = `${pageUrl}?server=${encodeURIComponent(server)}&collection=${collection}&maxEpsilon=4`;
  log("open", url);
  await page.goto(url);
  const ready = await waitForStatus(page, ["ready", "error"]);
  if (ready.state !== "ready") fail(`connect: ${ready.text}`);
  log("connected:", await page.textContent("#collection-info"));

  const fields = await page.$$eval("#fields input, #fields select", (els) => els.map((e) => e.name));
  if (fields.length !== 15) fail(`expected 15 fields, got ${fields.length}: ${fields}`);
  for (const [name, value] of Object.entries(RECORD)) {
    const sel = `#fields [name="${name}"]`;
    if (await page.$eval(sel, (e) => e.tagName) === "SELECT") await page.selectOption(sel, value);
    else await page.fill(sel, value);
  }
  if (await acceptedReports() !== 0) fail("reports accepted before submitting");
  const budgetBefore = await page.textContent("#budget");

  // A second tab of the origin shares localStorage: both submit at once, and the ledger's
  // Web Lock lets exactly one of them randomize; the other finds its entry and is refused
  // (budget spent) or resends that same report (answered `duplicate`), never a second one.
  if (!await page.evaluate(() => typeof navigator.locks?.request === "function")) {
    fail("this browser has no Web Locks API: the ledger would run its transactions unlocked");
  }
  const page2 = await context.newPage();
  page2.on("pageerror", (e) => log(`pageerror (tab 2): ${e.message}`));
  await page2.goto(url);
  const ready2 = await waitForStatus(page2, ["ready", "error"]);
  if (ready2.state !== "ready") fail(`connect (tab 2): ${ready2.text}`);
  await page2.click("#example");
  await Promise.all([page.click("#send"), page2.click("#send")]);
  const both = await Promise.all([page, page2].map((p) => waitForStatus(p, ["accepted", "duplicate", "error"])));
  log("two tabs at once:", both.map((r) => `${r.state} ${r.code ?? ""}`).join(" | "));
  const reportId = (r) => r.text.match(/report ([0-9a-f-]{36})/)?.[1];
  const winner = both.find((r) => r.state === "accepted");
  const other = both.find((r) => r !== winner);
  const sameReport = other?.state === "duplicate" && reportId(other) === reportId(winner);
  if (!winner || !other || !(other.code === "budget-exhausted" || sameReport)) {
    fail(`two tabs: expected one accepted report and the other tab refused or resending it, got ${JSON.stringify(both)}`);
  }
  const afterFirst = await acceptedReports();
  log(`aggregator reports_accepted = ${afterFirst}; budget ${budgetBefore} -> ${await page.textContent("#budget")}`);
  if (afterFirst !== 1) fail(`expected exactly 1 accepted report, got ${afterFirst}`);
  await page2.close();

  await page.click("#send");
  const second = await waitForStatus(page, ["error"]);
  log("second submit:", second.state, second.code, "-", second.text);
  if (second.code !== "budget-exhausted") fail(`second submit: expected budget-exhausted, got ${second.code}`);
  if (await acceptedReports() !== 1) fail("the second submit changed the server's count");

  // The ledger survives a reload (localStorage).
  await page.reload();
  const again = await waitForStatus(page, ["ready", "error"]);
  if (again.state !== "ready") fail(`reconnect: ${again.text}`);
  const budget = await page.textContent("#budget");
  await page.click("#example");
  await page.click("#send");
  const third = await waitForStatus(page, ["accepted", "duplicate", "error"]);
  log(`after reload: budget ${budget}; submit: ${third.state} ${third.code}`);
  if (budget !== "0" || third.code !== "budget-exhausted") fail("the ledger did not survive a reload");
  const final = await acceptedReports();
  if (final !== 1) fail(`count changed to ${final}`);
  log(`OK: exactly 1 report accepted by the aggregator; later submits refused by the ledger`);
} finally {
  await context.close();
}
