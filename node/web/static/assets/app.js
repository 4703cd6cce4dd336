// The dashboard's shell: the page its path names, navigation without
// reloading, the live connection, and signing out.

import { live, signOut } from "./api.js";
import { h, fill } from "./dom.js";
import * as dashboard from "./pages/dashboard.js";
import * as resources from "./pages/resources.js";
import * as jobsPage from "./pages/jobs.js";
import * as jobPage from "./pages/job.js";
import * as market from "./pages/market.js";
import * as ledger from "./pages/ledger.js";
import * as network from "./pages/network.js";

const routes = [
  [/^\/$/, dashboard, "Dashboard"],
  [/^\/resources$/, resources, "Resources"],
  [/^\/jobs$/, jobsPage, "Jobs"],
  [/^\/jobs\/([0-9a-fA-F]{6,64})$/, jobPage, "Job"],
  [/^\/market$/, market, "Market"],
  [/^\/ledger$/, ledger, "Ledger"],
  [/^\/network$/, network, "Network"],
];

const main = document.getElementById("main");
let stop = null;

function markNav(path) {
  for (const a of document.querySelectorAll("a[data-nav]")) {
    const href = a.getAttribute("href");
    const here = href === "/" ? path === "/" : path === href || path.startsWith(href + "/");
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

// show draws the page for path.
export function show(path, { focus = true } = {}) {
  if (stop) {
    try {
      stop();
    } catch (e) {
      console.error(e);
    }
    stop = null;
  }
  markNav(path);
  const route = routes.find(([re]) => re.test(path));
  if (!route) {
    document.title = "Not found · DeepMarket";
    fill(main, h("h1", null, "No such page"), h("p", null, h("a", { href: "/", "data-nav": "" }, "Back to the dashboard")));
    return;
  }
  const [re, page, title] = route;
  const params = path.match(re).slice(1);
  document.title = `${title} · DeepMarket`;
  main.replaceChildren();
  main.dataset.page = title.toLowerCase();
  stop = page.render(main, { params, navigate }) || null;
  if (focus) main.focus({ preventScroll: true });
}

// navigate goes to path without reloading.
export function navigate(path) {
  if (path !== location.pathname) history.pushState(null, "", path);
  show(path);
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a[data-nav]");
  if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
  ev.preventDefault();
  navigate(a.getAttribute("href"));
});
window.addEventListener("popstate", () => show(location.pathname));

document.getElementById("logout").addEventListener("click", () => signOut());

const liveEl = document.getElementById("live");
live.onState((on) => {
  liveEl.className = on ? "live on" : "live off";
  liveEl.textContent = on ? "live" : "reconnecting…";
});
live.on("status", (st) => {
  document.getElementById("node-name").textContent = st.moniker ? `· ${st.moniker}` : "";
});
live.start();
show(location.pathname, { focus: false });
