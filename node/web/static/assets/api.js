// The node's JSON API, as the dashboard uses it: the session cookie goes
// with every request; state-changing ones carry the CSRF token the page
// was served with.

const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";

// APIError is an error answer: its message, and the request field at fault
// when the API names one.
export class APIError extends Error {
  constructor(status, message, field, code) {
    super(message);
    this.status = status;
    this.field = field || "";
    this.code = code || 0;
  }
}

function signedOut() {
  location.assign("/login");
  return new APIError(401, "Signed out: get a new link with `deepmarket ui`.");
}

async function answer(res) {
  if (res.status === 401) throw signedOut();
  let body = null;
  const text = await res.text();
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
  }
  if (!res.ok) {
    const msg = (body && body.error) || `The node answered ${res.status} ${res.statusText}.`;
    throw new APIError(res.status, msg, body && body.field, body && body.code);
  }
  return body;
}

// api calls the node: api("GET", "/status") reads /api/v1/status.
export async function api(method, path, body) {
  const headers = {};
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch("/api/v1" + path, {
      method, headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new APIError(0, "The node does not answer: is it still running?");
  }
  return answer(res);
}

// upload sends files (with their paths inside the upload) to be added to
// the node's storage; it answers the pin (its CID).
export async function upload(name, files) {
  const fd = new FormData();
  for (const f of files) {
    fd.append("path", f.webkitRelativePath || f.name);
    fd.append("file", f, f.name);
  }
  let res;
  try {
    res = await fetch("/api/v1/data/upload?name=" + encodeURIComponent(name), {
      method: "POST", headers: { "X-CSRF-Token": csrf }, credentials: "same-origin", body: fd,
    });
  } catch (e) {
    throw new APIError(0, "The upload did not reach the node: is it still running?");
  }
  return answer(res);
}

// signOut ends the session.
export async function signOut() {
  await fetch("/logout", { method: "POST", headers: { "X-CSRF-Token": csrf }, credentials: "same-origin" });
  location.assign("/login");
}

// Live is the node's event stream, shared by every page: on(topic, fn)
// calls fn with the topic's latest payload at once (if one came) and on
// every change; it returns a function that stops.
class Live {
  constructor() {
    this.last = new Map();
    this.subs = new Map();
    this.state = new Set();
    this.topics = ["status", "lend", "balance", "jobs", "offers", "peers"];
  }

  start() {
    this.src = new EventSource("/api/v1/events");
    for (const t of this.topics) {
      this.src.addEventListener(t, (ev) => {
        let data;
        try {
          data = JSON.parse(ev.data);
        } catch {
          return;
        }
        this.last.set(t, data);
        for (const fn of this.subs.get(t) || []) fn(data);
      });
    }
    this.src.onopen = () => this.connected(true);
    this.src.onerror = () => {
      this.connected(false);
      // A stream refused for want of a session never recovers: check.
      fetch("/api/v1/status", { credentials: "same-origin" }).then((r) => {
        if (r.status === 401) signedOut();
      }).catch(() => {});
    };
  }

  connected(on) {
    for (const fn of this.state) fn(on);
  }

  onState(fn) {
    this.state.add(fn);
    return () => this.state.delete(fn);
  }

  on(topic, fn) {
    if (!this.subs.has(topic)) this.subs.set(topic, new Set());
    this.subs.get(topic).add(fn);
    if (this.last.has(topic)) fn(this.last.get(topic));
    return () => this.subs.get(topic).delete(fn);
  }
}

export const live = new Live();

// debounce runs fn at most once per ms, after the last call.
export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}
