// The console's one page: who is signed in, the view the path names, live updates (SSE).

import { get, post, Refused } from "./api.js";
import { h, tick } from "./dom.js";
import * as pages from "./pages.js";

const page = document.getElementById("page");
let me = null;
let live = null; // the latest snapshot from /api/live: { fleet, queue }
let source = null;

function signIn() {
  page.replaceChildren(h("div", { class: "signin" },
    h("h1", {}, "Sign in to the gpufleet console"),
    h("p", {}, "Run this where your gpufleet CLI is signed in, and open the link it prints:"),
    h("p", {}, h("code", {}, "gpufleet console login")),
    h("p", { class: "muted" }, "The link works once, for two minutes. The console then acts for " +
      "you with a short-lived credential of your own (12 hours at most), kept only in its memory.")));
}

function nav() {
  const items = [["/", "Overview"], ["/fleet", "Fleet"], ["/queue", "Queue"], ["/costs", "Costs"],
    ["/alerts", "Alerts"], ...(me.operator ? [["/admin", "Accounts"]] : [])];
  const here = location.pathname;
  document.getElementById("nav").replaceChildren(...items.map(([href, text]) => h("a", {
    href, "data-link": true,
    class: (href === "/" ? here === "/" : here.startsWith(href)) ? "here" : null,
  }, text)));
  document.getElementById("who").replaceChildren(
    me.operator ? "operator (every account)" : `account ${me.account}`,
    h("button", { id: "logout", onclick: async () => { await post("/logout"); location.assign("/"); } }, "Sign out"));
}

const refresh = () => render();

// Which view the path names; `live` views are drawn from the SSE snapshot.
function route() {
  const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const query = new URLSearchParams(location.search);
  switch (parts[0]) {
    case undefined:
      return { live: true, draw: (s) => [h("h1", {}, "Overview"),
        pages.fleetPage(me, s.fleet, null, null, refresh).slice(2), pages.queueTables(me, s.queue)] };
    case "fleet":
      return { live: true, draw: (s) => pages.fleetPage(me, s.fleet, parts[1], parts[2], refresh) };
    case "queue":
      return { live: true, draw: (s) => [h("h1", {}, "Queue"), pages.queueTables(me, s.queue)] };
    case "jobs":
      return { load: () => pages.jobPage(me, parts[1], query.get("account")) };
    case "costs":
      return { load: () => pages.costsPage(me, query.get("period") === "hour" ? "hour" : "day") };
    case "alerts":
      return { load: () => pages.alertsPage(me) };
    case "admin":
      return { load: () => pages.adminPage(me, refresh) };
    default:
      return { load: async () => h("p", {}, "No such page.") };
  }
}

// A view is a tree of elements and arrays; null and false are what was left out.
function show(view) {
  page.replaceChildren(...[view].flat(Infinity).filter((x) => x !== null && x !== undefined && x !== false));
}

async function render() {
  nav();
  const view = route();
  try {
    if (view.live) {
      if (live === null) live = await get("/api/snapshot").catch(() => null);
      show(live ? view.draw(live) : h("p", { class: "muted" }, "Loading…"));
    } else {
      show(await view.load());
    }
  } catch (e) {
    if (e instanceof Refused && e.status === 401) return signIn();
    page.replaceChildren(h("p", { class: "error" }, e.message));
  }
}

function listen() {
  source = new EventSource("/api/live");
  source.addEventListener("snapshot", (event) => {
    const data = JSON.parse(event.data);
    if (data.error) return;
    live = data;
    if (route().live) render();
  });
  source.addEventListener("signed_out", () => { source.close(); signIn(); });
}

document.addEventListener("click", (event) => {
  const a = event.target.closest("a[data-link]");
  if (!a || event.ctrlKey || event.metaKey || event.button !== 0) return;
  event.preventDefault();
  history.pushState({}, "", a.getAttribute("href"));
  render();
});
window.addEventListener("popstate", () => render());

setInterval(() => tick(page), 1000);

try {
  me = await get("/api/me");
  listen();
  render();
} catch (e) {
  signIn();
}
