// Costs and earnings over time: uPlot (vendored from npm by `just setup`), one chart per account.

import uPlot from "/vendor/uPlot.esm.js";

const SPENT = "#f0883e";
const EARNED = "#3fb950";

export function ledgerChart(series, width) {
  const xs = series.points.map((p) => Date.parse(p.start) / 1000);
  // Amounts are exact decimal strings; the chart only draws them.
  const spent = series.points.map((p) => Number(p.spent));
  const earned = series.points.map((p) => Number(p.earned));
  const step = series.period === "hour" ? 3600 : 86400;
  const holder = document.createElement("div");
  holder.className = "chart";
  holder.dataset.account = series.account;
  const opts = {
    title: `${series.account}: credits per ${series.period}`,
    width,
    height: 240,
    series: [
      {},
      { label: "spent", stroke: SPENT, fill: "rgba(240,136,62,0.15)", points: { show: true } },
      { label: "earned", stroke: EARNED, fill: "rgba(63,185,80,0.12)", points: { show: true } },
    ],
    scales: {
      // a period's margin either side: one period alone is drawn in the middle
      x: { time: true, range: [xs[0] - step, xs[xs.length - 1] + step] },
    },
    axes: [
      { stroke: "#8a96a3", grid: { stroke: "#26303b" } },
      {
        stroke: "#8a96a3",
        grid: { stroke: "#26303b" },
        size: 84,
        values: (u, ticks) => ticks.map((v) => (v === 0 ? "0" : Number(v.toPrecision(3)).toString())),
      },
    ],
  };
  new uPlot(opts, [xs, spent, earned], holder);
  return holder;
}
