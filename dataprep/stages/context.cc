// The run's state between stages (context.h).
#include "dataprep/stages/context.h"

#include <cmath>
#include <cstdio>

namespace kiln::prep::detail {

const char* stage_name(int stage) {
  switch (stage) {
    case kScan:
      return "scan";
    case kExact:
      return "exact";
    case kDedup:
      return "dedup";
    case kAnnotator:
      return "annotate";
    case kWrite:
      return "write";
    case kFinal:
      return "final";
    default:
      return "none";
  }
}

uint32_t Context::file_owner(uint32_t fid) const {
  // rank_file_begin is non-decreasing; the owner is the last rank whose begin <= fid.
  auto it = std::upper_bound(rank_file_begin.begin(), rank_file_begin.end() - 1, fid);
  return static_cast<uint32_t>(it - rank_file_begin.begin()) - 1;
}

std::string Context::unit_path(const FileRun& u, const char* ext) const {
  char name[64];
  std::snprintf(name, sizeof name, "/units/u-%08u.%s", u.first, ext);
  return rank_dir + name;
}

std::vector<std::string> Context::table_paths() const {
  std::vector<std::string> paths;
  for (const FileRun& u : units) paths.push_back(unit_path(u, "tbl"));
  return paths;
}

std::string Context::stage_marker(int stage) const {
  return rank_dir + "/stage-" + std::to_string(stage) + "-" + stage_name(stage) + ".json";
}

void Context::refilter(Document* doc) const {
  const filter::FilterChain& chain = *opt.filters;
  if (!chain.rewrites() && !chain.annotates()) return;
  const filter::ChainOutcome o = chain.replay_kept(&doc->text, doc->url);
  if (!o.annotations.language.empty()) {
    if (!doc->carried.is_object()) doc->carried = nlohmann::json::object();
    doc->carried["language"] = o.annotations.language;
    doc->carried["language_score"] = std::round(o.annotations.language_score * 1e4) / 1e4;
  }
}

bool Context::is_removed(uint64_t docid) const {
  auto it = std::lower_bound(removed.begin(), removed.end(), docid,
                             [](const RemovedEntry& e, uint64_t d) { return e.docid < d; });
  return it != removed.end() && it->docid == docid;
}

bool Context::is_exact_dup(uint64_t docid) const {
  auto it = std::lower_bound(exact_dups.begin(), exact_dups.end(), docid,
                             [](const DocPair& e, uint64_t d) { return e.first < d; });
  return it != exact_dups.end() && it->first == docid;
}

}  // namespace kiln::prep::detail
