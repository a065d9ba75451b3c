// Stages 2 and 3 (exact, dedup): exact and near-duplicate resolution across all ranks.
//
// Exact: (128-bit hash, docid) records go to owner rank hash % size, are sorted (spilling runs
// past the memory budget) and grouped; in each group the earliest document is the leader and the
// others are exact duplicates. The duplicate list is gathered on every rank.
// Near: (band key, docid) records of the remaining documents go to owner rank key % size; equal
// keys make candidate pairs (each member with the group's first, plus neighbours when verifying);
// candidates are verified by the Jaccard estimate of the full signatures (fetched from the
// documents' home ranks); verified edges are gathered everywhere and joined by union-find, so
// every rank computes the same clusters, each kept by its earliest document.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "common/hash.h"
#include "common/log.h"
#include "common/tsan.h"
#include "dataprep/dedup/external_sort.h"
#include "dataprep/stages/stages.h"
#include "dataprep/stages/work_files.h"

namespace kiln::prep::detail {

DedupSettings dedup_settings(const PrepOptions& opt) {
  DedupSettings s;
  s.exact = opt.exact;
  s.near = opt.near;
  s.threshold = opt.threshold;
  s.num_perm = opt.num_perm;
  s.bands = opt.lsh.bands;
  s.rows = opt.lsh.rows;
  s.ngram = opt.ngram;
  s.seed = opt.seed;
  s.strip_punct = opt.strip_punct;
  return s;
}

namespace {

// Sends records produced here to their owner ranks in bounded rounds; the owner adds what it
// receives to `sorter`. produce(Rec*) returns false when this rank has no more records.
template <typename Rec, typename Produce, typename Owner>
Status exchange(Context& c, Produce&& produce, Owner&& owner, ExternalSorter<Rec>* sorter) {
  if (c.size == 1) {
    Rec r;
    while (produce(&r)) KILN_RETURN_IF_ERROR(sorter->add(r));
    return Status::ok();
  }
  const size_t round_records = std::max<size_t>(4096, c.opt.memory_bytes / 8 / sizeof(Rec));
  bool exhausted = false;
  for (;;) {
    std::vector<std::vector<Rec>> per_dest(c.size);
    size_t n = 0;
    Rec r;
    while (!exhausted && n < round_records) {
      if (!produce(&r)) {
        exhausted = true;
        break;
      }
      per_dest[owner(r)].push_back(r);
      ++n;
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Rec> got, comm::alltoallv(*c.g, per_dest));
    KILN_RETURN_IF_ERROR(sorter->add(got.data(), got.size()));
    KILN_ASSIGN_OR_RETURN(int64_t more, comm::allreduce_value<int64_t>(*c.g, exhausted ? 0 : 1,
                                                                       comm::ReduceOp::kMax));
    if (more == 0) break;
  }
  return Status::ok();
}

struct ExactRec {
  uint64_t lo, hi, docid;
  bool operator<(const ExactRec& o) const {
    if (lo != o.lo) return lo < o.lo;
    if (hi != o.hi) return hi < o.hi;
    return docid < o.docid;
  }
};

struct BandRec {
  uint64_t key, docid;
  bool operator<(const BandRec& o) const { return key != o.key ? key < o.key : docid < o.docid; }
};

using Pair = DocPair;

// Reads the signatures of `want` (sorted, unique, all homed on this rank) from the tables:
// a binary search per document when requests are sparse, one sequential pass when dense.
Status read_signatures(const Context& c, const std::vector<uint64_t>& want,
                       std::unordered_map<uint64_t, std::vector<uint64_t>>* out) {
  const RecordLayout& L = c.layout;
  size_t wi = 0;
  for (const FileRun& u : c.units) {
    if (wi >= want.size()) break;
    uint64_t lo = make_docid(u.first, 0), hi = make_docid(u.last, 0);
    if (want[wi] >= hi) continue;
    if (want[wi] < lo) return Status::internal("signature request for a document of another rank");
    size_t wj = wi;  // requests inside this unit: [wi, wj)
    while (wj < want.size() && want[wj] < hi) ++wj;
    std::string path = c.unit_path(u, "tbl");
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::from_errno("open", path);
    struct stat st;
    ::fstat(fd, &st);
    const uint64_t nrec = static_cast<uint64_t>(st.st_size) / L.bytes;
    Status status;
    auto pread_all = [&](void* buf, size_t n, uint64_t off) {
      size_t done = 0;
      while (done < n) {
        ssize_t r =
            ::pread(fd, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(off + done));
        if (r <= 0) return false;
        done += static_cast<size_t>(r);
      }
      return true;
    };
    auto take = [&](uint64_t docid, const uint8_t* rec) {
      std::vector<uint64_t> sig(L.num_perm);
      std::memcpy(sig.data(), rec + L.sig_offset, 8 * static_cast<size_t>(L.num_perm));
      (*out)[docid] = std::move(sig);
    };
    if ((wj - wi) * 64 > nrec) {  // dense: stream the table
      std::vector<uint8_t> buf(std::max<size_t>(1, (size_t{4} << 20) / L.bytes) * L.bytes);
      size_t k = wi;
      for (uint64_t off = 0; off < nrec * L.bytes && k < wj && status.is_ok(); off += buf.size()) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), nrec * L.bytes - off));
        if (!pread_all(buf.data(), n, off)) {
          status = Status::io("reading a scan table failed").with_file(path);
          break;
        }
        for (size_t at = 0; at < n && k < wj; at += L.bytes) {
          uint64_t d = RecordView{buf.data() + at}.docid();
          while (k < wj && want[k] < d) {
            status = Status::internal("document missing from its scan table").with_file(path);
            ++k;
          }
          if (k < wj && want[k] == d) take(want[k++], buf.data() + at);
        }
      }
      if (status.is_ok() && k < wj)
        status = Status::internal("document missing from its scan table").with_file(path);
    } else {  // sparse: binary search on the docid column
      std::vector<uint8_t> rec(L.bytes);
      for (size_t k = wi; k < wj && status.is_ok(); ++k) {
        uint64_t a = 0, b = nrec;
        while (a < b) {
          uint64_t mid = (a + b) / 2, d = 0;
          if (!pread_all(&d, 8, mid * L.bytes)) break;
          if (d < want[k])
            a = mid + 1;
          else
            b = mid;
        }
        if (a >= nrec || !pread_all(rec.data(), L.bytes, a * L.bytes) ||
            RecordView{rec.data()}.docid() != want[k]) {
          status = Status::internal("document missing from its scan table").with_file(path);
          break;
        }
        take(want[k], rec.data());
      }
    }
    ::close(fd);
    KILN_RETURN_IF_ERROR(status);
    wi = wj;
  }
  if (wi != want.size()) return Status::internal("signature requests outside this rank's files");
  return Status::ok();
}

// Estimated Jaccard of each pair (collective: every rank calls it with its own pairs). Fetches
// signatures from the documents' home ranks in batches that fit the memory budget.
Result<std::vector<double>> pair_similarities(Context& c, const std::vector<Pair>& pairs) {
  const int np = c.layout.num_perm;
  // A fetched signature is held about four times over (table read, reply buffers, received
  // copy, lookup map): a batch's documents take ~1/4 of the budget.
  const size_t cap_docs =
      std::max<size_t>(256, c.opt.memory_bytes / 16 / (static_cast<size_t>(np) * 8 + 64));
  // Batch boundaries: consecutive pairs whose distinct documents fit cap_docs.
  std::vector<size_t> bounds{0};
  {
    std::unordered_set<uint64_t> docs;
    for (size_t i = 0; i < pairs.size(); ++i) {
      docs.insert(pairs[i].first);
      docs.insert(pairs[i].second);
      if (docs.size() + 2 > cap_docs) {
        bounds.push_back(i + 1);
        docs.clear();
      }
    }
    if (bounds.back() != pairs.size()) bounds.push_back(pairs.size());
  }
  int64_t my_batches = static_cast<int64_t>(bounds.size()) - 1;
  KILN_ASSIGN_OR_RETURN(int64_t batches,
                        comm::allreduce_value<int64_t>(*c.g, my_batches, comm::ReduceOp::kMax));
  std::vector<double> sims(pairs.size(), 0.0);
  for (int64_t bi = 0; bi < batches; ++bi) {
    std::vector<uint64_t> docs;
    size_t p0 = 0, p1 = 0;
    if (bi < my_batches) {
      p0 = bounds[bi];
      p1 = bounds[bi + 1];
      for (size_t i = p0; i < p1; ++i) {
        docs.push_back(pairs[i].first);
        docs.push_back(pairs[i].second);
      }
      std::sort(docs.begin(), docs.end());
      docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
    }
    // Ask each document's home rank for its signature; documents of earlier datasets are read
    // from their index here.
    std::vector<std::vector<uint64_t>> requests(c.size);
    std::vector<uint64_t> external;
    for (uint64_t d : docs) {
      if (is_external(d))
        external.push_back(d);
      else
        requests[c.file_owner(docid_file(d))].push_back(d);
    }
    std::vector<size_t> req_counts;
    KILN_ASSIGN_OR_RETURN(std::vector<uint64_t> asked,
                          comm::alltoallv(*c.g, requests, &req_counts));
    std::vector<uint64_t> want = asked;
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    std::unordered_map<uint64_t, std::vector<uint64_t>> found;
    Status st = read_signatures(c, want, &found);
    KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(st)));
    std::vector<std::vector<uint64_t>> replies(c.size);
    size_t at = 0;
    for (int r = 0; r < c.size; ++r) {
      for (size_t k = 0; k < req_counts[r]; ++k, ++at) {
        const auto& sig = found.at(asked[at]);
        replies[r].insert(replies[r].end(), sig.begin(), sig.end());
      }
    }
    found.clear();
    KILN_ASSIGN_OR_RETURN(std::vector<uint64_t> sig_data, comm::alltoallv(*c.g, replies));
    // Replies come in rank order, each in the order of our requests to that rank.
    std::unordered_map<uint64_t, const uint64_t*> sig_of;
    size_t off = 0;
    for (int r = 0; r < c.size; ++r)
      for (uint64_t d : requests[r]) {
        sig_of[d] = sig_data.data() + off;
        off += static_cast<size_t>(np);
      }
    std::vector<uint64_t> external_sigs(external.size() * static_cast<size_t>(np));
    for (size_t k = 0; k < external.size(); ++k) {
      const uint64_t d = external[k];
      uint64_t* sig = external_sigs.data() + k * static_cast<size_t>(np);
      KILN_RETURN_IF_ERROR(c.against.at(external_dataset(d))->signature(external_ref(d), sig));
      sig_of[d] = sig;
    }
    for (size_t i = p0; i < p1; ++i)
      sims[i] = MinHasher::jaccard(sig_of.at(pairs[i].first), sig_of.at(pairs[i].second), np);
  }
  return sims;
}

// The similarity of each (kept, member) pair, keyed by member, on every rank (collective: every
// rank passes the same pairs). Each rank computes a round-robin share and the shares are
// all-gathered. Without signatures (no near-duplicate stage) every pair is an exact copy: 1.
Result<std::unordered_map<uint64_t, double>> gathered_similarities(Context& c,
                                                                   const std::vector<Pair>& pairs) {
  std::vector<Pair> mine;
  for (size_t i = static_cast<size_t>(c.rank); i < pairs.size(); i += static_cast<size_t>(c.size))
    mine.push_back(pairs[i]);
  std::vector<double> sims(mine.size(), 1.0);
  if (c.layout.num_perm > 0) {
    KILN_ASSIGN_OR_RETURN(sims, pair_similarities(c, mine));
  }
  struct MemberSim {
    uint64_t member;
    double sim;
  };
  std::vector<MemberSim> local;
  local.reserve(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) local.push_back({mine[i].second, sims[i]});
  KILN_ASSIGN_OR_RETURN(std::vector<MemberSim> all, comm::allgatherv(*c.g, local));
  std::unordered_map<uint64_t, double> by_member;
  by_member.reserve(all.size());
  for (const MemberSim& ms : all) by_member[ms.member] = ms.sim;
  return by_member;
}

// The clustering order: documents of earlier datasets first (in their order), then the input.
inline uint64_t cluster_order(uint64_t d) { return d ^ kExternalBit; }
inline bool cluster_before(uint64_t a, uint64_t b) { return cluster_order(a) < cluster_order(b); }

// Union-find over docids (the representative of a set is its earliest document).
class DocUnionFind {
 public:
  // nodes: sorted by cluster_before, unique.
  explicit DocUnionFind(std::vector<uint64_t> nodes) : nodes_(std::move(nodes)) {
    parent_.resize(nodes_.size());
    for (size_t i = 0; i < parent_.size(); ++i) parent_[i] = i;
  }
  size_t index(uint64_t d) const {
    return static_cast<size_t>(std::lower_bound(nodes_.begin(), nodes_.end(), d, cluster_before) -
                               nodes_.begin());
  }
  bool contains(uint64_t d) const {
    size_t i = index(d);
    return i < nodes_.size() && nodes_[i] == d;
  }
  size_t find(size_t i) {
    while (parent_[i] != i) {
      parent_[i] = parent_[parent_[i]];
      i = parent_[i];
    }
    return i;
  }
  void unite(uint64_t a, uint64_t b) {
    size_t ra = find(index(a)), rb = find(index(b));
    if (ra == rb) return;
    if (ra < rb)
      parent_[rb] = ra;  // indices follow docid order: the smaller index is earlier
    else
      parent_[ra] = rb;
  }
  uint64_t rep(uint64_t d) { return nodes_[find(index(d))]; }
  const std::vector<uint64_t>& nodes() const { return nodes_; }

 private:
  std::vector<uint64_t> nodes_;
  std::vector<size_t> parent_;
};

}  // namespace

Status exact_stage(Context& c) {
  c.exact_dups.clear();
  if (!c.opt.exact) return Status::ok();
  KILN_RETURN_IF_ERROR(make_dirs(c.tmp_dir()));
  ExternalSorter<ExactRec> sorter(c.tmp_dir(), "exact", c.opt.memory_bytes / 2);
  TableScanner scan(c.layout, c.table_paths());
  auto produce = [&](ExactRec* r) {
    const uint8_t* p = scan.next();
    if (!p) return false;
    RecordView v{p};
    *r = {v.hash_lo(), v.hash_hi(), v.docid()};
    return true;
  };
  Status st = exchange<ExactRec>(
      c, produce,
      [&](const ExactRec& r) { return static_cast<int>(r.lo % static_cast<uint64_t>(c.size)); },
      &sorter);
  if (st.is_ok()) st = scan.status();
  KILN_RETURN_IF_ERROR(st);
  std::vector<Pair> local;
  bool have = false;
  ExactRec leader{};
  std::vector<uint64_t> refs;
  KILN_RETURN_IF_ERROR(sorter.merge([&](const ExactRec& r) {
    if (have && r.lo == leader.lo && r.hi == leader.hi) {
      local.push_back({r.docid, leader.docid});
    } else {
      leader = r;
      have = true;
      // A group whose text an earlier dataset holds: its leader is a copy of that document.
      for (size_t i = 0; i < c.against.size(); ++i) {
        c.against[i]->find_exact(r.lo, r.hi, &refs);
        if (refs.empty()) continue;
        local.push_back({r.docid, make_external(static_cast<uint32_t>(i), refs[0])});
        break;
      }
    }
    return Status::ok();
  }));
  c.dedup.spilled_bytes += sorter.spilled_bytes();
  KILN_ASSIGN_OR_RETURN(c.exact_dups, comm::allgatherv(*c.g, local));
  tsan::parallel_sort(c.exact_dups.begin(), c.exact_dups.end());
  return Status::ok();
}

Status dedup_stage(Context& c) {
  c.removed.clear();
  std::vector<Pair> edges;  // verified near-duplicate edges (global)
  std::unordered_map<uint64_t, double> rep_sim;
  std::unique_ptr<DocUnionFind> uf;
  if (c.opt.near) {
    KILN_RETURN_IF_ERROR(make_dirs(c.tmp_dir()));
    const int bands = c.layout.bands;
    std::vector<Pair> candidates;
    {
      ExternalSorter<BandRec> sorter(c.tmp_dir(), "bands", c.opt.memory_bytes / 2);
      TableScanner scan(c.layout, c.table_paths());
      RecordView cur{nullptr};
      int band = bands;
      auto produce = [&](BandRec* r) {
        while (band >= bands) {
          const uint8_t* p = scan.next();
          if (!p) return false;
          cur = RecordView{p};
          band = 0;
          if (!(cur.flags() & kFlagHasSig) || c.is_exact_dup(cur.docid())) band = bands;
        }
        *r = {cur.key(c.layout, band), cur.docid()};
        ++band;
        return true;
      };
      Status st = exchange<BandRec>(
          c, produce,
          [&](const BandRec& r) { return static_cast<int>(r.key % static_cast<uint64_t>(c.size)); },
          &sorter);
      if (st.is_ok()) st = scan.status();
      KILN_RETURN_IF_ERROR(st);
      std::vector<uint64_t> group, refs;
      uint64_t key = 0;
      auto flush = [&] {
        // The earlier datasets' kept documents with this key come first in the bucket, as they
        // would in one run over all the data; pairs of two of them are not ours to check.
        size_t n_ext = 0;
        if (!c.against.empty() && !group.empty()) {
          std::vector<uint64_t> ext;
          for (size_t i = 0; i < c.against.size(); ++i) {
            c.against[i]->find_band(key, &refs);
            for (uint64_t ref : refs) ext.push_back(make_external(static_cast<uint32_t>(i), ref));
          }
          n_ext = ext.size();
          group.insert(group.begin(), ext.begin(), ext.end());
        }
        for (size_t i = std::max<size_t>(1, n_ext); i < group.size(); ++i) {
          candidates.push_back({group[0], group[i]});
          if (c.opt.verify && i >= 2) candidates.push_back({group[i - 1], group[i]});
        }
        group.clear();
      };
      KILN_RETURN_IF_ERROR(sorter.merge([&](const BandRec& r) {
        if (!group.empty() && r.key != key) flush();
        key = r.key;
        group.push_back(r.docid);
        return Status::ok();
      }));
      flush();
      c.dedup.spilled_bytes += sorter.spilled_bytes();
    }
    tsan::parallel_sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    if (c.size > 1) {
      // Several bands (owned by different ranks) can propose the same pair: give each pair one
      // owner so it is verified and counted once, whatever the rank count.
      std::vector<std::vector<Pair>> per_dest(c.size);
      for (const Pair& p : candidates) {
        uint64_t h = xxh3_64(&p, sizeof p);
        per_dest[h % static_cast<uint64_t>(c.size)].push_back(p);
      }
      std::vector<Pair>().swap(candidates);
      KILN_ASSIGN_OR_RETURN(candidates, comm::alltoallv(*c.g, per_dest));
      tsan::parallel_sort(candidates.begin(), candidates.end());
      candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    }
    std::vector<Pair> local_edges;
    if (c.opt.verify) {
      KILN_ASSIGN_OR_RETURN(std::vector<double> sims, pair_similarities(c, candidates));
      for (size_t i = 0; i < candidates.size(); ++i)
        if (sims[i] >= c.opt.threshold) local_edges.push_back(candidates[i]);
    } else {
      local_edges = candidates;
    }
    KILN_ASSIGN_OR_RETURN(
        uint64_t total_candidates,
        comm::allreduce_value<uint64_t>(*c.g, candidates.size(), comm::ReduceOp::kSum));
    c.dedup.candidate_pairs = total_candidates;
    std::vector<Pair>().swap(candidates);
    KILN_ASSIGN_OR_RETURN(edges, comm::allgatherv(*c.g, local_edges));
    tsan::parallel_sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    c.dedup.verified_pairs = edges.size();
    // An earlier dataset's document that its run removed links to the document its cluster kept
    // there: the edges of that run's clustering, which a run over all the data would find again.
    if (!c.against.empty()) {
      std::vector<Pair> links;
      for (const auto& [a, b] : edges)
        for (uint64_t d : {a, b}) {
          if (!is_external(d)) continue;
          KILN_ASSIGN_OR_RETURN(uint64_t kept,
                                c.against.at(external_dataset(d))->kept_ref(external_ref(d)));
          if (kept != external_ref(d))
            links.push_back({make_external(external_dataset(d), kept), d});
        }
      edges.insert(edges.end(), links.begin(), links.end());
      tsan::parallel_sort(edges.begin(), edges.end());
      edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    }

    // Clusters (identical on every rank).
    std::vector<uint64_t> nodes;
    nodes.reserve(edges.size() * 2);
    for (const auto& [a, b] : edges) {
      nodes.push_back(a);
      nodes.push_back(b);
    }
    tsan::parallel_sort(nodes.begin(), nodes.end(), cluster_before);
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    uf = std::make_unique<DocUnionFind>(std::move(nodes));
    for (const auto& [a, b] : edges) uf->unite(a, b);
    std::vector<Pair>().swap(edges);

    // Similarity of every removed member to its kept representative, computed round-robin.
    std::vector<Pair> rep_pairs;  // (rep, member), in member order
    for (uint64_t d : uf->nodes()) {
      if (is_external(d)) continue;  // not ours to remove
      uint64_t r = uf->rep(d);
      if (r != d) rep_pairs.push_back({r, d});
      // The earliest document of a cluster is never one its own run removed (it links to an
      // earlier one), so removed.jsonl names a kept document.
      if (is_external(r)) {
        KILN_ASSIGN_OR_RETURN(uint64_t kept,
                              c.against.at(external_dataset(r))->kept_ref(external_ref(r)));
        if (kept != external_ref(r))
          return Status::internal("dedup: a cluster is kept by a removed document of " +
                                  c.opt.against.at(external_dataset(r)));
      }
    }
    KILN_ASSIGN_OR_RETURN(rep_sim, gathered_similarities(c, rep_pairs));
    for (const auto& [r, d] : rep_pairs) c.removed.push_back({d, r, rep_sim.at(d), 0, 0});
  }
  // An exact copy of an earlier dataset's document is kept for by the document kept there (the
  // index's exact hash points at it), or, when this run joined that document's cluster to an
  // earlier one (a new document near both), by that cluster's kept document, as in one run.
  auto kept_for_external = [&](uint64_t ext) {
    return uf && uf->contains(ext) ? uf->rep(ext) : ext;
  };
  // Leaders that are exact copies of an earlier dataset's document: their similarity to the
  // document kept for them (1 unless the copy was itself a removed member of a cluster there).
  std::unordered_map<uint64_t, double> external_sim;
  if (!c.against.empty()) {
    std::vector<Pair> copies;  // (document kept for the leader, copy), in copy order
    for (const auto& [dup, leader] : c.exact_dups)
      if (is_external(leader)) copies.push_back({kept_for_external(leader), dup});
    KILN_ASSIGN_OR_RETURN(external_sim, gathered_similarities(c, copies));
  }
  // Exact duplicates follow their leader's cluster (or the earlier dataset's document).
  for (const auto& [dup, leader] : c.exact_dups) {
    if (is_external(leader)) {
      c.removed.push_back({dup, kept_for_external(leader), external_sim.at(dup), 1, 0});
      continue;
    }
    RemovedEntry e{dup, leader, 1.0, 1, 0};
    auto ext = std::lower_bound(c.exact_dups.begin(), c.exact_dups.end(), leader,
                                [](const Pair& p, uint64_t d) { return p.first < d; });
    if (ext != c.exact_dups.end() && ext->first == leader) {  // the leader copies an earlier one
      e.kept = kept_for_external(ext->second);
      e.similarity = external_sim.at(leader);
      c.removed.push_back(e);
      continue;
    }
    if (uf && uf->contains(leader)) {
      uint64_t r = uf->rep(leader);
      if (r != leader) {
        e.kept = r;
        e.similarity = rep_sim.at(leader);
      }
    }
    c.removed.push_back(e);
  }
  tsan::parallel_sort(
      c.removed.begin(), c.removed.end(),
      [](const RemovedEntry& a, const RemovedEntry& b) { return a.docid < b.docid; });
  return Status::ok();
}

}  // namespace kiln::prep::detail
