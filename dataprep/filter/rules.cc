// The rule filters: language identification (fastText), PII masking, URL block lists and user
// regular expressions (RE2: linear time, so a user's pattern cannot stall prep).
#include <re2/re2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "dataprep/filter/params.h"
#include "dataprep/filter/text.h"
#include "dataprep/ingest/url.h"
#include "dataprep/tagging/tagger.h"

namespace kiln::prep::filter {
namespace {

bool drop(FilterDrop* d, const char* rule, double value, const char* op, double threshold,
          std::string note = {}) {
  d->rule = rule;
  d->value = value;
  d->op = op;
  d->threshold = threshold;
  d->note = std::move(note);
  return false;
}

bool blank(std::string_view s) {
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) return false;
  return true;
}

// ---- language ----------------------------------------------------------------------------------

class Language final : public Filter {
 public:
  std::unique_ptr<FastTextTagger> model;
  std::vector<std::string> languages;  // empty: any
  double threshold = 0.65;
  bool annotates() const override { return true; }

  bool apply(std::string* text, const FilterInput&, FilterDrop* d, bool*,
             FilterAnnotations* ann) const override {
    auto p = model->predict(*text);
    if (!p) return drop(d, "language_score", 0, "<=", threshold, "no prediction");
    ann->language = p->domain;
    ann->language_score = p->probability;
    if (!languages.empty() &&
        std::find(languages.begin(), languages.end(), p->domain) == languages.end())
      return drop(d, "language", p->probability, "not in", 0, p->domain);
    if (!(p->probability > threshold))
      return drop(d, "language_score", p->probability, "<=", threshold, p->domain);
    return true;
  }
};

// ---- pii ---------------------------------------------------------------------------------------

// The patterns of tests/dataprep/filter_reference.py (Python `re` with re.ASCII matches the same).
const char* const kEmailPattern =
    R"(\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@)"
    R"((?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)";
const char* const kIpPattern = R"(\b(?:[0-9]{1,3}\.){3}[0-9]{1,3}\b)";
const char* const kPhonePattern =
    R"((?:\+?1[-. ])?(?:\([0-9]{3}\) ?|\b[0-9]{3}[-. ])[0-9]{3}[-. ][0-9]{4}\b)";

// Python 3.11 ipaddress: a dotted quad (no leading zeros, octets <= 255) and is_global.
bool public_ipv4(std::string_view s) {
  uint32_t octets[4];
  size_t at = 0;
  for (int k = 0; k < 4; ++k) {
    if (k > 0) {
      if (at >= s.size() || s[at] != '.') return false;
      ++at;
    }
    size_t b = at;
    uint32_t v = 0;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9' && at - b < 3)
      v = v * 10 + (s[at++] - '0');
    if (at == b || v > 255 || (at - b > 1 && s[b] == '0')) return false;
    octets[k] = v;
  }
  if (at != s.size()) return false;
  const uint32_t a = octets[0] << 24 | octets[1] << 16 | octets[2] << 8 | octets[3];
  struct Net {
    uint32_t base;
    int bits;
  };
  static const Net kNotGlobal[] = {
      {0x00000000, 8},  {0x0A000000, 8},  {0x64400000, 10}, {0x7F000000, 8},  {0xA9FE0000, 16},
      {0xAC100000, 12}, {0xC0000000, 29}, {0xC00000AA, 31}, {0xC0000200, 24}, {0xC0A80000, 16},
      {0xC6120000, 15}, {0xC6336400, 24}, {0xCB007100, 24}, {0xF0000000, 4},  {0xFFFFFFFF, 32}};
  for (const Net& n : kNotGlobal) {
    const uint32_t mask = n.bits == 0 ? 0 : ~uint32_t{0} << (32 - n.bits);
    if ((a & mask) == n.base) return false;
  }
  return true;
}

// Whether some '.' has a digit on both sides: every match of kIpPattern does.
bool has_digit_dot_digit(std::string_view s) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t at = s.find('.', 1); at != std::string_view::npos && at + 1 < s.size();
       at = s.find('.', at + 1))
    if (digit(s[at - 1]) && digit(s[at + 1])) return true;
  return false;
}

// The characters kEmailPattern consumes: its local part's, '.', '@' and the domain's.
bool email_char(char c) {
  static const auto table = [] {
    std::array<bool, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[c] = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             std::strchr("!#$%&'*+/=?^_`{|}~-.@", c) != nullptr;
    t[0] = false;
    return t;
  }();
  return table[static_cast<uint8_t>(c)];
}
// The next run of email_char around an '@' at or after `from` (an e-mail address lies inside one).
bool email_window(std::string_view s, size_t from, size_t* b, size_t* e) {
  const size_t at = s.find('@', from);
  if (at == std::string_view::npos) return false;
  size_t l = at, r = at + 1;
  while (l > from && email_char(s[l - 1])) --l;
  while (r < s.size() && email_char(s[r])) ++r;
  *b = l;
  *e = r;
  return true;
}
// The next run of digits and dots with a digit-dot-digit at or after `from` (kIpPattern consumes
// only digits and dots).
bool ip_window(std::string_view s, size_t from, size_t* b, size_t* e) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t at = s.find('.', from + 1); at != std::string_view::npos && at + 1 < s.size();
       at = s.find('.', at + 1)) {
    if (!(digit(s[at - 1]) && digit(s[at + 1]))) continue;
    size_t l = at, r = at;
    while (l > from && (digit(s[l - 1]) || s[l - 1] == '.')) --l;
    while (r < s.size() && (digit(s[r]) || s[r] == '.')) ++r;
    *b = l;
    *e = r;
    return true;
  }
  return false;
}
bool whole_window(std::string_view s, size_t from, size_t* b, size_t* e) {
  if (from > 0) return false;
  *b = 0;
  *e = s.size();
  return true;
}

class Pii final : public Filter {
 public:
  bool emails = true, ips = true, phones = false, only_public_ips = true;
  std::string email_replacement = "email@example.com";
  std::string ip_replacement = "22.214.171.124";
  std::string phone_replacement = "<PHONE>";
  std::unique_ptr<RE2> email_re, ip_re, phone_re;
  bool rewrites() const override { return true; }

  // Replaces every match of re (accepted by accept) in *text; returns whether it changed.
  // `window(text, from, &b, &e)` gives the next part [b, e) of the text at or after `from` that
  // can hold a match (false: none): the regex runs only there. RE2 matches a window with the
  // whole text as context (\b sees the characters around it), and every match of the patterns
  // lies inside one window (the characters a pattern consumes form the windows' runs), so the
  // matches are the same as a search of the whole text.
  template <typename Accept, typename Window>
  static bool replace_all(const RE2& re, const std::string& with, Accept accept, Window window,
                          std::string* text) {
    thread_local std::string out;
    out.clear();
    re2::StringPiece in(*text);
    re2::StringPiece m;
    size_t at = 0, from = 0, wb = 0, we = 0;
    bool changed = false;
    while (from <= text->size() && window(std::string_view(*text), from, &wb, &we)) {
      size_t search = std::max(wb, from);
      while (search <= we && re.Match(in, search, we, RE2::UNANCHORED, &m, 1)) {
        const size_t b = m.data() - text->data(), e = b + m.size();
        if (m.empty()) {  // (the patterns cannot match empty; guard anyway)
          search = b + 1;
          continue;
        }
        out.append(*text, at, b - at);
        if (accept(std::string_view(m.data(), m.size()))) {
          out += with;
          changed = true;
        } else {
          out.append(m.data(), m.size());
        }
        at = search = e;
      }
      from = we + 1;
    }
    if (!changed) return false;
    out.append(*text, at, std::string::npos);
    text->swap(out);
    return true;
  }

  bool apply(std::string* text, const FilterInput&, FilterDrop*, bool* edited,
             FilterAnnotations*) const override {
    bool changed = false;
    auto any = [](std::string_view) { return true; };
    if (emails && text->find('@') != std::string::npos)
      changed |= replace_all(*email_re, email_replacement, any, email_window, text);
    if (ips && has_digit_dot_digit(*text)) {
      if (only_public_ips)
        changed |= replace_all(*ip_re, ip_replacement, public_ipv4, ip_window, text);
      else
        changed |= replace_all(
            *ip_re, ip_replacement,
            [](std::string_view s) {
              // any dotted quad that is an address
              uint32_t o = 0;
              int parts = 1;
              size_t digits = 0;
              for (size_t i = 0; i <= s.size(); ++i) {
                if (i == s.size() || s[i] == '.') {
                  if (o > 255 || digits == 0) return false;
                  if (digits > 1 && s[i - digits] == '0') return false;
                  o = 0;
                  digits = 0;
                  parts += i < s.size();
                } else {
                  o = o * 10 + (s[i] - '0');
                  ++digits;
                }
              }
              return parts == 4;
            },
            ip_window, text);
    }
    if (phones) changed |= replace_all(*phone_re, phone_replacement, any, whole_window, text);
    *edited = changed;
    return true;
  }
};

// ---- url ---------------------------------------------------------------------------------------

// The host of a URL, lower-cased, without user info, port and a leading "www.".
std::string_view url_host(std::string_view url, std::string* buf) {
  std::string path;
  split_url(url, buf, &path);
  std::string_view h(*buf);
  while (!h.empty() && h.back() == '.') h.remove_suffix(1);
  if (h.substr(0, 4) == "www.") h.remove_prefix(4);
  return h;
}

}  // namespace

std::string url_dedup_key(std::string_view url) {
  if (url.empty()) return {};
  size_t p = url.find("://");
  std::string_view rest = p == std::string_view::npos ? url : url.substr(p + 3);
  size_t hash = rest.find('#');
  if (hash != std::string_view::npos) rest = rest.substr(0, hash);
  const size_t end = rest.find_first_of("/?");
  std::string buf;
  std::string key(url_host(rest.substr(0, end), &buf));
  std::string_view tail = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  const size_t q = tail.find('?');
  std::string_view path = tail.substr(0, q),
                   query = q == std::string_view::npos ? "" : tail.substr(q);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  key.append(path);
  key.append(query);
  return key;
}

namespace {

class Url final : public Filter {
 public:
  std::set<std::string, std::less<>> domains;
  std::set<std::string, std::less<>> words;
  bool dedup = false;
  bool needs_url() const override { return true; }
  bool url_dedup() const override { return dedup; }

  bool apply(std::string*, const FilterInput& in, FilterDrop* d, bool*,
             FilterAnnotations*) const override {
    const std::string_view url = in.url;
    if (url.empty()) return true;
    thread_local std::string host_buf;
    std::string_view host = url_host(url, &host_buf);
    // The host and each parent domain (a.b.example.com, b.example.com, example.com, com).
    for (std::string_view h = host; !h.empty();) {
      if (domains.count(h)) return drop(d, "blocked_domain", 1, "==", 1, std::string(h));
      size_t dot = h.find('.');
      if (dot == std::string_view::npos) break;
      h.remove_prefix(dot + 1);
    }
    if (dedup && in.url_duplicate) return drop(d, "duplicate_url", 1, "==", 1);
    if (!words.empty()) {
      thread_local std::string token;
      token.clear();
      for (size_t i = 0; i <= url.size(); ++i) {
        const unsigned char c = i < url.size() ? static_cast<unsigned char>(url[i]) : 0;
        if (c != 0 && (std::isalnum(c) || c >= 0x80)) {
          token.push_back(static_cast<char>(std::tolower(c)));
          continue;
        }
        if (!token.empty() && words.count(token)) return drop(d, "blocked_word", 1, "==", 1, token);
        token.clear();
      }
    }
    return true;
  }
};

// ---- regex -------------------------------------------------------------------------------------

class Regex final : public Filter {
 public:
  std::vector<std::unique_ptr<RE2>> drop_res, strip_res;
  std::vector<std::string> drop_patterns;
  bool rewrites() const override { return !strip_res.empty(); }

  bool apply(std::string* text, const FilterInput&, FilterDrop* d, bool* edited,
             FilterAnnotations*) const override {
    for (size_t i = 0; i < drop_res.size(); ++i)
      if (RE2::PartialMatch(*text, *drop_res[i]))
        return drop(d, "drop_pattern", static_cast<double>(i), "==", static_cast<double>(i),
                    drop_patterns[i]);
    if (strip_res.empty()) return true;
    thread_local std::string out;
    out.clear();
    bool changed = false, first = true;
    size_t at = 0;
    while (at <= text->size()) {
      size_t nl = text->find('\n', at);
      if (nl == std::string::npos) nl = text->size();
      re2::StringPiece line(text->data() + at, nl - at);
      bool strip = false;
      for (const auto& re : strip_res) strip = strip || RE2::PartialMatch(line, *re);
      if (strip) {
        changed = true;
      } else {
        if (!first) out.push_back('\n');
        out.append(line.data(), line.size());
        first = false;
      }
      at = nl + 1;
    }
    if (!changed) return true;
    if (blank(out)) return drop(d, "empty", 0, "==", 0);
    text->swap(out);
    *edited = true;
    return true;
  }
};

Result<std::unique_ptr<RE2>> compile(const std::string& pattern, const std::string& key) {
  RE2::Options o;
  o.set_log_errors(false);
  auto re = std::make_unique<RE2>(pattern, o);
  if (!re->ok()) return Status::config("not a valid RE2 pattern: " + re->error()).with_key(key);
  return re;
}

Status read_list_file(const std::string& path, const std::string& key,
                      std::set<std::string, std::less<>>* out) {
  std::ifstream in(path);
  if (!in) return Status::config("cannot read the list file '" + path + "'").with_key(key);
  std::string line;
  while (std::getline(in, line)) {
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t b = 0;
    while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
    line = line.substr(b);
    if (line.empty()) continue;
    for (char& c : line) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out->insert(line);
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Filter>> make_language(Params& p) {
  auto f = std::make_unique<Language>();
  std::string model;
  KILN_RETURN_IF_ERROR(p.text("model", &model));
  KILN_RETURN_IF_ERROR(p.texts("languages", &f->languages));
  KILN_RETURN_IF_ERROR(p.number("threshold", 0, 1, &f->threshold));
  if (model.empty())
    return Status::config(
               "the language filter needs a fastText model (e.g. lid.176.bin, or one "
               "made by tools/make_lid_model)")
        .with_key(p.key_of("model"));
  auto m = FastTextTagger::load(model);
  if (!m.is_ok())
    return Status::config("cannot load the language model '" + model + "': " + m.status().message())
        .with_key(p.key_of("model"));
  f->model = std::move(*m);
  return std::unique_ptr<Filter>(std::move(f));
}

Result<std::unique_ptr<Filter>> make_pii(Params& p) {
  auto f = std::make_unique<Pii>();
  KILN_RETURN_IF_ERROR(p.boolean("emails", &f->emails));
  KILN_RETURN_IF_ERROR(p.boolean("ips", &f->ips));
  KILN_RETURN_IF_ERROR(p.boolean("phones", &f->phones));
  KILN_RETURN_IF_ERROR(p.boolean("only_public_ips", &f->only_public_ips));
  KILN_RETURN_IF_ERROR(p.text("email_replacement", &f->email_replacement));
  KILN_RETURN_IF_ERROR(p.text("ip_replacement", &f->ip_replacement));
  KILN_RETURN_IF_ERROR(p.text("phone_replacement", &f->phone_replacement));
  KILN_ASSIGN_OR_RETURN(f->email_re, compile(kEmailPattern, p.key()));
  KILN_ASSIGN_OR_RETURN(f->ip_re, compile(kIpPattern, p.key()));
  KILN_ASSIGN_OR_RETURN(f->phone_re, compile(kPhonePattern, p.key()));
  return std::unique_ptr<Filter>(std::move(f));
}

Result<std::unique_ptr<Filter>> make_url(Params& p) {
  auto f = std::make_unique<Url>();
  std::string file;
  std::vector<std::string> domains, words;
  KILN_RETURN_IF_ERROR(p.text("domains_file", &file));
  KILN_RETURN_IF_ERROR(p.texts("domains", &domains));
  KILN_RETURN_IF_ERROR(p.texts("words", &words));
  if (!file.empty())
    KILN_RETURN_IF_ERROR(read_list_file(file, p.key_of("domains_file"), &f->domains));
  for (auto d : domains) {
    for (char& c : d) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    f->domains.insert(d);
  }
  for (auto w : words) {
    for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    f->words.insert(w);
  }
  KILN_RETURN_IF_ERROR(p.boolean("dedup", &f->dedup));
  if (f->domains.empty() && f->words.empty() && !f->dedup)
    return Status::config("give domains_file, domains or words to block, or dedup: true")
        .with_key(p.key());
  return std::unique_ptr<Filter>(std::move(f));
}

Result<std::unique_ptr<Filter>> make_regex(Params& p) {
  auto f = std::make_unique<Regex>();
  std::vector<std::string> drops, strips;
  KILN_RETURN_IF_ERROR(p.texts("drop", &drops));
  KILN_RETURN_IF_ERROR(p.texts("strip_lines", &strips));
  for (size_t i = 0; i < drops.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(auto re,
                          compile(drops[i], p.key_of("drop") + "[" + std::to_string(i) + "]"));
    f->drop_res.push_back(std::move(re));
  }
  for (size_t i = 0; i < strips.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(
        auto re, compile(strips[i], p.key_of("strip_lines") + "[" + std::to_string(i) + "]"));
    f->strip_res.push_back(std::move(re));
  }
  f->drop_patterns = drops;
  if (drops.empty() && strips.empty())
    return Status::config("give drop or strip_lines patterns").with_key(p.key());
  return std::unique_ptr<Filter>(std::move(f));
}

}  // namespace kiln::prep::filter
