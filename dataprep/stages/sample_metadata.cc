// A shard sample's <key>.json (sample_metadata.h).
#include "dataprep/stages/sample_metadata.h"

#include <nlohmann/json.hpp>

#include "common/json.h"
#include "common/text.h"
#include "dataprep/ingest/doc_parser.h"

namespace kiln::prep::detail {
namespace {

bool needs_utf8_check(std::string_view v) {
  for (char ch : v)
    if (static_cast<unsigned char>(ch) >= 0x80) return true;
  return false;
}

}  // namespace

std::string sample_metadata(const Document& doc) {
  const bool simple = !doc.chat && (!doc.carried.is_object() || doc.carried.empty()) &&
                      !(needs_utf8_check(doc.id) && !is_valid_utf8(doc.id)) &&
                      !(needs_utf8_check(doc.source) && !is_valid_utf8(doc.source)) &&
                      !(needs_utf8_check(doc.url) && !is_valid_utf8(doc.url)) &&
                      !(needs_utf8_check(doc.domain_by) && !is_valid_utf8(doc.domain_by));
  if (!simple) {
    nlohmann::json meta = doc.carried.is_object() ? doc.carried : nlohmann::json::object();
    meta["id"] = doc.id_is_number ? nlohmann::json::parse(doc.id) : nlohmann::json(doc.id);
    meta["domain"] = doc.domain;
    meta["domain_by"] = doc.domain_by;
    meta["source"] = doc.source;
    if (!doc.url.empty()) meta["url"] = doc.url;
    meta["tokens"] = doc.tokens.size();
    if (doc.chat) {  // a chat sample: how many of its tokens the loss counts (<key>.mask.npy)
      uint64_t counted = 0;
      for (uint8_t m : doc.loss_mask) counted += m;
      meta["loss_tokens"] = counted;
    }
    return meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string out;
  out.reserve(96 + doc.id.size() + doc.source.size() + doc.url.size());
  out.append("{\"domain\":");
  append_json_string(&out, doc.domain);
  out.append(",\"domain_by\":");
  append_json_string(&out, doc.domain_by);
  out.append(",\"id\":");
  if (doc.id_is_number)
    out.append(doc.id);  // a number stays a number (canonical JSON text)
  else
    append_json_string(&out, doc.id);
  out.append(",\"source\":");
  append_json_string(&out, doc.source);
  out.append(",\"tokens\":");
  out.append(std::to_string(doc.tokens.size()));
  if (!doc.url.empty()) {
    out.append(",\"url\":");
    append_json_string(&out, doc.url);
  }
  out.push_back('}');
  return out;
}

}  // namespace kiln::prep::detail
