// One job: its state, workers and their machines, cost so far, the result
// to download, live logs, and cancel (or confirm, while it waits).

import { api, live } from "../api.js";
import { h, fill, table, dl } from "../dom.js";
import { credits, shortPeer, when, ago, size, nsToDuration, joinCommand, duration } from "../format.js";
import { curveChart } from "../chart.js";
import { jobState, workerState, staleWorker } from "./common.js";
import { quotePanel, waitPanel } from "./jobs.js";

const TERMINAL = ["succeeded", "failed", "cancelled"];
const LOG_KEEP = 256 * 1024; // characters of log kept on the page

// NOISE matches TensorFlow's start-up lines (the node's jobs.IsNoise),
// after a worker's tag: hidden unless the reader asks for them.
const NOISE = new RegExp("^(\\[(w\\d+|h)\\] )?(" + [
  "\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d\\.\\d+: [IWE] (tensorflow|external)/",
  "[IWE]\\d{4} \\d\\d:\\d\\d:\\d+\\.\\d+ +\\d+ \\S+:\\d+\\] ",
  "WARNING: All log messages before absl::InitializeLog\\(\\) is called are written to STDERR",
  "(WARNING|INFO):(tensorflow|absl):",
  "To enable the following instructions: ",
  "oneDNN custom operations are on",
  "Could not find cuda drivers",
].join("|") + ")");

export function quietLog(text) {
  let hidden = 0;
  const kept = text.split("\n").filter((l) => {
    if (NOISE.test(l)) {
      hidden++;
      return false;
    }
    return true;
  });
  return { text: kept.join("\n"), hidden };
}

// curves: the run's training curves as chart series, over steps or
// seconds: each worker's (and the holder's) training loss or accuracy,
// and its evaluations as dots.
export function curves(run, key, evalKey, overTime) {
  const who = (run.workers || []).map((w, i) => [`worker ${i}`, w]);
  if (run.holder) who.push(["holder", run.holder]);
  const out = [];
  for (const [name, w] of who) {
    const pts = (w.curve || []).filter((p) => p[key] !== undefined);
    const evs = (w.curve || []).filter((p) => p[evalKey] !== undefined);
    const at = (p) => (overTime ? p.t : p.step);
    if (pts.length) out.push({ label: `${name} training`, points: pts.map((p) => [at(p), p[key]]) });
    // An evaluation is drawn at the step it was made at (when it was reported, over time).
    if (evs.length) out.push({ label: name, points: evs.map((p) => [overTime ? p.t : p.eval_at || p.step, p[evalKey]]), dots: true });
  }
  return out;
}
// costSoFar: what settled runs cost, plus the current run's workers at
// their hourly price for the time they ran (what the node will pay).
export function costSoFar(j, now = Date.now()) {
  const run = (j.runs || [])[j.runs.length - 1];
  if (TERMINAL.includes(j.state) || !run || run.settled) return j.cost;
  let used = 0;
  for (const w of run.workers || []) {
    if (run.holder) { // held: each machine is paid for its accepted rounds
      used += (w.per_hour * (w.accepted_seconds || 0)) / 3600;
      continue;
    }
    if (!w.started) continue;
    const start = new Date(w.started).getTime();
    let end = now;
    if (w.ended) end = new Date(w.ended).getTime();
    else if (w.last_seen) end = Math.min(now, new Date(w.last_seen).getTime());
    if (end > start) used += (w.per_hour * (end - start)) / 3.6e6;
  }
  return j.cost + Math.floor(used);
}

export function render(main, { params, navigate }) {
  const id = params[0];
  const head = h("div", { id: "job-head" }, h("h1", null, "Job"), h("p", { class: "muted" }, "…"));
  const summary = h("div", { id: "job-summary" });
  const progress = h("div", { id: "job-progress" });
  const charts = h("div", { id: "job-curves" });
  let overTime = false;
  let verbose = false;
  const workers = h("div", { id: "job-workers" });
  const result = h("div", { id: "job-result" });
  const actions = h("div", { id: "job-actions" });
  const logs = h("pre", { class: "logs", id: "job-logs", tabindex: "0", "aria-label": "Job log" });
  const err = h("p", { class: "error", role: "alert" });
  main.append(head, err, actions,
    h("div", { class: "cols" },
      h("section", { "aria-labelledby": "js-h" }, h("h2", { id: "js-h" }, "Summary"), summary),
      h("section", { "aria-labelledby": "jr-h" }, h("h2", { id: "jr-h" }, "Result"), result)),
    h("section", { "aria-labelledby": "jp-h" }, h("h2", { id: "jp-h" }, "Training"), progress, charts),
    h("section", { "aria-labelledby": "jw-h" }, h("h2", { id: "jw-h" }, "Workers"), workers),
    h("section", { "aria-labelledby": "jl-h" }, h("h2", { id: "jl-h" }, "Log"), logs));

  let job = null;
  let lastSummary = "";
  let stopped = false;

  function draw() {
    const j = job;
    const run = (j.runs || [])[j.runs.length - 1] || {};
    fill(head,
      h("h1", null, `Job ${j.spec.name} `, jobState(j)),
      h("p", { class: "muted small mono" }, j.id),
      j.reason ? h("p", { class: j.state === "failed" ? "error" : "notice", id: "job-reason" }, j.reason) : null);
    fill(summary, dl([
      ["Submitted", when(j.created)],
      ["Framework", j.spec.framework],
      ["Command", h("code", null, joinCommand(j.spec.command))],
      ["Shape", `${j.spec.workers} × ${j.spec.cores} cores, ${size(j.spec.mem_bytes)}${j.spec.gpus ? `, ${j.spec.gpus} GPUs` : ""}`],
      ["Limits", `${credits(j.spec.max_price)} credits, ${nsToDuration(j.spec.max_duration_ns)}`],
      ["Bundle", h("span", { class: "mono small" }, j.bundle_cid || j.spec.bundle)],
      j.dataset_cid || j.spec.dataset ? ["Dataset", h("span", { class: "mono small" }, j.dataset_cid || j.spec.dataset)] : null,
      j.image_cid || j.spec.image ? ["Image", h("span", { class: "mono small" }, j.image_cid || j.spec.image)] : null,
      run.per_hour ? ["Price per hour", `${credits(run.per_hour)} credits`] : null,
      run.escrow && !run.settled ? ["In escrow", `${credits(run.escrow)} credits`] : null,
      run.escrow && run.settled ? ["Refunded", `${credits(run.escrow - (run.paid || 0))} credits of the ${credits(run.escrow)} in escrow`] : null,
      ["Cost so far", h("span", { id: "job-cost" }, `${credits(costSoFar(j))} credits`)],
      (j.runs || []).length > 1 ? ["Runs", `${j.runs.length} (re-placed after a lost worker)`] : null,
      j.state === "waiting" && j.queue ? ["In the queue", h("span", { id: "job-queue" },
        `#${j.queue.position || "?"} since ${when(j.queue.since)}, ${j.queue.bids} bids so far` +
        (j.queue.price_now ? `; it would run now for ${credits(j.queue.price_now)} credits` : ""))] : null,
    ]));
    drawTraining(j, run);
    const ws = j.workers || [];
    const held = !!((j.runs || [])[(j.runs || []).length - 1] || {}).holder;
    fill(workers, table({
      id: "workers-table",
      columns: [{ label: "#", num: true }, { label: "Machine" }, { label: "Site" }, { label: "State" }, { label: "Price/h", num: true }, { label: "Started" }, { label: "Last heard" }],
      rows: ws.map((w, i) => [
        String(i),
        [w.moniker || shortPeer(w.machine), h("div", { class: "muted small mono" }, shortPeer(w.machine))],
        w.site || "",
        [workerState(w), w.reason ? h("div", { class: "small" }, w.reason) : null,
          held ? h("div", { class: "small" }, heldNote(w)) : null],
        credits(w.per_hour),
        when(w.started),
        ago(w.last_seen),
      ]),
      rowAttrs: (i) => ({ class: ws[i].state === "failed" || staleWorker(ws[i]) ? "panic" : null }),
      empty: "No workers placed yet.",
    }));
    if (j.result_cid) {
      fill(result,
        h("p", null, "Result CID: ", h("code", { id: "result-cid" }, j.result_cid)),
        h("p", null, h("a", { href: `/api/v1/data/${encodeURIComponent(j.result_cid)}/archive`, download: `${j.spec.name}-result.tar.gz`, id: "result-download" }, "Download the result (.tar.gz)")),
        h("p", { class: "muted small" }, "Or: ", h("code", null, `deepmarket data get ${j.result_cid} -o ~/${j.spec.name}-result`)));
    } else {
      fill(result, h("p", { class: "muted" }, TERMINAL.includes(j.state) ? "This job left no result." : "The chief's output appears here when the job succeeds."));
    }
    drawActions();
  }

  function drawTraining(j, run) {
    const sm = j.summary || {};
    const rows = [];
    if (sm.total_steps && !TERMINAL.includes(j.state)) {
      rows.push(["Progress", h("div", { id: "job-progress-text" },
        h("div", { class: "progress-bar", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(sm.percent || 0) },
          h("span", { style: `width: ${Math.min(100, sm.percent || 0)}%` })),
        `${sm.percent || 0}% (${sm.steps} of ${sm.total_steps} steps)` + (sm.eta_s ? `, about ${duration(sm.eta_s)} left` : ""))]);
    }
    if (sm.accuracy || sm.loss) {
      rows.push([TERMINAL.includes(j.state) ? "Result" : "Latest", h("span", { id: "job-accuracy" },
        (sm.accuracy ? `accuracy ${sm.accuracy.toFixed(4)}, ` : "") + `loss ${Number(sm.loss).toPrecision(4)} (${sm.from})`)]);
    }
    if (sm.started) rows.push(["Started", when(sm.started)]);
    if (sm.ended) rows.push(["Ended", `${when(sm.ended)} (ran ${duration(sm.duration_s || 0)})`]);
    else if (sm.duration_s) rows.push(["Running for", duration(sm.duration_s)]);
    fill(progress, rows.length ? dl(rows) : h("p", { class: "muted" }, "Progress, accuracy and curves appear here once the workers report them (the deepmarket package's progress callback)."));
    const loss = curves(run, "loss", "eval_loss", overTime);
    const acc = curves(run, "acc", "eval_acc", overTime);
    if (!loss.length && !acc.length) {
      charts.replaceChildren();
      return;
    }
    const fmtX = overTime ? (v) => duration(v) : (v) => String(Math.round(v));
    const toggle = h("button", { type: "button", id: "curves-axis", class: "small" }, overTime ? "Against steps" : "Against time");
    toggle.addEventListener("click", () => {
      overTime = !overTime;
      drawTraining(job, (job.runs || [])[job.runs.length - 1] || {});
    });
    const last = (se) => se.points[se.points.length - 1][1].toFixed(4);
    fill(charts, h("div", { class: "actions" }, toggle),
      loss.length ? h("h3", null, "Loss") : null,
      loss.length ? curveChart({ title: "Loss", series: loss, fmtX, xLabel: overTime ? "time" : "steps",
        summary: "Loss " + (overTime ? "over time" : "over steps") + ": " + loss.map((se) => `${se.label} ${last(se)}`).join(", ") }) : null,
      acc.length ? h("h3", null, "Accuracy") : null,
      acc.length ? curveChart({ title: "Accuracy", series: acc, fmtX, xLabel: overTime ? "time" : "steps",
        summary: "Accuracy " + (overTime ? "over time" : "over steps") + ": " + acc.map((se) => `${se.label} ${last(se)}`).join(", ") }) : null);
  }

  function drawActions() {
    const j = job;
    const msg = h("p", { class: "error", role: "alert" });
    if (TERMINAL.includes(j.state)) {
      actions.replaceChildren();
      return;
    }
    const waiting = j.state === "waiting" && !j.confirmed;
    const quoted = j.state === "quoting" && !j.confirmed && (j.workers || []).length;
    if (waiting || quoted) {
      if (actions.querySelector(waiting ? "#wait" : "#quote")) return;
      fill(actions, (waiting ? waitPanel : quotePanel)(j, {
        onConfirm: async () => {
          job = await api("POST", `/jobs/${id}/confirm`);
          actions.replaceChildren();
          draw();
        },
        onCancel: async () => {
          job = await api("POST", `/jobs/${id}/cancel`);
          draw();
        },
      }));
      return;
    }
    if (actions.querySelector("#cancel-job")) return;
    const cancel = h("button", { type: "button", class: "danger", id: "cancel-job" }, "Cancel the job");
    cancel.addEventListener("click", async () => {
      cancel.disabled = true;
      cancel.textContent = "Cancelling…";
      try {
        job = await api("POST", `/jobs/${id}/cancel`);
        draw();
      } catch (e) {
        msg.textContent = e.message;
        cancel.disabled = false;
        cancel.textContent = "Cancel the job";
      }
    });
    fill(actions, h("div", { class: "actions" }, cancel, h("span", { class: "muted small" }, "What its workers used is paid; the rest comes back.")), msg);
  }

  async function load() {
    try {
      job = await api("GET", `/jobs/${id}`);
      err.textContent = "";
    } catch (e) {
      if (!job) fill(head, h("h1", null, "Job"), h("p", { class: "error", role: "alert" }, e.message), h("p", null, h("a", { href: "/jobs", "data-nav": "" }, "All jobs")));
      else err.textContent = e.message;
      return;
    }
    if (job.id !== id) {
      navigate(`/jobs/${job.id}`); // a prefix was given
      return;
    }
    draw();
  }

  // Logs, live; TensorFlow's start-up noise hidden unless asked for.
  const showAll = h("input", { type: "checkbox", id: "log-verbose" });
  const hiddenNote = h("span", { class: "muted small", id: "log-hidden" });
  showAll.addEventListener("change", () => {
    verbose = showAll.checked;
    showLog();
  });
  logs.before(h("p", { class: "small" }, h("label", null, showAll, " Show TensorFlow's start-up messages "), hiddenNote));
  function showLog() {
    const q = verbose ? { text, hidden: 0 } : quietLog(text);
    logs.textContent = q.text;
    hiddenNote.textContent = q.hidden ? `(${q.hidden} ${q.hidden === 1 ? "line" : "lines"} left out)` : "";
  }
  let offset = 0;
  let src = null;
  let text = "";
  function follow() {
    if (stopped) return;
    src = new EventSource(`/api/v1/jobs/${encodeURIComponent(id)}/logs/stream?offset=${offset}`);
    src.addEventListener("log", (ev) => {
      const chunk = JSON.parse(ev.data);
      offset = chunk.next;
      const atEnd = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
      text += chunk.data;
      if (text.length > LOG_KEEP) text = "…\n" + text.slice(text.length - LOG_KEEP);
      showLog();
      if (atEnd) logs.scrollTop = logs.scrollHeight;
    });
    src.addEventListener("done", () => src.close());
    src.addEventListener("error", () => {
      // Reconnect from where we are, not from the URL's offset.
      src.close();
      if (!stopped) setTimeout(follow, 2000);
    });
  }

  load();
  follow();
  const tick = setInterval(() => {
    if (!job || TERMINAL.includes(job.state)) return;
    const el = document.getElementById("job-cost");
    if (el) el.textContent = `${credits(costSoFar(job))} credits`;
  }, 1000);
  const stop = live.on("jobs", (list) => {
    const mine = list.find((j) => j.id === id);
    const key = JSON.stringify(mine || null);
    if (key !== lastSummary) {
      lastSummary = key;
      if (job) load();
    }
  });
  return () => {
    stopped = true;
    clearInterval(tick);
    if (src) src.close();
    stop();
  };
}

// heldNote is what the holder of a held run says of worker w.
function heldNote(w) {
  let note = `${w.accepted || 0} rounds accepted, ${w.refused || 0} refused`;
  if (w.forfeited) note += `, forfeited its pay: failed a spot check (${w.check_failure || ""})`;
  else if (w.dropped) note += ", dropped";
  if (w.checks_passed) note += `, ${w.checks_passed} spot check${w.checks_passed === 1 ? "" : "s"} passed`;
  else if (w.held_seconds && !w.forfeited) note += `, pay for ${Math.round(w.held_seconds)} s held back until it passes a spot check`;
  return note;
}
