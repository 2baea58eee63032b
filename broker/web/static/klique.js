/* Klique's web UI: charts of scalars (uPlot), select-all, ages that tick, the live badge.
   Live data arrives over the page's one EventSource (htmx's sse extension). */
(function () {
  "use strict";
  var COLORS = ["#0b57d0", "#b3261e", "#146c2e", "#8a5300", "#6f42c1", "#0a7f8c", "#c2185b", "#5d4037"];
  var charts = {}; // scalar name -> {plot, series: {label: [[x, y], ...]}}

  function aligned(series) {
    var labels = Object.keys(series);
    var xs = {};
    labels.forEach(function (l) { series[l].forEach(function (p) { xs[p[0]] = true; }); });
    var xAxis = Object.keys(xs).map(Number).sort(function (a, b) { return a - b; });
    var data = [xAxis];
    labels.forEach(function (l) {
      var byX = {};
      series[l].forEach(function (p) { byX[p[0]] = p[1]; });
      data.push(xAxis.map(function (x) { return x in byX ? byX[x] : null; }));
    });
    return { labels: labels, data: data };
  }

  function draw(box, name) {
    var entry = charts[name];
    var a = aligned(entry.series);
    if (entry.plot && entry.labels === a.labels.join("\n")) { entry.plot.setData(a.data); return; }
    if (entry.plot) { entry.plot.destroy(); }
    var width = Math.min(560, Math.max(320, box.clientWidth - 20));
    var opts = {
      title: name, width: width, height: 240,
      scales: { x: { time: false } },
      axes: [{ label: "step" }, {}],
      series: [{ label: "step" }].concat(a.labels.map(function (l, i) {
        return { label: l, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { show: true, size: 4 } };
      }))
    };
    entry.holder.textContent = "";
    entry.plot = new uPlot(opts, a.data, entry.holder);
    entry.labels = a.labels.join("\n");
  }

  function ensure(box, name) {
    if (!charts[name]) {
      var fig = document.createElement("figure");
      fig.className = "chart";
      fig.setAttribute("data-scalar", name);
      var caption = document.createElement("figcaption");
      caption.className = "visually-hidden";
      caption.textContent = "Scalar " + name + " by step";
      var holder = document.createElement("div");
      fig.appendChild(caption);
      fig.appendChild(holder);
      box.appendChild(fig);
      charts[name] = { series: {}, holder: holder, plot: null, labels: "" };
    }
    return charts[name];
  }

  function initCharts() {
    var box = document.querySelector("[data-charts]");
    var source = document.getElementById("chart-data");
    if (!box || !source || typeof uPlot === "undefined") { return; }
    var initial = JSON.parse(source.textContent);
    initial.charts.forEach(function (c) {
      var entry = ensure(box, c.name);
      c.series.forEach(function (s) { entry.series[s.label] = s.points.slice(); });
      draw(box, c.name);
    });
    box.addEventListener("htmx:sseBeforeMessage", function (evt) {
      if (evt.detail.type !== "scalars") { return; }
      evt.preventDefault(); // JSON for the charts, not HTML to swap
      var label = "task " + box.getAttribute("data-task");
      var touched = {};
      JSON.parse(evt.detail.data).forEach(function (s) {
        var entry = ensure(box, s.name);
        var points = entry.series[label] || (entry.series[label] = []);
        points.push([s.step === null ? points.length : s.step, s.value]);
        touched[s.name] = true;
      });
      Object.keys(touched).forEach(function (name) { draw(box, name); });
      var none = document.querySelector("[data-no-scalars]");
      if (none) { none.remove(); }
    });
  }

  var selected = {}; // task id -> true: kept when a live update redraws a row

  function initSelection() {
    var boxes = "input[name=id][form=cancel-many]";
    document.addEventListener("change", function (evt) {
      if (evt.target.matches("[data-select-all]")) {
        document.querySelectorAll(boxes).forEach(function (box) {
          box.checked = evt.target.checked;
          if (box.checked) { selected[box.value] = true; } else { delete selected[box.value]; }
        });
      } else if (evt.target.matches(boxes)) {
        if (evt.target.checked) { selected[evt.target.value] = true; } else { delete selected[evt.target.value]; }
      }
    });
    document.body.addEventListener("htmx:load", function (evt) {
      var box = evt.target.querySelector && evt.target.querySelector(boxes);
      if (box && selected[box.value]) { box.checked = true; }
      if (box) { document.querySelectorAll("[data-empty]").forEach(function (el) { el.remove(); }); }
    });
  }

  function age(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    if (s < 60) { return s + " s"; }
    if (s < 3600) { return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s"; }
    if (s < 86400) { return Math.floor(s / 3600) + " h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + " min"; }
    return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
  }

  function tickAges() {
    var now = Date.now() / 1000;
    document.querySelectorAll("[data-age]").forEach(function (el) {
      el.textContent = age(now - parseFloat(el.getAttribute("data-age")));
    });
  }

  function initNewRows() {
    // A task that came in live is sent again as new after a reconnect: redraw it in place.
    document.body.addEventListener("htmx:sseBeforeMessage", function (evt) {
      if (evt.detail.type !== "task-new") { return; }
      var id = /id="(task-\d+)"/.exec(evt.detail.data);
      var existing = id && document.getElementById(id[1]);
      if (!existing) { return; }
      evt.preventDefault();
      htmx.swap(existing, evt.detail.data, { swapStyle: "outerHTML" });
    });
  }

  function initLiveBadge() {
    document.body.addEventListener("htmx:sseOpen", function () {
      document.querySelectorAll("[data-live-status]").forEach(function (el) { el.setAttribute("data-state", "open"); });
    });
    document.body.addEventListener("htmx:sseError", function () {
      document.querySelectorAll("[data-live-status]").forEach(function (el) { el.setAttribute("data-state", "closed"); });
    });
  }

  function initConsole() {
    var pre = document.getElementById("console");
    if (!pre) { return; }
    pre.scrollTop = pre.scrollHeight;
    pre.addEventListener("htmx:sseMessage", function () { pre.scrollTop = pre.scrollHeight; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    initCharts();
    initSelection();
    initLiveBadge();
    initNewRows();
    initConsole();
    setInterval(tickAges, 10000);
  });
})();
