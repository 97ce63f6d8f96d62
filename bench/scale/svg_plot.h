// The sweep's plot, written as SVG text (no plotting library): two panels
// against world size (log2 axis), samples/s (log axis) with each series' ideal
// line (its smallest world size scaled linearly, dashed), and scaling
// efficiency with the ideal at 1.0. One colour per series; circles for ours,
// squares for torch; solid lines for strong scaling, dashed for weak.
//
// Structure, for readers and tests: each series is a <g class="series"
// data-label="LABEL"> holding one <polyline> per panel and its markers; each
// ideal line a <polyline class="ideal">; the legend a <g class="legend">.
#pragma once

#include "bench/scale/sweep.h"

#include <string>
#include <vector>

namespace ddp::scaling {

struct PlotOptions {
  std::string title = "Data-parallel scaling";
  std::string subtitle;  // e.g. the machine and the flags of the sweep
};

// A complete SVG document (UTF-8, standalone). Series without points are
// skipped; no series at all gives the axes and a "no data" note.
std::string render_svg(const std::vector<Series>& series, const PlotOptions& options);

// `text` with &, <, >, " and ' escaped for XML text and attribute values.
std::string xml_escape(std::string_view text);

}  // namespace ddp::scaling
