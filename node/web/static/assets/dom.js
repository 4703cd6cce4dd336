// Building DOM without innerHTML: everything shown may come from other
// peers (monikers, sites, reasons), so it goes in as text, never markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function set(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") {
      el.addEventListener(k.slice(2).toLowerCase(), v);
    } else if (k === "class") {
      el.setAttribute("class", Array.isArray(v) ? v.filter(Boolean).join(" ") : v);
    } else if (k === "dataset") {
      Object.assign(el.dataset, v);
    } else if (k === "value" && "value" in el && el.namespaceURI !== SVG_NS) {
      el.value = v;
    } else if (k === "checked" || k === "selected") {
      el[k] = Boolean(v);
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// h creates an HTML element: h("a", {href: "/"}, "text", child, [more]).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  set(el, attrs);
  append(el, children);
  return el;
}

// s creates an SVG element.
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  set(el, attrs);
  append(el, children);
  return el;
}

// fill replaces el's children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let ids = 0;
// uid returns an id unique in the document.
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

// table builds a table: columns [{label, num, cls}], rows of cells (a
// cell is text, a node, or {v, cls}); rowAttrs(row index) gives a row's
// attributes (such as class "panic").
export function table({ caption, columns, rows, empty, rowAttrs, id }) {
  if (!rows.length) return h("p", { class: "empty", id }, empty || "Nothing yet.");
  return h("div", { class: "table-wrap" },
    h("table", { id },
      caption ? h("caption", { class: "sr-only" }, caption) : null,
      h("thead", null, h("tr", null, columns.map((c) => h("th", { scope: "col", class: c.num ? "num" : null }, c.label)))),
      h("tbody", null, rows.map((r, i) => h("tr", rowAttrs ? rowAttrs(i) : null,
        r.map((cell, j) => {
          const cls = [columns[j].num ? "num" : null];
          if (cell && typeof cell === "object" && !(cell instanceof Node) && "v" in cell) {
            cls.push(cell.cls);
            return h("td", { class: cls.filter(Boolean).join(" ") || null }, cell.v);
          }
          return h("td", { class: cls.filter(Boolean).join(" ") || null }, cell);
        })))),
    ));
}

// dl builds a description list from [term, value] pairs.
export function dl(pairs, attrs) {
  return h("dl", Object.assign({ class: "kv" }, attrs || {}),
    pairs.filter(Boolean).map(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
}
