// SentencePiece models (.model: Llama 2, Mistral v1, ...) through the SentencePiece library
// (Debian libsentencepiece-dev). Encoding and decoding are the library's own; Kiln adds no BOS.
#include <sentencepiece_processor.h>

#include "dataprep/tokenizer/charsmap.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "dataprep/tokenizer/tokenizer_impl.h"

namespace kiln::prep {

Result<Tokenizer> Tokenizer::from_sentencepiece(std::string bytes, const std::string& origin,
                                                const TokenizerLimits& limits) {
  return load_sentencepiece(std::move(bytes), origin, limits);
}

Result<Tokenizer> load_sentencepiece(std::string bytes, const std::string& origin,
                                     const TokenizerLimits& limits) {
  // The library trusts the normalizer's charsmap (a corrupt one crashes it): the protobuf's
  // lengths and the charsmaps' tries are checked first.
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || bytes[first] != '{') {
    Status valid = validate_sentencepiece_model(bytes);
    if (!valid.is_ok()) return std::move(valid).with_file(origin);
  }
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  auto st = sp->LoadFromSerializedProto(bytes);
  if (!st.ok())
    return Status::data(
               "not a tokenizer Kiln reads: neither JSON (tokenizer.json, Kiln's tokenizer, a "
               "GPT-2 vocab.json) nor a SentencePiece model (" +
               st.ToString() + ")")
        .with_file(origin);
  const int n = sp->GetPieceSize();
  KILN_RETURN_IF_ERROR(
      check_limit(uint64_t(n), limits.max_vocab, "the SentencePiece model", "max_vocab", origin));
  if (n <= 0) return Status::data("the SentencePiece model has no pieces").with_file(origin);
  Tokenizer tok;
  auto& impl = TokenizerAccess::impl(tok);
  impl.source = TokenizerSource::kSentencePiece;
  impl.tokens.resize(size_t(n));
  impl.special.assign(size_t(n), 0);
  impl.spelled.resize(size_t(n));
  for (int id = 0; id < n; ++id) {
    impl.tokens[id] = sp->IdToPiece(id);
    impl.spelled[id] = impl.tokens[id];
    impl.special[id] = sp->IsControl(id) || sp->IsUnknown(id) ? 1 : 0;
  }
  impl.eos_id = sp->eos_id() >= 0 && sp->eos_id() < n ? sp->eos_id() : -1;
  // --special-tokens parse: the control pieces' text (<s>, </s>) in the input are their ids.
  std::vector<AddedToken> controls;
  for (int id = 0; id < n; ++id)
    if (sp->IsControl(id) && !impl.tokens[id].empty())
      controls.push_back({impl.tokens[id], uint32_t(id), false, false, false});
  impl.added[1][0] = AddedMatcher(std::move(controls));
  impl.sp = std::move(sp);
  impl.sp_model = std::move(bytes);
  return tok;
}

Status sentencepiece_encode(const sentencepiece::SentencePieceProcessor& sp, std::string_view text,
                            std::vector<uint32_t>* out) {
  std::vector<int> ids;
  auto st = sp.Encode(absl::string_view(text.data(), text.size()), &ids);
  if (!st.ok()) return Status::internal("SentencePiece encode: " + st.ToString());
  out->insert(out->end(), ids.begin(), ids.end());
  return Status::ok();
}

Result<std::string> sentencepiece_decode(const sentencepiece::SentencePieceProcessor& sp,
                                         std::span<const uint32_t> ids) {
  std::vector<int> v(ids.begin(), ids.end());
  std::string text;
  auto st = sp.Decode(v, &text);
  if (!st.ok()) return Status::data("SentencePiece decode: " + st.ToString());
  return text;
}

}  // namespace kiln::prep
