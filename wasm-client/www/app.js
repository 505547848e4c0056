// Demo of the ldpsyn-wasm package: connect to a collection, render a form from its public
// schema (with examples/adult/schema.json: the 15 Adult attributes) and submit it with
// LdpClient. Served next to ../pkg/ (the output of wasm-client/build.sh).
// Query parameters: ?server=<aggregator URL>&collection=<id>[&maxEpsilon=4] connect at once.
import init, { LdpClient } from "../pkg/ldpsyn_wasm.js";

const $ = (sel) => document.querySelector(sel);
const status = (state, text, code) => {
  const el = $("#status");
  el.dataset.state = state;
  if (code) el.dataset.code = code; else delete el.dataset.code;
  el.textContent = text;
};

// The first row of the Adult data set, for "Fill in an example".
const EXAMPLE = {
  "age": 39, "workclass": "State-gov", "fnlwgt": 77516, "education": "Bachelors",
  "education-num": 13, "marital-status": "Never-married", "occupation": "Adm-clerical",
  "relationship": "Not-in-family", "race": "White", "sex": "Male", "capital-gain": 2174,
  "capital-loss": 0, "hours-per-week": 40, "native-country": "United-States", "income": "<=50K",
};

let client = null;

function renderForm(schema) {
  const fields = $("#fields");
  fields.querySelectorAll("label").forEach((l) => l.remove());
  for (const a of schema.attributes) {
    const label = document.createElement("label");
    label.append(a.name + " ");
    let input;
    if (a.type === "categorical") {
      input = document.createElement("select");
      input.append(new Option("— choose —", ""));
      for (const l of a.labels) input.append(new Option(l, l));
    } else {
      input = document.createElement("input");
      input.type = "number";
      input.step = a.integer ? "1" : "any";
      input.min = a.min; input.max = a.max;
      const hint = document.createElement("small");
      hint.textContent = ` ${a.min}–${a.max}`;
      label.append(hint);
    }
    input.name = a.name;
    input.dataset.kind = a.type;
    // Under `on_invalid: "randomize"` an empty field is sent as missing and replaced on the
    // device by a random code, so the person reports whatever they leave out.
    input.required = a.missing !== "category" && a.on_invalid !== "randomize";
    label.append(input);
    fields.append(label);
  }
  $("#record").hidden = false;
}

function showBudget() {
  $("#budget").textContent = client ? String(client.remainingBudget()) : "–";
}

function readRecord() {
  const record = {};
  for (const input of $("#fields").querySelectorAll("input, select")) {
    const v = input.value.trim();
    if (v === "") record[input.name] = null;
    else record[input.name] = input.dataset.kind === "numeric" ? Number(v) : v;
  }
  return record;
}

async function connect(server, collection, maxEpsilon) {
  status("connecting", "Connecting…");
  try {
    client = await LdpClient.connect(server, collection, { maxEpsilon });
  } catch (e) {
    client = null;
    status("error", `Cannot connect: ${e.code ?? ""} ${e.detail ?? e.message}`, e.code);
    return;
  }
  $("#collection-info").textContent =
    `Collection ${client.collectionId}: ε = ${client.epsilon} per report, ` +
    `${client.schema.attributes.length} attributes, ledger in ${client.storage}.`;
  renderForm(client.schema);
  showBudget();
  status("ready", "Connected. Fill in the form and submit.");
}

$("#connect").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  connect(f.get("server").trim(), f.get("collection").trim(), Number(f.get("maxEpsilon")));
});

$("#example").addEventListener("click", () => {
  for (const [k, v] of Object.entries(EXAMPLE)) {
    const input = $("#fields").querySelector(`[name="${CSS.escape(k)}"]`);
    if (input) input.value = String(v);
  }
});

$("#record").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  if (!client) return;
  $("#send").disabled = true;
  status("sending", "Randomizing and sending…");
  try {
    const receipt = await client.submit(readRecord());
    status(receipt.status, `Thank you: report ${receipt.reportId} ${receipt.status} (ε ${receipt.epsilonSpent} spent).`);
  } catch (e) {
    status("error", `Not sent: ${e.code ?? ""} — ${e.detail ?? e.message}`, e.code);
  } finally {
    $("#send").disabled = false;
    showBudget();
  }
});

await init();
const params = new URLSearchParams(location.search);
for (const k of ["server", "collection", "maxEpsilon"]) {
  if (params.has(k)) $("#connect").elements[k].value = params.get(k);
}
document.body.dataset.ready = "1";
if (params.has("server") && params.has("collection")) {
  connect(params.get("server"), params.get("collection"), Number($("#connect").elements.maxEpsilon.value));
}
