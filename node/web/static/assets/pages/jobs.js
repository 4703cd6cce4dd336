// Jobs: the submit form (fields or a TOML file; bundle and dataset by CID,
// path on this machine, or upload), the quote to confirm, and the list.

import { api, upload, live } from "../api.js";
import { h, fill, table, dl } from "../dom.js";
import { credits, size, shortID, shortPeer, ago, when, splitCommand, joinCommand, duration, nsToDuration } from "../format.js";
import { field, formError, clearErrors, showError, busy } from "../forms.js";
import { jobState, isProblemJob, section } from "./common.js";

const SPEC_FIELDS = ["name", "framework", "command", "bundle", "dataset", "workers", "cores", "memory", "gpus", "max_price", "max_duration", "site", "deadline", "max_wait"];

function isCID(s) {
  return /^(Qm[1-9A-HJ-NP-Za-km-z]{44}|b[a-z2-7]{20,})$/.test(s);
}

function uploadControls(name, label) {
  const status = h("p", { class: "hint", id: `${name}-upload-status`, role: "status" });
  return h("div", { class: "field wide" },
    h("div", { class: "row" },
      h("div", { class: "field" },
        h("label", { for: `${name}-files` }, `Upload ${label} files`),
        h("input", { type: "file", id: `${name}-files`, multiple: true, dataset: { upload: name } })),
      h("div", { class: "field" },
        h("label", { for: `${name}-folder` }, `or a ${label} folder`),
        h("input", { type: "file", id: `${name}-folder`, webkitdirectory: true, dataset: { upload: name } }))),
    status);
}

// askPanel is a panel that asks whether a job goes on: its body, then
// a confirm and a cancel button (ids prefix-confirm, prefix-cancel), and
// the error of either.
function askPanel(prefix, title, confirmLabel, body, { onConfirm, onCancel }) {
  const msg = h("p", { class: "error", role: "alert" });
  const confirm = h("button", { type: "button", id: `${prefix}-confirm` }, confirmLabel);
  const cancel = h("button", { type: "button", class: "secondary", id: `${prefix}-cancel` }, "Cancel the job");
  const act = (fn) => async () => {
    confirm.disabled = cancel.disabled = true;
    try {
      await fn();
    } catch (e) {
      msg.textContent = e.message;
      confirm.disabled = cancel.disabled = false;
    }
  };
  confirm.addEventListener("click", act(onConfirm));
  cancel.addEventListener("click", act(onCancel));
  const heading = h("h2", { id: `${prefix}-h`, tabindex: "-1" }, title);
  const panel = h("section", { id: prefix, class: "notice", "aria-labelledby": `${prefix}-h` },
    heading, ...body, h("div", { class: "actions" }, confirm, cancel), msg);
  setTimeout(() => heading.focus(), 0);
  return panel;
}

// quotePanel shows a quoted job's placement and asks to confirm it.
export function quotePanel(job, handlers) {
  const run = (job.runs || [])[job.runs.length - 1] || {};
  const workers = run.workers || job.workers || [];
  const sites = [...new Set(workers.map((w) => w.site).filter(Boolean))];
  return askPanel("quote", `Quote for ${job.spec.name}`, "Confirm and run", [
    table({
      id: "quote-workers",
      columns: [{ label: "Worker", num: true }, { label: "Machine" }, { label: "Site" }, { label: "Price/h", num: true }],
      rows: workers.map((w, i) => [String(i), w.moniker || shortPeer(w.machine), w.site || "", credits(w.per_hour)]),
    }),
    dl([
      ["Machines", `${new Set(workers.map((w) => w.machine)).size}`],
      ["Sites", sites.join(", ") || "—"],
      ["Price per hour", h("span", { id: "quote-per-hour" }, `${credits(run.per_hour)} credits`)],
      ["Most it can cost", h("span", { id: "quote-total" }, `${credits(run.quoted_total)} credits`, h("span", { class: "muted small" }, ` (for ${(job.spec.max_duration_ns / 3.6e12).toFixed(2).replace(/\.?0+$/, "")} h at most; your limit is ${credits(job.spec.max_price)})`))],
      ["Expected duration", h("span", { id: "quote-duration" }, run.predicted
        ? `${duration(run.predicted.total_s)} to train (${run.predicted.speed_up.toFixed(2)}x one worker's speed)`
        : `not predicted (give [training] steps and params for a prediction); at most ${nsToDuration(job.spec.max_duration_ns)}`)],
      run.held_until ? ["Machines held until", when(run.held_until)] : null,
    ]),
    h("p", { class: "small muted" }, "Confirming locks your maximum price in escrow on the ledger; what the workers do not use comes back."),
  ], handlers);
}

// waitPanel shows why a job waits in the queue and asks whether to leave
// it there.
export function waitPanel(job, handlers) {
  const q = job.queue || {};
  return askPanel("wait", `No machines for ${job.spec.name} now`, "Wait in the queue", [
    h("p", { id: "wait-why" }, q.why || job.reason || ""),
    dl([
      ["Place in the queue", h("span", { id: "wait-position" }, String(q.position || "—"))],
      q.price_now ? ["It would run now for", h("span", { id: "wait-price-now" }, `${credits(q.price_now)} credits (your limit is ${credits(job.spec.max_price)})`)] : null,
      q.next_bid ? ["Bids again by", when(q.next_bid)] : null,
    ]),
    h("p", { class: "small muted" }, "A waiting job bids again as machines free up or prices fall; nothing is paid while it waits, and you can cancel it at any time."),
  ], handlers);
}

export function render(main, { navigate }) {
  const list = h("div", { id: "job-list" }, h("p", { class: "muted" }, "…"));
  const quoteBox = h("div", { id: "quote-box" });
  const progress = h("p", { role: "status", id: "submit-progress", class: "muted" });

  const form = h("form", { id: "submit-form", novalidate: true, "aria-labelledby": "submit-h" },
    formError("submit-error"),
    h("div", { class: "field wide" },
      h("label", { for: "spec-toml" }, "Load a job spec (TOML)"),
      h("input", { type: "file", id: "spec-toml", accept: ".toml,text/plain", "aria-describedby": "spec-toml-error", dataset: { field: "toml" } }),
      h("p", { class: "field-error", id: "spec-toml-error", "aria-live": "polite" })),
    h("div", { class: "row" },
      field({ name: "name", label: "Name", hint: "Letters, digits, '.', '_' or '-'." }),
      field({ name: "framework", label: "Framework", value: "tensorflow", options: [["tensorflow", "TensorFlow (TF_CONFIG)"], ["generic", "generic (DM_* variables)"]] })),
    field({ name: "command", label: "Command", wide: true, hint: "Run in the bundle's directory, e.g. python3 train.py --epochs 2" }),
    field({ name: "bundle", label: "Bundle (code)", wide: true, hint: "A CID, a folder on this machine (absolute path), or upload it below." }),
    uploadControls("bundle", "bundle"),
    field({ name: "dataset", label: "Dataset (optional)", wide: true, hint: "A CID or a folder on this machine, or upload it below." }),
    uploadControls("dataset", "dataset"),
    h("div", { class: "row" },
      field({ name: "workers", label: "Workers", type: "number", value: "1", attrs: { min: 1, step: 1, inputmode: "numeric" } }),
      field({ name: "cores", label: "Cores per worker", type: "number", value: "1", attrs: { min: 1, step: 1, inputmode: "numeric" } }),
      field({ name: "memory", label: "Memory per worker", value: "2GiB", hint: "Such as 512MiB or 2GiB." }),
      field({ name: "gpus", label: "GPUs per worker", type: "number", value: "0", attrs: { min: 0, step: 1, inputmode: "numeric" } })),
    h("div", { class: "row" },
      field({ name: "max_price", label: "Max price (credits)", value: "5", hint: "The most the whole job may cost." }),
      field({ name: "max_duration", label: "Max duration", value: "30m", hint: "Such as 30m or 2h." }),
      field({ name: "site", label: "Preferred site (optional)" }),
      field({ name: "deadline", label: "Deadline (optional)", hint: "RFC 3339, e.g. 2026-12-01T18:00:00Z" }),
      field({ name: "max_wait", label: "Wait for machines at most", value: "24h", hint: "In the queue, when none is free; 0s: not at all." })),
    h("div", { class: "actions" }, h("button", { type: "submit", id: "get-quote" }, "Get a quote"), progress));

  main.append(
    h("h1", null, "Jobs"),
    section("submit", "Submit a job", form, quoteBox),
    section("jobs", "My jobs", list),
  );

  // TOML: read it into the fields.
  const tomlInput = form.querySelector("#spec-toml");
  tomlInput.addEventListener("change", async () => {
    clearErrors(form);
    const f = tomlInput.files[0];
    if (!f) return;
    try {
      const spec = await api("POST", "/jobs/spec", { toml: await f.text() });
      const e = form.elements;
      for (const k of SPEC_FIELDS) {
        if (!(k in e)) continue;
        const v = spec[k];
        if (k === "command") e[k].value = joinCommand(v);
        else if (v !== undefined && v !== null && v !== "") e[k].value = v;
        else if (k !== "framework" && k !== "bundle" && k !== "dataset") e[k].value = ""; // keep what was uploaded
      }
      progress.textContent = `Loaded ${f.name}. Relative paths in it must become a CID, an absolute path, or an upload.`;
    } catch (e) {
      const slot = document.getElementById("spec-toml-error");
      slot.textContent = e.message;
      tomlInput.setAttribute("aria-invalid", "true");
    }
  });

  // Uploads: add the files to the node's storage and use the CID.
  for (const input of form.querySelectorAll("input[data-upload]")) {
    input.addEventListener("change", async () => {
      const which = input.dataset.upload;
      const status = document.getElementById(`${which}-upload-status`);
      const files = [...input.files];
      if (!files.length) return;
      clearErrors(form);
      status.textContent = `Uploading ${files.length} file${files.length === 1 ? "" : "s"}…`;
      try {
        const pin = await busy(form, () => upload(which, files));
        form.elements[which].value = pin.cid;
        status.textContent = `Uploaded ${files.length} file${files.length === 1 ? "" : "s"} (${size(pin.size)}) as ${pin.cid}.`;
      } catch (e) {
        status.textContent = "";
        showError(form, e, which);
      }
    });
  }

  function readSpec() {
    const e = form.elements;
    const int = (v) => (v === "" ? 0 : Number(v));
    const spec = {
      name: e.name.value.trim(), framework: e.framework.value, command: splitCommand(e.command.value),
      bundle: e.bundle.value.trim(), dataset: e.dataset.value.trim(),
      workers: int(e.workers.value), cores: int(e.cores.value), memory: e.memory.value.trim(), gpus: int(e.gpus.value),
      max_price: e.max_price.value.trim(), max_duration: e.max_duration.value.trim(),
      site: e.site.value.trim(), deadline: e.deadline.value.trim(), max_wait: e.max_wait.value.trim(),
    };
    for (const k of ["bundle", "dataset"]) {
      const v = spec[k];
      if (v && !isCID(v) && !v.startsWith("/")) {
        showError(form, { message: `${k}: give a CID, upload it, or an absolute path on this machine (relative paths have nothing to be relative to here).` }, k);
        return null;
      }
    }
    for (const k of ["workers", "cores", "gpus"]) {
      if (!Number.isInteger(spec[k])) {
        showError(form, { message: `${k}: a whole number.` }, k);
        return null;
      }
    }
    return spec;
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    quoteBox.replaceChildren();
    const spec = readSpec();
    if (!spec) return;
    progress.textContent = "Asking the market for a quote…";
    await busy(form, async () => {
      let job;
      try {
        job = await api("POST", "/jobs", { spec, base_dir: "", yes: false });
      } catch (e) {
        progress.textContent = "";
        showError(form, e);
        return;
      }
      progress.textContent = "";
      if (job.state === "failed") {
        showError(form, { message: `No quote: ${job.reason}` });
        return;
      }
      const waiting = job.state === "waiting" && !job.confirmed;
      if (!waiting && (job.state !== "quoting" || !(job.workers || []).length)) {
        navigate(`/jobs/${job.id}`);
        return;
      }
      fill(quoteBox, (waiting ? waitPanel : quotePanel)(job, {
        onConfirm: async () => {
          await api("POST", `/jobs/${job.id}/confirm`);
          navigate(`/jobs/${job.id}`);
        },
        onCancel: async () => {
          await api("POST", `/jobs/${job.id}/cancel`);
          fill(quoteBox, h("p", { role: "status", class: "muted" }, `Job ${job.spec.name} cancelled before it ran; nothing was paid.`));
        },
      }));
    });
  });

  const stop = live.on("jobs", (jobs) => {
    fill(list, table({
      id: "jobs-table",
      columns: [{ label: "Job" }, { label: "ID" }, { label: "State" }, { label: "Workers", num: true }, { label: "Accuracy", num: true }, { label: "Took", num: true }, { label: "Cost", num: true }, { label: "Updated" }],
      rows: jobs.map((j) => {
        const sm = j.summary || {};
        return [
          h("a", { href: `/jobs/${j.id}`, "data-nav": "" }, j.name),
          h("span", { class: "mono small" }, shortID(j.id)),
          [jobState(j), sm.percent && !["succeeded", "failed", "cancelled"].includes(j.state) ? h("span", { class: "small" }, ` ${sm.percent}%`) : null,
            j.reason && (j.state === "failed" || j.state === "waiting") ? h("div", { class: "small" }, j.reason) : null],
          String((j.workers || []).length),
          sm.accuracy ? sm.accuracy.toFixed(4) : "—",
          sm.duration_s ? duration(sm.duration_s) : "—",
          credits(j.cost),
          ago(j.updated),
        ];
      }),
      rowAttrs: (i) => ({ class: isProblemJob(jobs[i]) ? "panic" : null }),
      empty: "No jobs submitted from this node yet.",
    }));
  });
  return stop;
}
