// Dashboard: balance, credits over 30 days, estimates for the next 24
// hours, my machines and my jobs, with problems in red as PLUTO's panic
// state was.

import { api, live, debounce } from "../api.js";
import { h, fill, table } from "../dom.js";
import { credits, resources, shortPeer, ago, shortID } from "../format.js";
import { barChart } from "../chart.js";
import { machineState, jobState, isProblemJob } from "./common.js";

export function render(main) {
  const balance = h("p", { class: "figure", id: "balance", "aria-live": "polite" }, "…");
  const account = h("p", { class: "muted small mono", id: "account" });
  const estimate = h("div", { id: "estimate" }, h("p", { class: "muted" }, "…"));
  const totals = h("div", { id: "totals" }, h("p", { class: "muted" }, "…"));
  const problems = h("section", { class: "problems", id: "problems", hidden: true, "aria-labelledby": "problems-h" },
    h("h2", { id: "problems-h" }, "Problems"), h("ul"));
  const chart = h("div", { id: "flows-chart" }, h("p", { class: "muted" }, "Loading the ledger…"));
  const machines = h("div", { id: "my-machines" }, h("p", { class: "muted" }, "…"));
  const jobs = h("div", { id: "my-jobs" }, h("p", { class: "muted" }, "…"));
  const err = h("p", { class: "error", role: "alert" });

  main.append(
    h("h1", null, "Dashboard"),
    err,
    problems,
    h("div", { class: "grid" },
      h("section", { "aria-labelledby": "bal-h" }, h("h2", { id: "bal-h" }, "Balance"), balance, account),
      h("section", { "aria-labelledby": "est-h" }, h("h2", { id: "est-h" }, "Next 24 hours (estimated)"), estimate),
      h("section", { "aria-labelledby": "tot-h" }, h("h2", { id: "tot-h" }, "Last 30 days"), totals)),
    h("section", { "aria-labelledby": "flows-h" }, h("h2", { id: "flows-h" }, "Credits earned and spent, last 30 days"), chart),
    h("div", { class: "cols" },
      h("section", { "aria-labelledby": "mm-h" }, h("h2", { id: "mm-h" }, "My machines"), machines),
      h("section", { "aria-labelledby": "mj-h" }, h("h2", { id: "mj-h" }, "My jobs"), jobs)),
  );

  let jobList = [];
  let overview = null;

  function drawProblems() {
    const items = [];
    for (const p of (overview && overview.problems) || []) items.push(h("li", null, p.message));
    fill(problems.querySelector("ul"), items);
    problems.hidden = items.length === 0;
  }

  async function loadOverview() {
    try {
      overview = await api("GET", "/dashboard");
      err.textContent = "";
    } catch (e) {
      err.textContent = e.message;
      return;
    }
    const o = overview;
    balance.dataset.micro = String(o.balance);
    fill(balance, credits(o.balance), h("span", { class: "unit" }, "credits"));
    account.textContent = o.account;
    const e = o.estimate;
    fill(estimate, h("dl", { class: "kv" },
      h("dt", null, "Earnings"), h("dd", { id: "est-earnings" }, `${credits(e.earnings_24h)} credits`,
        e.earnings_if_busy_24h ? h("span", { class: "muted small" }, ` (up to ${credits(e.earnings_if_busy_24h)} if all you lend is busy)`)
          : h("span", { class: "muted small" }, " (this machine lends nothing)")),
      h("dt", null, "Costs"), h("dd", { id: "est-costs" }, `${credits(e.costs_24h)} credits`)));
    fill(machines, table({
      id: "machines-table",
      columns: [{ label: "Machine" }, { label: "State" }, { label: "Lent" }, { label: "Busy" }, { label: "Price/h", num: true }, { label: "Earned", num: true }],
      rows: o.machines.map((m) => [
        [m.moniker || shortPeer(m.machine), m.self ? h("span", { class: "tag" }, "this one") : null, m.site ? h("div", { class: "muted small" }, m.site) : null],
        machineState(m),
        m.lent && m.lent.cores ? resources(m.lent) : "—",
        m.allocated && m.allocated.cores ? resources(m.allocated) : (m.workers ? `${m.workers} workers` : "idle"),
        m.per_hour ? credits(m.per_hour) : "—",
        credits(m.earned),
      ]),
      rowAttrs: (i) => ({ class: o.machines[i].state === "lost" ? "panic" : null }),
      empty: "No machines.",
    }));
    drawProblems();
  }

  function drawJobs() {
    const recent = jobList.slice(0, 10);
    fill(jobs, table({
      id: "jobs-table",
      columns: [{ label: "Job" }, { label: "State" }, { label: "Workers", num: true }, { label: "Cost", num: true }, { label: "Updated" }],
      rows: recent.map((j) => [
        h("a", { href: `/jobs/${j.id}`, "data-nav": "" }, j.name || shortID(j.id)),
        jobState(j),
        String((j.workers || []).length),
        credits(j.cost),
        ago(j.updated),
      ]),
      rowAttrs: (i) => ({ class: isProblemJob(recent[i]) ? "panic" : null }),
      empty: h("span", null, "No jobs yet. ", h("a", { href: "/jobs", "data-nav": "" }, "Submit one"), "."),
    }));
  }

  async function loadActivity() {
    let a;
    try {
      a = await api("GET", "/ledger/activity?days=30");
    } catch (e) {
      fill(chart, h("p", { class: "error" }, e.message));
      return;
    }
    fill(totals, h("dl", { class: "kv" },
      h("dt", null, "Earned"), h("dd", { id: "earned-30d" }, `${credits(a.earned)} credits`),
      h("dt", null, "Spent"), h("dd", { id: "spent-30d" }, `${credits(a.spent)} credits`)));
    const points = a.days.map((d) => ({ label: d.day.slice(5), earned: d.earned, spent: d.spent }));
    fill(chart, barChart({
      title: "Credits earned and spent per day",
      summary: `Over the last 30 days: ${credits(a.earned)} credits earned or received, ${credits(a.spent)} spent or sent.`,
      points,
      series: [{ key: "earned", label: "earned (incl. received)", cls: "earned" }, { key: "spent", label: "spent (incl. sent)", cls: "spent" }],
      fmt: (v) => credits(v),
    }));
  }

  const refresh = debounce(() => {
    loadOverview();
    loadActivity();
  }, 300);

  loadOverview();
  loadActivity();
  const stops = [
    live.on("jobs", (list) => {
      jobList = list;
      drawJobs();
      refresh();
    }),
    live.on("balance", refresh),
    live.on("lend", refresh),
    live.on("offers", debounce(loadOverview, 500)),
  ];
  if (!live.last.has("jobs")) jobs.replaceChildren(h("p", { class: "muted" }, "Waiting for the node…"));
  return () => stops.forEach((s) => s());
}
