#include "loader/stream.h"

#include <cmath>
#include <cstdlib>

#include "common/atomic_file.h"
#include "common/log.h"
#include "common/text.h"

namespace kiln::loader {

Status run_stream(const StreamOptions& options, std::FILE* out) {
  if (options.steps < 0) return Status::usage("--steps must be >= 0").with_key("--steps");
  LoaderOptions lo = options.loader;
  lo.sample_ids = true;
  // Weights given on the command line are applied after a restore (and recorded in its history).
  const DomainWeights flag_weights = lo.weights;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader, Loader::open(options.dataset, lo));
  if (!options.state_in.empty()) {
    std::vector<LoaderState> states;
    for (const std::string& path : options.state_in) {
      KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
      KILN_ASSIGN_OR_RETURN(LoaderState s, LoaderState::from_json(text, path));
      states.push_back(std::move(s));
    }
    LoaderState state = states.front();
    if (states.size() > 1) {
      KILN_ASSIGN_OR_RETURN(state, LoaderState::merge(states));
    }
    KILN_RETURN_IF_ERROR(loader->restore(state));
    if (!flag_weights.empty()) KILN_RETURN_IF_ERROR(loader->set_weights(flag_weights));
  }
  const auto& names = loader->domain_names();
  std::string buf;
  for (int64_t i = 0; i < options.steps; ++i) {
    KILN_ASSIGN_OR_RETURN(Batch b, loader->next_batch());
    buf.clear();
    for (int64_t r = 0; r < b.micro_batch; ++r) {
      buf += "{\"step\":" + std::to_string(b.step) +
             ",\"row\":" + std::to_string(b.global_rows[r]) +
             ",\"rank\":" + std::to_string(lo.dp_rank) + ",\"domain\":";
      append_json_string(&buf, names[b.domains[r]]);
      buf += ",\"samples\":[";
      for (size_t k = 0; k < b.docs[r].size(); ++k) {
        if (k) buf.push_back(',');
        buf += b.docs[r][k].id;  // raw JSON (string or number) from <key>.json
      }
      buf += "]";
      if (options.show_tokens) {
        buf += ",\"tokens\":[";
        auto row = b.row(r);
        for (size_t t = 0; t < row.size(); ++t) buf += (t ? "," : "") + std::to_string(row[t]);
        buf += "],\"doc_starts\":[";
        auto starts = b.doc_starts(r);
        for (size_t t = 0; t < starts.size(); ++t)
          buf += (t ? "," : "") + std::to_string(starts[t]);
        buf += "],\"loss_mask\":\"";
        for (size_t t = 0; t < row.size(); ++t)
          buf.push_back(b.loss_mask[r * row.size() + t] ? '1' : '0');
        buf += "\"";
      }
      buf += "}\n";
    }
    // One write per batch keeps lines whole when several ranks share a terminal or pipe.
    if (std::fwrite(buf.data(), 1, buf.size(), out) != buf.size() || std::fflush(out) != 0) {
      return Status::io("writing the stream to standard output failed");
    }
  }
  if (!options.state_out.empty()) {
    std::string path = options.state_out;
    for (size_t p; (p = path.find("{rank}")) != std::string::npos;) {
      path.replace(p, 6, std::to_string(lo.dp_rank));
    }
    KILN_RETURN_IF_ERROR(write_file_atomic(path, loader->state().to_json() + "\n"));
  }
  const LoaderStats st = loader->stats();
  KILN_LOG_DEBUG("kiln stream: rank {} of {}: {} steps, {} shard reads, waited {:.1f} ms",
                 lo.dp_rank, lo.dp_world, options.steps, st.shards_read, st.wait_ms_total);
  return Status::ok();
}

}  // namespace kiln::loader
