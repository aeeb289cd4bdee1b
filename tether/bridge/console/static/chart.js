// A small SVG chart: one series per key, drawn as lines with dots, redrawn on every update.

const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// series: [{name, cls, points: [y, ...]}] (x = index); `name` is the series' legend text.
export function drawLines(container, series, { yLabel = "", xLabel = "turn" } = {}) {
  const W = 560, H = 220, L = 52, R = 10, T = 14, B = 24;
  const all = series.flatMap((s) => s.points);
  const n = Math.max(1, ...series.map((s) => s.points.length));
  const ymax = Math.max(1, ...all) * 1.1;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  const x = (i) => L + (n <= 1 ? 0 : (i * (W - L - R)) / (n - 1));
  const y = (v) => H - B - (v * (H - T - B)) / ymax;
  root.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  root.append(svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  for (const frac of [0, 0.5, 1]) {
    const v = (ymax / 1.1) * frac;
    const t = svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" });
    t.textContent = v >= 10000 ? `${Math.round(v / 1000)}k` : v >= 10 || v === 0 ? String(Math.round(v)) : v.toFixed(1);
    root.append(t);
  }
  const xl = svg("text", { x: W - R, y: H - 6, "text-anchor": "end" });
  xl.textContent = `${xLabel} (1–${n})`;
  root.append(xl);
  if (yLabel) {
    const yl = svg("text", { x: L + 4, y: T - 2 });
    yl.textContent = yLabel;
    root.append(yl);
  }
  series.forEach((s, k) => {
    if (s.points.length) {
      const d = s.points.map((v, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
      root.append(svg("path", { d, class: `line ${s.cls}` }));
      s.points.forEach((v, i) => root.append(svg("circle", { cx: x(i), cy: y(v), r: 2.5, class: s.cls })));
    }
    const lg = svg("text", { x: W - R - 150 + 80 * k, y: T, class: s.cls });
    lg.textContent = s.name;
    root.append(lg);
  });
  container.replaceChildren(root);
}
