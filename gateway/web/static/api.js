// The console's JSON API (same origin; the session cookie goes with every request).

export class Refused extends Error {
  constructor(status, body) {
    super(body?.error?.message || body?.detail || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function answer(response) {
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Refused(response.status, body);
  return body;
}

export async function get(path) {
  return answer(await fetch(path, { credentials: "same-origin" }));
}

export async function post(path, body = {}) {
  return answer(await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  }));
}

export async function remove(path) {
  return answer(await fetch(path, { method: "DELETE", credentials: "same-origin" }));
}

// An operator's action goes on the connection of the account that owns the object.
export function forAccount(path, me, account) {
  return me.operator && account ? `${path}?account=${encodeURIComponent(account)}` : path;
}
