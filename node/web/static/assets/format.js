// Numbers as the CLI writes them: credits from micro-credits (integers in
// the API), sizes in binary units.

export const MICRO = 1000000;

// credits formats micro-credits as credits with up to six decimals.
export function credits(micro) {
  const m = BigInt(Math.max(0, Math.round(Number(micro) || 0)));
  const whole = m / 1000000n;
  const frac = (m % 1000000n).toString().padStart(6, "0").replace(/0+$/, "");
  return frac ? `${whole}.${frac}` : `${whole}`;
}

// parseCredits reads "12.5" as micro-credits; null when it is not an
// amount with at most six decimals.
export function parseCredits(s) {
  const m = /^\s*(\d+)(?:\.(\d{0,6}))?\s*$/.exec(String(s));
  if (!m) return null;
  const v = Number(m[1]) * MICRO + Number((m[2] || "").padEnd(6, "0"));
  return Number.isSafeInteger(v) ? v : null;
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

// size formats bytes: 8589934592 -> "8 GiB".
export function size(bytes) {
  let v = Number(bytes) || 0;
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i += 1;
  }
  const digits = v >= 100 || i === 0 ? 0 : v >= 10 ? 1 : 2;
  return `${Number(v.toFixed(digits))} ${UNITS[i]}`;
}

export const GiB = 1024 * 1024 * 1024;

// shortID shortens peer IDs, job IDs and hashes for tables.
export function shortID(id, n = 12) {
  if (!id) return "";
  return id.length > n + 1 ? id.slice(0, n) + "…" : id;
}

// shortPeer keeps a peer ID's end, where they differ.
export function shortPeer(id) {
  if (!id) return "";
  return id.length > 14 ? "…" + id.slice(-10) : id;
}

// when formats a time (ISO string) in local time.
export function when(t) {
  if (!t) return "";
  const d = new Date(t);
  if (Number.isNaN(d.getTime()) || d.getFullYear() < 2000) return "";
  return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

// ago says how long ago a time was.
export function ago(t, now = Date.now()) {
  if (!t) return "";
  const s = Math.round((now - new Date(t).getTime()) / 1000);
  if (Number.isNaN(s)) return "";
  if (s < 0) return "in " + duration(-s);
  return duration(s) + " ago";
}

// duration formats seconds: 3725 -> "1h 2m".
export function duration(sec) {
  sec = Math.max(0, Math.round(sec));
  if (sec < 60) return `${sec}s`;
  const m = Math.floor(sec / 60);
  if (m < 60) return `${m}m ${sec % 60}s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return `${hrs}h ${m % 60}m`;
  return `${Math.floor(hrs / 24)}d ${hrs % 24}h`;
}

// nsToDuration formats a Go duration in nanoseconds.
export function nsToDuration(ns) {
  return duration(Number(ns) / 1e9);
}

// resources formats cores, memory and GPUs.
export function resources(r) {
  if (!r) return "";
  const parts = [`${r.cores || 0} cores`, size(r.mem_bytes || 0)];
  if (r.gpus) parts.push(`${r.gpus} GPU${r.gpus === 1 ? "" : "s"}`);
  return parts.join(", ");
}

// splitCommand splits a command line on spaces, keeping quoted parts
// together: python3 train.py --name "a b" -> 4 arguments.
export function splitCommand(line) {
  const out = [];
  let cur = "";
  let quote = "";
  let any = false;
  for (const ch of String(line)) {
    if (quote) {
      if (ch === quote) quote = "";
      else cur += ch;
    } else if (ch === '"' || ch === "'") {
      quote = ch;
      any = true;
    } else if (/\s/.test(ch)) {
      if (cur || any) out.push(cur);
      cur = "";
      any = false;
    } else {
      cur += ch;
    }
  }
  if (cur || any) out.push(cur);
  return out;
}

// joinCommand is splitCommand's inverse, for showing a command.
export function joinCommand(args) {
  return (args || []).map((a) => (/[\s"']/.test(a) || a === "" ? JSON.stringify(a) : a)).join(" ");
}
