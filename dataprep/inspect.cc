#include "dataprep/inspect.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdarg>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_set>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/text.h"
#include "common/tsan.h"
#include "dataprep/chat/chat_data.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "format/manifest.h"
#include "format/npy.h"
#include "format/shard_reader.h"

namespace kiln::prep {
namespace fs = std::filesystem;
namespace {

std::string format(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

uint64_t u64(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_number_unsigned()) ? it->get<uint64_t>() : 0;
}

// Cut at a UTF-8 boundary.
std::string_view utf8_prefix(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  while (max > 0 && (static_cast<unsigned char>(s[max]) & 0xC0) == 0x80) --max;
  return s.substr(0, max);
}

struct ShardCheck {
  std::vector<std::string> problems;
  uint64_t more_problems = 0;
  uint64_t samples = 0;
  uint64_t tokens = 0;
  std::vector<std::string> keys;
  void problem(std::string p) {
    if (problems.size() < 20) {
      problems.push_back(std::move(p));
    } else {
      ++more_problems;
    }
  }
};

void check_shard(const Manifest& m, const ManifestShard& shard, const Tokenizer* tok,
                 ShardCheck* out) {
  const std::string path = m.shard_path(shard);
  const std::string name = shard.path;
  std::error_code ec;
  uint64_t size = fs::file_size(path, ec);
  if (ec) {
    out->problem(name + ": cannot read: " + ec.message());
    return;
  }
  if (size != shard.bytes)
    out->problem(format("%s: %llu bytes on disk, manifest says %llu", name.c_str(),
                        (unsigned long long)size, (unsigned long long)shard.bytes));
  if (auto checked = m.checked_shard_path(shard); !checked.is_ok()) {
    out->problem(name + ": " + checked.status().to_string());
    return;
  }
  auto reader = ShardReader::open(path, Manifest::reader_options(shard, true));
  if (!reader.is_ok()) {
    out->problem(name + ": " + reader.status().to_string());
    return;
  }
  const NpyDtype want_dtype = npy_token_dtype(tok ? tok->vocab_size() : 0);
  ShardSample sample;
  std::vector<uint32_t> stored, expected;
  std::vector<uint8_t> unused_mask;
  std::optional<chat::ChatEncoder> chat_encoder;  // chat samples: special-token text parsed
  if (tok) {
    auto enc = chat::ChatEncoder::create(*tok);
    if (enc.is_ok()) chat_encoder = std::move(enc).value();
  }
  while (true) {
    auto more = (*reader)->next(&sample);
    if (!more.is_ok()) {
      out->problem(name + ": " + more.status().to_string());
      return;
    }
    if (!*more) break;
    ++out->samples;
    out->keys.push_back(sample.key);
    const std::string where = name + " sample '" + sample.key + "'";
    const ShardMember* txt = sample.find("txt");
    const ShardMember* meta = sample.find("json");
    const ShardMember* npy = sample.find("tokens.npy");
    if (!txt || !meta) {
      out->problem(where + ": missing " + (txt ? ".json" : ".txt"));
      continue;
    }
    auto j = parse_untrusted_json_or_discarded(meta->data);
    if (j.is_discarded() || !j.is_object()) {
      out->problem(where + ": .json is not a JSON object");
      continue;
    }
    if (!j.contains("id")) out->problem(where + ": .json has no id");
    if (!j.contains("domain") || !j["domain"].is_string() || j["domain"] != shard.domain)
      out->problem(where + ": .json domain is not '" + shard.domain + "'");
    if (!npy) {
      if (tok) out->problem(where + ": missing .tokens.npy");
      continue;
    }
    auto view = npy_parse(npy->data);
    if (!view.is_ok()) {
      out->problem(where + ": .tokens.npy: " + view.status().message());
      continue;
    }
    out->tokens += view->size;
    if (u64(j, "tokens") != view->size)
      out->problem(format("%s: .json says %llu tokens, .tokens.npy holds %llu", where.c_str(),
                          (unsigned long long)u64(j, "tokens"), (unsigned long long)view->size));
    // A chat sample's loss mask (<key>.mask.npy): uint8 0/1, one per token, its count in .json.
    const ShardMember* mask = sample.find("mask.npy");
    if (mask) {
      auto mv = npy_parse(mask->data);
      if (!mv.is_ok()) {
        out->problem(where + ": .mask.npy: " + mv.status().message());
      } else {
        uint64_t counted = 0;
        bool binary = mv->dtype == NpyDtype::kU8;
        for (uint64_t i = 0; i < mv->size; ++i) {
          counted += mv->at(i);
          binary &= mv->at(i) <= 1;
        }
        if (!binary || mv->size != view->size)
          out->problem(
              format("%s: .mask.npy must be |u1 zeros and ones, one per token (%llu tokens, %llu "
                     "mask entries)",
                     where.c_str(), (unsigned long long)view->size, (unsigned long long)mv->size));
        if (u64(j, "loss_tokens") != counted)
          out->problem(format("%s: .json says %llu loss tokens, .mask.npy counts %llu",
                              where.c_str(), (unsigned long long)u64(j, "loss_tokens"),
                              (unsigned long long)counted));
      }
    }
    if (!tok) continue;
    if (view->dtype != want_dtype)
      out->problem(where + ": .tokens.npy dtype " + npy_descr(view->dtype) + ", expected " +
                   npy_descr(want_dtype) + " for this vocabulary");
    stored.resize(view->size);
    for (uint64_t i = 0; i < view->size; ++i) stored[i] = view->at(i);
    expected.clear();
    if (mask && chat_encoder) {
      chat_encoder->encode(txt->data, {}, &expected, &unused_mask);
    } else if (Status st = tok->encode(txt->data, &expected); !st.is_ok()) {
      out->problem(where + ": " + st.message());
      continue;
    }
    if (stored != expected) {
      size_t i = 0;
      while (i < stored.size() && i < expected.size() && stored[i] == expected[i]) ++i;
      out->problem(format("%s: .tokens.npy differs from the tokenizer's encoding of .txt at token "
                          "%zu (%zu stored, %zu expected)",
                          where.c_str(), i, stored.size(), expected.size()));
    }
  }
  if (out->samples != shard.samples)
    out->problem(format("%s: %llu samples, manifest says %llu", name.c_str(),
                        (unsigned long long)out->samples, (unsigned long long)shard.samples));
  if (out->tokens != shard.tokens)
    out->problem(format("%s: %llu tokens, manifest says %llu", name.c_str(),
                        (unsigned long long)out->tokens, (unsigned long long)shard.tokens));
}

}  // namespace

Result<InspectResult> inspect_dataset(const std::string& out_dir, const InspectOptions& options) {
  KILN_ASSIGN_OR_RETURN(Manifest m, read_manifest(out_dir));
  InspectResult r;
  std::string& s = r.summary;

  nlohmann::json stats;
  const std::string stats_path = (fs::path(m.dir) / "stats.json").string();
  auto stats_text = read_file(stats_path);
  if (stats_text.is_ok()) {
    stats = parse_untrusted_json_or_discarded(*stats_text);
    if (stats.is_discarded() || !stats.is_object()) {
      r.problems.push_back(stats_path + ": not a JSON object");
      stats = nlohmann::json::object();
    }
  } else {
    r.problems.push_back(stats_path + ": " + stats_text.status().message());
    stats = nlohmann::json::object();
  }

  std::optional<Tokenizer> tok;
  s += "dataset " + m.dir + " (" + m.format + ")\n";
  if (!m.tokenizer.path.empty()) {
    auto t = Tokenizer::load((fs::path(m.dir) / m.tokenizer.path).string());
    if (!t.is_ok()) {
      r.problems.push_back("tokenizer: " + t.status().to_string());
    } else {
      tok = std::move(t).value();
      if (tok->vocab_size() != m.tokenizer.vocab_size)
        r.problems.push_back(format("tokenizer has %zu tokens, manifest says %llu",
                                    tok->vocab_size(), (unsigned long long)m.tokenizer.vocab_size));
      if (tok->eos_id() != m.tokenizer.eos_id)
        r.problems.push_back(format("tokenizer eos_id %lld, manifest says %lld",
                                    (long long)tok->eos_id(), (long long)m.tokenizer.eos_id));
    }
    const std::string pre = !tok ? "?"
                            : std::string_view(tok->kind()) == "sentencepiece"
                                ? "sentencepiece"
                                : pretokenizer_label(tok->pretokenizer());
    s += format("tokenizer %s: %llu tokens, eos_id %lld, pre-tokenizer %s\n",
                m.tokenizer.path.c_str(), (unsigned long long)m.tokenizer.vocab_size,
                (long long)m.tokenizer.eos_id, pre.c_str());
  } else {
    s += "tokenizer: none (samples carry no tokens)\n";
  }

  // ---- per-domain table ----
  uint64_t total_docs = 0, total_tokens = 0, total_shards = 0, total_bytes = 0;
  for (const auto& [name, d] : m.domains) {
    total_docs += d.samples;
    total_tokens += d.tokens;
    total_shards += d.shards;
    total_bytes += d.bytes;
  }
  const bool by_tokens = total_tokens > 0;
  s += format("\n%-16s %12s %14s %7s %11s %7s\n", "domain", "docs", "tokens", "shards", "bytes",
              by_tokens ? "share" : "share*");
  for (const auto& [name, d] : m.domains) {
    double share = by_tokens ? double(d.tokens) / double(total_tokens)
                             : (total_docs ? double(d.samples) / double(total_docs) : 0.0);
    s += format("%-16s %12llu %14llu %7llu %11s %6.1f%%\n", name.c_str(),
                (unsigned long long)d.samples, (unsigned long long)d.tokens,
                (unsigned long long)d.shards, human_bytes(d.bytes).c_str(), 100 * share);
  }
  s += format("%-16s %12llu %14llu %7llu %11s %6.1f%%\n", "total", (unsigned long long)total_docs,
              (unsigned long long)total_tokens, (unsigned long long)total_shards,
              human_bytes(total_bytes).c_str(), total_docs ? 100.0 : 0.0);
  if (!by_tokens) s += "* share of documents (no tokens)\n";

  // ---- how domains were assigned ----
  if (stats.contains("domains") && stats["domains"].is_object()) {
    s += "\nassigned by\n";
    for (const auto& [name, dj] : stats["domains"].items()) {
      std::string line = format("  %-14s", name.c_str());
      if (dj.contains("domain_by") && dj["domain_by"].is_object())
        for (const auto& [by, n] : dj["domain_by"].items())
          line += format(" %s=%llu", by.c_str(), (unsigned long long)(n.is_number_unsigned() ? n.get<uint64_t>() : 0));
      s += line + "\n";
      auto md = m.domains.find(name);
      uint64_t mdocs = md == m.domains.end() ? 0 : md->second.samples;
      uint64_t mtok = md == m.domains.end() ? 0 : md->second.tokens;
      // stats.json counts a domain's validation documents too (val_docs, val_tokens of them).
      const uint64_t train_docs = u64(dj, "docs") - std::min(u64(dj, "docs"), u64(dj, "val_docs"));
      const uint64_t train_tokens =
          u64(dj, "tokens") - std::min(u64(dj, "tokens"), u64(dj, "val_tokens"));
      if (train_docs != mdocs || train_tokens != mtok)
        r.problems.push_back(format("domain %s: stats.json says %llu docs / %llu tokens, manifest "
                                    "%llu / %llu",
                                    name.c_str(), (unsigned long long)u64(dj, "docs"),
                                    (unsigned long long)u64(dj, "tokens"),
                                    (unsigned long long)mdocs, (unsigned long long)mtok));
    }
    for (const auto& [name, d] : m.domains)
      if (!stats["domains"].contains(name))
        r.problems.push_back("domain " + name + " is in the manifest but not in stats.json");
  }

  // ---- dedup and rejects ----
  if (stats.contains("docs_in")) {
    uint64_t in = u64(stats, "docs_in"), out = u64(stats, "docs_out"), ex = u64(stats, "exact_dups"),
             near = u64(stats, "near_dups"), rej = u64(stats, "rejected");
    const bool has_filters = stats.contains("filtered");
    const uint64_t flt = has_filters ? u64(stats, "filtered") : 0;
    const bool balanced = in == out + ex + near + rej + flt;
    s += format(
        "\ndocuments: %llu in = %llu out + %llu exact duplicates + %llu near duplicates + "
        "%llu rejected",
        (unsigned long long)in, (unsigned long long)out, (unsigned long long)ex,
        (unsigned long long)near, (unsigned long long)rej);
    if (has_filters) s += format(" + %llu filtered", (unsigned long long)flt);
    s += balanced ? "  [balanced]\n" : "  [DOES NOT ADD UP]\n";
    if (!balanced)
      r.problems.push_back(
          std::string("stats.json: docs_in != docs_out + exact_dups + near_dups + rejected") +
          (has_filters ? " + filtered" : ""));
    // The quality filters: documents and bytes each dropped (by rule) and edited.
    if (stats.contains("filters") && stats["filters"].is_array()) {
      for (const auto& f : stats["filters"]) {
        if (!f.is_object()) continue;
        std::string line =
            format("filter %s: dropped %llu docs (%s)", f.value("filter", std::string("?")).c_str(),
                   (unsigned long long)u64(f, "docs"), human_bytes(u64(f, "bytes")).c_str());
        if (f.contains("rules") && f["rules"].is_object()) {
          std::string rules;
          for (const auto& [rule, n] : f["rules"].items())
            if (n.is_number_unsigned())
              rules += format("%s %s=%llu", rules.empty() ? ":" : ",", rule.c_str(),
                              (unsigned long long)n.get<uint64_t>());
          line += rules;
        }
        if (u64(f, "edited") > 0)
          line += format("; edited %llu docs", (unsigned long long)u64(f, "edited"));
        s += line + "\n";
      }
    }
    uint64_t val_docs = 0;  // validation shards are not in the domain totals
    for (const ManifestShard& sh : m.shards) val_docs += sh.val ? sh.samples : 0;
    if (out != total_docs + val_docs)
      r.problems.push_back(format("stats.json docs_out %llu, manifest holds %llu documents",
                                  (unsigned long long)out,
                                  (unsigned long long)(total_docs + val_docs)));
    if (stats.contains("rejected_by_reason") && stats["rejected_by_reason"].is_object()) {
      std::string reasons;
      for (const auto& [reason, n] : stats["rejected_by_reason"].items())
        if (n.is_number_unsigned() && n.get<uint64_t>() > 0)
          reasons += format(" %s=%llu", reason.c_str(), (unsigned long long)n.get<uint64_t>());
      if (!reasons.empty()) s += "rejected:" + reasons + "\n";
    }
    if (stats.contains("dedup") && stats["dedup"].is_object()) {
      const auto& d = stats["dedup"];
      std::string line = "near-dedup:";
      if (d.contains("threshold")) line += " threshold " + d["threshold"].dump();
      if (d.contains("bands")) line += ", " + d["bands"].dump() + " bands x " + d["rows"].dump() + " rows";
      if (d.contains("clusters")) line += ", " + d["clusters"].dump() + " clusters";
      if (d.contains("largest_cluster")) line += ", largest " + d["largest_cluster"].dump();
      s += line + "\n";
    }
  }

  // ---- verify ----
  if (options.verify) {
    std::vector<ShardCheck> checks(m.shards.size());
    const tsan::ForkJoin fork_join;
    tbb::parallel_for(size_t(0), m.shards.size(), fork_join.task([&](size_t i) {
      check_shard(m, m.shards[i], tok ? &*tok : nullptr, &checks[i]);
    }));
    fork_join.join();
    std::map<std::string, std::pair<uint64_t, uint64_t>> per_domain;  // samples, tokens
    std::unordered_set<std::string> keys;
    for (size_t i = 0; i < checks.size(); ++i) {
      auto& c = checks[i];
      r.problems.insert(r.problems.end(), c.problems.begin(), c.problems.end());
      if (c.more_problems)
        r.problems.push_back(format("%s: %llu more problems", m.shards[i].path.c_str(),
                                    (unsigned long long)c.more_problems));
      if (!m.shards[i].val) {  // the manifest's domain totals are of the training shards
        per_domain[m.shards[i].domain].first += c.samples;
        per_domain[m.shards[i].domain].second += c.tokens;
      }
      for (auto& k : c.keys)
        if (!keys.insert(k).second)
          r.problems.push_back(m.shards[i].path + ": key '" + k + "' is used more than once");
      r.samples_checked += c.samples;
      ++r.shards_checked;
    }
    // The dedup index (when there is one) must open and cover every document of the dataset.
    if (fs::exists(fs::path(m.dir) / "dedup" / "index" / "index.json")) {
      auto index = prep::DedupIndex::open(m.dir);
      if (!index.is_ok()) {
        r.problems.push_back("dedup index: " + index.status().to_string());
      } else {
        uint64_t docs = 0;
        for (const ManifestShard& sh : m.shards) docs += sh.samples;
        if ((*index)->kept_docs() != docs)
          r.problems.push_back(format("dedup index covers %llu documents, the shards hold %llu",
                                      (unsigned long long)(*index)->kept_docs(),
                                      (unsigned long long)docs));
        if (Status links = (*index)->check_links(); !links.is_ok())
          r.problems.push_back("dedup index: " + links.to_string());
      }
    }
    for (const auto& [name, d] : m.domains) {
      auto [samples, tokens] = per_domain[name];
      if (samples != d.samples || tokens != d.tokens)
        r.problems.push_back(format("domain %s: shards hold %llu samples / %llu tokens, manifest "
                                    "says %llu / %llu",
                                    name.c_str(), (unsigned long long)samples,
                                    (unsigned long long)tokens, (unsigned long long)d.samples,
                                    (unsigned long long)d.tokens));
    }
    s += format("\nverify: %llu shards, %llu samples checked (checksums, members, metadata%s): "
                "%zu problem(s)\n",
                (unsigned long long)r.shards_checked, (unsigned long long)r.samples_checked,
                tok ? ", tokens = encode(text)" : "", r.problems.size());
  }

  // ---- samples ----
  if (options.sample > 0 && total_docs > 0) {
    uint64_t n = std::min(options.sample, total_docs);
    std::vector<uint64_t> targets;
    for (uint64_t i = 0; i < n; ++i) targets.push_back(i * total_docs / n);
    uint64_t base = 0;
    size_t next = 0;
    for (const auto& shard : m.shards) {
      if (next == targets.size()) break;
      if (targets[next] >= base + shard.samples) {
        base += shard.samples;
        continue;
      }
      KILN_ASSIGN_OR_RETURN(std::string path, m.checked_shard_path(shard));
      auto reader = ShardReader::open(path, Manifest::reader_options(shard, false));
      if (!reader.is_ok()) return std::move(reader).take_status();
      ShardSample sample;
      for (uint64_t idx = base; next < targets.size() && idx < base + shard.samples; ++idx) {
        KILN_ASSIGN_OR_RETURN(bool more, (*reader)->next(&sample));
        if (!more) break;
        if (idx != targets[next]) continue;
        ++next;
        const ShardMember* txt = sample.find("txt");
        const ShardMember* meta = sample.find("json");
        const ShardMember* npy = sample.find("tokens.npy");
        auto j = meta ? parse_untrusted_json_or_discarded(meta->data) : nlohmann::json();
        std::string id = j.is_object() && j.contains("id") ? j["id"].dump() : "?";
        std::string by = j.is_object() && j.contains("domain_by") && j["domain_by"].is_string()
                             ? " (" + j["domain_by"].get<std::string>() + ")"
                             : "";
        std::string text = txt ? txt->data : "";
        std::string tokens_note = "no tokens";
        if (npy && tok) {
          std::vector<uint32_t> ids;
          if (npy_decode(npy->data, &ids).is_ok()) {
            auto decoded = tok->decode(ids);
            if (decoded.is_ok()) text = std::move(decoded).value();
            tokens_note = format("%zu tokens, decoded", ids.size());
          }
        }
        r.samples += format("--- sample %zu/%llu: key %s, id %s, domain %s%s, %s, %s\n", next,
                            (unsigned long long)n, sample.key.c_str(), id.c_str(),
                            shard.domain.c_str(), by.c_str(), tokens_note.c_str(),
                            shard.path.c_str());
        std::string_view shown = utf8_prefix(text, options.sample_bytes);
        r.samples += std::string(shown);
        if (shown.size() < text.size())
          r.samples += format("\n[... %zu more bytes]", text.size() - shown.size());
        r.samples += "\n";
      }
      base += shard.samples;
    }
  }
  return r;
}

}  // namespace kiln::prep
