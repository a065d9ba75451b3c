// The dedup index run of this rank, built by the write stage (index_builder.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/stages/context.h"
#include "dataprep/stages/scan_table.h"

namespace kiln::prep::detail {

// Builds this rank's run of the index segment (index_builder.cc) while the write stage hands it the
// kept documents and removed entries in order. Collective: every rank constructs it and calls
// finish().
class IndexBuilder {
 public:
  explicit IndexBuilder(Context& c);
  ~IndexBuilder();
  bool enabled() const { return enabled_; }
  // The next kept document or removed entry of this rank (docid order) and its input id as JSON
  // text.
  Status add(uint64_t docid, std::string_view id_json);
  // Runs the rest of the table, exchanges the refs of cluster representatives and writes the
  // run; returns its IndexRunInfo as JSON.
  Result<nlohmann::json> finish();

 private:
  Status advance_to(uint64_t docid, bool* found);
  Result<uint64_t> ref_of_kept(uint64_t kept) const;
  Context& c_;
  bool enabled_ = false;
  std::unique_ptr<IndexRunWriter> writer_;
  std::unique_ptr<TableScanner> scan_;
  uint64_t first_ = 0, next_ordinal_ = 0;
  std::vector<uint64_t> reps_;                          // this rank's documents removed ones keep
  std::vector<std::pair<uint64_t, uint64_t>> my_reps_;  // (docid, ref) of those, once written
  uint64_t last_lo_ = 0, last_hi_ = 0;                  // the record advance_to() found
  std::vector<uint64_t> last_keys_, last_sig_;
  struct Pending {
    uint64_t lo, hi, kept;
  };
  std::vector<Pending> pending_;  // removed documents whose representative's ref is elsewhere
  struct PendingLink {
    uint64_t ref, kept;
  };
  std::vector<PendingLink> pending_links_;  // removed entries whose representative is elsewhere
};

}  // namespace kiln::prep::detail
