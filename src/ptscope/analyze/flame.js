// ptscope flame graph / flame chart: hover for details, click to zoom, search.
// Written for ptscope (see src/ptscope/analyze/flame_svg.py, which embeds it).
// Every box is a <g class="f"> holding a <title> (first line: the name), a <rect> and a
// <text>; its data-* attributes keep the box in ns (x, w), its depth (d), band (l),
// self time (s) and calls (c), so the script can lay boxes out again at any zoom. A
// differential graph (data-unit="instructions" on the <svg>) measures boxes in
// instructions instead of ns, and each box has its change of self instructions (data-dd).
"use strict";
(function () {
  var svg = document.documentElement;
  var num = function (el, name) { return Number(el.getAttribute(name)); };
  var kind = svg.getAttribute("data-kind");
  var total = num(svg, "data-total");
  var base = num(svg, "data-base");
  var origin = num(svg, "data-origin");
  var width = num(svg, "width");
  var pad = num(svg, "data-pad");
  var charWidth = num(svg, "data-char");
  var unit = svg.getAttribute("data-unit") || "ns";
  var details = document.getElementById("details");
  var matched = document.getElementById("matched");
  var reset = document.getElementById("reset");
  var search = document.getElementById("search");
  var idle = details.textContent;

  var boxes = Array.prototype.map.call(document.querySelectorAll("g.f"), function (g) {
    var title = g.querySelector("title").textContent;
    return {
      g: g, rect: g.querySelector("rect"), text: g.querySelector("text"),
      name: title.split("\n")[0],
      x: num(g, "data-x"), w: num(g, "data-w"), d: num(g, "data-d"), l: num(g, "data-l"),
      s: num(g, "data-s"), c: num(g, "data-c"),
      dd: g.hasAttribute("data-dd") ? num(g, "data-dd") : null
    };
  });
  var byElement = new Map(boxes.map(function (b) { return [b.g, b]; }));
  var view = { x0: 0, x1: total, focus: null };

  function count(n) {
    return Math.round(n).toLocaleString("en-US");
  }

  function duration(ns) {
    if (unit !== "ns") { return count(ns) + " " + unit; }
    var units = [["s", 1e9], ["ms", 1e6], ["us", 1e3]];
    for (var i = 0; i < units.length; i++) {
      if (ns >= units[i][1]) {
        var v = ns / units[i][1];
        return (v >= 100 ? v.toFixed(0) : v.toPrecision(3)) + " " + units[i][0];
      }
    }
    return Math.round(ns) + " ns";
  }

  function share(ns) {
    if (!(base > 0)) { return "-"; }
    var pct = 100 * ns / base;
    return (pct >= 0.1 || pct === 0 ? pct.toFixed(1) : pct.toPrecision(2)) + "%";
  }

  function label(box, pixels) {
    var room = Math.floor((pixels - 6) / charWidth);
    if (room < 3) { return ""; }
    return box.name.length <= room ? box.name : box.name.slice(0, room - 2) + "..";
  }

  // Place every box for the current view: boxes that overlap [x0, x1] are clipped to
  // it and stretched to the full width; the others are hidden. Boxes of the zoomed-in
  // box's band that contain it (its callers) are dimmed.
  function layout() {
    var scale = (width - 2 * pad) / (view.x1 - view.x0);
    var focus = view.focus;
    boxes.forEach(function (box) {
      var a = Math.max(box.x, view.x0);
      var b = Math.min(box.x + box.w, view.x1);
      var shown = b > a;
      box.g.style.display = shown ? "" : "none";
      if (!shown) { return; }
      var left = pad + (a - view.x0) * scale;
      var pixels = (b - a) * scale;
      box.rect.setAttribute("x", left.toFixed(2));
      box.rect.setAttribute("width", Math.max(pixels, 0.3).toFixed(2));
      box.text.setAttribute("x", (left + 3).toFixed(2));
      box.text.textContent = label(box, pixels);
      var caller = focus !== null && box !== focus && box.l === focus.l && box.d < focus.d;
      box.g.classList.toggle("caller", caller);
    });
    reset.style.visibility = focus === null ? "hidden" : "visible";
  }

  function zoom(box) {
    view = box === null ? { x0: 0, x1: total, focus: null }
                        : { x0: box.x, x1: box.x + Math.max(box.w, 1), focus: box };
    layout();
    details.textContent = box === null ? idle : "zoomed to " + box.name + " (click Reset zoom or press Esc)";
  }

  function describe(box) {
    var text = box.name + " \u2014 " + duration(box.w) + " (" + share(box.w) + ")";
    text += ", self " + duration(box.s) + " (" + share(box.s) + ")";
    if (box.dd !== null) {
      var before = box.s - box.dd;
      text += ", self change " + (box.dd > 0 ? "+" : "") + count(box.dd) +
        (before > 0 ? " (" + (box.dd > 0 ? "+" : "") + (100 * box.dd / before).toFixed(1) + "%)"
                    : box.dd !== 0 ? " (new)" : "");
    }
    if (kind === "graph") {
      text += ", " + box.c + (box.c === 1 ? " call" : " calls");
    } else {
      text += ", at " + duration(origin + box.x);
    }
    return text;
  }

  // The time the hits cover, each moment once: hits nested in hits are not added again.
  function coveredTime(hits) {
    var byBand = new Map();
    hits.forEach(function (box) {
      if (!byBand.has(box.l)) { byBand.set(box.l, []); }
      byBand.get(box.l).push(box);
    });
    var sum = 0;
    byBand.forEach(function (list) {
      list.sort(function (p, q) { return p.x - q.x; });
      var end = -Infinity;
      list.forEach(function (box) {
        var right = box.x + box.w;
        if (right > end) {
          sum += right - Math.max(box.x, end);
          end = right;
        }
      });
    });
    return sum;
  }

  function find(pattern) {
    var regex = null;
    if (pattern !== "") {
      try {
        regex = new RegExp(pattern, "i");
      } catch (err) {
        regex = new RegExp(pattern.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i");
      }
    }
    var hits = [];
    boxes.forEach(function (box) {
      var hit = regex !== null && regex.test(box.name);
      box.g.classList.toggle("hit", hit);
      if (hit) { hits.push(box); }
    });
    matched.textContent = regex === null ? "" :
      "matched: " + share(coveredTime(hits)) + (unit === "ns" ? " of the time, " : " of the " + unit + ", ") + hits.length +
      (hits.length === 1 ? " box" : " boxes");
  }

  svg.addEventListener("mouseover", function (event) {
    var g = event.target.closest("g.f");
    if (g !== null) { details.textContent = describe(byElement.get(g)); }
  });
  svg.addEventListener("mouseout", function (event) {
    if (event.target.closest("g.f") !== null) {
      details.textContent = view.focus === null ? idle : "zoomed to " + view.focus.name;
    }
  });
  svg.addEventListener("click", function (event) {
    var g = event.target.closest("g.f");
    if (g !== null) { zoom(byElement.get(g)); }
  });
  reset.addEventListener("click", function () { zoom(null); });
  search.addEventListener("input", function () { find(search.value); });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      if (document.activeElement === search) { search.value = ""; find(""); search.blur(); }
      zoom(null);
    } else if ((event.key === "f" && (event.ctrlKey || event.metaKey)) ||
               (event.key === "/" && document.activeElement !== search)) {
      event.preventDefault();
      search.focus();
    }
  });

  layout();
  svg.setAttribute("data-ready", String(boxes.length));
})();
