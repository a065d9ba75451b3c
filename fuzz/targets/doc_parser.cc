// Fuzz target: JSONL line -> Document (dataprep/ingest/doc_parser.h): JSON, ids, fields, UTF-8
// repair; also the text-document path and repair_utf8 itself. Invariants: an accepted document
// has a non-empty id and valid UTF-8 text when repair is on; repair_utf8's output is valid UTF-8
// and repairing valid text changes nothing.
#include "dataprep/ingest/doc_parser.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string_view in = fuzz::as_view(data, size);
  for (bool repair : {true, false}) {
    prep::ParseOptions opt;
    opt.repair_utf8 = repair;
    prep::Document doc;
    prep::ParseResult r = parse_jsonl_line(in, "fuzz", 7, opt, &doc);
    if (r.ok) {
      FUZZ_REQUIRE(!doc.id.empty());
      FUZZ_REQUIRE(prep::is_valid_utf8(doc.text));
      FUZZ_REQUIRE(r.text == doc.text);
    }
    prep::Document text_doc;
    prep::ParseResult t = parse_text_document(in, "dir/file.txt", opt, &text_doc);
    if (t.ok) FUZZ_REQUIRE(prep::is_valid_utf8(text_doc.text));
    if (t.ok && !repair) FUZZ_REQUIRE(text_doc.text == in);
  }
  std::string fixed;
  if (prep::repair_utf8(in, &fixed)) {
    FUZZ_REQUIRE(prep::is_valid_utf8(fixed));
    std::string again;
    FUZZ_REQUIRE(!prep::repair_utf8(fixed, &again));
  } else {
    FUZZ_REQUIRE(prep::is_valid_utf8(in));
  }
  return 0;
}
