// The configuration schema, one table per section: every key's name, default, comment and
// reader in one entry, so that a new key is one edit in one file.
//
// A section (engine/config/model.cc, parallel.cc, ...) is a Schema<S>: its struct S (whose
// in-class initialisers are the defaults), the YAML path it lives under, and a list of Fields.
// From that one table come
//   - the parser: parse_section() starts from S{} and lets every field read its key
//     (a kConfig error naming the key on a bad value), then runs the section's check;
//   - the YAML defaults: write_section() prints each field's default (read from S{}) with its
//     comment - the schema common/config.h validates user configs against, and, resolved, the
//     config a run prints to RUN/config.yaml.
// Fields are built by the helpers below (integer, real, flag, text, choice, steps, custom); an
// accessor is a member pointer (&ModelConfig::d_model) or a lambda returning a reference
// ([](auto& s) -> auto& { return s.spike.window; }).
//
// Thread safety: schemas are immutable after construction (each section builds its own once).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine::config_schema {

template <typename S>
struct Field {
  std::string key;      // below the section, dotted: "d_model", "spike.window"
  std::string comment;  // printed after the default ("" none)
  std::function<std::string(const S&)> default_yaml;
  std::function<Status(const Config&, const std::string& key, S*)> read;
};

template <typename S>
struct Schema {
  std::string section;  // "model"; "" for a key at the top level ("precision")
  std::vector<Field<S>> fields;
  std::function<Status(const S&)> check;  // after every field is read (may be empty)
};

// A name <-> value table of an enum (its first entry is not special).
template <typename E>
using Names = std::span<const std::pair<const char*, E>>;

template <typename E>
const char* name_of(Names<E> names, E value) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return "?";
}

// ---- readers (errors are kConfig naming `key`) ----
Status bad(const std::string& key, const std::string& msg);
Status check_range(const std::string& key, int64_t v, int64_t lo, int64_t hi);
Status read_int(const Config& cfg, const std::string& key, int64_t lo, int64_t hi, int64_t* out);
// lo <= v <= hi (lo < v when lo_open), finite.
Status read_real(const Config& cfg, const std::string& key, double lo, double hi, bool lo_open,
                 double* out);
// One of `names`, with a "did you mean" for a near miss.
Status read_name(const Config& cfg, const std::string& key, const std::vector<std::string>& names,
                 size_t* index);
// A list of 1-based step numbers (testing hooks); absent or null: empty.
Status read_steps(const Config& cfg, const std::string& key, std::vector<int64_t>* out);

// ---- default printing ----
std::string yaml_real(double v);  // 0.02, 10000.0, 6.0e-4 (exponent form below 0.01)
std::string yaml_real(float v);   // the same, float's shortest digits (0.9, not 0.899999...)
std::string yaml_text(const std::string& v);  // "" when empty, else as is

// ---- field builders ----
template <typename S, typename A>
Field<S> integer(std::string key, A acc, int64_t lo, int64_t hi, std::string comment = "") {
  return {std::move(key), std::move(comment),
          [acc](const S& s) { return std::to_string(std::invoke(acc, s)); },
          [acc, lo, hi](const Config& cfg, const std::string& k, S* s) {
            return read_int(cfg, k, lo, hi, &std::invoke(acc, *s));
          }};
}

// An integer checked elsewhere (the section's check names the key).
template <typename S, typename A>
Field<S> integer(std::string key, A acc, std::string comment = "") {
  return integer<S>(std::move(key), acc, std::numeric_limits<int64_t>::min(),
                    std::numeric_limits<int64_t>::max(), std::move(comment));
}

enum class Open { kNo, kLow };  // kLow: the lower bound itself is refused

template <typename S, typename A>
Field<S> real(std::string key, A acc, double lo, double hi, std::string comment = "",
              Open open = Open::kNo) {
  return {std::move(key), std::move(comment),
          [acc](const S& s) { return yaml_real(std::invoke(acc, s)); },
          [acc, lo, hi, open](const Config& cfg, const std::string& k, S* s) {
            double v = 0;
            KILN_RETURN_IF_ERROR(read_real(cfg, k, lo, hi, open == Open::kLow, &v));
            auto& out = std::invoke(acc, *s);
            out = static_cast<std::remove_reference_t<decltype(out)>>(v);
            return Status::ok();
          }};
}

template <typename S, typename A>
Field<S> flag(std::string key, A acc, std::string comment = "") {
  return {std::move(key), std::move(comment),
          [acc](const S& s) { return std::string(std::invoke(acc, s) ? "true" : "false"); },
          [acc](const Config& cfg, const std::string& k, S* s) -> Status {
            KILN_ASSIGN_OR_RETURN(std::invoke(acc, *s), cfg.get<bool>(k));
            return Status::ok();
          }};
}

template <typename S, typename A>
Field<S> text(std::string key, A acc, std::string comment = "") {
  return {std::move(key), std::move(comment),
          [acc](const S& s) { return yaml_text(std::invoke(acc, s)); },
          [acc](const Config& cfg, const std::string& k, S* s) -> Status {
            KILN_ASSIGN_OR_RETURN(std::invoke(acc, *s), cfg.get<std::string>(k));
            return Status::ok();
          }};
}

template <typename S, typename A, typename E>
Field<S> choice(std::string key, A acc, Names<E> names, std::string comment = "") {
  return {std::move(key), std::move(comment),
          [acc, names](const S& s) { return std::string(name_of(names, std::invoke(acc, s))); },
          [acc, names](const Config& cfg, const std::string& k, S* s) {
            std::vector<std::string> all;
            for (const auto& n : names) all.emplace_back(n.first);
            size_t i = 0;
            KILN_RETURN_IF_ERROR(read_name(cfg, k, all, &i));
            std::invoke(acc, *s) = names[i].second;
            return Status::ok();
          }};
}

template <typename S, typename A>
Field<S> steps(std::string key, A acc, std::string comment = "") {
  return {std::move(key), std::move(comment), [](const S&) { return std::string("[]"); },
          [acc](const Config& cfg, const std::string& k, S* s) {
            return read_steps(cfg, k, &std::invoke(acc, *s));
          }};
}

// Anything else: the default as YAML text and a reader of its own.
template <typename S>
Field<S> custom(std::string key, std::function<std::string(const S&)> default_yaml,
                std::function<Status(const Config&, const std::string& key, S*)> read,
                std::string comment = "") {
  return {std::move(key), std::move(comment), std::move(default_yaml), std::move(read)};
}

// ---- using a schema ----
std::string full_key(const std::string& section, const std::string& key);

template <typename S>
Result<S> parse_section(const Config& cfg, const Schema<S>& schema) {
  S s{};
  for (const auto& f : schema.fields)
    KILN_RETURN_IF_ERROR(f.read(cfg, full_key(schema.section, f.key), &s));
  if (schema.check) KILN_RETURN_IF_ERROR(schema.check(s));
  return s;
}

// Prints YAML lines of defaults, opening nested maps as the dotted keys need them.
class YamlWriter {
 public:
  void line(const std::string& dotted_key, const std::string& value, const std::string& comment);
  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> open_;  // the maps the last line sat in
  std::string text_;
};

template <typename S>
void write_section(YamlWriter& w, const Schema<S>& schema) {
  const S defaults{};
  for (const auto& f : schema.fields)
    w.line(full_key(schema.section, f.key), f.default_yaml(defaults), f.comment);
}

}  // namespace kiln::engine::config_schema
