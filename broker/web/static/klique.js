/* Klique's web UI: charts of scalars (uPlot; smoothing and a log axis), histograms, image
   sliders, select-all, ages that tick, the live badge.
   Live data arrives over the page's one EventSource (htmx's sse extension). */
(function () {
  "use strict";
  var COLORS = ["#0b57d0", "#b3261e", "#146c2e", "#8a5300", "#6f42c1", "#0a7f8c", "#c2185b", "#5d4037"];
  var charts = {}; // scalar name -> {plot, series: {label: [[x, y], ...]}}
  var view = { smoothing: 0, log: false }; // the chart controls: how every line is drawn

  function smoothed(ys) {
    // An exponential moving average, debiased at the start (as TensorBoard draws it).
    var w = view.smoothing, last = 0, n = 0;
    if (!w) { return ys; }
    return ys.map(function (y) {
      if (y === null) { return null; }
      last = last * w + (1 - w) * y;
      n += 1;
      return last / (1 - Math.pow(w, n));
    });
  }

  function shown(data) {
    // What is drawn: each line smoothed; on a log axis, values at or below 0 left out.
    return [data[0]].concat(data.slice(1).map(function (ys) {
      var line = smoothed(ys);
      return view.log ? line.map(function (y) { return y !== null && y > 0 ? y : null; }) : line;
    }));
  }

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
    var key = a.labels.join("\n") + (view.log ? "\nlog" : "");
    if (entry.plot && entry.labels === key) { entry.plot.setData(shown(a.data)); return; }
    if (entry.plot) { entry.plot.destroy(); }
    var width = Math.min(560, Math.max(320, box.clientWidth - 20));
    var opts = {
      title: name, width: width, height: 240,
      scales: { x: { time: false }, y: view.log ? { distr: 3 } : {} },
      axes: [{ label: "step" }, {}],
      series: [{ label: "step" }].concat(a.labels.map(function (l, i) {
        return { label: l, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { show: true, size: 4 } };
      }))
    };
    entry.holder.textContent = "";
    entry.plot = new uPlot(opts, shown(a.data), entry.holder);
    entry.labels = key;
  }

  function initChartControls(box) {
    var smoothing = document.querySelector("[data-smoothing]");
    var log = document.querySelector("[data-log-axis]");
    var output = document.querySelector("[data-smoothing-value]");
    function redraw() {
      view.smoothing = smoothing ? parseFloat(smoothing.value) || 0 : 0;
      view.log = !!(log && log.checked);
      if (output) { output.textContent = String(view.smoothing); }
      Object.keys(charts).forEach(function (name) { draw(box, name); });
    }
    if (smoothing) { smoothing.addEventListener("input", redraw); }
    if (log) { log.addEventListener("change", redraw); }
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
    initChartControls(box);
    initial.charts.forEach(function (c) {
      var entry = ensure(box, c.name);
      c.series.forEach(function (s) { entry.series[s.label] = s.points.slice(); });
      draw(box, c.name);
    });
    box.addEventListener("htmx:sseBeforeMessage", function (evt) {
      if (evt.detail.type !== "scalars") { return; }
      evt.preventDefault(); // JSON for the charts, not HTML to swap
      var touched = {};
      JSON.parse(evt.detail.data).forEach(function (s) {
        var entry = ensure(box, s.name);
        var label = s.series || s.name; // a chart per title, a line per series
        var points = entry.series[label] || (entry.series[label] = []);
        points.push([s.step === null ? points.length : s.step, s.value]);
        touched[s.name] = true;
      });
      Object.keys(touched).forEach(function (name) { draw(box, name); });
      var none = document.querySelector("[data-no-scalars]");
      if (none) { none.remove(); }
    });
  }

  function initHistograms() {
    var box = document.querySelector("[data-histograms]");
    var source = document.getElementById("histogram-data");
    if (!box || !source || typeof uPlot === "undefined") { return; }
    JSON.parse(source.textContent).forEach(function (h, i) {
      var fig = document.createElement("figure");
      fig.className = "chart";
      fig.setAttribute("data-histogram", h.title);
      var caption = document.createElement("figcaption");
      caption.className = "visually-hidden";
      caption.textContent = "Histogram " + h.title + ": " + h.labels.map(function (l, k) {
        return l + " " + h.values[k];
      }).join(", ");
      var holder = document.createElement("div");
      fig.appendChild(caption);
      fig.appendChild(holder);
      box.appendChild(fig);
      var xs = h.values.map(function (_, k) { return k; });
      var bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.7, 80] }) : undefined;
      var color = COLORS[i % COLORS.length];
      new uPlot({
        title: h.title, width: Math.min(560, Math.max(320, box.clientWidth - 20)), height: 240,
        scales: {
          x: { time: false, range: [-0.5, Math.max(0.5, xs.length - 0.5)] },
          y: { range: function (u, min, max) { return [Math.min(0, min), Math.max(0, max) * 1.05 || 1]; } }
        },
        axes: [{ splits: function () { return xs; }, values: function (u, splits) {
          return splits.map(function (k) { return k in h.labels ? String(h.labels[k]) : ""; });
        } }, {}],
        series: [{ label: "bin" }, { label: h.series, stroke: color, fill: color + "80", width: 1, paths: bars, points: { show: !bars } }]
      }, [xs, h.values], holder);
    });
  }

  function initImageSliders() {
    document.querySelectorAll("[data-image-slider]").forEach(function (slider) {
      var steps = JSON.parse(slider.getAttribute("data-steps"));
      var fig = slider.closest("[data-image-series]");
      var img = fig.querySelector("[data-image]");
      var label = fig.querySelector("[data-image-step]");
      slider.addEventListener("input", function () {
        var step = steps[parseInt(slider.value, 10)];
        if (!step) { return; }
        img.src = step.src;
        var at = step.iteration === null ? "" : "iteration " + step.iteration;
        label.textContent = at;
        img.alt = img.alt.replace(/, iteration .*$/, "") + (at ? ", " + at : "");
      });
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
    initHistograms();
    initImageSliders();
    initSelection();
    initLiveBadge();
    initNewRows();
    initConsole();
    setInterval(tickAges, 10000);
  });
})();
