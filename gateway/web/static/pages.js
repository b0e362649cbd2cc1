// The console's pages: each takes what the API answered and returns the elements to show.

import { forAccount, get, post, remove } from "./api.js";
import { h, meter, pct, state, table, waited, when } from "./dom.js";

const link = (href, text) => h("a", { href, "data-link": true }, text);

function jobLink(me, id, owner) {
  return link(forAccount(`/jobs/${encodeURIComponent(id)}`, me, owner), id);
}

// --- the fleet: all nodes, one region, one node (the multi-tier view) -------------------

function nodeCard(me, node, refresh) {
  const gpus = node.gpus.map((g) => [
    ...meter(`GPU ${g.index} ${node.gpu_models[g.index] || ""}`, g.utilization_pct, 100,
      `${pct(g.utilization_pct)} · ${g.temperature_c ?? "-"}°C · ${g.memory_used_mb ?? "-"} MB`),
  ]);
  const toggle = h("button", {
    onclick: async () => {
      const path = forAccount(`/api/nodes/${encodeURIComponent(node.name)}/maintenance`, me, node.owner);
      try {
        await post(path, { maintenance: node.state !== "maintenance" });
      } catch (e) {
        alert(e.message);
      }
      refresh();
    },
  }, node.state === "maintenance" ? "Back in service" : "Maintenance");
  return h("div", { class: "card", "data-node": node.minion_id },
    h("h3", {}, link(`/fleet/${encodeURIComponent(node.region)}/${encodeURIComponent(node.name)}`, node.name),
      " ", state(node.state)),
    h("div", { class: "muted" }, `${node.owner} · ${node.kind}${node.simulated ? " · simulated" : ""} · seen ${when(node.last_seen)}`),
    meter("CPU", node.cpu_pct, 100, pct(node.cpu_pct)),
    meter("RAM", node.ram_used_mb, null, node.ram_used_mb == null ? "-" : `${node.ram_used_mb} MB used`),
    meter("Disk", node.disk_used_pct, 100,
      `${pct(node.disk_used_pct)}${node.disk_free_gb == null ? "" : ` · ${node.disk_free_gb.toFixed(1)} GB free`}`),
    gpus,
    h("div", { class: "muted" }, node.running.length ? `running ${node.running.join(", ")}` : "idle"),
    ["active", "maintenance"].includes(node.state) ? toggle : null,
  );
}

export function fleetPage(me, fleet, region, nodeName, refresh) {
  const crumbs = h("div", { class: "crumbs" }, link("/fleet", "all nodes"),
    region ? [" / ", link(`/fleet/${encodeURIComponent(region)}`, region)] : null,
    nodeName ? [" / ", nodeName] : null);
  const groups = fleet.regions
    .filter((g) => !region || g.region === region)
    .map((g) => {
      const nodes = g.nodes.filter((n) => !nodeName || n.name === nodeName || n.minion_id === nodeName);
      return h("section", { "data-region": g.region },
        h("h2", {}, link(`/fleet/${encodeURIComponent(g.region)}`, `Region ${g.region}`),
          h("span", { class: "muted" }, ` · ${g.nodes.length} nodes · ${g.gpus} GPUs · GPU use ${pct(g.gpu_utilization_pct)}`)),
        h("div", { class: "grid" }, nodes.map((n) => nodeCard(me, n, refresh))));
    });
  return [
    h("h1", {}, "Fleet"), crumbs,
    h("div", { class: "stats" },
      h("div", { class: "stat" }, h("b", {}, fleet.nodes), "nodes"),
      h("div", { class: "stat" }, h("b", {}, fleet.gpus), "GPUs"),
      h("div", { class: "stat" }, h("b", {}, fleet.regions.length), "regions")),
    groups.length ? h("div", { class: "regions" }, groups) : h("p", { class: "muted" }, "No nodes."),
  ];
}

// --- the queue and the running jobs -----------------------------------------------------

export function queueTables(me, queue) {
  const queued = queue.queued.map((j) => h("tr", { "data-job": j.id },
    h("td", {}, j.position), h("td", {}, jobLink(me, j.id, j.owner)), h("td", {}, j.name),
    me.operator ? h("td", {}, j.owner) : null,
    h("td", { class: "reason" }, j.reason || "-"), waited(j.queued_at)));
  const running = queue.running.map((j) => h("tr", { "data-job": j.id },
    h("td", {}, jobLink(me, j.id, j.owner)), h("td", {}, j.name),
    me.operator ? h("td", {}, j.owner) : null, h("td", {}, state(j.state)),
    h("td", {}, j.nodes.join(", ") || "-"), h("td", {}, when(j.started_at))));
  const recent = queue.recent.map((j) => h("tr", { "data-job": j.id },
    h("td", {}, jobLink(me, j.id, j.owner)), h("td", {}, j.name),
    me.operator ? h("td", {}, j.owner) : null, h("td", {}, state(j.state))));
  const owner = me.operator ? ["Account"] : [];
  return [
    h("h2", {}, `Queue (${queue.queued.length})`),
    h("div", { id: "queue" }, table(["#", "Job", "Name", ...owner, "Why it waits", "Waiting"], queued, "Nothing is waiting.")),
    h("h2", {}, `Running (${queue.running.length})`),
    h("div", { id: "running" }, table(["Job", "Name", ...owner, "State", "Nodes", "Started"], running, "Nothing runs.")),
    h("h2", {}, "Ended lately"),
    h("div", { id: "recent" }, table(["Job", "Name", ...owner, "State"], recent)),
  ];
}

// --- one job ------------------------------------------------------------------------------

export async function jobPage(me, id, account) {
  const page = await get(forAccount(`/api/jobs/${encodeURIComponent(id)}`, me, account));
  const job = page.job;
  const history = job.history.map((e) => h("tr", {}, h("td", {}, state(e.state)), h("td", {}, when(e.at)), h("td", {}, e.reason || "")));
  const phases = Object.entries(job.cold_start || {}).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, `${Number(v).toFixed(3)} s`)));
  const workers = job.workers.map((w) => h("tr", {},
    h("td", {}, w.index), h("td", {}, state(w.state)), h("td", {}, w.node || "-"),
    h("td", {}, w.gpu_model || (w.cpu_count ? `${w.cpu_count} CPUs` : "-")), h("td", {}, w.rate || "-"),
    h("td", {}, w.charge || "-"), h("td", {}, w.exit_code ?? "-"),
    h("td", {}, (w.staging || []).map((s) => `${s.name || s.kind || "item"}: ${s.state || ""}`).join(", ") || "-"),
    h("td", {}, Object.entries(w.cold_start || {}).map(([k, v]) => `${k} ${Number(v).toFixed(2)}s`).join(", ") || "-")));
  const ended = ["finished", "failed", "stopped"].includes(job.state);
  const cancel = ended ? null : h("button", {
    class: "danger",
    onclick: async () => {
      try {
        await post(forAccount(`/api/jobs/${encodeURIComponent(id)}/cancel`, me, job.owner));
      } catch (e) {
        alert(e.message);
      }
      window.dispatchEvent(new Event("popstate"));
    },
  }, "Cancel job");
  return [
    h("h1", {}, `Job ${job.id} `, state(job.state), " ", cancel),
    h("p", { class: "muted" }, `${job.name} · account ${job.owner} · project ${job.project}` +
      (job.queue_reason ? ` · waiting: ${job.queue_reason}` : "")),
    h("h2", {}, "State history"), table(["State", "At", "Why"], history),
    phases.length ? [h("h2", {}, "Cold start"), table(["Phase", "Took"], phases)] : null,
    h("h2", {}, "Workers"),
    table(["#", "State", "Node", "GPU", "Rate", "Billed as", "Exit", "Staging", "Cold start"], workers),
    h("h2", {}, "Log tail"),
    h("pre", { class: "log", id: "log" }, page.log_tail || "(no output yet)"),
  ];
}

// --- costs and earnings, alerts, accounts -------------------------------------------------

export async function costsPage(me, period) {
  const { ledgerChart } = await import("./charts.js");
  const all = await get(`/api/costs?period=${period}`);
  const width = Math.min(1300, document.querySelector("main").clientWidth - 40);
  const sums = (s, key) => s.points.reduce((a, p) => a + Number(p[key]), 0).toFixed(6);
  return [
    h("h1", {}, "Costs and earnings"),
    h("div", { class: "crumbs" }, link("/costs?period=day", "per day"), " · ", link("/costs?period=hour", "per hour")),
    all.map((s) => [
      h("p", { class: "muted" }, `${s.account}: spent ${sums(s, "spent")}, earned ${sums(s, "earned")} in these ${s.points.length} ${s.period}s`),
      s.points.length ? ledgerChart(s, width) : h("p", { class: "muted" }, "No ledger entries yet."),
    ]),
  ];
}

export async function alertsPage(me) {
  const answer = await get("/api/alerts");
  const rows = (wanted) => answer.alerts.alerts.filter((a) => wanted.includes(a.state)).map((a) => h("tr", { "data-alert": a.id },
    h("td", {}, state(a.state)), h("td", {}, a.rule_name),
    me.operator ? h("td", {}, a.account || "-") : null,
    h("td", {}, Object.entries(a.labels).map(([k, v]) => `${k}=${v}`).join(" ")),
    h("td", {}, a.value ?? "-"), h("td", {}, a.annotations.summary || a.annotations.description || ""),
    h("td", {}, when(a.fired_at || a.started_at)), h("td", {}, when(a.resolved_at))));
  const head = ["State", "Rule", ...(me.operator ? ["Account"] : []), "Labels", "Value", "Summary", "Since", "Resolved"];
  return [
    h("h1", {}, "Alerts"),
    answer.unavailable ? h("p", { class: "muted" }, `Alerts cannot be read now: ${answer.unavailable}`) : null,
    h("h2", {}, "Firing and pending"), table(head, rows(["firing", "pending"]), "Nothing is firing."),
    h("h2", {}, "Resolved"), table(head, rows(["resolved"]), "None resolved lately."),
  ];
}

export async function adminPage(me, refresh) {
  if (!me.operator) return h("p", { class: "error" }, "Operators only.");
  const accounts = await get("/api/accounts");
  const name = h("input", { name: "account", placeholder: "account name", required: true });
  const plan = h("select", { name: "plan" }, ["free", "team", "enterprise"].map((p) => h("option", { value: p }, p)));
  const message = h("span", { class: "muted" });
  const form = h("form", {
    class: "inline",
    onsubmit: async (event) => {
      event.preventDefault();
      try {
        await post("/api/accounts", { account: name.value, plan: plan.value });
        refresh();
      } catch (e) {
        message.textContent = e.message;
      }
    },
  }, name, plan, h("button", { type: "submit" }, "Add account"), message);
  // Removing revokes every credential of the account and its name is never reused; the
  // provisioner refuses it while the account still has nodes (the message says which).
  const removeButton = (account) => h("button", {
    class: "danger",
    "data-account": account,
    onclick: async () => {
      const asked = `Remove account ${account}? Its users and console sessions are cut off at once, ` +
        "and its name can never be used again.";
      if (!window.confirm(asked)) return;
      try {
        await remove(`/api/accounts/${encodeURIComponent(account)}`);
        refresh();
      } catch (e) {
        message.textContent = e.message;
      }
    },
  }, "Remove");
  return [
    h("h1", {}, "Accounts"), form,
    table(["Account", ""], accounts.map((a) => h("tr", {}, h("td", {}, a), h("td", {}, removeButton(a))))),
  ];
}
