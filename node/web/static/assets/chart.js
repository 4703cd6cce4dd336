// Charts as inline SVG: bars per day (credits earned and spent) and lines
// over time (prices). Values are integers (micro-credits), shown with fmt;
// each chart has a title and a text summary for screen readers, and a
// legend.

import { h, s, uid } from "./dom.js";

const W = 720;
const H = 240;
const PAD = { r: 12, t: 12, b: 34 };
const TICKS = 4;

// roundStep is the smallest of 1, 2 or 5 times a power of ten that is at
// least raw.
function roundStep(raw) {
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5]) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

// scale picks a round step (at least 1: values are integers) and a top
// that holds max.
function scale(max) {
  const step = roundStep(Math.max(1, max / TICKS));
  return { step, top: step * Math.max(1, Math.ceil(max / step)) };
}

// axis draws the grid and its labels, and returns the left margin used.
function axis({ top, step }, fmt) {
  const labels = [];
  for (let v = 0; v <= top + step / 2; v += step) labels.push([v, fmt(v)]);
  const left = Math.max(32, 8 + 7 * Math.max(...labels.map(([, t]) => t.length)));
  const plotH = H - PAD.t - PAD.b;
  const grid = labels.map(([v, text]) => {
    const y = PAD.t + plotH * (1 - v / top);
    return s("g", { class: "grid" },
      s("line", { x1: left, x2: W - PAD.r, y1: y, y2: y }),
      s("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, text));
  });
  const base = s("g", { class: "axis" }, s("line", { x1: left, x2: W - PAD.r, y1: PAD.t + plotH, y2: PAD.t + plotH }));
  return { left, nodes: [grid, base] };
}

function frame(title, summary, children) {
  const tid = uid("chart-title");
  const did = uid("chart-desc");
  return s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": `${tid} ${did}` },
    s("title", { id: tid }, title),
    s("desc", { id: did }, summary),
    children);
}

function legend(items) {
  return h("ul", { class: "legend", "aria-hidden": "true" },
    items.map(([cls, label]) => h("li", null, h("span", { class: `swatch ${cls}` }), label)));
}

// barChart draws a bar per series for each point: series [{key, label,
// cls}], points [{label, <key>: value}].
export function barChart({ title, points, series, fmt, summary }) {
  const sc = scale(Math.max(0, ...points.flatMap((p) => series.map((se) => Number(p[se.key]) || 0))));
  const ax = axis(sc, fmt);
  const plotW = W - ax.left - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  const slot = plotW / Math.max(1, points.length);
  const barW = Math.max(1, (slot * 0.8) / series.length);
  const bars = [];
  const labels = [];
  const every = Math.ceil(points.length / 8);
  const lastLabelled = Math.floor((points.length - 1) / every) * every;
  points.forEach((p, i) => {
    series.forEach((se, j) => {
      const v = Number(p[se.key]) || 0;
      const bh = (v / sc.top) * plotH;
      const x = ax.left + i * slot + slot * 0.1 + j * barW;
      bars.push(s("rect", { class: se.cls, x: x.toFixed(1), y: (PAD.t + plotH - bh).toFixed(1), width: barW.toFixed(1), height: Math.max(0, bh).toFixed(1) },
        s("title", null, `${p.label}: ${se.label} ${fmt(v)}`)));
    });
    if (i % every === 0 || (i === points.length - 1 && i - lastLabelled >= every / 2)) {
      labels.push(s("text", { x: (ax.left + i * slot + slot / 2).toFixed(1), y: H - PAD.b + 16, "text-anchor": "middle" }, p.label));
    }
  });
  return h("figure", { class: "chart-figure" },
    frame(title, summary, [ax.nodes, bars, labels]),
    legend(series.map((se) => [se.cls, se.label])));
}

// lineChart draws one line per series over time: points [{t (ms), values:
// [.. (null: no value then)]}], series [{label}]. The time axis covers the points, at least
// minSpan and at most maxSpan (ms) back from the last one.
export function lineChart({ title, points, series, fmt, summary, minSpan = 600000, maxSpan = 86400000 }) {
  const t1 = points.length ? points[points.length - 1].t : Date.now();
  const first = points.length ? points[0].t : t1;
  const t0 = t1 - Math.min(maxSpan, Math.max(minSpan, t1 - first));
  const shown = points.filter((p) => p.t >= t0);
  const sc = scale(Math.max(0, ...shown.flatMap((p) => p.values.map((v) => Number(v) || 0))));
  const ax = axis(sc, fmt);
  const plotW = W - ax.left - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  const x = (t) => ax.left + ((t - t0) / (t1 - t0 || 1)) * plotW;
  const y = (v) => PAD.t + plotH - ((Number(v) || 0) / sc.top) * plotH;
  const lines = series.map((se, j) => {
    const g = s("g", { class: `series-${j}` });
    // A null value is a gap (nothing to price then): the line breaks.
    let run = [];
    const flush = () => {
      if (run.length > 1) g.append(s("polyline", { class: `series-${j}`, points: run.join(" ") }));
      run = [];
    };
    for (const p of shown) {
      if (p.values[j] === null || p.values[j] === undefined) flush();
      else run.push(`${x(p.t).toFixed(1)},${y(p.values[j]).toFixed(1)}`);
    }
    flush();
    // A dot on the latest value (and on a single sample).
    const last = shown[shown.length - 1];
    if (last && last.values[j] !== null && last.values[j] !== undefined) {
      g.append(s("circle", { class: `series-${j}`, cx: x(last.t).toFixed(1), cy: y(last.values[j]).toFixed(1), r: 3 },
        s("title", null, `${se.label}: ${fmt(last.values[j])}`)));
    }
    return g;
  });
  const labels = [];
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    labels.push(s("text", { x: x(t).toFixed(1), y: H - PAD.b + 16, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" },
      new Date(t).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" })));
  }
  return h("figure", { class: "chart-figure" },
    frame(title, summary, [ax.nodes, lines, labels]),
    legend(series.map((se, j) => [`series-${j}`, se.label])));
}

// niceRange is an axis over [lo, hi] in round steps (1, 2 or 5 times a
// power of ten), for values of any size (losses, accuracies, steps).
function niceRange(lo, hi) {
  if (!(hi > lo)) hi = lo + (lo === 0 ? 1 : Math.abs(lo) * 0.1);
  const step = roundStep((hi - lo) / TICKS);
  const first = Math.floor(lo / step) * step;
  const last = Math.ceil(hi / step) * step;
  return { lo: first, hi: last, step };
}

function tickLabel(v, step) {
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  return v.toFixed(Math.min(6, digits));
}

// curveChart draws training curves: one line per series over x (steps or
// seconds), series [{label, points: [[x, y]], dots (draw each point: an
// evaluation)}]. fmtX labels the x axis.
export function curveChart({ title, series, summary, fmtX = String, xLabel = "" }) {
  const all = series.flatMap((se) => se.points);
  const xs = niceRange(Math.min(0, ...all.map((p) => p[0])), Math.max(1, ...all.map((p) => p[0])));
  const ys = niceRange(Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1])));
  const labels = [];
  for (let v = ys.lo; v <= ys.hi + ys.step / 2; v += ys.step) labels.push([v, tickLabel(v, ys.step)]);
  const left = Math.max(32, 8 + 7 * Math.max(...labels.map(([, t]) => t.length)));
  const plotW = W - left - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  const x = (v) => left + ((v - xs.lo) / (xs.hi - xs.lo)) * plotW;
  const y = (v) => PAD.t + plotH * (1 - (v - ys.lo) / (ys.hi - ys.lo));
  const grid = labels.map(([v, text]) => s("g", { class: "grid" },
    s("line", { x1: left, x2: W - PAD.r, y1: y(v), y2: y(v) }),
    s("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, text)));
  const base = s("g", { class: "axis" }, s("line", { x1: left, x2: W - PAD.r, y1: PAD.t + plotH, y2: PAD.t + plotH }));
  const xt = [];
  for (let v = xs.lo; v <= xs.hi + xs.step / 2; v += xs.step) {
    xt.push(s("text", { x: x(v).toFixed(1), y: H - PAD.b + 16, "text-anchor": "middle" }, fmtX(v)));
  }
  if (xLabel) xt.push(s("text", { x: W - PAD.r, y: H - 4, "text-anchor": "end" }, xLabel));
  const lines = series.map((se, j) => {
    const g = s("g", { class: `series-${j % 6}` });
    const pts = se.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`);
    if (!se.dots && pts.length > 1) g.append(s("polyline", { class: `series-${j % 6}`, points: pts.join(" ") }));
    se.points.forEach((p, i) => {
      if (se.dots || i === se.points.length - 1) {
        g.append(s("circle", { class: `series-${j % 6}`, cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: se.dots ? 4 : 3 },
          s("title", null, `${se.label}: ${p[1].toFixed(4)} at ${fmtX(p[0])}`)));
      }
    });
    return g;
  });
  return h("figure", { class: "chart-figure" },
    frame(title, summary, [grid, base, xt, lines]),
    legend(series.map((se, j) => [`series-${j % 6}`, se.label + (se.dots ? " (evaluated)" : "")])));
}
