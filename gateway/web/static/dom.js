// Building the page: elements from data, never HTML from data (text goes in as text).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function table(headers, rows, empty = "none") {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}

export function state(name) {
  return h("span", { class: `state ${name}` }, name);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

// Seconds from `iso` to now, by this browser's clock; null without a time.
export function since(iso) {
  const at = iso ? Date.parse(iso) : NaN;
  return isNaN(at) ? null : (Date.now() - at) / 1000;
}

// A cell of how long it has been since `iso`, kept counting by `tick`.
export function waited(iso) {
  return h("td", { "data-since": iso }, duration(since(iso)));
}

// Each cell `waited` made, counted again (the live stream sends nothing while it is unchanged).
export function tick(root) {
  for (const cell of root.querySelectorAll("[data-since]")) {
    cell.textContent = duration(since(cell.dataset.since));
  }
}

export function when(iso) {
  if (!iso) return "-";
  const at = new Date(iso);
  return isNaN(at) ? String(iso) : at.toLocaleString();
}

export function pct(value) {
  return value === null || value === undefined ? "-" : `${Math.round(value)}%`;
}

export function meter(label, value, max, text) {
  const share = value === null || value === undefined || !max ? 0 : Math.min(1, value / max);
  const fill = h("span");
  fill.style.width = `${Math.round(share * 100)}%`; // CSSOM: allowed by the page's CSP
  return [
    h("div", { class: "metric" }, h("span", {}, label), h("span", {}, text)),
    h("div", { class: share > 0.85 ? "bar hot" : "bar" }, fill),
  ];
}
