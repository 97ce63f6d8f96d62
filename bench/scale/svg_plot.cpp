#include "bench/scale/svg_plot.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>

namespace ddp::scaling {
namespace {

constexpr std::array kPalette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                 "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
constexpr double kWidth = 1000, kPanelTop = 80, kPanelHeight = 300, kPanelWidth = 380;
constexpr double kLegendTop = 440, kLegendRow = 20;

// Maps data values to pixels; `log` axes map log(value).
struct Axis {
  double lo = 1, hi = 10;
  bool log = false;
  double px_lo = 0, px_hi = 1;  // pixel of lo, pixel of hi (y axes: px_lo > px_hi)

  double map(double v) const {
    const double t =
        log ? (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo)) : (v - lo) / (hi - lo);
    return px_lo + t * (px_hi - px_lo);
  }
};

struct Panel {
  double left = 0;
  std::string title, y_label;
  Axis x, y;
  std::vector<double> y_ticks;
};

// "950", "12K", "1.5M": compact tick labels.
std::string short_number(double v) {
  if (v >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:g}K", v / 1e3);
  return fmt::format("{:g}", v);
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  for (double decade = std::pow(10.0, std::floor(std::log10(lo))); decade <= hi; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (decade * m >= lo && decade * m <= hi) ticks.push_back(decade * m);
    }
  }
  return ticks;
}

// The ideal line of a series: its smallest world size's throughput, scaled linearly.
double ideal_samples_per_s(const Series& s, int world_size) {
  const SeriesPoint& base = s.points.front();
  return base.samples_per_s * world_size / base.world_size;
}

Axis world_axis(const std::vector<Series>& series, double left) {
  int lo = std::numeric_limits<int>::max(), hi = 1;
  for (const auto& s : series) {
    for (const auto& p : s.points) lo = std::min(lo, p.world_size), hi = std::max(hi, p.world_size);
  }
  if (lo > hi) lo = 1, hi = 4;
  const double pad = lo == hi ? 2.0 : 1.25;
  return {.lo = lo / pad, .hi = hi * pad, .log = true, .px_lo = left, .px_hi = left + kPanelWidth};
}

Panel throughput_panel(const std::vector<Series>& series, double left) {
  double lo = std::numeric_limits<double>::max(), hi = 0;
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      lo = std::min(lo, p.samples_per_s);
      hi = std::max({hi, p.samples_per_s, ideal_samples_per_s(s, p.world_size)});
    }
  }
  if (!(lo > 0 && hi >= lo)) lo = 100, hi = 1000;
  Panel panel;
  panel.left = left;
  panel.title = "throughput";
  panel.y_label = "samples/s (all ranks, log scale)";
  panel.x = world_axis(series, left);
  panel.y = {.lo = lo / 1.3,
             .hi = hi * 1.3,
             .log = true,
             .px_lo = kPanelTop + kPanelHeight,
             .px_hi = kPanelTop};
  panel.y_ticks = log_ticks(panel.y.lo, panel.y.hi);
  return panel;
}

Panel efficiency_panel(const std::vector<Series>& series, double left) {
  double hi = 1.2;
  for (const auto& s : series) {
    for (const auto& p : s.points) hi = std::max(hi, std::ceil(p.efficiency * 10) / 10 + 0.1);
  }
  Panel panel;
  panel.left = left;
  panel.title = "scaling efficiency";
  panel.y_label = "per-rank samples/s / that at the smallest W";
  panel.x = world_axis(series, left);
  panel.y = {
      .lo = 0, .hi = hi, .log = false, .px_lo = kPanelTop + kPanelHeight, .px_hi = kPanelTop};
  const double step = hi > 3 ? 0.5 : 0.2;
  for (double t = 0; t <= hi + 1e-9; t += step) panel.y_ticks.push_back(t);
  return panel;
}

void render_frame(std::string& out, const Panel& panel, const std::set<int>& world_sizes) {
  const double bottom = kPanelTop + kPanelHeight, right = panel.left + kPanelWidth;
  out += fmt::format(
      "<g class=\"axes\">\n<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"panel-title\">{}</text>\n",
      panel.left + kPanelWidth / 2, kPanelTop - 10, xml_escape(panel.title));
  for (double t : panel.y_ticks) {
    const double y = panel.y.map(t);
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"ytick\">{}</text>\n",
        panel.left, y, right, y, panel.left - 6, y + 4,
        panel.y.log ? short_number(t) : fmt::format("{:.1f}", t));
  }
  for (int w : world_sizes) {
    const double x = panel.x.map(w);
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"xtick\">{}</text>\n",
        x, kPanelTop, x, bottom, x, bottom + 16, w);
  }
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" class=\"frame\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"xlabel\">world size (ranks)</text>\n"
      "<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" class=\"ylabel\">{}</text>\n</g>\n",
      panel.left, kPanelTop, kPanelWidth, kPanelHeight, panel.left + kPanelWidth / 2, bottom + 36,
      panel.left - 52, kPanelTop + kPanelHeight / 2, xml_escape(panel.y_label));
}

std::string marker(const Series& s, double x, double y, const std::string& color,
                   const std::string& tooltip) {
  const std::string title = fmt::format("<title>{}</title>", xml_escape(tooltip));
  if (s.impl == "torch") {
    return fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"8\" height=\"8\" fill=\"{}\">{}</rect>\n", x - 4,
        y - 4, color, title);
  }
  return fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" fill=\"{}\">{}</circle>\n", x,
                     y, color, title);
}

std::string dash_of(const Series& s) {
  return s.scaling == "weak" ? " stroke-dasharray=\"7 4\"" : "";
}

void render_series(std::string& out, const Series& s, const std::string& color,
                   const Panel& throughput, const Panel& efficiency) {
  out += fmt::format("<g class=\"series\" data-label=\"{}\">\n", xml_escape(s.label));
  for (const Panel* panel : {&throughput, &efficiency}) {
    std::string points, markers;
    for (const auto& p : s.points) {
      const double value = panel == &throughput ? p.samples_per_s : p.efficiency;
      const double x = panel->x.map(p.world_size), y = panel->y.map(value);
      points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", x, y);
      markers +=
          marker(s, x, y, color,
                 fmt::format("{} W={}: {:.0f} samples/s, efficiency {:.2f} (median of {})", s.label,
                             p.world_size, p.samples_per_s, p.efficiency, p.repeats));
    }
    out += fmt::format(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n{}", points,
        color, dash_of(s), markers);
  }
  out += "</g>\n";
}

void render_ideals(std::string& out, const std::vector<Series>& series,
                   const std::vector<std::string>& colours, const Panel& throughput,
                   const Panel& efficiency) {
  out += "<g class=\"ideals\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    if (s.points.size() < 2) continue;
    const int w0 = s.points.front().world_size, w1 = s.points.back().world_size;
    out += fmt::format(
        "<polyline class=\"ideal\" data-label=\"{}\" points=\"{:.1f},{:.1f} {:.1f},{:.1f}\" "
        "fill=\"none\" stroke=\"{}\" stroke-width=\"1\" stroke-dasharray=\"2 3\" "
        "opacity=\"0.7\"/>\n",
        xml_escape(s.label), throughput.x.map(w0), throughput.y.map(ideal_samples_per_s(s, w0)),
        throughput.x.map(w1), throughput.y.map(ideal_samples_per_s(s, w1)), colours[i]);
  }
  const double y = efficiency.y.map(1.0);
  out += fmt::format(
      "<polyline class=\"ideal\" data-label=\"ideal efficiency\" points=\"{:.1f},{:.1f} "
      "{:.1f},{:.1f}\" "
      "fill=\"none\" stroke=\"#444\" stroke-width=\"1\" stroke-dasharray=\"2 3\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"note\">ideal</text>\n</g>\n",
      efficiency.left, y, efficiency.left + kPanelWidth, y, efficiency.left + kPanelWidth - 30,
      y - 5);
}

// One colour per group (implementation and model): strong and weak scaling of
// the same code share it and differ by dash.
std::vector<std::string> colours_of(const std::vector<Series>& series) {
  std::vector<std::string> groups, colours;
  for (const auto& s : series) {
    auto it = std::find(groups.begin(), groups.end(), s.group);
    if (it == groups.end()) it = groups.insert(groups.end(), s.group);
    colours.push_back(kPalette[static_cast<size_t>(it - groups.begin()) % kPalette.size()]);
  }
  return colours;
}

// The legend: every series and the ideal lines' entry, in two columns.
size_t legend_rows(size_t series) {
  return (series + 2) / 2;
}

void render_legend(std::string& out, const std::vector<Series>& series,
                   const std::vector<std::string>& colours) {
  out += "<g class=\"legend\">\n";
  const size_t rows = legend_rows(series.size());
  for (size_t i = 0; i <= series.size(); ++i) {
    const double x = 90 + (i < rows ? 0 : 500), y = kLegendTop + (i % rows) * kLegendRow;
    if (i == series.size()) {  // the ideal lines' entry
      out += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#444\" "
          "stroke-dasharray=\"2 3\"/>\n<text x=\"{:.1f}\" y=\"{:.1f}\">ideal (linear from each "
          "series' smallest world size)</text>\n",
          x, y, x + 30, y, x + 40, y + 4);
      break;
    }
    const std::string& color = colours[i];
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n{}<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        x, y, x + 30, y, color, dash_of(series[i]),
        marker(series[i], x + 15, y, color, series[i].label), x + 40, y + 4,
        xml_escape(series[i].label));
  }
  out += "</g>\n";
}

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_svg(const std::vector<Series>& all, const PlotOptions& options) {
  std::vector<Series> series;
  std::set<int> world_sizes;
  for (const auto& s : all) {
    if (s.points.empty()) continue;
    series.push_back(s);
    for (const auto& p : s.points) world_sizes.insert(p.world_size);
  }
  const Panel throughput = throughput_panel(series, 90);
  const Panel efficiency = efficiency_panel(series, 590);
  const double height = kLegendTop + legend_rows(series.size()) * kLegendRow + 10;
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<style>.grid{{stroke:#e4e4e4}} .frame{{fill:none;stroke:#888}} "
      ".xtick,.xlabel,.panel-title{{text-anchor:middle}} .ytick{{text-anchor:end}} "
      ".ylabel{{text-anchor:middle}} .panel-title{{font-size:14px;font-weight:bold}} "
      ".note{{fill:#444}}</style>\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2:.0f}\" y=\"26\" text-anchor=\"middle\" font-size=\"18\">{3}</text>\n"
      "<text x=\"{2:.0f}\" y=\"46\" text-anchor=\"middle\" class=\"note\">{4}</text>\n",
      kWidth, height, kWidth / 2, xml_escape(options.title), xml_escape(options.subtitle));
  render_frame(out, throughput, world_sizes);
  render_frame(out, efficiency, world_sizes);
  if (series.empty()) {
    out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"middle\">no data</text>\n",
                       kWidth / 2, kPanelTop + kPanelHeight / 2);
  }
  const auto colours = colours_of(series);
  render_ideals(out, series, colours, throughput, efficiency);
  for (size_t i = 0; i < series.size(); ++i) {
    render_series(out, series[i], colours[i], throughput, efficiency);
  }
  render_legend(out, series, colours);
  out += "</svg>\n";
  return out;
}

}  // namespace ddp::scaling
