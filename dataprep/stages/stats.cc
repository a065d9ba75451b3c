// The stages' counters and their JSON forms (stats.h).
#include "dataprep/stages/stats.h"

#include "common/hash.h"
#include "common/json.h"

namespace kiln::prep::detail {

void FilterTally::add(const FilterTally& o) {
  docs += o.docs;
  bytes += o.bytes;
  edited += o.edited;
  edited_bytes += o.edited_bytes;
  for (const auto& [rule, n] : o.rules) rules[rule] += n;
}

void FileStats::add(const FileStats& o) {
  docs_in += o.docs_in;
  valid += o.valid;
  text_bytes += o.text_bytes;
  input_bytes += o.input_bytes;
  repaired += o.repaired;
  filtered += o.filtered;
  if (filters.size() < o.filters.size()) filters.resize(o.filters.size());
  for (size_t i = 0; i < o.filters.size(); ++i) filters[i].add(o.filters[i]);
  for (int i = 0; i < kRejectReasonCount; ++i) rejected[i] += o.rejected[i];
}

nlohmann::json FileStats::to_json() const {
  nlohmann::json j;
  j["docs_in"] = docs_in;
  j["valid"] = valid;
  j["text_bytes"] = text_bytes;
  j["repaired"] = repaired;
  j["rejected"] = rejected;
  if (input_bytes != text_bytes || filtered > 0 || !filters.empty()) {
    j["input_bytes"] = input_bytes;
    j["filtered"] = filtered;
    nlohmann::json fl = nlohmann::json::array();
    for (const FilterTally& t : filters)
      fl.push_back({{"docs", t.docs},
                    {"bytes", t.bytes},
                    {"edited", t.edited},
                    {"edited_bytes", t.edited_bytes},
                    {"rules", t.rules}});
    j["filters"] = fl;
  }
  return j;
}

FileStats FileStats::from_json(const nlohmann::json& j) {
  FileStats s;
  s.docs_in = json_integer_at<uint64_t>(j, "docs_in");
  s.valid = json_integer_at<uint64_t>(j, "valid");
  s.text_bytes = json_integer_at<uint64_t>(j, "text_bytes");
  s.repaired = json_integer_at<uint64_t>(j, "repaired");
  s.input_bytes =
      j.contains("input_bytes") ? json_integer_at<uint64_t>(j, "input_bytes") : s.text_bytes;
  if (j.contains("filtered")) s.filtered = json_integer_at<uint64_t>(j, "filtered");
  if (j.contains("filters") && j["filters"].is_array()) {
    for (const auto& f : j["filters"]) {
      FilterTally t;
      t.docs = json_integer_at<uint64_t>(f, "docs");
      t.bytes = json_integer_at<uint64_t>(f, "bytes");
      t.edited = json_integer_at<uint64_t>(f, "edited");
      t.edited_bytes = json_integer_at<int64_t>(f, "edited_bytes");
      if (f.contains("rules") && f["rules"].is_object())
        for (const auto& [rule, n] : f["rules"].items())
          t.rules[rule] = json_integer<uint64_t>(n, rule);
      s.filters.push_back(std::move(t));
    }
  }
  auto r = json_integers<uint64_t>(j.at("rejected"), "rejected");
  for (size_t i = 0; i < r.size() && i < s.rejected.size(); ++i) s.rejected[i] = r[i];
  return s;
}

nlohmann::json DedupStats::to_json() const {
  return {{"candidate_pairs", candidate_pairs},
          {"verified_pairs", verified_pairs},
          {"spilled_bytes", spilled_bytes}};
}
DedupStats DedupStats::from_json(const nlohmann::json& j) {
  DedupStats d;
  d.candidate_pairs = json_integer_or(j, "candidate_pairs", uint64_t{0});
  d.verified_pairs = json_integer_or(j, "verified_pairs", uint64_t{0});
  d.spilled_bytes = json_integer_or(j, "spilled_bytes", uint64_t{0});
  return d;
}

nlohmann::json WriteResult::to_json() const {
  nlohmann::json j;
  j["docs_out"] = docs_out;
  j["shards"] = nlohmann::json::array();
  for (const auto& s : shards)
    j["shards"].push_back({{"path", s.path},
                           {"domain", s.domain},
                           {"samples", s.samples},
                           {"tokens", s.tokens},
                           {"bytes", s.bytes},
                           {"xxh3", hex64(s.xxh3)},
                           {"tar_bytes", s.tar_bytes},
                           {"val", s.val}});
  j["domains"] = nlohmann::json::object();
  for (const auto& [name, d] : domains)
    j["domains"][name] = {{"docs", d.docs},         {"tokens", d.tokens},
                          {"bytes", d.bytes},       {"domain_by", d.domain_by},
                          {"val_docs", d.val_docs}, {"val_tokens", d.val_tokens}};
  j["ids"] = nlohmann::json::array();
  for (const auto& [docid, id] : ids) j["ids"].push_back({docid, id});
  j["index_run"] = index_run;
  return j;
}

WriteResult WriteResult::from_json(const nlohmann::json& j) {
  WriteResult w;
  w.docs_out = json_integer_at<uint64_t>(j, "docs_out");
  if (j.contains("index_run")) w.index_run = j["index_run"];
  for (const auto& s : j.at("shards")) {
    WrittenShard ws;
    ws.path = s.at("path").get<std::string>();
    ws.domain = s.at("domain").get<std::string>();
    ws.samples = json_integer_at<uint64_t>(s, "samples");
    ws.tokens = json_integer_at<uint64_t>(s, "tokens");
    ws.bytes = json_integer_at<uint64_t>(s, "bytes");
    auto h = parse_hex64(s.at("xxh3").get<std::string>());
    ws.xxh3 = h.is_ok() ? *h : 0;
    ws.val = s.value("val", false);
    ws.tar_bytes = json_integer_or(s, "tar_bytes", uint64_t{0});
    w.shards.push_back(ws);
  }
  for (const auto& [name, d] : j.at("domains").items()) {
    DomainStats ds;
    ds.docs = json_integer_at<uint64_t>(d, "docs");
    ds.tokens = json_integer_at<uint64_t>(d, "tokens");
    ds.bytes = json_integer_at<uint64_t>(d, "bytes");
    ds.domain_by = json_integer_map<uint64_t>(d.at("domain_by"), "domain_by");
    ds.val_docs = json_integer_or(d, "val_docs", uint64_t{0});
    ds.val_tokens = json_integer_or(d, "val_tokens", uint64_t{0});
    w.domains[name] = ds;
  }
  for (const auto& p : j.at("ids"))
    w.ids.emplace_back(json_integer<uint64_t>(p.at(0), "ids"), p.at(1));
  return w;
}

}  // namespace kiln::prep::detail
