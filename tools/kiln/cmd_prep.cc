// `kiln prep`: flags -> prep config -> dataprep::run_prep (all logic lives in dataprep/).
#include <algorithm>
#include <cstdio>
#include <memory>

#include "comm/comm.h"
#include "comm/watchdog.h"
#include "common/config.h"
#include "common/host_memory.h"
#include "common/text.h"
#include "dataprep/append.h"
#include "dataprep/prep.h"
#include "dataprep/prep_config.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct PrepFlags {
  ConfigFlags config;
  std::vector<std::string> inputs;
  std::string output;
  double threshold = 0;
  int threads = 0;
  std::string memory;
  int num_perm = 0, bands = 0, rows = 0, ngram = 0;
  uint64_t seed = 0;
  bool no_exact = false, no_near = false, no_verify = false, strip_punct = false;
  std::string utf8;
  uint64_t max_line_bytes = 0;
  double max_reject_fraction = 0;
  std::string compression;
  uint64_t shard_samples = 0;
  std::string shard_bytes;
  std::string default_domain, tokenizer;
  uint64_t vocab_size = 0;
  bool overwrite = false, keep_work = false, no_index = false, dry_run_filters = false;
  std::vector<std::string> against;
  std::string append;
  double collective_timeout = 3600;
};

const char* const kFooter = R"(
Inputs: JSONL files (.jsonl/.ndjson/.json, plain, .gz or .zst: one object per line with "text";
optional "id", "source", "url", "domain", "meta"; other fields are carried), folders (JSONL files
by name, every other file is one text document) and globs. Files are taken in sorted path order.

Output (OUT):
  manifest.json            shards per domain with sample/token counts and xxh3 checksums
  stats.json               docs_in, docs_out, exact_dups, near_dups, rejected_by_reason, domains,
                           LSH settings and candidate probabilities, cluster sizes, stage timings
  dedup/removed.jsonl      {"id", "kept", "similarity"} for every removed duplicate
  rejects/rejects-R.jsonl  every rejected input record with file, line, reason (one file per rank)
  shards/<domain>/<domain>-NNNNNN.tar.zst   samples <key>.txt, <key>.json[, <key>.tokens.npy]
  tokenizer.json           when a tokenizer is configured or trained (tokenizer.model for a
                           SentencePiece model)
docs_in = docs_out + exact_dups + near_dups + rejected, always.

Resume: progress is recorded in OUT/.kiln-prep; after a crash or kill, run the same command
again and it continues, giving byte-identical output. A finished OUT is left as it is; use
--overwrite to redo it.

Many processes: mpirun -np N kiln prep ... splits the input files between ranks; the kept set is
the same as with one process. A rank that stops arriving at a collective for --collective-timeout
seconds (default 3600) stops every rank with a message naming it, instead of a hang.

Exit codes: 0 ok, 2 bad flag/config, 3 too many rejected input records, 1 other failures.
Config keys (configs/prep/default.yaml) can be set with --config FILE and --set key=value.

Example:
  kiln prep --input corpus/ --output out/ --threshold 0.8 --threads 8 --memory 4G
)";

}  // namespace

RunFn add_prep_command(CLI::App& root) {
  auto f = std::make_shared<PrepFlags>();
  CLI::App* sub = root.add_subcommand(
      "prep", "deduplicate (exact + MinHash-LSH), tag, tokenize and shard a corpus");
  sub->footer(kFooter);
  sub->add_option("-i,--input", f->inputs,
                  "input files, folders or globs (repeatable; config input.paths)")
      ->type_name("PATH...");
  sub->add_option("-o,--output", f->output, "output folder OUT (config output)")->type_name("OUT");
  add_config_flags(sub, &f->config);
  sub->add_option("--threshold", f->threshold,
                  "near-duplicate Jaccard threshold in (0,1), default 0.8 (dedup.threshold)")
      ->type_name("J");
  sub->add_option("--threads", f->threads, "worker threads, 0 = all cores (threads)");
  sub->add_option("--memory", f->memory,
                  "memory budget for dedup tables, e.g. 512M, 4G; beyond it sorted runs spill "
                  "to OUT/.kiln-prep (memory, default 2G)")
      ->type_name("SIZE");
  sub->add_option("--num-perm", f->num_perm, "MinHash permutations, default 128 (dedup.num_perm)");
  sub->add_option("--bands", f->bands,
                  "LSH bands; with --rows overrides the choice from the threshold (dedup.bands)");
  sub->add_option("--rows", f->rows, "LSH rows per band (dedup.rows)");
  sub->add_option("--ngram", f->ngram,
                  "shingle size: words, or characters for CJK/Thai/... scripts, default 5 "
                  "(dedup.ngram)");
  sub->add_option("--seed", f->seed, "MinHash permutation seed, default 1 (dedup.seed)");
  sub->add_flag("--no-exact", f->no_exact, "skip exact dedup (dedup.exact=false)");
  sub->add_flag("--no-near", f->no_near, "skip near-duplicate dedup (dedup.near=false)");
  sub->add_flag("--no-verify", f->no_verify,
                "keep LSH candidates without checking their estimated Jaccard (dedup.verify)");
  sub->add_flag("--strip-punct", f->strip_punct,
                "ignore punctuation when comparing texts (dedup.strip_punct)");
  sub->add_option("--utf8", f->utf8,
                  "invalid UTF-8: 'repair' (U+FFFD, default) or 'reject' (input.utf8)")
      ->check(CLI::IsMember({"repair", "reject"}));
  sub->add_option("--max-line-bytes", f->max_line_bytes,
                  "longer lines / text files are rejected without being loaded, default 16 MiB "
                  "(input.max_line_bytes)");
  sub->add_option("--max-reject-fraction", f->max_reject_fraction,
                  "exit 3 when more of the input is rejected, default 0.05 "
                  "(input.max_reject_fraction)");
  sub->add_option("--compression", f->compression, "shards: 'zstd' (default) or 'none'")
      ->check(CLI::IsMember({"zstd", "none"}));
  sub->add_option("--shard-samples", f->shard_samples,
                  "max samples per shard, default 10000 (shards.max_samples)");
  sub->add_option("--shard-bytes", f->shard_bytes,
                  "max uncompressed bytes per shard, default 256M (shards.max_bytes)")
      ->type_name("SIZE");
  sub->add_option("--default-domain", f->default_domain,
                  "domain of documents no rule assigns, default web (domains.default)");
  sub->add_option("--tokenizer", f->tokenizer,
                  "tokenizer to use: a Hugging Face tokenizer.json (byte-level BPE), a "
                  "SentencePiece .model, Kiln's older JSON or a GPT-2 vocab.json; without it one "
                  "is trained on the kept text (tokenizer.path)")
      ->type_name("FILE");
  sub->add_option("--vocab-size", f->vocab_size,
                  "vocabulary size when training a tokenizer, default 8192 (tokenizer.vocab_size)");
  sub->add_flag("--overwrite", f->overwrite,
                "replace an existing dataset or unfinished run in OUT instead of refusing/resuming");
  sub->add_flag("--keep-work", f->keep_work, "keep OUT/.kiln-prep after success (keep_work)");
  sub->add_flag("--dry-run-filters", f->dry_run_filters,
                "run the quality filters (filters:) only: their decisions go to OUT/rejects/ and "
                "OUT/stats.json, no dedup and no shards (to tune thresholds)");
  sub->add_option("--against", f->against,
                  "an earlier dataset (a prep output): input documents that duplicate its kept "
                  "documents are removed, with its tokenizer and domain rules used unless given "
                  "(repeatable; dedup.against)")
      ->type_name("DATASET");
  sub->add_option("--append", f->append,
                  "add the input to this dataset: deduplicated against it, written as new "
                  "shards, manifest, stats and index updated atomically (no --output)")
      ->type_name("DATASET");
  sub->add_flag("--no-index", f->no_index,
                "write no dedup index OUT/dedup/index (dedup.index=false)");
  sub->add_option("--collective-timeout", f->collective_timeout,
                  "under mpirun: a rank waiting longer than this in a collective stops every "
                  "rank, naming the ranks that did not arrive (default 3600; 0: off)")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 1e7))
      ->check(CLI::Validator(
          [](std::string& s) {  // CLI::Range lets "nan" through
            return std::isfinite(std::strtod(s.c_str(), nullptr)) ? std::string()
                                                                  : "not a finite number: " + s;
          },
          "FINITE"));

  return [f, sub]() -> Status {
    if (comm::launched_by_mpi() && !comm::mpi_available())
      return Status::usage("started under mpirun, but this kiln was built without MPI");
    KILN_ASSIGN_OR_RETURN(
        Config cfg, Config::load(prep::kPrepDefaultsYaml, f->config.config_file, f->config.sets));
    auto set_text = [&](const char* key, const std::string& v) {
      return cfg.set_node(key, YAML::Node(v));
    };
    auto given = [&](const char* name) { return sub->count(name) > 0; };
    if (!f->inputs.empty()) {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const auto& p : f->inputs) list.push_back(p);
      KILN_RETURN_IF_ERROR(cfg.set_node("input.paths", list));
    }
    if (given("--output")) KILN_RETURN_IF_ERROR(set_text("output", f->output));
    if (given("--threshold")) KILN_RETURN_IF_ERROR(cfg.set("dedup.threshold", std::to_string(f->threshold)));
    if (given("--threads")) KILN_RETURN_IF_ERROR(cfg.set("threads", std::to_string(f->threads)));
    if (given("--memory")) {
      // A budget the machine cannot give would end at the OOM killer, not in a spill to disk.
      // Every rank decides together: the ranks of one machine share its memory.
      KILN_ASSIGN_OR_RETURN(uint64_t want, parse_size("--memory", f->memory));
      const HostMemory host = host_memory();
      const int ranks = comm::ranks_on_this_host(comm::world());
      const uint64_t mine = host.available / static_cast<uint64_t>(std::max(1, ranks));
      Status fits = Status::ok();
      if (host.known && want > mine) {
        fits = Status::usage(
            "--memory " + f->memory + " is more than this process can have: " + human_bytes(mine) +
            " (" + host.source +
            (ranks > 1 ? ", shared by this machine's " + std::to_string(ranks) + " ranks"
                       : std::string()) +
            "); give less - beyond the budget prep spills sorted runs to disk");
      }
      KILN_RETURN_IF_ERROR(comm::agree(comm::world(), std::move(fits)));
      KILN_RETURN_IF_ERROR(set_text("memory", f->memory));
    }
    if (given("--num-perm")) KILN_RETURN_IF_ERROR(cfg.set("dedup.num_perm", std::to_string(f->num_perm)));
    if (given("--bands")) KILN_RETURN_IF_ERROR(cfg.set("dedup.bands", std::to_string(f->bands)));
    if (given("--rows")) KILN_RETURN_IF_ERROR(cfg.set("dedup.rows", std::to_string(f->rows)));
    if (given("--ngram")) KILN_RETURN_IF_ERROR(cfg.set("dedup.ngram", std::to_string(f->ngram)));
    if (given("--seed")) KILN_RETURN_IF_ERROR(cfg.set("dedup.seed", std::to_string(f->seed)));
    if (f->no_exact) KILN_RETURN_IF_ERROR(cfg.set("dedup.exact", "false"));
    if (f->no_near) KILN_RETURN_IF_ERROR(cfg.set("dedup.near", "false"));
    if (f->no_verify) KILN_RETURN_IF_ERROR(cfg.set("dedup.verify", "false"));
    if (f->strip_punct) KILN_RETURN_IF_ERROR(cfg.set("dedup.strip_punct", "true"));
    if (given("--utf8")) KILN_RETURN_IF_ERROR(set_text("input.utf8", f->utf8));
    if (given("--max-line-bytes"))
      KILN_RETURN_IF_ERROR(cfg.set("input.max_line_bytes", std::to_string(f->max_line_bytes)));
    if (given("--max-reject-fraction"))
      KILN_RETURN_IF_ERROR(
          cfg.set("input.max_reject_fraction", std::to_string(f->max_reject_fraction)));
    if (given("--compression")) KILN_RETURN_IF_ERROR(set_text("shards.compression", f->compression));
    if (given("--shard-samples"))
      KILN_RETURN_IF_ERROR(cfg.set("shards.max_samples", std::to_string(f->shard_samples)));
    if (given("--shard-bytes")) {
      KILN_ASSIGN_OR_RETURN(uint64_t b, parse_size("--shard-bytes", f->shard_bytes));
      KILN_RETURN_IF_ERROR(cfg.set("shards.max_bytes", std::to_string(b)));
    }
    if (given("--default-domain")) KILN_RETURN_IF_ERROR(set_text("domains.default", f->default_domain));
    if (given("--tokenizer")) KILN_RETURN_IF_ERROR(set_text("tokenizer.path", f->tokenizer));
    if (given("--vocab-size"))
      KILN_RETURN_IF_ERROR(cfg.set("tokenizer.vocab_size", std::to_string(f->vocab_size)));
    if (f->keep_work) KILN_RETURN_IF_ERROR(cfg.set("keep_work", "true"));
    if (f->no_index) KILN_RETURN_IF_ERROR(cfg.set("dedup.index", "false"));
    if (!f->against.empty()) {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const auto& p : f->against) list.push_back(p);
      KILN_RETURN_IF_ERROR(cfg.set_node("dedup.against", list));
    }

    comm::ProcessGroup& world = comm::world();
    // A rank that stops arriving (stuck I/O, a deadlock) must not hang the others: the collective
    // watchdog (comm/watchdog.h) ends the job, as in kiln train. Ranks wait for each other at
    // the stage boundaries, so the timeout is generous (an unbalanced stage is not a hang).
    if (world.size() > 1) {
      KILN_RETURN_IF_ERROR(
          comm::start_watchdog(world, f->collective_timeout, "--collective-timeout"));
      comm::set_watchdog_context("kiln prep");
      comm::test_stall(world.rank(), 0);  // test-only (KILN_TEST_STALL=RANK:0:SECONDS)
    }
    prep::PrepRunOptions ro;
    ro.overwrite = f->overwrite;
    ro.filters_only = f->dry_run_filters;
    prep::PrepResult r;
    if (given("--append")) {
      KILN_ASSIGN_OR_RETURN(r, prep::append_prep(cfg, f->append, world, ro));
    } else {
      KILN_ASSIGN_OR_RETURN(r, prep::run_prep(cfg, world, ro));
    }
    if (world.rank() == 0) {
      std::fputs(r.summary.c_str(), stdout);
      std::fflush(stdout);
    }
    return Status::ok();
  };
}

}  // namespace kiln::cli
