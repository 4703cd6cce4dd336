// Resources: the machine's inventory, the lend form (checked against the
// inventory here and by the node), machines I own, and taking this one
// back (lend --stop).

import { api, live } from "../api.js";
import { h, fill, dl, table } from "../dom.js";
import { credits, parseCredits, size, resources, shortPeer, when, duration, GiB } from "../format.js";
import { field, formError, clearErrors, showError, busy } from "../forms.js";
import { machineState, section } from "./common.js";

export function render(main) {
  const inventory = h("div", { id: "inventory" }, h("p", { class: "muted" }, "…"));
  const lendState = h("div", { id: "lend-state" }, h("p", { class: "muted" }, "…"));
  const mine = h("div", { id: "owned" }, h("p", { class: "muted" }, "…"));
  const done = h("p", { class: "ok", role: "status", id: "lend-done" });
  let inv = null;
  let state = null;

  const form = h("form", { id: "lend-form", novalidate: true, "aria-labelledby": "lend-h" },
    formError("lend-error"),
    h("div", { class: "row" },
      field({ name: "cores", label: "Cores", type: "number", attrs: { min: 1, step: 1, inputmode: "numeric", required: true }, hint: "…" }),
      field({ name: "mem", apiField: "mem_bytes", label: "Memory (GiB)", type: "number", attrs: { min: 0.25, step: 0.25, required: true }, hint: "…" }),
      field({ name: "gpus", label: "GPUs", type: "number", value: "0", attrs: { min: 0, step: 1, inputmode: "numeric" }, hint: "…" })),
    h("fieldset", { "aria-describedby": "window-hint" },
      h("legend", null, "Availability window (daily, this machine's local time)"),
      h("p", { class: "hint muted small", id: "window-hint" }, "Leave both empty to lend around the clock; 19:00 to 07:00 lends nights."),
      h("div", { class: "row" },
        field({ name: "window_start", apiField: "window", label: "From", type: "time" }),
        field({ name: "window_end", apiField: "window-end", label: "Until", type: "time" }))),
    h("fieldset", null,
      h("legend", null, "Reserve prices (credits per hour; empty: the node's defaults)"),
      h("div", { class: "row" },
        field({ name: "price_core", apiField: "price", label: "Per core", attrs: { inputmode: "decimal", placeholder: "default" } }),
        field({ name: "price_mem", apiField: "price-mem", label: "Per GiB of memory", attrs: { inputmode: "decimal", placeholder: "default" } }),
        field({ name: "price_gpu", apiField: "price-gpu", label: "Per GPU", attrs: { inputmode: "decimal", placeholder: "default" } }))),
    h("div", { class: "actions" }, h("button", { type: "submit", id: "lend-submit" }, "Lend"), done));

  const stopBox = h("div", { id: "stop-box" });
  const holds = h("div", { id: "holds" }, h("p", { class: "muted" }, "…"));

  main.append(
    h("h1", null, "Resources"),
    h("div", { class: "cols" },
      section("inv", "This machine", inventory),
      section("lending", "Lending now", lendState, stopBox)),
    section("holds", "Holds on this machine", holds),
    section("lend", "Lend this machine", form),
    section("mine", "Machines I own", mine),
  );

  function hints() {
    if (!inv) return;
    const set = (name, text) => {
      const el = document.getElementById(`f-${name}-hint`);
      if (el) el.textContent = text;
    };
    set("cores", `This machine has ${inv.cores}.`);
    set("mem", `This machine has ${size(inv.mem_bytes)}.`);
    set("gpus", `This machine has ${(inv.gpus || []).length}.`);
    form.elements.cores.max = inv.cores;
    form.elements.gpus.max = (inv.gpus || []).length;
  }

  function prefill() {
    const s = state && state.settings;
    if (!s) return;
    const e = form.elements;
    e.cores.value = s.cores;
    e.mem.value = Number((s.mem_bytes / GiB).toFixed(2));
    e.gpus.value = s.gpus || 0;
    if (s.window) [e.window_start.value, e.window_end.value] = s.window.split("-");
    if (s.price) {
      e.price_core.value = credits(s.price.core_hour);
      e.price_mem.value = credits(s.price.mem_gib_hour);
      e.price_gpu.value = credits(s.price.gpu_hour);
    }
  }

  async function loadInventory() {
    try {
      inv = await api("GET", "/inventory");
    } catch (e) {
      fill(inventory, h("p", { class: "error" }, e.message));
      return;
    }
    const gpus = inv.gpus || [];
    fill(inventory, dl([
      ["Cores", String(inv.cores)],
      ["Memory", size(inv.mem_bytes)],
      ["GPUs", gpus.length ? gpus.map((g) => `${g.model} (${size(g.mem_bytes)})`).join(", ") : "none"],
      ["Free disk", size(inv.disk_free_bytes)],
      ["System", `${inv.os}/${inv.arch}`],
      ["Python", inv.python || "not found"],
      ["TensorFlow", inv.tensorflow || "not importable"],
    ], { id: "inventory-list" }));
    hints();
  }

  // drawHolds lists what schedulers hold here: each for a job whose
  // bidder can pay; the owner may drop any that runs no worker.
  function drawHolds(st) {
    const list = st.holds || [];
    if (!list.length) {
      fill(holds, h("p", { class: "muted", id: "holds-none" }, "No holds: nobody has reserved this machine's capacity."));
      return;
    }
    const msg = h("p", { class: "error", role: "alert" });
    const release = (id) => async (ev) => {
      ev.target.disabled = true;
      try {
        const next = await api("DELETE", `/lend/holds/${encodeURIComponent(id)}`);
        drawLend(next);
      } catch (e) {
        msg.textContent = e.message;
        ev.target.disabled = false;
      }
    };
    fill(holds, table({
      id: "holds-table",
      columns: [{ label: "Hold" }, { label: "State" }, { label: "Job" }, { label: "Resources" }, { label: "Paid by" }, { label: "Lapses" }, { label: "" }],
      rows: list.map((x) => [
        x.id, x.state, shortPeer(x.job_id), resources({ cores: x.cores, mem_bytes: x.mem_bytes, gpus: x.gpus }),
        shortPeer(x.account), x.expires ? when(x.expires) : "—",
        x.state === "running" ? "" : h("button", { type: "button", class: "secondary small", "aria-label": `Release hold ${x.id}`, onclick: release(x.id) }, "Release"),
      ]),
    }), msg);
  }

  function drawLend(st) {
    const first = state === null;
    state = st;
    drawHolds(st);
    if (!st.lending) {
      fill(lendState, h("p", { id: "lend-status" }, h("span", { class: "badge" }, "not lending"), " This machine lends nothing."));
      stopBox.replaceChildren();
    } else {
      const s = st.settings;
      fill(lendState,
        h("p", { id: "lend-status" }, st.offering ? h("span", { class: "badge good" }, "offering") : h("span", { class: "badge warn" }, "outside its window"),
          " ", resources({ cores: s.cores, mem_bytes: s.mem_bytes, gpus: s.gpus })),
        dl([
          ["Window", s.window || "around the clock"],
          ["Reserve prices", s.price ? `${credits(s.price.core_hour)}/core, ${credits(s.price.mem_gib_hour)}/GiB, ${credits(s.price.gpu_hour)}/GPU per hour` : "defaults"],
          st.since ? ["Since", when(st.since)] : null,
          st.next_change ? ["Window changes", when(st.next_change)] : null,
          st.offering && st.announce_every_s ? ["Announced", `every ${duration(st.announce_every_s)}; peers keep it ${duration(st.offer_ttl_s)}`] : null,
        ]),
        ...(st.warnings || []).map((w) => h("p", { class: "error", role: "alert" }, w)));
      drawStop();
    }
    if (first) prefill();
  }

  function drawStop(confirming) {
    if (!confirming) {
      fill(stopBox, h("div", { class: "actions" },
        h("button", { type: "button", class: "danger", id: "stop-lend", onclick: () => drawStop(true) }, "Take this machine back")));
      return;
    }
    const msg = h("p", { class: "error", role: "alert" });
    const yes = h("button", { type: "button", class: "danger", id: "stop-confirm" }, "Yes, take it back");
    const no = h("button", { type: "button", class: "secondary", onclick: () => drawStop(false) }, "Keep lending");
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      try {
        drawLend(await api("DELETE", "/lend"));
        done.textContent = "This machine is back: its offer was withdrawn.";
      } catch (e) {
        msg.textContent = e.message;
        yes.disabled = false;
      }
    });
    fill(stopBox, h("div", { class: "notice", role: "group", "aria-label": "Confirm taking the machine back" },
      h("p", null, "Withdraw this machine from the market? Running jobs get a minute to finish or checkpoint."),
      h("div", { class: "actions" }, yes, no), msg));
    no.focus();
  }

  async function loadMine() {
    let o;
    try {
      o = await api("GET", "/dashboard");
    } catch (e) {
      fill(mine, h("p", { class: "error" }, e.message));
      return;
    }
    fill(mine, table({
      id: "owned-table",
      columns: [{ label: "Machine" }, { label: "Site" }, { label: "State" }, { label: "Lent" }, { label: "Price/h", num: true },
        { label: "Jobs done", num: true }, { label: "Failed", num: true }, { label: "Earned", num: true }],
      rows: o.machines.map((m) => [
        [m.moniker || shortPeer(m.machine), m.self ? h("span", { class: "tag" }, "this one") : null],
        m.site || "",
        machineState(m),
        m.lent && m.lent.cores ? resources(m.lent) : "—",
        m.per_hour ? credits(m.per_hour) : "—",
        String(m.completed),
        String(m.failed),
        credits(m.earned),
      ]),
      rowAttrs: (i) => ({ class: o.machines[i].state === "lost" ? "panic" : null }),
    }));
  }

  // check validates the form against the inventory; it answers the lend
  // request, or shows what is wrong and answers null.
  function check() {
    const e = form.elements;
    const bad = (name, msg) => {
      showError(form, { message: msg }, name);
      return null;
    };
    const cores = Number(e.cores.value);
    if (!e.cores.value || !Number.isInteger(cores) || cores < 1) return bad("cores", "Cores: a whole number, at least 1.");
    if (inv && cores > inv.cores) return bad("cores", `Cannot lend ${cores} cores: this machine has ${inv.cores}.`);
    const gib = Number(e.mem.value);
    if (!e.mem.value || !(gib > 0)) return bad("mem_bytes", "Memory: more than 0 GiB.");
    const mem = Math.round(gib * GiB);
    if (inv && mem > inv.mem_bytes) return bad("mem_bytes", `Cannot lend ${size(mem)} of memory: this machine has ${size(inv.mem_bytes)}.`);
    const gpus = Number(e.gpus.value || 0);
    if (!Number.isInteger(gpus) || gpus < 0) return bad("gpus", "GPUs: a whole number, 0 or more.");
    if (inv && gpus > (inv.gpus || []).length) return bad("gpus", `Cannot lend ${gpus} GPUs: this machine has ${(inv.gpus || []).length}.`);
    const ws = e.window_start.value;
    const we = e.window_end.value;
    if (Boolean(ws) !== Boolean(we)) return bad("window", "Give both ends of the window, or neither.");
    if (ws && ws === we) return bad("window", "The window must not start and end at the same time.");
    const req = { cores, mem_bytes: mem, gpus };
    if (ws) req.window = `${ws.slice(0, 5)}-${we.slice(0, 5)}`;
    const prices = [["price_core", "core_hour", "price"], ["price_mem", "mem_gib_hour", "price-mem"], ["price_gpu", "gpu_hour", "price-gpu"]];
    if (prices.some(([n]) => e[n].value.trim() !== "")) {
      req.price = {};
      for (const [n, key, f] of prices) {
        const v = e[n].value.trim() === "" ? 0 : parseCredits(e[n].value);
        if (v === null) return bad(f, "A price in credits, such as 0.25 (at most six decimals).");
        req.price[key] = v;
      }
    }
    return req;
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    done.textContent = "";
    const req = check();
    if (!req) return;
    await busy(form, async () => {
      try {
        const st = await api("PUT", "/lend", req);
        drawLend(st);
        done.textContent = st.offering ? "Lent: the offer is out." : "Saved: the offer goes out when the window opens.";
        loadMine();
      } catch (e) {
        showError(form, e);
      }
    });
  });

  loadInventory();
  loadMine();
  const stops = [
    live.on("lend", drawLend),
    live.on("offers", () => loadMine()),
  ];
  return () => stops.forEach((s) => s());
}
