// What several pages show the same way: states as badges, problems in red.

import { h } from "../dom.js";

const jobClass = {
  submitted: "busy", quoting: "busy", reserving: "busy", escrowed: "busy", launching: "busy",
  waiting: "warn", running: "good", succeeded: "good", failed: "panic", cancelled: "warn",
};

// A worker not heard from for this long (ms) is in trouble; the node polls
// its workers every second and gives up on one after 30 s.
export const STALE_MS = 10000;

export function staleWorker(w, now = Date.now()) {
  if (!w || (w.state !== "running" && w.state !== "fetching") || !w.last_seen) return false;
  return now - new Date(w.last_seen).getTime() > STALE_MS;
}

// isProblemJob: failed, or a live job with a worker gone quiet.
export function isProblemJob(j) {
  if (j.state === "failed") return true;
  if (["succeeded", "cancelled"].includes(j.state)) return false;
  return (j.workers || []).some((w) => staleWorker(w) || w.state === "failed");
}

export function jobState(j) {
  let text = j.state === "quoting" && j.confirmed === false && (j.workers || []).length ? "awaiting confirmation" : j.state;
  if (j.state === "waiting" && j.queue && j.queue.position) text = `waiting (#${j.queue.position} in the queue)`;
  const cls = isProblemJob(j) ? "panic" : jobClass[j.state] || "";
  return h("span", { class: `badge ${cls}`, dataset: { state: j.state } }, isProblemJob(j) && j.state !== "failed" ? `${text} ⚠` : text);
}

const machineText = {
  offering: ["offering", "good"],
  "outside-window": ["outside its window", "warn"],
  idle: ["not lending", ""],
  lost: ["lost ⚠", "panic"],
};

export function machineState(m) {
  const [text, cls] = machineText[m.state] || [m.state, ""];
  return h("span", { class: `badge ${cls}`, dataset: { state: m.state } }, text);
}

export function workerState(w) {
  const stale = staleWorker(w);
  const cls = w.state === "failed" || stale ? "panic" : w.state === "running" ? "good" : w.state === "exited" || w.state === "released" ? "" : "busy";
  return h("span", { class: `badge ${cls}`, dataset: { state: w.state } }, stale ? `${w.state} (not heard from) ⚠` : w.state);
}

export function section(id, title, ...children) {
  return h("section", { "aria-labelledby": `${id}-h`, id }, h("h2", { id: `${id}-h` }, title), children);
}
