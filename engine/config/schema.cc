#include "engine/config/schema.h"

#include <charconv>
#include <cmath>

#include "common/text.h"

namespace kiln::engine::config_schema {

Status bad(const std::string& key, const std::string& msg) {
  return Status::config(msg).with_key(key);
}

Status check_range(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(v));
  }
  return Status::ok();
}

Status read_int(const Config& cfg, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
  KILN_ASSIGN_OR_RETURN(int64_t v, cfg.get<int64_t>(key));
  KILN_RETURN_IF_ERROR(check_range(key, v, lo, hi));
  *out = v;
  return Status::ok();
}

Status read_real(const Config& cfg, const std::string& key, double lo, double hi, bool lo_open,
                 double* out) {
  KILN_ASSIGN_OR_RETURN(double v, cfg.get<double>(key));
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
    return bad(key, std::string("must be a finite number in ") + (lo_open ? "(" : "[") +
                        std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(v));
  }
  *out = v;
  return Status::ok();
}

Status read_name(const Config& cfg, const std::string& key, const std::vector<std::string>& names,
                 size_t* index) {
  KILN_ASSIGN_OR_RETURN(std::string v, cfg.get<std::string>(key));
  for (size_t i = 0; i < names.size(); ++i) {
    if (v == names[i]) {
      *index = i;
      return Status::ok();
    }
  }
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : " | ") + n;
  std::string hint = closest_match(v, names);
  return bad(key, "'" + v + "' is not one of " + all +
                      (hint.empty() ? std::string() : " (did you mean '" + hint + "'?)"));
}

Status read_steps(const Config& cfg, const std::string& key, std::vector<int64_t>* out) {
  YAML::Node inj = cfg.node(key);
  if (!inj.IsDefined() || inj.IsNull()) return Status::ok();
  if (!inj.IsSequence()) return bad(key, "expected a list of steps");
  for (const auto& n : inj) {
    try {
      int64_t step = n.as<int64_t>();
      if (step < 1) return bad(key, "steps start at 1");
      out->push_back(step);
    } catch (const YAML::Exception&) {
      return bad(key, "expected integers");
    }
  }
  return Status::ok();
}

namespace {

// Shortest round-trip digits; below 0.01 in exponent form with a one-digit-or-more mantissa
// ("6.0e-4"), whole numbers with ".0" so that YAML reads them as numbers, not integers.
template <typename F>
std::string format_real(F v) {
  char buf[64];
  const bool tiny = v != 0 && std::fabs(v) < F(0.01);
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v,
                                 tiny ? std::chars_format::scientific : std::chars_format::fixed);
  std::string s(buf, end);
  if (!tiny) return s.find('.') == std::string::npos ? s + ".0" : s;
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  int exponent = std::stoi(s.substr(e + 1));
  return mantissa + "e" + std::to_string(exponent);
}

}  // namespace

std::string yaml_real(double v) { return format_real(v); }
std::string yaml_real(float v) { return format_real(v); }
std::string yaml_text(const std::string& v) { return v.empty() ? "\"\"" : v; }

std::string full_key(const std::string& section, const std::string& key) {
  return section.empty() ? key : section + "." + key;
}

void YamlWriter::line(const std::string& dotted_key, const std::string& value,
                      const std::string& comment) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = dotted_key.find('.', start);
    parts.push_back(dotted_key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const std::string leaf = parts.back();
  parts.pop_back();
  size_t common = 0;
  while (common < parts.size() && common < open_.size() && parts[common] == open_[common]) ++common;
  for (size_t i = common; i < parts.size(); ++i)
    text_ += std::string(2 * i, ' ') + parts[i] + ":\n";
  open_ = parts;
  std::string out = std::string(2 * parts.size(), ' ') + leaf + ": " + value;
  if (!comment.empty()) {
    if (out.size() < 24) out.resize(24, ' ');
    out += "  # " + comment;
  }
  text_ += out + "\n";
}

}  // namespace kiln::engine::config_schema
