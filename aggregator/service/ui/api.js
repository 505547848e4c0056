// The admin API, same origin. The admin token lives in sessionStorage (this tab only, gone
// when it closes) and travels only in the Authorization header, never in a URL.

const KEY = "ldpsyn-admin-token";

/** The stored admin token, or null. */
export function token() {
  return sessionStorage.getItem(KEY);
}

/** Stores the admin token for this tab. */
export function setToken(value) {
  sessionStorage.setItem(KEY, value);
}

/** Forgets the admin token. */
export function forgetToken() {
  sessionStorage.removeItem(KEY);
}

/** An API error carrying the problem document's type and status. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.type = problem?.type ?? null;
  }
}

/** GET `path` with the admin token; the raw Response (2xx) or an ApiError. */
export async function get(path) {
  const headers = { accept: "application/json" };
  const t = token();
  if (t) headers.authorization = `Bearer ${t}`;
  const resp = await fetch(path, { headers, cache: "no-store" });
  if (!resp.ok) {
    let problem = null;
    try { problem = await resp.json(); } catch { /* not a problem document */ }
    throw new ApiError(resp.status, problem);
  }
  return resp;
}

/** POST to `path` with the admin token (no body); the JSON answer or an ApiError. */
export async function post(path) {
  const headers = { accept: "application/json" };
  const t = token();
  if (t) headers.authorization = `Bearer ${t}`;
  const resp = await fetch(path, { method: "POST", headers, cache: "no-store" });
  if (!resp.ok) {
    let problem = null;
    try { problem = await resp.json(); } catch { /* not a problem document */ }
    throw new ApiError(resp.status, problem);
  }
  return resp.json();
}

/** GET `path` as JSON. */
export async function getJson(path) {
  return (await get(path)).json();
}

const enc = encodeURIComponent;

/** Every collection with its status (admin). */
export const collections = () => getJson("/v1/collections");
/** One collection's public config and status. */
export const collection = (id) => getJson(`/v1/collections/${enc(id)}`);
/** Finalizes a collection (admin): it takes no more reports; the model is built. */
export const finalize = (id) => post(`/v1/collections/${enc(id)}/finalize`);
/** `&provisional=true` when asked for: before finalize, the model refitted from the reports so far. */
const prov = (provisional) => (provisional ? "provisional=true" : "");
/**
 * The model description (admin): the final model, or with `provisional` before finalize the
 * model refitted from the reports so far (`provisional: true`, `reports`, `fitted_at`).
 */
export const model = (id, { provisional = false } = {}) =>
  getJson(`/v1/collections/${enc(id)}/model${provisional ? `?${prov(true)}` : ""}`);
/** The marginal of `names` (attribute names) with standard errors (admin); `provisional` as for `model`. */
export const marginal = (id, names, { provisional = false } = {}) =>
  getJson(`/v1/collections/${enc(id)}/marginals?attrs=${names.map(enc).join(",")}${provisional ? `&${prov(true)}` : ""}`);
/** The synthetic download as a Blob (admin; the token in the header, not the URL). */
export async function synthetic(id, { rows, seed, format, numeric }) {
  const q = new URLSearchParams({ rows, seed, format, numeric });
  return (await get(`/v1/collections/${enc(id)}/synthetic?${q}`)).blob();
}
