// Ledger: what moved my credits and why, a transfer form, and the audit.

import { api, live, debounce } from "../api.js";
import { h, fill, table, dl } from "../dom.js";
import { credits, parseCredits, when, shortID } from "../format.js";
import { field, formError, clearErrors, showError, busy } from "../forms.js";
import { section } from "./common.js";

export function render(main) {
  const balance = h("p", { class: "figure", id: "ledger-balance" }, "…");
  const address = h("p", { class: "muted small mono", id: "ledger-address" });
  const history = h("div", { id: "history" }, h("p", { class: "muted" }, "…"));
  const audit = h("div", { id: "audit" });
  const sent = h("p", { class: "ok", role: "status", id: "transfer-done" });
  const days = h("select", { id: "history-days", "aria-label": "How far back" },
    [["30", "last 30 days"], ["90", "last 90 days"], ["366", "last year"]].map(([v, t]) => h("option", { value: v }, t)));

  const form = h("form", { id: "transfer-form", novalidate: true, "aria-labelledby": "xfer-h" },
    formError("transfer-error"),
    field({ name: "to", label: "To (account)", wide: true, attrs: { placeholder: "dm1…", autocomplete: "off", spellcheck: "false" } }),
    h("div", { class: "row" },
      field({ name: "amount", label: "Amount (credits)", attrs: { inputmode: "decimal" } }),
      field({ name: "memo", label: "Memo (optional)", attrs: { maxlength: 256 } })),
    h("div", { class: "actions" }, h("button", { type: "submit", id: "transfer-submit" }, "Transfer"), sent));

  const runAudit = h("button", { type: "button", id: "run-audit" }, "Run the audit");

  main.append(
    h("h1", null, "Ledger"),
    h("div", { class: "cols" },
      section("lb", "Balance", balance, address),
      section("xfer", "Transfer credits", form)),
    section("hist", "History", h("div", { class: "actions" }, h("label", { for: "history-days" }, "Show"), days), history),
    section("aud", "Audit", h("p", { class: "muted" }, "Replays this node's copy of the chain from genesis and checks every balance, escrow and block's app hash."),
      h("div", { class: "actions" }, runAudit), audit),
  );

  async function loadBalance() {
    try {
      const b = await api("GET", "/ledger/balance");
      balance.dataset.micro = String(b.balance);
      fill(balance, credits(b.balance), h("span", { class: "unit" }, "credits"));
      address.textContent = b.address;
    } catch (e) {
      balance.textContent = e.message;
    }
  }

  async function loadHistory() {
    let a;
    try {
      a = await api("GET", `/ledger/activity?days=${days.value}`);
    } catch (e) {
      fill(history, h("p", { class: "error" }, e.message));
      return;
    }
    const amount = (v, sign) => (v ? `${sign}${credits(v)}` : "");
    fill(history,
      h("p", { class: "muted small" }, `In: ${credits(a.earned)} credits; out: ${credits(a.spent)} credits.`),
      table({
        id: "history-table",
        columns: [{ label: "When" }, { label: "What" }, { label: "In", num: true }, { label: "Out", num: true }, { label: "Escrow", num: true }, { label: "Block", num: true }],
        rows: a.entries.map((e) => [
          when(e.time),
          [e.what, e.memo ? h("div", { class: "muted small" }, `“${e.memo}”`) : null, h("div", { class: "muted small mono" }, `${e.type} · ${shortID(e.hash, 10)}`)],
          { v: amount(e.in, "+"), cls: "in" },
          { v: amount(e.out, "−"), cls: "out" },
          e.locked ? `locked ${credits(e.locked)}` : e.unlocked ? `refunded ${credits(e.unlocked)}` : "",
          String(e.height),
        ]),
        empty: "Nothing moved credits for this account in that time.",
      }));
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    sent.textContent = "";
    const e = form.elements;
    const to = e.to.value.trim();
    if (!to) return showError(form, { message: "Give the account to send to (dm1…)." }, "to");
    const amount = parseCredits(e.amount.value);
    if (!amount) return showError(form, { message: "An amount of credits more than 0, with at most six decimals." }, "amount");
    await busy(form, async () => {
      try {
        const r = await api("POST", "/ledger/send", { to, amount, memo: e.memo.value });
        sent.textContent = `Sent ${credits(amount)} credits (block ${r.height}).`;
        form.reset();
        loadBalance();
        loadHistory();
      } catch (err) {
        showError(form, err);
      }
    });
  });

  runAudit.addEventListener("click", async () => {
    runAudit.disabled = true;
    fill(audit, h("p", { role: "status", class: "muted" }, "Replaying the chain…"));
    try {
      const r = await api("GET", "/ledger/audit");
      fill(audit,
        h("p", { id: "audit-result", role: "status", class: r.ok ? "ok" : "error" },
          r.ok ? "The books balance: every block replays to the app hash the chain committed to." : "The audit found problems."),
        dl([
          ["Height", String(r.height)],
          ["Transactions", `${r.txs} replayed, ${r.txs_ok} accepted`],
          ["Supply", `${credits(r.supply)} credits`],
          ["Balances", `${credits(r.balances)} credits`],
          ["In escrow", `${credits(r.escrowed)} credits`],
          ["App hash", h("span", { class: "mono small" }, r.app_hash)],
        ]),
        (r.problems || []).length ? h("ul", { class: "error", id: "audit-problems" }, r.problems.map((p) => h("li", null, p))) : null);
    } catch (e) {
      fill(audit, h("p", { class: "error", role: "alert" }, e.message));
    } finally {
      runAudit.disabled = false;
    }
  });

  days.addEventListener("change", loadHistory);
  loadBalance();
  loadHistory();
  const refresh = debounce(() => {
    loadBalance();
    loadHistory();
  }, 300);
  return live.on("balance", refresh);
}
