// The scale driver's plot: a well-formed SVG document with one group per
// series, its ideal lines, a legend, escaped text, and points where the data
// puts them.
#include "bench/scale/svg_plot.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>

namespace ddp::scaling {
namespace {

// A small XML well-formedness check: every element closed in order, attribute
// values quoted, no stray '<' or '&' in text. Returns "" or what is wrong.
std::string xml_problem(const std::string& doc) {
  std::vector<std::string> open;
  size_t i = 0;
  if (doc.rfind("<?xml", 0) == 0) i = doc.find("?>") + 2;
  while (i < doc.size()) {
    const size_t lt = doc.find('<', i);
    const std::string text = doc.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
      if (!std::regex_search(text.substr(a), std::regex("^&(amp|lt|gt|quot|apos);")))
        return "bare & in text: " + text;
    }
    if (lt == std::string::npos) break;
    const size_t gt = doc.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag";
    const std::string tag = doc.substr(lt + 1, gt - lt - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag: " + tag;
    static const std::regex kAttributes(R"(^/?[A-Za-z][\w:-]*(\s+[\w:-]+="[^"<]*")*\s*/?$)");
    if (!std::regex_match(tag, kAttributes)) return "malformed tag: <" + tag + ">";
    const std::string name =
        tag.substr(tag[0] == '/', tag.find_first_of(" \t\n/", 1) - (tag[0] == '/'));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name) return "unexpected </" + name + ">";
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
    i = gt + 1;
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

Series series(std::string impl, std::string scaling, std::vector<std::pair<int, double>> points) {
  Series s{.label = impl + " mlp " + scaling,
           .group = impl + " mlp",
           .impl = impl,
           .model = "mlp",
           .scaling = scaling,
           .points = {}};
  const double base = points.front().second / points.front().first;
  for (auto [w, sps] : points) {
    s.points.push_back({.world_size = w,
                        .batch_per_rank = 64,
                        .samples_per_s = sps,
                        .min_samples_per_s = sps,
                        .max_samples_per_s = sps,
                        .comm_exposed_ms = 0.0,
                        .efficiency = sps / w / base,
                        .repeats = 1});
  }
  return s;
}

TEST(ScaleSvg, WellFormedWithEverySeriesItsIdealAndTheLegend) {
  const std::vector<Series> all = {series("ours", "strong", {{1, 1000}, {2, 1800}, {4, 3000}}),
                                   series("torch", "strong", {{1, 800}, {2, 1000}, {4, 1200}}),
                                   series("ours", "weak", {{1, 900}, {2, 1700}, {4, 3300}})};
  const std::string svg = render_svg(all, {.title = "t", .subtitle = "s"});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(count(svg, "<g class=\"series\""), 3u);
  for (const auto& s : all) {
    EXPECT_EQ(count(svg, "<g class=\"series\" data-label=\"" + s.label + "\">"), 1u) << s.label;
    EXPECT_EQ(count(svg, "<polyline class=\"ideal\" data-label=\"" + s.label + "\""), 1u);
  }
  EXPECT_EQ(count(svg, "data-label=\"ideal efficiency\""), 1u);
  // Per series one line in each panel; ours draws circles, torch squares (+ legend markers).
  EXPECT_EQ(count(svg, "<polyline points="), 6u);
  EXPECT_EQ(count(svg, "<circle"), 2u * 2 * 3 + 2);
  EXPECT_EQ(count(svg, "<rect x="), 2u * 3 + 1 + 2);  // torch markers, legend marker, 2 frames
  EXPECT_EQ(count(svg, "stroke-dasharray=\"7 4\""), 2u + 1);  // weak: 2 panel lines + legend
  EXPECT_EQ(count(svg, "<g class=\"legend\">"), 1u);
  // ours strong and ours weak share a colour; torch has another.
  const std::regex first_stroke(
      R"re(data-label="([^"]+)">\n<polyline points="[^"]*" fill="none" stroke="(#[0-9a-f]+)")re");
  std::map<std::string, std::string> colour;
  for (std::sregex_iterator it(svg.begin(), svg.end(), first_stroke), end; it != end; ++it) {
    colour[(*it)[1]] = (*it)[2];
  }
  ASSERT_EQ(colour.size(), 3u);
  EXPECT_EQ(colour["ours mlp strong"], colour["ours mlp weak"]);
  EXPECT_NE(colour["ours mlp strong"], colour["torch mlp strong"]);
}

TEST(ScaleSvg, PointsLandWhereTheDataSays) {
  // Log-log throughput: ideal scaling from (1, 1000) to (4, 4000) is a straight
  // line, so the middle point (2, 2000) lies halfway between the end points.
  const std::string svg =
      render_svg({series("ours", "weak", {{1, 1000}, {2, 2000}, {4, 4000}})}, {});
  const std::regex line(
      R"re(<polyline points="([\d.]+),([\d.]+) ([\d.]+),([\d.]+) ([\d.]+),([\d.]+)")re");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, line)) << svg;
  const double x0 = std::stod(m[1]), y0 = std::stod(m[2]), x1 = std::stod(m[3]),
               y1 = std::stod(m[4]), x2 = std::stod(m[5]), y2 = std::stod(m[6]);
  EXPECT_NEAR(x1, (x0 + x2) / 2, 0.11);
  EXPECT_NEAR(y1, (y0 + y2) / 2, 0.11);
  EXPECT_LT(y2, y0);  // more samples/s is higher up
  // Efficiency 1.0 everywhere: the second polyline is flat, on the ideal line.
  const std::string rest = m.suffix();
  ASSERT_TRUE(std::regex_search(rest, m, line));
  EXPECT_EQ(m[2], m[4]);
  EXPECT_EQ(m[4], m[6]);
}

TEST(ScaleSvg, EscapesTextAndDrawsAxesWithoutData) {
  const std::string svg = render_svg({}, {.title = "a < b & \"c\"", .subtitle = ""});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("a &lt; b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find(">no data</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"series\""), 0u);
  EXPECT_EQ(xml_escape("<'&'>"), "&lt;&apos;&amp;&apos;&gt;");
  // A series of one point: drawn, no ideal line of its own.
  const std::string one = render_svg({series("torch", "strong", {{2, 500}})}, {});
  EXPECT_EQ(xml_problem(one), "");
  EXPECT_EQ(count(one, "<g class=\"series\""), 1u);
  EXPECT_EQ(count(one, "<polyline class=\"ideal\" data-label=\"torch"), 0u);
}

}  // namespace
}  // namespace ddp::scaling
