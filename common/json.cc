#include "common/json.h"

#include <string>

namespace kiln {

Status check_json_depth(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return Status::data("JSON nested deeper than the limit of " + std::to_string(max_depth) +
                            " levels (at byte " + std::to_string(i) + ")");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return Status::ok();
}

Result<nlohmann::json> parse_untrusted_json(std::string_view text, size_t max_depth) {
  KILN_RETURN_IF_ERROR(check_json_depth(text, max_depth));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("not valid JSON: ") + e.what());
  }
}

nlohmann::json parse_untrusted_json_or_discarded(std::string_view text, size_t max_depth) {
  if (!check_json_depth(text, max_depth).is_ok()) return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

nlohmann::json parse_untrusted_json_or_throw(std::string_view text, size_t max_depth) {
  if (Status st = check_json_depth(text, max_depth); !st.is_ok())
    throw nlohmann::json::parse_error::create(101, 0, st.message(), nullptr);
  return nlohmann::json::parse(text);
}

namespace detail {

void throw_json_type_error(const std::string& expected, const std::string& shown) {
  throw nlohmann::json::type_error::create(302, expected + ", not " + shown, nullptr);
}

}  // namespace detail

}  // namespace kiln
