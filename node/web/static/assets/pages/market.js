// Market: the offers this node holds, prices per resource now and over the
// last 24 hours, and why my last job was not placed, if it was not.

import { api, live, debounce } from "../api.js";
import { h, fill, table, dl } from "../dom.js";
import { credits, size, shortPeer, ago, shortID } from "../format.js";
import { lineChart } from "../chart.js";
import { section } from "./common.js";

// price shows a unit price; 0 means no available machine lends it.
function price(micro) {
  return micro ? credits(micro) : "—";
}

export function render(main) {
  const offers = h("div", { id: "offers" }, h("p", { class: "muted" }, "…"));
  const prices = h("div", { id: "prices" }, h("p", { class: "muted" }, "…"));
  const history = h("div", { id: "price-history" }, h("p", { class: "muted" }, "…"));
  const rejection = h("div", { id: "rejection" }, h("p", { class: "muted" }, "…"));

  main.append(
    h("h1", null, "Market"),
    h("div", { class: "cols" },
      section("now", "Prices now", prices),
      section("last", "My last job", rejection)),
    section("hist", "Prices over the last 24 hours (median per unit-hour)", history),
    section("offers-s", "Offers in the network", offers),
  );

  async function loadOffers() {
    let list;
    try {
      list = await api("GET", "/offers");
    } catch (e) {
      fill(offers, h("p", { class: "error" }, e.message));
      return;
    }
    list.sort((a, b) => a.price - b.price);
    fill(offers, table({
      id: "offers-table",
      columns: [{ label: "Machine" }, { label: "Site" }, { label: "Cores", num: true }, { label: "Memory", num: true }, { label: "GPUs", num: true },
        { label: "Busy" }, { label: "Price/h", num: true }, { label: "Window" }, { label: "Expires" }],
      rows: list.map((o) => [
        [h("span", { dataset: { machine: o.machine } }, o.moniker || shortPeer(o.machine)), o.self ? h("span", { class: "tag" }, "this one") : null,
          h("div", { class: "muted small mono" }, shortPeer(o.machine))],
        o.site || "",
        String(o.cores),
        size(o.mem_bytes),
        String(o.gpus),
        o.allocated && o.allocated.cores ? `${o.allocated.cores} cores` : "idle",
        credits(o.price),
        o.window || "always",
        ago(o.expires_at),
      ]),
      empty: "No offers: no machine in this node's view lends anything now.",
    }));
  }

  async function loadPrices() {
    let mk;
    try {
      mk = await api("GET", "/prices");
    } catch (e) {
      fill(prices, h("p", { class: "error" }, e.message));
      return;
    }
    const avail = (mk.machines || []).filter((m) => m.available).length;
    fill(prices,
      table({
        id: "prices-table",
        columns: [{ label: "Resource" }, { label: "Lowest", num: true }, { label: "Median", num: true }],
        rows: [
          ["Core-hour", price(mk.lowest.core), price(mk.median.core)],
          ["GiB-hour of memory", price(mk.lowest.mem_gib), price(mk.median.mem_gib)],
          ["GPU-hour", price(mk.lowest.gpu), price(mk.median.gpu)],
        ],
      }),
      h("p", { class: "muted small" }, `Credits, from ${(mk.machines || []).length} machine(s), ${avail} available now (scheduler view: ${mk.subset}). —: no available machine lends it.`));
  }

  async function loadHistory() {
    let samples;
    try {
      samples = await api("GET", "/prices/history?hours=24");
    } catch (e) {
      fill(history, h("p", { class: "error" }, e.message));
      return;
    }
    const points = samples.map((p) => ({ t: new Date(p.time).getTime(), values: [p.median.core, p.median.mem_gib, p.median.gpu].map((v) => v || null) }));
    const last = samples[samples.length - 1];
    fill(history, lineChart({
      title: "Median prices over the last 24 hours",
      summary: last ? `${samples.length} samples; now a core-hour costs ${credits(last.median.core)} credits, a GiB-hour ${credits(last.median.mem_gib)}, a GPU-hour ${credits(last.median.gpu)}.` : "No samples yet.",
      points,
      series: [{ label: "core-hour" }, { label: "GiB-hour of memory" }, { label: "GPU-hour" }],
      fmt: (v) => credits(v),
    }));
  }

  async function loadLastJob() {
    let jobs;
    try {
      jobs = await api("GET", "/jobs");
    } catch (e) {
      fill(rejection, h("p", { class: "error" }, e.message));
      return;
    }
    const j = jobs[0];
    if (!j) {
      fill(rejection, h("p", { class: "muted" }, "No jobs submitted from this node yet."));
      return;
    }
    const link = h("a", { href: `/jobs/${j.id}`, "data-nav": "" }, j.spec.name);
    if (j.state === "failed") {
      fill(rejection,
        h("p", null, "Your last job, ", link, ", was not run to the end:"),
        h("p", { class: "error", id: "rejection-reason" }, j.reason || "no reason recorded"),
        h("p", { class: "muted small" }, "When the reason is a missing resource or a price above your maximum, lend more, raise the maximum, or try a smaller shape."));
    } else {
      const now = { succeeded: "succeeded", cancelled: "was cancelled" }[j.state] || `is ${j.state}`;
      fill(rejection, h("p", null, "Your last job, ", link, ` (${shortID(j.id)}), ${now}: it was not rejected.`),
        dl([["Updated", ago(j.updated)]]));
    }
  }

  loadOffers();
  loadPrices();
  loadHistory();
  loadLastJob();
  const onOffers = debounce(() => {
    loadOffers();
    loadPrices();
  }, 250);
  const stops = [
    live.on("offers", onOffers),
    live.on("jobs", debounce(loadLastJob, 500)),
  ];
  const every = setInterval(loadHistory, 60000);
  return () => {
    clearInterval(every);
    stops.forEach((s) => s());
  };
}
