// kiln inspect OUT [--verify] [--sample N] — see dataprep/inspect.h.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "dataprep/append.h"
#include "dataprep/inspect.h"
#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_inspect_command(CLI::App& root) {
  struct Flags {
    std::string out;
    prep::InspectOptions options;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = root.add_subcommand("inspect", "summarise and verify a prepared dataset");
  cmd->add_option("OUT", f->out, "the output folder of kiln prep (or its manifest.json)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_flag("--verify", f->options.verify,
                "re-check every shard's checksum, every sample, and that every .tokens.npy equals "
                "the tokenizer's encoding of the .txt; exit 3 on any mismatch");
  cmd->add_option("--sample", f->options.sample,
                  "print N documents spread over the dataset, decoded from their tokens");
  cmd->add_option("--sample-bytes", f->options.sample_bytes,
                  "print at most this many bytes of each sampled document")
      ->capture_default_str();
  return [f]() -> Status {
    {
      // An append killed after its commit point is finished first (dataprep/append.h).
      std::error_code ec;
      std::string dir = std::filesystem::is_directory(f->out, ec)
                            ? f->out
                            : std::filesystem::path(f->out).parent_path().string();
      if (dir.empty()) dir = ".";
      KILN_ASSIGN_OR_RETURN(bool finished, prep::finish_pending_append(dir));
      if (finished) std::fprintf(stderr, "finished an interrupted append to %s\n", dir.c_str());
    }
    KILN_ASSIGN_OR_RETURN(prep::InspectResult r, prep::inspect_dataset(f->out, f->options));
    std::fputs(r.summary.c_str(), stdout);
    if (!r.samples.empty()) std::fputs(("\n" + r.samples).c_str(), stdout);
    if (r.problems.empty()) return Status::ok();
    std::fprintf(stdout, "\n%zu problem(s):\n", r.problems.size());
    for (const auto& p : r.problems) std::fprintf(stdout, "  %s\n", p.c_str());
    std::fflush(stdout);
    return Status::data(std::to_string(r.problems.size()) + " problem(s) found in " + f->out);
  };
}

}  // namespace kiln::cli
