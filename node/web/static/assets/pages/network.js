// Network: this node's health, its peers, the sites they belong to, the
// ledger's validators and the chain height.

import { api, live, debounce } from "../api.js";
import { h, fill, table, dl } from "../dom.js";
import { shortPeer, duration } from "../format.js";
import { section } from "./common.js";

export function render(main) {
  const node = h("div", { id: "this-node" }, h("p", { class: "muted" }, "…"));
  const peers = h("div", { id: "peers" }, h("p", { class: "muted" }, "…"));
  const sites = h("div", { id: "sites" }, h("p", { class: "muted" }, "…"));
  const validators = h("div", { id: "validators" }, h("p", { class: "muted" }, "…"));

  main.append(
    h("h1", null, "Network"),
    h("div", { class: "cols" },
      section("me", "This node", node),
      section("sites-s", "Sites", sites)),
    section("peers-s", "Peers", peers),
    section("val", "Validators", validators),
  );

  let status = null;
  let health = null;
  let peerList = [];
  let offers = [];
  let started = Date.now();
  let validatorsAt = Date.now();

  function drawNode() {
    if (!status) return;
    const st = status;
    fill(node, dl([
      ["Health", h("span", { id: "health", class: health === "ok" ? "badge good" : "badge panic" }, health === "ok" ? "healthy" : health || "checking…")],
      ["Moniker", st.moniker || "—"],
      ["Site", st.site || "—"],
      ["Chain", h("span", { class: "mono" }, st.chain_id)],
      ["Chain height", h("span", { id: "chain-height" }, String(st.height))],
      ["Peers", String(st.peers)],
      ["Lending", st.lending ? (st.offering ? "yes, offer out" : "yes, outside its window") : "no"],
      ["Peer ID", h("span", { class: "mono small" }, st.peer_id)],
      ["Account", h("span", { class: "mono small" }, st.account)],
      ["Ledger node", h("span", { class: "mono small" }, `${st.ledger_node_id} (RPC ${st.ledger_rpc})`)],
      ["Reachable", h("span", { id: "reachability" }, reachability(st.nat))],
      ["Public addresses", h("ul", { class: "small mono", id: "public-addrs" }, ((st.nat && st.nat.public_addrs) || []).map((a) => h("li", null, a)))],
      ["Addresses", h("ul", { class: "small mono" }, (st.addrs || []).map((a) => h("li", null, a)))],
      ["Version", `${st.version}, up ${duration(st.uptime_s + (Date.now() - started) / 1000)}`],
    ], { id: "node-info" }));
  }

  function drawSites() {
    if (!status) return;
    const bySite = new Map();
    const add = (site, id, kind) => {
      const key = site || "(no site)";
      if (!bySite.has(key)) bySite.set(key, { nodes: new Set(), machines: new Set(), cores: 0 });
      const e = bySite.get(key);
      if (kind === "node") e.nodes.add(id);
      return e;
    };
    add(status.site, status.peer_id, "node");
    for (const p of peerList) if (p.deepmarket) add(p.site, p.peer_id, "node");
    for (const o of offers) {
      const e = add(o.site, o.machine, "machine");
      e.machines.add(o.machine);
      e.cores += o.cores;
    }
    const rows = [...bySite.entries()].sort((a, b) => a[0].localeCompare(b[0]));
    fill(sites, table({
      id: "sites-table",
      columns: [{ label: "Site" }, { label: "Nodes in view", num: true }, { label: "Machines offering", num: true }, { label: "Cores offered", num: true }],
      rows: rows.map(([site, e]) => [site, String(e.nodes.size), String(e.machines.size), String(e.cores)]),
    }));
  }

  async function loadStatus() {
    try {
      status = await api("GET", "/status");
      started = Date.now();
    } catch (e) {
      fill(node, h("p", { class: "error" }, e.message));
      return;
    }
    try {
      const r = await fetch("/healthz", { credentials: "same-origin" });
      health = r.ok ? "ok" : `unhealthy (${r.status})`;
    } catch {
      health = "not answering";
    }
    drawNode();
    drawSites();
  }

  async function loadPeers() {
    try {
      [peerList, offers] = await Promise.all([api("GET", "/peers"), api("GET", "/offers")]);
    } catch (e) {
      fill(peers, h("p", { class: "error" }, e.message));
      return;
    }
    peerList.sort((a, b) => (a.site || "").localeCompare(b.site || "") || (a.moniker || "").localeCompare(b.moniker || ""));
    fill(peers, table({
      id: "peers-table",
      columns: [{ label: "Peer" }, { label: "Site" }, { label: "Latency", num: true }, { label: "Score", num: true }, { label: "Direction" }, { label: "Connection" }, { label: "Version" }],
      rows: peerList.map((p) => [
        [p.moniker || shortPeer(p.peer_id), p.deepmarket ? null : h("span", { class: "tag" }, "not DeepMarket"), h("div", { class: "muted small mono" }, shortPeer(p.peer_id))],
        p.site || "",
        p.latency_ms ? `${p.latency_ms.toFixed(1)} ms` : "—",
        p.score.toFixed(1),
        p.direction,
        p.connection === "relayed" ? h("span", { class: "tag", title: "through a relay: control messages only, until a hole punch" }, "relayed") : "direct",
        p.version || "",
      ]),
      empty: "No peers connected: check the bootstrap addresses in config.toml.",
    }));
    drawSites();
  }

  async function loadValidators() {
    let v;
    try {
      v = await api("GET", "/validators");
    } catch (e) {
      fill(validators, h("p", { class: "error" }, e.message));
      return;
    }
    const me = status && status.account;
    fill(validators,
      h("p", { class: "muted small" }, `As of block ${v.height}: total power ${v.total_power}; a change needs more than two thirds of it.`),
      table({
        id: "validators-table",
        columns: [{ label: "Name" }, { label: "Account" }, { label: "Power", num: true }, { label: "Share", num: true }],
        rows: v.validators.map((x) => [
          [x.name || "—", x.account === me ? h("span", { class: "tag" }, "this node") : null],
          h("span", { class: "mono small" }, x.account),
          String(x.power),
          v.total_power ? `${((100 * x.power) / v.total_power).toFixed(1)}%` : "",
        ]),
      }),
      (v.proposals || []).length ? [h("h3", null, "Votes under way"), table({
        id: "proposals-table",
        columns: [{ label: "Name" }, { label: "Power now", num: true }, { label: "Proposed", num: true }, { label: "Votes", num: true }, { label: "Needed", num: true }],
        rows: v.proposals.map((p) => [p.name || "—", String(p.current_power), p.power === 0 ? "remove" : String(p.power), String(p.vote_power), String(p.needed)]),
      })] : null);
  }

  loadStatus().then(loadValidators);
  loadPeers();
  const stops = [
    live.on("status", (st) => {
      if (!status) return;
      const grew = st.height !== status.height;
      status = Object.assign({}, status, st, { uptime_s: status.uptime_s });
      drawNode();
      if (grew && Date.now() - validatorsAt > 10000) {
        validatorsAt = Date.now();
        loadValidators();
      }
    }),
    live.on("peers", debounce(loadPeers, 300)),
    live.on("offers", debounce(loadPeers, 300)),
  ];
  const tick = setInterval(drawNode, 5000);
  return () => {
    clearInterval(tick);
    stops.forEach((s) => s());
  };
}

// reachability says in words how peers reach this node (status.nat).
function reachability(nat) {
  if (!nat) return "—";
  let s = {
    public: "yes, directly",
    private: "behind a NAT: through a relay, then a hole punch",
  }[nat.reachability] || "not known yet";
  if (nat.relaying) s += "; relays for members";
  if (nat.hole_punches) s += `; hole punches ${nat.hole_punches_won} of ${nat.hole_punches} succeeded`;
  return s;
}
