// Multi-rank loader checks, one binary run under `mpirun -np N` (see
// tests/loader/loader_mpi.cmake). Exits non-zero on any mismatch.
//
//   loader_mpi_check make DIR
//       writes the test dataset (one process).
//   mpirun -np W loader_mpi_check partition DIR
//       every rank reads its own part with dp_rank = MPI rank, dp_world = W, in lockstep until all
//       ranks have finished epoch 0 of every domain. Checks: every batch is full and holds exactly
//       the truth's tokens; every rank made the same number of steps with the same mixture
//       decisions; over epoch 0 of each domain every token of every document was emitted exactly
//       once, each document by exactly one rank.
//   loader_mpi_check check-stream DIR W STEPS MICRO_BATCH < lines
//       checks the output of `mpirun -np W kiln stream DIR --steps STEPS ...`: each rank printed
//       STEPS * MICRO_BATCH lines for steps 0..STEPS-1, the domain of every slot is the same on
//       all ranks, every id belongs to its line's domain, and no document is on two ranks (the
//       run is shorter than an epoch).
#include <mpi.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "format/shard_reader.h"
#include "tests/loader/loader_testutil.h"

namespace kiln {
namespace {

using testing::Coverage;
using testing::Dataset;
using testing::DatasetSpec;

DatasetSpec spec() {
  DatasetSpec s;
  // 5 + 6 + 3 shards: not divisible by 2, 4, 7 or 8 (and 14 is not divisible by 3).
  s.domains = {{"alpha", 47, 10, 0, 30}, {"beta", 23, 4, 0, 30}, {"gamma", 9, 3, 1, 9}};
  return s;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "loader_mpi_check: FAILED: %s\n", what.c_str());
  return 1;
}

// The truth, read back from the shards (every rank can do this without coordination).
Result<Dataset> load_truth(const std::string& dir) {
  Dataset ds;
  ds.dir = dir;
  KILN_ASSIGN_OR_RETURN(ds.manifest, read_manifest(dir));
  for (uint32_t s = 0; s < ds.manifest.shards.size(); ++s) {
    const auto& sh = ds.manifest.shards[s];
    KILN_ASSIGN_OR_RETURN(auto samples, ShardReader::read_all(ds.manifest.shard_path(sh)));
    for (uint32_t m = 0; m < samples.size(); ++m) {
      testing::TruthDoc doc;
      doc.domain = sh.domain;
      doc.id = samples[m].key;
      KILN_RETURN_IF_ERROR(npy_decode(samples[m].find("tokens.npy")->data, &doc.tokens));
      ds.docs[{s, m}] = std::move(doc);
    }
  }
  return ds;
}

int partition(const std::string& dir) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto truth = load_truth(dir);
  if (!truth) return fail(truth.status().to_string());
  loader::LoaderOptions o;
  o.seq_len = 7;
  o.micro_batch = 4;
  o.seed = 21;
  o.dp_rank = rank;
  o.dp_world = world;
  o.workers = 1;
  o.prefetch_depth = 2;
  o.weights = {{"alpha", 5}, {"beta", 3}, {"gamma", 2}};
  auto loader = loader::Loader::open(truth->manifest, o);
  if (!loader) return fail(loader.status().to_string());
  Coverage cov(&*truth);
  const uint32_t eos = static_cast<uint32_t>(truth->manifest.tokenizer.eos_id);
  // Pieces of epoch-0 documents: (shard, member, doc_offset, length) sent to rank 0 at the end.
  std::vector<uint64_t> pieces;
  int64_t steps = 0;
  while (true) {
    int done = 1;
    for (const auto& d : (*loader)->stats().domains) done &= d.epoch >= 1;
    int all_done = 0;
    MPI_Allreduce(&done, &all_done, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_done) break;
    if (steps > 20000) return fail("epoch 0 never ends");
    auto b = (*loader)->next_batch();
    if (!b) return fail("rank " + std::to_string(rank) + ": " + b.status().to_string());
    if (b->step != steps || b->micro_batch != o.micro_batch)
      return fail("short or misnumbered batch");
    const std::string problem = cov.add(*b, eos, rank);
    if (!problem.empty()) return fail("rank " + std::to_string(rank) + ": " + problem);
    // With the default partitions (one per row of the global batch) rank r holds the rows
    // [r * micro_batch, (r + 1) * micro_batch) of every step's global batch.
    for (int64_t i = 0; i < o.micro_batch; ++i) {
      if (b->global_rows[i] != rank * o.micro_batch + i) return fail("rows of another rank");
    }
    for (const auto& row : b->docs) {
      for (const loader::DocSpan& s : row) {
        if (s.epoch == 0) pieces.insert(pieces.end(), {s.shard, s.member, s.doc_offset, s.length});
      }
    }
    ++steps;
  }
  // Equal step counts on every rank.
  std::vector<int64_t> all_steps(world);
  MPI_Allgather(&steps, 1, MPI_INT64_T, all_steps.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  // Gather every rank's epoch-0 pieces on rank 0.
  int count = static_cast<int>(pieces.size());
  std::vector<int> counts(world), displs(world);
  MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<uint64_t> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < world; ++r) {
      displs[r] = total;
      total += counts[r];
    }
    all.resize(total);
  }
  MPI_Gatherv(pieces.data(), count, MPI_UINT64_T, all.data(), counts.data(), displs.data(),
              MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (rank != 0) return 0;
  for (int r = 0; r < world; ++r) {
    if (all_steps[r] != steps) return fail("ranks made different numbers of steps");
  }
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::pair<uint64_t, uint64_t>>> held;
  std::map<std::pair<uint64_t, uint64_t>, std::set<int>> owners;
  for (int r = 0; r < world; ++r) {
    for (int i = displs[r]; i < displs[r] + counts[r]; i += 4) {
      held[{all[i], all[i + 1]}].push_back({all[i + 2], all[i + 3]});
      owners[{all[i], all[i + 1]}].insert(r);
    }
  }
  if (held.size() != truth->docs.size()) {
    return fail("epoch 0 held " + std::to_string(held.size()) + " documents, the dataset has " +
                std::to_string(truth->docs.size()));
  }
  for (const auto& [key, doc] : truth->docs) {
    auto it = held.find(key);
    if (it == held.end()) return fail("document " + doc.id + " missing from epoch 0");
    if (owners[key].size() != 1) return fail("document " + doc.id + " on several ranks");
    auto ps = it->second;
    std::sort(ps.begin(), ps.end());
    uint64_t at = 0;
    for (const auto& [off, len] : ps) {
      if (off != at) return fail("document " + doc.id + ": tokens repeated or skipped");
      at += len;
    }
    if (at != doc.tokens.size() + 1) return fail("document " + doc.id + " incomplete");
  }
  std::printf("loader_mpi_check partition: W=%d, %lld steps per rank, %zu documents once each\n",
              world, static_cast<long long>(steps), held.size());
  return 0;
}

int check_stream(const std::string& dir, int world, int64_t steps, int64_t micro_batch) {
  auto truth = load_truth(dir);
  if (!truth) return fail(truth.status().to_string());
  // JSON id from <key>.json -> domain.
  std::map<std::string, std::string> domain_of;
  for (uint32_t s = 0; s < truth->manifest.shards.size(); ++s) {
    auto samples = ShardReader::read_all(truth->manifest.shard_path(truth->manifest.shards[s]));
    if (!samples) return fail(samples.status().to_string());
    for (const auto& smp : *samples) {
      auto j = nlohmann::json::parse(smp.find("json")->data);
      domain_of[j["id"].dump()] = truth->manifest.shards[s].domain;
    }
  }
  std::vector<std::vector<nlohmann::json>> by_rank(world);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      return fail("not a JSON line: " + line);
    }
    const int r = j.value("rank", -1);
    if (r < 0 || r >= world) return fail("bad rank in: " + line);
    by_rank[r].push_back(j);
  }
  std::map<std::string, int> owner;
  for (int r = 0; r < world; ++r) {
    if (static_cast<int64_t>(by_rank[r].size()) != steps * micro_batch) {
      return fail("rank " + std::to_string(r) + " printed " + std::to_string(by_rank[r].size()) +
                  " lines");
    }
    for (size_t i = 0; i < by_rank[r].size(); ++i) {
      const auto& j = by_rank[r][i];
      if (j["step"] != static_cast<int64_t>(i) / micro_batch) return fail("bad step: " + j.dump());
      if (j["row"] != r * micro_batch + static_cast<int64_t>(i) % micro_batch) {
        return fail("rows of another rank: " + j.dump());
      }
      for (const auto& id : j["samples"]) {
        auto it = domain_of.find(id.dump());
        if (it == domain_of.end() || it->second != j["domain"]) return fail("bad id: " + j.dump());
        auto [o, fresh] = owner.emplace(id.dump(), r);
        if (!fresh && o->second != r) return fail("document " + id.dump() + " on two ranks");
      }
    }
  }
  std::printf("loader_mpi_check check-stream: W=%d, %lld lines per rank, %zu documents\n", world,
              static_cast<long long>(steps * micro_batch), owner.size());
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  using namespace kiln;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "make" && argc == 3) {
    auto ds = testing::make_dataset(argv[2], spec());
    if (!ds) return fail(ds.status().to_string());
    return 0;
  }
  if (mode == "partition" && argc == 3) {
    MPI_Init(&argc, &argv);
    const int rc = partition(argv[2]);
    if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
    MPI_Finalize();
    return 0;
  }
  if (mode == "check-stream" && argc == 6) {
    return check_stream(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]));
  }
  std::fprintf(stderr,
               "usage: loader_mpi_check make DIR | partition DIR | check-stream DIR W STEPS MB\n");
  return 2;
}
